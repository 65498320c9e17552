"""The write path's figure (issue 35): durable appends, three versions side by side in one run.

    python -m bench.committer [--quick]

Three subprocesses run ``bench/flush_probe.py`` over a store of their own, each importing one
``ctxrt``: commit b1e9a4f's (the last that committed on the trio thread), the main line this work
started from (11a53f0: the flush on the store's writer thread, every commit through it), and the
current package (the committer chooses). This process drives them command by command,
alternating: each round takes the measures in a shuffled order and the versions in a random order
for each, so drift on a busy host hits all alike. Public API only (``add_message``).

(a) A durable ``add_message``, one at a time: each round's median µs. Target: the current package
    within 1.2x of b1e9a4f's (ratio of the medians across rounds).
(b) 10 concurrent durable ``add_message`` callers, a manager each: appends/s, each round's median.
    Target: >= 0.95x b1e9a4f's.
(c) The same with 100 callers. Target: >= 0.95x b1e9a4f's.

Results are printed and written to ``bench/results-committer.md``. ``CTXRT_BENCH_DIR`` chooses where
the stores live (a real disk: on tmpfs a flush costs nothing). ``bench/flush.py`` keeps the loop's
figures (a compile and a timer under others' durable appends) against b1e9a4f.
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import harness
from .actors import Probe
from .harness import TABLE_HEAD, measured, scratch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PROBE = HERE / "flush_probe.py"
RESULTS_PATH = HERE / "results-committer.md"
BASE, MAIN = "b1e9a4f", "11a53f0"
VERSIONS = ("base", "main", "current")
LABELS = {"base": f"{BASE} (commits on the trio thread)", "main": f"{MAIN} (every durable commit on the writer thread)",
          "current": "current (the committer chooses)"}
# What flush_probe.py calls each version: "base" when it has no writer thread.
PROBE_DESIGNS = {"base": "base", "main": "current", "current": "current"}
MESSAGES = 100  # the probe's "big" namespace, which these measures don't read


def _settings(quick: bool) -> dict[str, int]:
    if quick:
        return {"rounds": 2, "adds": 100, "groups10": 20, "groups100": 5}
    return {"rounds": 4, "adds": 400, "groups10": 100, "groups100": 20}


def _measure(probes: dict[str, Probe], settings: dict[str, int], rng: random.Random) -> dict[str, dict[str, list[float]]]:
    """Per measure and version, each round's median."""
    commands = {"add": f"add {settings['adds']}", "group10": f"group {settings['groups10']} 10",
                "group100": f"group {settings['groups100']} 100"}
    for version in VERSIONS:  # warm-up, not counted (it also opens the crowd's managers)
        for command in ("add 20", "group 2 10", "group 2 100"):
            probes[version].ask(command)
    figures: dict[str, dict[str, list[float]]] = {name: {v: [] for v in VERSIONS} for name in commands}
    for _ in range(settings["rounds"]):
        names = list(commands)
        rng.shuffle(names)
        for name in names:
            order = list(VERSIONS)
            rng.shuffle(order)
            for version in order:
                figures[name][version].append(statistics.median(probes[version].ask(commands[name])))
    return figures


