"""The refusal ladder under a model that often won't write a memory (docs/behaviours.md T12, T13).

    python -m bench.ladder [--quick]

A host runs an agent with tools for 500 turns (150 with ``--quick``): each turn adds the user's
message and the agent's reply, then drains compression (``wait_ready()``, the host's tick). The
compression model is a ``ScriptedModel`` that, per call and from a seeded random, refuses 50% of
requests (stop reason "refusal"), answers 20% with a tool call (only when the request offers
tools: a model can't call a tool it wasn't given; otherwise it answers) and writes a memory
otherwise. The same turns and the same random sequence run twice: with the ladder
(``refusal_fallbacks=3``, the default) and without it (``refusal_fallbacks=0``, each refusal
counts a failure). Figures: the units quarantined (target with the ladder: 0), the compression
debt left at the end, and the model calls per summary made (what the ladder costs).

The model's refusals here are random per call, not driven by what the request holds, so this
measures the ladder's bounded retries and its no-tools rung; a classifier keyed on the request's
content would answer its shape-changing rungs (source only, split) differently. Results are
printed and written to ``bench/results-ladder.md``.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

import trio

import ctxrt
from ctxrt.testing import ScriptedModel

from . import harness
from .harness import TABLE_HEAD, scratch

RESULTS_PATH = Path(__file__).with_name("results-ladder.md")
NAMESPACE = "agents/ann"
MODEL = "bench-model"
SEED = 20261204
TURNS, QUICK_TURNS = 500, 150
REFUSE, TOOL_CALL = 0.5, 0.2
TOOLS = [{"name": "search", "description": "Search the docs.", "input_schema": {"type": "object", "properties": {}}}]
MEMORY = ("I remember going through the user's questions about the deploy: we read the logs, found the retry "
          "storm, agreed to cap retries and add jitter, and left the alert thresholds open. ") * 3

_TOPICS = ("the deploy", "the schema", "a flaky test", "the budget", "the release notes", "an outage")


def say(n: int, who: str) -> str:
    """A ~200-character message (about 70 tokens)."""
    topic = _TOPICS[n % len(_TOPICS)]
    return (f"Turn {n} ({who}): about {topic}, I looked at what changed since yesterday and I think we should keep "
            f"the current plan, but check the numbers again before we ship anything.")[:200]


def strategy(fallbacks: int) -> ctxrt.Autobiographical:
    return ctxrt.Autobiographical(MODEL, target_chunk_tokens=1_000, head_window_tokens=1_000,
                                  recent_window_tokens=4_000, refusal_fallbacks=fallbacks)


class Reluctant:
    """The scripted model's responder: refuses, calls a tool, or remembers, from a seeded random."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.calls = {"refusal": 0, "tool_use": 0, "memory": 0}

    def __call__(self, request: ctxrt.ModelRequest) -> ctxrt.ModelResponse | str:
        draw = self.rng.random()
        usage = ctxrt.Usage(100, 10)
        if draw < REFUSE:
            self.calls["refusal"] += 1
            return ctxrt.ModelResponse((ctxrt.Text("I can't help with that."),), "refusal", usage)
        if draw < REFUSE + TOOL_CALL and request.tools:
            self.calls["tool_use"] += 1
            return ctxrt.ModelResponse((ctxrt.ToolUse("t1", "search", {}),), "tool_use", usage)
        self.calls["memory"] += 1
        return MEMORY


async def host(directory: Path, turns: int, fallbacks: int, seed: int = SEED) -> dict[str, Any]:
    """``turns`` turns of a host that drains compression after each; what it left behind."""
    logging.getLogger("ctxrt.autobiographical").setLevel(logging.CRITICAL)  # a line per refusal, else
    responder = Reluctant(seed)
    model = ScriptedModel(responder)
    async with ctxrt.open_runtime(directory, model=model, durability="os") as rt:
        m = await rt.open(NAMESPACE, view_reader="ann", strategy=strategy(fallbacks))
        m.set_tool_definitions(TOOLS)
        async with m.subscribe(alarms=True) as events:
            for n in range(turns):
                await m.add_message("user", say(n, "user"))
                await m.add_message("ann", say(n, "ann"))
                await m.wait_ready()
            health = await m.health()
            memory = (await m.inspect()).strategy
            given_up = set(memory.quarantined())
            raw = sum(len(chunk.message_ids) for chunk in memory.chunks if chunk.id in given_up)
            summaries = await m.search_summaries(include_merged=True, limit=100_000)
            alarms = 0
            while True:
                try:
                    event = events.receive_nowait()
                except trio.WouldBlock:
                    break
                alarms += isinstance(event, ctxrt.QuarantineAlarm)
    return {"quarantined": len(health.quarantined), "alarms": alarms, "raw": raw, "debt": health.compression_debt_tokens,
            "pending": health.pending_units, "chunks": len(memory.chunks), "summaries": len(summaries), "calls": len(model.requests),
            **responder.calls}


