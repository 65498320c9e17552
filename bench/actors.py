"""Actors benchmarks: the namespace-actor design against the previous one, side by side in one run.

    python -m bench.actors [--quick]

The redesign (a task and a mailbox per namespace) should cost at most one channel hop. The
previous design is commit 796a154 of this repository, the last before the redesign: its ``ctxrt``
is extracted (``git archive``) into a temporary directory. Two subprocesses run
``bench/actors_probe.py``, one importing that copy and one the current package, each over a store
of its own; this process drives them command by command, interleaved (each round takes the
measures in a shuffled order, and the two designs in a random order for each), so drift on a busy
host hits both alike. The probe uses only the public API both designs share (``open_runtime``,
``open``, ``add_message``, ``compile``, ``Budget``, the default Passthrough strategy), but for (d).

(a) A warm Passthrough compile at 20,000 messages, a budget that holds them all: median µs of
    each design, the difference and the ratio. Target: the current design within 50 µs of the
    previous one (difference of the medians).
(b) A durable ``add_message`` (durability "sync") in a namespace of its own: median µs. Target:
    ratio (current / previous) <= 1.1.
(c) A request's round trip through the namespace: a compile of a 1-message namespace, median µs.
    The difference is what the mailbox hop costs a request. No target.
(d) The reader check alone, ns per call in a tight loop, *internal path*: the previous design's
    ``manager._actor.check("ann")`` against the current ``check_reader(record, "ann", place)``
    (``ctxrt.namespace.core``) on the record the actor holds. Target: ratio <= 2. Not the product's
    figure: a request pays it inside (c).

Each figure is the median across rounds of each round's median (min–max across rounds). If the
repository's history isn't here (an installed copy) or lacks 796a154, the module reports one
skipped row saying why. Results are printed and written to ``bench/results-actors.md``.
``CTXRT_BENCH_DIR`` chooses where the stores live (a real disk, for the durable figure).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

from . import harness
from .harness import TABLE_HEAD, measured, scratch, summary

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PROBE = HERE / "actors_probe.py"
RESULTS_PATH = HERE / "results-actors.md"
PREVIOUS = "796a154"
MESSAGES = 20_000
LABEL = f"previous design ({PREVIOUS})"
DESIGNS = ("previous", "current")


# -- the previous design's tree ----------------------------------------------------------------


def previous_tree(directory: Path) -> Path | str:
    """Extract the previous design's ``ctxrt`` under ``directory``; its path, or why it can't be."""
    return harness.tree_at(ROOT, PREVIOUS, directory, "the previous design")


# -- the probes ----------------------------------------------------------------------------------


class Probe:
    """One probe subprocess (``actors_probe.py``, or ``script``): one design over its own store. The
    probe's first line names the ctxrt it imported and its ``design``."""

    def __init__(self, design: str, package_root: Path, store: Path, log: Path, messages: int,
                 script: Path = PROBE) -> None:
        self.design = design
        self.package_root = package_root
        self.log_path = log
        self._log: IO[bytes] = log.open("wb")
        env = dict(os.environ, PYTHONPATH=str(package_root), PYTHONDONTWRITEBYTECODE="1")
        self.started = time.perf_counter()
        self.process = subprocess.Popen(
            [sys.executable, str(script), str(store), str(messages)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self._log, env=env, cwd=str(store.parent), text=True, bufsize=1,
        )
        self.setup_s = 0.0

    def _read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            self.process.wait(timeout=30)
            self._log.flush()
            tail = self.log_path.read_text(errors="replace").strip().splitlines()[-5:]
            raise RuntimeError(f"the {self.design} design's probe stopped (exit {self.process.returncode}): "
                               + " | ".join(tail))
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"the {self.design} design's probe: {answer['error']}")
        return answer

    def ready(self) -> None:
        answer = self._read()
        self.setup_s = time.perf_counter() - self.started
        expected = (self.package_root / "ctxrt").resolve()
        if Path(answer["ctxrt"]).resolve() != expected or answer["design"] != self.design:
            raise RuntimeError(f"the {self.design} design's probe imported {answer['ctxrt']} ({answer['design']} "
                               f"design), not {expected}")

    def ask(self, command: str) -> list[float]:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self._read()["figures"]

    def close(self) -> None:
        try:
            if self.process.poll() is None and self.process.stdin is not None:
                self.process.stdin.write("quit\n")
                self.process.stdin.flush()
                self.process.stdin.close()
            self.process.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()
        finally:
            self._log.close()