def _row(measure: str, unit: str, rounds: dict[str, list[float]], target: float, op: str) -> dict[str, Any]:
    """The current package's figure, judged by the ratio of its median to the base's (current / base,
    as the issue states its targets)."""
    medians = {version: statistics.median(rounds[version]) for version in VERSIONS}
    ratio = medians["current"] / medians["base"]
    return harness.row(measure, unit, rounds["current"], target=target, op=op, judged=ratio,
                       comparison={v: harness.summary(rounds[v]) for v in ("base", "main")},
                       ratio=ratio, main_ratio=medians["main"] / medians["base"],
                       by_round={v: list(rounds[v]) for v in VERSIONS})


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Measure (a)-(c); one dict per figure, or one skipped row. Also writes ``bench/results-committer.md``."""
    settings = _settings(quick)
    rng = random.Random(20261204)
    started = time.perf_counter()
    with scratch("ctxrt-bench-committer-") as root:
        roots: dict[str, Path] = {"current": ROOT}
        for version, commit in (("base", BASE), ("main", MAIN)):
            (root / version).mkdir()
            tree = harness.tree_at(ROOT, commit, root / version, LABELS[version])
            if isinstance(tree, str):
                rows: list[dict[str, Any]] = [{"skipped": f"committer: {tree}", "quick": quick}]
                RESULTS_PATH.write_text(to_markdown(rows))
                return rows
            roots[version] = tree
        probes: dict[str, Probe] = {}
        try:
            for version in VERSIONS:
                (root / f"{version}-store").mkdir()
                probes[version] = Probe(PROBE_DESIGNS[version], roots[version], root / f"{version}-store" / "store",
                                        root / f"{version}.log", MESSAGES, PROBE)
            for probe in probes.values():
                probe.ready()
            figures = _measure(probes, settings, rng)
        finally:
            for probe in probes.values():
                probe.close()
    rows = [
        _row("(a) durable add_message, one at a time", "µs", figures["add"], 1.2, "<="),
        _row("(b) 10 concurrent durable add_message callers, a manager each", "appends/s", figures["group10"], 0.95,
             ">="),
        _row("(c) 100 concurrent durable add_message callers, a manager each", "appends/s", figures["group100"], 0.95,
             ">="),
    ]
    info = {"where": os.environ.get("CTXRT_BENCH_DIR") or tempfile.gettempdir(), "quick": quick, "rounds_run": settings["rounds"], "settings": dict(settings),
            "seconds": time.perf_counter() - started, "python": sys.executable}
    for each in rows:
        each.update(info)
    RESULTS_PATH.write_text(to_markdown(rows))
    return rows


def to_markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["## The committer: durable appends against b1e9a4f and the main line", ""]
    skipped = [row["skipped"] for row in rows if "skipped" in row]
    if skipped:
        return "\n".join(lines + [f"Not measured: {line}." for line in skipped]) + "\n"
    first = rows[0]
    settings = first["settings"]
    lines += [
        measured("committer", first["quick"], f"the current package against commits {BASE} and {MAIN}")
        + f" {first['rounds_run']} rounds; each round takes the measures in a shuffled order and the three "
        "versions, each a subprocess over its own store (durability \"sync\"), in a random order for each. Per "
        f"round and version: {settings['adds']} appends one at a time, {settings['groups10']} groups of 10 and "
        f"{settings['groups100']} groups of 100 concurrent appends. Each figure is the median across rounds of the "
        "round's median, min–max across rounds beside it; the ratio is the current package's over b1e9a4f's. "
        f"The stores lived under {first['where']} (``CTXRT_BENCH_DIR``).",
        "",
        *TABLE_HEAD,
    ]
    for row in rows:
        unit = row["unit"]
        comparison = "; ".join(f"{LABELS[v]}: {harness.median_figure(row['comparison'][v], unit)}"
                               for v in ("base", "main"))
        verdict = "" if row["passed"] is None else "pass" if row["passed"] else "**fail**"
        lines.append(f"| {row['measure']} | {harness.median_figure(row['ctxrt'], unit)} | {comparison} | "
                     f"{row['ratio']:.2f} (current / base; main / base {row['main_ratio']:.2f}) | "
                     f"{row['op']} {row['target']:g} | {verdict} |")
    lines += ["", "Per round (" + ", ".join(VERSIONS) + "):", ""]
    for row in rows:
        per = "; ".join(f"{v} " + ", ".join(f"{x:,.0f}" for x in row["by_round"][v]) for v in VERSIONS)
        lines.append(f"- {row['measure'].split(' ', 1)[0]} {per}")
    return "\n".join(lines) + "\n"


main = harness.entry("committer", __doc__, run, to_markdown, RESULTS_PATH, quick_help="fewer rounds and samples")


if __name__ == "__main__":
    raise SystemExit(main())