async def _run(quick: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    turns = QUICK_TURNS if quick else TURNS
    with scratch("ctxrt-bench-ladder-") as root:
        ladder = await host(root / "ladder", turns, 3)
        bare = await host(root / "bare", turns, 0)
        seeds = range(1, 4 if quick else 11)  # other random sequences: how often the one above is luck
        others = [(await host(root / f"ladder-{n}", turns, 3, n))["quarantined"] for n in seeds]
        others_bare = [(await host(root / f"bare-{n}", turns, 0, n))["quarantined"] for n in seeds]
    per_summary = {name: run["calls"] / max(run["summaries"], 1) for name, run in (("ladder", ladder), ("bare", bare))}
    rows = [
        harness.row(f"units quarantined over {turns} turns, with the ladder (refusal_fallbacks=3)", "units",
                    [ladder["quarantined"]], comparison=bare["quarantined"],
                    comparison_label="without it (refusal_fallbacks=0)", ratio=None, target=0,
                    note=f"QuarantineAlarms heard: {ladder['alarms']} with the ladder, {bare['alarms']} without"),
        harness.row(f"units quarantined over {turns} turns with the ladder, summed over {len(seeds)} other seeds",
                    "units", [sum(others)], comparison=sum(others_bare), comparison_label="without it", ratio=None,
                    target=None, note=(f"seeds {seeds.start}-{seeds.stop - 1}: with the ladder {others}, without "
                                       f"{others_bare}")),
        harness.row("messages left raw in quarantined chunks at the end, with the ladder", "messages",
                    [ladder["raw"]], comparison=bare["raw"], comparison_label="without it", ratio=None, target=None,
                    note=(f"of {2 * turns} messages in {ladder['chunks']} chunks; queued work left: "
                          f"{ladder['pending']} units, {ladder['debt']} tokens with the ladder, {bare['pending']} "
                          f"units, {bare['debt']} tokens without")),
        harness.row("model calls per summary made, with the ladder", "calls", [per_summary["ladder"]],
                    comparison=per_summary["bare"], comparison_label="without it",
                    ratio=per_summary["ladder"] / per_summary["bare"], target=None,
                    note=(f"summaries {ladder['summaries']} vs {bare['summaries']}; calls {ladder['calls']} vs "
                          f"{bare['calls']}; replies with the ladder: {ladder['refusal']} refusals, "
                          f"{ladder['tool_use']} tool calls, {ladder['memory']} memories; without: "
                          f"{bare['refusal']}, {bare['tool_use']}, {bare['memory']}")),
    ]
    return rows, {"quick": quick, "turns": turns}


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Run the host with and without the ladder; one dict per figure."""
    return harness.run_trio(_run, quick)


def to_markdown(rows: list[dict[str, Any]]) -> str:
    first = rows[0]
    lines = [
        "## The refusal ladder",
        "",
        harness.measured("ladder", first["quick"], f"trio {trio.__version__}")
        + f" One run of {first['turns']} turns each way (the model's replies come from one seeded random "
        f"sequence, seed {SEED}): {REFUSE:.0%} refusals, {TOOL_CALL:.0%} tool calls when tools are offered, the "
        "rest memories; the host drains after every turn (`wait_ready()`). The refusals are random per call, not "
        "driven by the request's content: this measures the ladder's bounded retries and its no-tools rung.",
        "",
        *TABLE_HEAD,
    ]
    for row in rows:
        ratio = "—" if row["ratio"] is None else f"{row['ratio']:.2f}"
        target = "—" if row["target"] is None else f"{row['op']} {row['target']:g}"
        verdict = "—" if row["passed"] is None else "pass" if row["passed"] else "**fail**"
        lines.append(f"| {row['measure']} | {harness.figure(row['ctxrt']['median'], row['unit'])} | "
                     f"{row['comparison_label']}: {harness.figure(row['comparison'], row['unit'])} | {ratio} | "
                     f"{target} | {verdict} |")
    lines.append("")
    lines += [f"- {row['measure'].split(',')[0]}: {row['note']}." for row in rows if row.get("note")]
    return "\n".join(lines) + "\n"


main = harness.entry("ladder", __doc__, run, to_markdown, RESULTS_PATH,
                     quick_help=f"{QUICK_TURNS} turns instead of {TURNS}")


if __name__ == "__main__":
    raise SystemExit(main())