# -- the run ---------------------------------------------------------------------------------------


def _settings(quick: bool) -> dict[str, Any]:
    if quick:
        return {"rounds": 30, "compile": 15, "tiny": 200, "add": 20, "check": (200_000, 3)}
    return {"rounds": 150, "compile": 25, "tiny": 300, "add": 30, "check": (300_000, 3)}


Figures = dict[str, dict[str, list[float]]]


def _measure(probes: dict[str, Probe], settings: dict[str, Any], rng: random.Random) -> Figures:
    """Per measure and design, one figure per round: the median of that round's samples."""
    calls, batches = settings["check"]
    commands = {
        "compile": f"compile {settings['compile']}",
        "add": f"add {settings['add']}",
        "tiny": f"tiny {settings['tiny']}",
        "check": f"check {calls} {batches}",
    }
    for design in DESIGNS:  # warm-up, not counted
        for command in commands.values():
            probes[design].ask(command)
    figures: dict[str, dict[str, list[float]]] = {name: {d: [] for d in DESIGNS} for name in commands}
    for _ in range(settings["rounds"]):
        names = list(commands)
        rng.shuffle(names)
        for name in names:
            order = list(DESIGNS)
            rng.shuffle(order)
            for design in order:
                figures[name][design].append(statistics.median(probes[design].ask(commands[name])))
    return figures


