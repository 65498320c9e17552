"""The namespace actor as a machine (issue 25): a compile while a sibling edits, side by side with the
actor before it, in one run.

    python -m bench.machine [--quick]

Before, the namespace actor awaited the store inside its handlers: a compile sent while a sibling
manager's edit was committing waited for that edit's commit, fsync included. Now commits go out
from child tasks and the compile is answered at its turn. The earlier actor is commit b1e9a4f's
``ctxrt`` (``git archive``, as ``bench/actors.py`` does); two subprocesses run
``bench/machine_probe.py``, one importing it and one the current package, each over a durable
store of its own (20,000 messages in one namespace, a 20,000-token budget); this process drives
them command by command, interleaved (each round takes the measures in a shuffled order, and the
two designs in a random order for each), so drift on a busy host hits both alike.

(a) A compile while a sibling manager of the same namespace edits its newest message in a loop
    (each compile after a random pause of up to 2 ms, so it lands anywhere in an edit's cycle),
    against a compile right after an edit with nothing in flight: p99 of each, pooled over every
    round, for the current design. Target: ratio <= 2 (the issue's figure).
(b) The same two figures for the earlier design: the reference, no target.
(c) A warm compile with no edit: median µs, current against earlier. Target: ratio <= 1.1.
(d) A durable ``add_message`` (durability "sync"), one at a time: median µs. Target: ratio <= 1.1.
(e) 100 concurrent durable appenders: appends/s. Target: current / earlier >= 0.9.

The current package's store commits durably on its writer thread (the store's part of the issue),
so a compile is served while a commit flushes; b1e9a4f's store flushes on the trio thread, where
nothing else runs meanwhile, so (b) holds that wait as well as the wait behind the edit's whole
commit in the actor's mailbox, and (d)-(e) compare the machine with the writer thread against
neither (bench/results-flush.md measures the writer thread alone). Results are printed and written to
``bench/results-machine.md``. ``CTXRT_BENCH_DIR`` chooses where the stores live (a real disk).
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from . import harness
from .actors import Probe
from .harness import TABLE_HEAD, measured, scratch, summary

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PROBE = HERE / "machine_probe.py"
RESULTS_PATH = HERE / "results-machine.md"
EARLIER = "b1e9a4f"
MESSAGES = 20_000
LABEL = f"the actor before the machine ({EARLIER})"
DESIGNS = ("previous", "current")
POOLED = ("quiet", "busy")  # latency figures whose tail is the point: every sample pooled


def _settings(quick: bool) -> dict[str, Any]:
    if quick:
        return {"rounds": 6, "quiet": 25, "busy": 50, "warm": 20, "add": 20, "crowd": 2_000}
    return {"rounds": 40, "quiet": 40, "busy": 80, "warm": 30, "add": 30, "crowd": 3_000}


def percentile(values: list[float], fraction: float) -> float:
    """The value below which ``fraction`` of ``values`` lie (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))]


Figures = dict[str, dict[str, list[Any]]]


def _measure(probes: dict[str, Probe], settings: dict[str, Any], rng: random.Random) -> Figures:
    """Per measure and design: every sample (pooled measures), else one figure per round."""
    commands = {name: f"{name} {settings[name]}" for name in ("quiet", "busy", "warm", "add", "crowd")}
    for design in DESIGNS:  # warm-up, not counted
        for command in commands.values():
            probes[design].ask(command)
    figures: Figures = {name: {d: [] for d in DESIGNS} for name in commands}
    for _ in range(settings["rounds"]):
        names = list(commands)
        rng.shuffle(names)
        for name in names:
            order = list(DESIGNS)
            rng.shuffle(order)
            for design in order:
                answer = probes[design].ask(commands[name])
                if name in POOLED:
                    figures[name][design].extend(answer)
                else:
                    figures[name][design].append(statistics.median(answer))
    return figures


