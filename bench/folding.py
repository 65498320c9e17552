"""Folding benchmark: adaptive resolution over a long run under a tight budget (T10).

    python -m bench.folding [--quick]

One Autobiographical namespace per variant, 2,000 turns (300 with ``--quick``): each turn adds a
message (alternating "user" and "Claude", 20 to 150 estimated tokens, seeded), lets the drain
compress what is due (``wait_ready()``, as a host ticking between turns would), and compiles under
a 5,000-token budget (chunks of 1,600 tokens, a 2,000-token recent window, no head window, merges
of 4, ~60-token summaries from a ``ScriptedModel``). The budget is tight enough that today's
selection (adaptive resolution off) leaves history out: the newest closed chunk is held back raw,
and the summaries plus that debt and the stretch not yet closed overrun the middle.

Variants: ``adaptive_resolution=True`` with ``folding="kv-stable"``, with ``"flat"``, and off.
Figures per variant:

- the mean stable-prefix ratio: ``CompileResult.stable_prefix_tokens`` over the compile's own
  estimate (``estimate_blocks`` of its messages), over every compile but the first;
- uncovered drops: the messages ``render_stats().dropped_ids`` reported left out with no shown
  summary covering them, summed over the run, and the compiles that left any out.

Targets: kv-stable's ratio >= 0.9 with 0 uncovered drops. Results are printed and written to
``bench/results-folding.md``.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import trio

import ctxrt
from ctxrt.testing import ScriptedModel, estimate_blocks

from . import harness
from .harness import TABLE_HEAD, measured, scratch

RESULTS_PATH = Path(__file__).with_name("results-folding.md")
MODEL = "bench-model"
BUDGET = ctxrt.Budget(max_tokens=5_000, reserve_for_response=0)
VARIANTS = ("kv-stable", "flat", "off")
NAMES = {"kv-stable": 'adaptive, folding="kv-stable"', "flat": 'adaptive, folding="flat"', "off": "today's (adaptive off)"}
SUMMARY = ("I remember we went through the plan step by step, checked what had changed, agreed on the next "
           "change and left one question open for later.")  # about 45 tokens, 60 shown with the recall header
WORDS = "we looked again at the numbers and agreed to keep the plan but check the logs first".split()


def config(variant: str) -> ctxrt.Autobiographical:
    folding = {} if variant == "off" else {"adaptive_resolution": True, "folding": variant}
    return ctxrt.Autobiographical(MODEL, target_chunk_tokens=1_600, recent_window_tokens=2_000, merge_threshold=4,
                                  summary_target_tokens=60, **folding)


def text(rng: random.Random, turn: int) -> str:
    """A message of 20 to 150 estimated tokens (about 2.9 characters a token)."""
    length = rng.randint(58, 435)
    words: list[str] = [f"turn {turn}:"]
    while sum(len(w) + 1 for w in words) < length:
        words.append(rng.choice(WORDS))
    return " ".join(words)[:length]


async def long_run(directory: Path, variant: str, turns: int) -> dict[str, Any]:
    """The run's figures for one variant: ratios, drops, compiles with drops, seconds."""
    rng = random.Random(36)
    ratios: list[float] = []
    dropped = compiles_dropping = 0
    started = time.perf_counter()
    async with ctxrt.open_runtime(directory, model=ScriptedModel(lambda request: SUMMARY), durability="os") as rt:
        m = await rt.open("bench", strategy=config(variant))
        for turn in range(turns):
            await m.add_message("user" if turn % 2 == 0 else "Claude", text(rng, turn))
            await m.wait_ready()
            result = await m.compile(BUDGET)
            stats = m.render_stats()
            assert stats is not None
            dropped += len(stats.dropped_ids)
            compiles_dropping += bool(stats.dropped_ids)
            if turn:
                total = sum(estimate_blocks(message.content) for message in result.messages)
                ratios.append(result.stable_prefix_tokens / total if total else 1.0)
    return {"ratio": statistics.mean(ratios), "dropped": dropped, "compiles_dropping": compiles_dropping,
            "seconds": time.perf_counter() - started}


def run(quick: bool = False) -> list[dict[str, Any]]:
    turns = 300 if quick else 2_000
    found: dict[str, dict[str, Any]] = {}
    with scratch("ctxrt-folding-") as directory:
        for variant in VARIANTS:
            found[variant] = trio.run(long_run, directory / variant, variant, turns)
    rows: list[dict[str, Any]] = []
    for variant in VARIANTS:
        figures = found[variant]
        target = 0.9 if variant == "kv-stable" else None
        rows.append({
            "measure": f"{NAMES[variant]}: mean stable_prefix_tokens / compile tokens", "unit": "",
            "ctxrt": figures["ratio"], "comparison": None if variant == "off" else found["off"]["ratio"],
            "comparison_label": NAMES["off"], "ratio": None, "target": target, "op": ">=" if target else None,
            "passed": None if target is None else figures["ratio"] >= target, "turns": turns, "quick": quick,
            "seconds": figures["seconds"],
        })
        rows.append({
            "measure": f"{NAMES[variant]}: uncovered drops (messages left out, summed over compiles)", "unit": "",
            "ctxrt": figures["dropped"], "comparison": None if variant == "off" else found["off"]["dropped"],
            "comparison_label": NAMES["off"], "ratio": None, "target": 0 if variant == "kv-stable" else None,
            "op": "<=" if variant == "kv-stable" else None,
            "passed": figures["dropped"] == 0 if variant == "kv-stable" else None,
            "compiles_dropping": figures["compiles_dropping"], "turns": turns, "quick": quick,
            "seconds": figures["seconds"],
        })
    return rows


def to_markdown(rows: list[dict[str, Any]]) -> str:
    quick = bool(rows and rows[0].get("quick"))
    turns = rows[0].get("turns") if rows else "?"
    lines = ["## Folding", "", measured("folding", quick, f"{turns:,} turns per variant" if isinstance(turns, int)
                                        else "?"), "",
             f"One namespace per variant; each turn adds a message, waits for the drain and compiles under a "
             f"{BUDGET.usable:,}-token budget (chunks of 1,600 tokens, a 2,000-token recent window, merges of 4). "
             "The stable-prefix ratio is the mean over compiles of stable_prefix_tokens over the compile's "
             "estimate; uncovered drops are render_stats().dropped_ids summed over the run.", "", *TABLE_HEAD]
    for each in rows:
        mine, theirs = each["ctxrt"], each.get("comparison")

        def shown(value: Any) -> str:
            return f"{value:.3f}" if isinstance(value, float) else f"{value:,}"

        versus = "–" if theirs is None else f"{shown(theirs)} ({each['comparison_label']})"
        target = "–" if each.get("target") is None else f"{each['op']} {each['target']}"
        passed = {True: "pass", False: "FAIL", None: "–"}[each.get("passed")]
        lines.append(f"| {each['measure']} | {shown(mine)} | {versus} | – | {target} | {passed} |")
    dropping = "; ".join(f"{each['measure'].split(':', 1)[0]} {each['compiles_dropping']:,} of {each['turns']:,}"
                         for each in rows if "compiles_dropping" in each)
    seconds = "; ".join(f"{each['measure'].split(':', 1)[0]} {each['seconds']:.0f} s"
                        for each in rows if "compiles_dropping" in each)
    lines += ["", f"Compiles that left history out: {dropping}.", "", f"Wall time: {seconds}."]
    return "\n".join(lines) + "\n"


main = harness.entry("folding", __doc__, run, to_markdown, RESULTS_PATH,
                     quick_help="300 turns per variant instead of 2,000")

if __name__ == "__main__":
    sys.exit(main())