def _compare(
    measure: str, unit: str, figures: dict[str, list[float]], *, target: float | None = None,
    judge: str = "ratio", label: str = LABEL,
) -> dict[str, Any]:
    """A row of the current design against the previous, measured in the same rounds: the ratio
    (current / previous) and the difference (current - previous) of the medians, and the medians of
    the per-round ratios and differences. ``judge`` names what ``target`` bounds."""
    current, previous = figures["current"], figures["previous"]
    ratio, paired_ratio = harness.ratios(current, previous)
    difference = statistics.median(current) - statistics.median(previous)
    paired_difference = statistics.median(c - p for c, p in zip(current, previous))
    if target is None:
        target_field: float | str | None = None
    elif judge == "ratio":
        target_field = target
    else:
        target_field = f"difference <= {target:g} {unit}"
    return harness.row(
        measure, unit, current, target=target_field, op="<=", judged=ratio if judge == "ratio" else difference,
        limit=None if judge == "ratio" else target, comparison=summary(previous), comparison_label=label,
        ratio=ratio, ratio_means=f"current / previous; difference {difference:+,.1f} {unit}",
        difference=difference, paired_ratio=paired_ratio, paired_difference=paired_difference,
    )


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Measure (a)-(d); one dict per figure, or one skipped row. Also writes ``bench/results-actors.md``."""
    settings = _settings(quick)
    rng = random.Random(20261201)
    started = time.perf_counter()
    with scratch("ctxrt-bench-actors-") as root:
        tree = previous_tree(root)
        if isinstance(tree, str):
            rows: list[dict[str, Any]] = [{"skipped": f"actors: {tree}", "quick": quick}]
            RESULTS_PATH.write_text(to_markdown(rows))
            return rows
        roots = {"previous": tree, "current": ROOT}
        probes: dict[str, Probe] = {}
        try:
            for design in DESIGNS:
                (root / design).mkdir()
                probes[design] = Probe(design, roots[design], root / design / "store", root / f"{design}.log",
                                       MESSAGES)
            for probe in probes.values():
                probe.ready()
            figures = _measure(probes, settings, rng)
        finally:
            for probe in probes.values():
                probe.close()
    rows = [
        _compare(f"(a) warm Passthrough compile at {MESSAGES:,} messages (budget holds them all)", "µs",
                 figures["compile"], target=50, judge="difference"),
        _compare("(b) durable add_message (durability \"sync\")", "µs", figures["add"], target=1.1),
        _compare("(c) a request's round trip through the namespace: compile of a 1-message namespace", "µs",
                 figures["tiny"]),
        _compare("(d) reader check alone (internal path: `check_reader(record, reader, place)` vs the previous "
                 "`manager._actor.check(reader)`)", "ns", figures["check"], target=2,
                 label=f"{LABEL}, internal path"),
    ]
    info = {
        "quick": quick, "rounds_run": settings["rounds"], "settings": {k: v for k, v in settings.items()},
        "setup_s": {design: probe.setup_s for design, probe in probes.items()},
        "seconds": time.perf_counter() - started, "python": sys.executable,
    }
    for each in rows:
        each.update(info)
    RESULTS_PATH.write_text(to_markdown(rows))
    return rows


# -- markdown --------------------------------------------------------------------------------------

# Each number at its median's precision: no decimals from 100 up, one from 1, else three.


def to_markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["## Actors", ""]
    skipped = [row["skipped"] for row in rows if "skipped" in row]
    if skipped:
        return "\n".join(lines + [f"Not measured: {line}." for line in skipped]) + "\n"
    first = rows[0]
    settings = first["settings"]
    calls, batches = settings["check"]
    setup = ", ".join(f"{design} {seconds:.1f} s" for design, seconds in first["setup_s"].items())
    lines += [
        measured("actors", first["quick"], f"the current package against commit {PREVIOUS}'s `ctxrt`")
        + f" {first['rounds_run']} rounds; each round takes the measures in a shuffled order and the two "
        "designs, each a subprocess over its own store, in a random order for each; a figure is the median "
        "across rounds of each round's median (min–max across rounds). Per round and design: "
        f"{settings['compile']} warm compiles, {settings['add']} durable appends, {settings['tiny']} compiles of "
        f"the 1-message namespace, {batches} batches of {calls:,} reader checks. Set-up (a {MESSAGES:,}-message "
        f"store built with durability \"os\", then reopened \"sync\"): {setup}.",
        "",
        *TABLE_HEAD,
    ]
    for row in rows:
        comparison = f"{row['comparison_label']}: {harness.median_figure(row['comparison'], row['unit'])}"
        ratio = f"{row['ratio']:.2f} (current / previous); difference {row['difference']:+,.1f} {row['unit']}"
        target = "" if row["target"] is None else row["target"] if isinstance(row["target"], str) \
            else f"{row['op']} {row['target']:g}"
        verdict = "" if row["passed"] is None else "pass" if row["passed"] else "**fail**"
        lines.append(f"| {row['measure']} | {harness.median_figure(row['ctxrt'], row['unit'])} | {comparison} | {ratio} | "
                     f"{target} | {verdict} |")
    lines += [
        "",
        "Medians of the per-round figures (each round ran both designs): "
        + "; ".join(f"{row['measure'].split(' ', 1)[0]} ratio {row['paired_ratio']:.2f}, difference "
                    f"{row['paired_difference']:+,.1f} {row['unit']}" for row in rows) + ".",
        "",
        ("- (c)'s difference is the cost of the mailbox hop a request now pays (a send, a wait on its reply, "
         "the actor task's turn); (a) and (b) are the figures a user sees."),
        "- (d) is an internal path, not the product's figure: a request pays its check inside (c).",
    ]
    return "\n".join(lines) + "\n"


main = harness.entry("actors", __doc__, run, to_markdown, RESULTS_PATH, quick_help="fewer rounds and samples")


if __name__ == "__main__":
    raise SystemExit(main())