def _tail_row(measure: str, design: str, figures: Figures, *, target: float | None) -> dict[str, Any]:
    busy, quiet = figures["busy"][design], figures["quiet"][design]
    ratio = percentile(busy, 0.99) / percentile(quiet, 0.99)
    return harness.row(
        measure, "µs", [percentile(busy, 0.99)], target=target, op="<=", judged=ratio,
        comparison=percentile(quiet, 0.99), comparison_label="a compile right after an edit, nothing in flight (p99)",
        ratio=ratio, p50=percentile(busy, 0.5), comparison_p50=percentile(quiet, 0.5), samples=len(busy),
        comparison_samples=len(quiet),
    )


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Measure (a)-(e); one dict per figure, or one skipped row. Also writes ``bench/results-machine.md``."""
    settings = _settings(quick)
    rng = random.Random(20261202)
    started = time.perf_counter()
    with scratch("ctxrt-bench-machine-") as root:
        tree = harness.tree_at(ROOT, EARLIER, root, "the actor before the machine")
        if isinstance(tree, str):
            rows: list[dict[str, Any]] = [{"skipped": f"machine: {tree}", "quick": quick}]
            RESULTS_PATH.write_text(to_markdown(rows))
            return rows
        roots = {"previous": tree, "current": ROOT}
        probes: dict[str, Probe] = {}
        try:
            for design in DESIGNS:
                (root / design).mkdir()
                probes[design] = Probe(design, roots[design], root / design / "store", root / f"{design}.log",
                                       MESSAGES, script=PROBE)
            for probe in probes.values():
                probe.ready()
            figures = _measure(probes, settings, rng)
        finally:
            for probe in probes.values():
                probe.close()
    rows = [
        _tail_row("(a) compile while a sibling edits the same namespace (p99), current design", "current", figures,
                  target=2),
        _tail_row(f"(b) the same, {LABEL}", "previous", figures, target=None),
        harness.versus("(c) warm compile, no edit (20,000 messages, 20,000-token budget)", "µs",
                       figures["warm"]["current"], figures["warm"]["previous"], LABEL, target=1.1),
        harness.versus("(d) durable add_message, one at a time", "µs", figures["add"]["current"],
                       figures["add"]["previous"], LABEL, target=1.1),
        harness.versus("(e) 100 concurrent durable appenders", "appends/s", figures["crowd"]["current"],
                       figures["crowd"]["previous"], LABEL, inverse=True, target=1 / 0.9),
    ]
    info = {
        "quick": quick, "rounds_run": settings["rounds"], "settings": dict(settings),
        "setup_s": {design: probe.setup_s for design, probe in probes.items()},
        "seconds": time.perf_counter() - started, "python": sys.executable,
    }
    for each in rows:
        each.update(info)
    RESULTS_PATH.write_text(to_markdown(rows))
    return rows


# -- markdown --------------------------------------------------------------------------------------


def to_markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["## The namespace machine", ""]
    skipped = [row["skipped"] for row in rows if "skipped" in row]
    if skipped:
        return "\n".join(lines + [f"Not measured: {line}." for line in skipped]) + "\n"
    first = rows[0]
    settings = first["settings"]
    setup = ", ".join(f"{design} {seconds:.1f} s" for design, seconds in first["setup_s"].items())
    lines += [
        measured("machine", first["quick"], f"the current package against commit {EARLIER}'s `ctxrt`")
        + f" {first['rounds_run']} rounds; each round takes the measures in a shuffled order and the two "
        "designs, each a subprocess over its own durable store, in a random order for each. Per round and design: "
        f"{settings['quiet']} compiles right after an edit, {settings['busy']} compiles while a sibling edits, "
        f"{settings['warm']} warm compiles, {settings['add']} durable appends, {settings['crowd']:,} appends by 100 "
        f"callers. (a) and (b) pool every sample; (c)-(e) are medians across rounds of each round's median (min–max "
        f"across rounds). Set-up ({MESSAGES:,} messages built with durability \"os\", then reopened \"sync\"): "
        f"{setup}.",
        "",
        *TABLE_HEAD,
    ]
    for row in rows:
        if "p50" in row:
            ours = f"{row['ctxrt']['median']:,.0f} µs (p50 {row['p50']:,.0f} µs)"
            comparison = (f"{row['comparison_label']}: {row['comparison']:,.0f} µs (p50 {row['comparison_p50']:,.0f} "
                          f"µs)")
            ratio = f"{row['ratio']:.2f} (p99 / p99)"
        else:
            ours = harness.median_figure(row["ctxrt"], row["unit"])
            comparison = f"{row['comparison_label']}: {harness.median_figure(row['comparison'], row['unit'])}"
            ratio = f"{row['ratio']:.2f}" + (" (earlier / current)" if row["unit"] == "appends/s" else
                                             " (current / earlier)")
        target = "" if row["target"] is None else f"{row['op']} {row['target']:.3g}"
        verdict = "" if row["passed"] is None else "pass" if row["passed"] else "**fail**"
        lines.append(f"| {row['measure']} | {ours} | {comparison} | {ratio} | {target} | {verdict} |")
    lines += [
        "",
        harness.paired_line([row for row in rows if row.get("paired_ratio") is not None]),
        "",
        "- The current package also commits durably on the store's writer thread (main's flush work, issue 25 "
        f"item 1); {EARLIER} flushes on the trio thread. So (b)'s tail holds the flush as well as the wait behind "
        "the sibling's whole edit in the namespace's mailbox, which the machine removes, and (d)-(e) compare the "
        "machine with the writer thread against neither (bench/results-flush.md has the writer thread's own "
        "figures).",
    ]
    return "\n".join(lines) + "\n"


main = harness.entry("machine", __doc__, run, to_markdown, RESULTS_PATH, quick_help="fewer rounds and samples")


if __name__ == "__main__":
    raise SystemExit(main())
