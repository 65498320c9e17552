"""Every benchmark in one run: ``make bench`` / ``python -m bench [--quick] [--only NAME ...]``.

Runs each bench module present, in order (store, context, compression, audience, peers, actors, flush,
committer, machine, prefix, costs, controls, postgres, aio, edits, inspector, adapters, turn, ladder, folding,
metadata, channels, ledger),
each imported only when its turn comes. A module that is missing, fails to import or raises is
reported as one line, and the run goes on. Then writes ``bench/results.md``: a header (date,
machine), a summary table of every figure with its comparison, ratio, target and pass/fail, and
each module's section: its ``to_markdown(rows)`` of this run's rows, else its
``bench/results-<name>.md`` if this run wrote it, else a table rebuilt from the rows. Only
``bench/results.md`` is written here; ``python -m bench.<name>`` writes the module's own file.

Each module exposes ``run(quick: bool = False) -> list[dict]`` (one dict per figure) and, if it
can, ``to_markdown(rows) -> str``. A row is ``{"measure", "unit", "ctxrt", "comparison",
"comparison_label", "ratio", "target", "op", "passed", ...}`` where ``ctxrt`` and
``comparison`` are ``{"median", "min", "max"}`` or plain numbers; a row with ``"skipped"``
holds one line saying what was left out (a peer that isn't installed).

Exit status: 0 when every module present ran and every figure with a target passed; 1 if a
module failed or a figure missed its target. ``--quick`` stays under about 3 minutes on the
project's 2-core VM, the full run under about 15.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from .harness import figure

HERE = Path(__file__).resolve().parent
RESULTS_PATH = HERE / "results.md"
MODULES = ("store", "context", "compression", "audience", "peers", "actors", "flush", "committer", "machine", "prefix", "costs",
           "controls", "postgres", "aio", "edits", "inspector", "adapters", "turn", "ladder", "folding", "metadata", "channels", "ledger")
TITLES = {"store": "Store", "context": "Context", "compression": "Compression", "audience": "Audience",
          "peers": "Peers", "actors": "Actors", "prefix": "Prefix", "costs": "Costs",
          "controls": "Controls", "postgres": "PostgreSQL", "aio": "From asyncio",
          "edits": "Compiles after edits", "inspector": "Inspector",
          "adapters": "Framework adapters", "flush": "Flushes off the loop", "committer": "The committer", "machine": "The namespace machine",
          "turn": "A turn", "ladder": "The refusal ladder", "folding": "Folding under budget",
          "metadata": "compile_metadata against a compile", "channels": "Channels", "ledger": "The request ledger"}


class Outcome:
    """What one module gave: rows and a markdown section, or a line saying why not."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.rows: list[dict[str, Any]] = []
        self.section = ""
        self.problem: str | None = None  # a failure: import error, exception, bad rows
        self.absent: str | None = None  # not present yet: not a failure
        self.seconds = 0.0


# -- running -----------------------------------------------------------------------------------


def _present(name: str) -> bool:
    return (HERE / f"{name}.py").exists() or (HERE / name / "__init__.py").exists()


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    if isinstance(exc, BaseExceptionGroup):
        leaves: list[BaseException] = []
        stack: list[BaseException] = [exc]
        while stack:
            item = stack.pop()
            if isinstance(item, BaseExceptionGroup):
                stack.extend(item.exceptions)
            else:
                leaves.append(item)
        text = "; ".join(f"{type(leaf).__name__}: {' '.join(str(leaf).split())}" for leaf in leaves[:3])
        return f"{type(exc).__name__} ({text})"
    return f"{type(exc).__name__}: {text}"[:400]


def run_module(name: str, quick: bool) -> Outcome:
    outcome = Outcome(name)
    if not _present(name):
        outcome.absent = f"{name}: not present (no bench/{name}.py yet)"
        return outcome
    results_file = HERE / f"results-{name}.md"
    started = time.perf_counter()
    started_wall = time.time()
    try:
        module = importlib.import_module(f"bench.{name}")
    except Exception as exc:  # a module being written may not import
        outcome.problem = f"{name}: failed to import: {_one_line(exc)}"
        traceback.print_exc(file=sys.stderr)
        return outcome
    if not callable(getattr(module, "run", None)):
        outcome.problem = f"{name}: has no run(quick) function"
        return outcome
    try:
        rows = module.run(quick=quick)
    except Exception as exc:
        outcome.seconds = time.perf_counter() - started
        outcome.problem = f"{name}: raised {_one_line(exc)} after {outcome.seconds:.0f} s"
        traceback.print_exc(file=sys.stderr)
        return outcome
    outcome.seconds = time.perf_counter() - started
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        outcome.problem = f"{name}: run() returned {type(rows).__name__}, not a list of dicts"
        return outcome
    outcome.rows = rows
    outcome.section = _section(name, module, rows, results_file, started_wall)
    return outcome


def _section(name: str, module: Any, rows: list[dict[str, Any]], results_file: Path, since: float) -> str:
    """The module's markdown: its ``to_markdown``, else its results file if this run wrote it, else rows."""
    to_markdown = getattr(module, "to_markdown", None)
    if callable(to_markdown):
        try:
            return str(to_markdown(rows))
        except Exception as exc:
            print(f"{name}: to_markdown failed ({_one_line(exc)}); rebuilding from rows", file=sys.stderr)
    if results_file.exists() and results_file.stat().st_mtime >= since:
        return results_file.read_text()
    return _generic_section(name, rows)


def _generic_section(name: str, rows: list[dict[str, Any]]) -> str:
    lines = [f"## {TITLES.get(name, name.title())}", "", "(rebuilt from the rows `run()` returned)", ""]
    lines += _table([(name, row) for row in rows], with_module=False)
    return "\n".join(lines) + "\n"


# -- formatting --------------------------------------------------------------------------------


def _measure(row: dict[str, Any]) -> str:
    return str(row.get("measure") or row.get("name") or row.get("figure") or "?")


def _cells(row: dict[str, Any]) -> tuple[str, str, str, str, str, str]:
    """(measure, ctxrt, comparison, ratio, target, pass/fail) of one row."""
    unit = str(row.get("unit") or "")
    label = row.get("comparison_label")
    comparison = figure(row.get("comparison"), unit)
    if label:
        comparison = f"{label}: {comparison}"
    ratio = row.get("ratio")
    ratio_text = "–" if not isinstance(ratio, (int, float)) else f"{ratio:,.2f}"
    if row.get("ratio_means") and ratio_text != "–":
        ratio_text += f" ({row['ratio_means']})"
    if row.get("by_round"):  # judged on the median of the per-round ratios (harness.versus)
        ratio_text += f"; per round {row['paired_ratio']:,.2f}, judged"
    target, op = row.get("target"), row.get("op")
    if target is None:
        target_text = "none"
    elif isinstance(target, (int, float)):
        target_text = f"{op or ''} {target:g}".strip()
    else:
        target_text = str(target)
    passed = row.get("passed")
    verdict = "pass" if passed is True else "**fail**" if passed is False else "info"
    return _measure(row), figure(row.get("ctxrt"), unit), comparison, ratio_text, target_text, verdict


def _table(rows: list[tuple[str, dict[str, Any]]], *, with_module: bool) -> list[str]:
    head = "| module | measure | ctxrt | comparison | ratio | target | pass/fail |" if with_module else \
        "| measure | ctxrt | comparison | ratio | target | pass/fail |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    notes: list[str] = []
    for module, row in rows:
        if "skipped" in row:
            notes.append(f"- {module}: {row['skipped']}")
            continue
        cells = _cells(row)
        lines.append("| " + " | ".join(((module,) if with_module else ()) + cells) + " |")
    if len(lines) == 2:
        lines = []
    if notes:
        lines += ([""] if lines else []) + notes
    return lines


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = ""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = f", {int(line.split()[1]) / 1024 / 1024:.0f} GiB RAM"
                break
    except (OSError, ValueError, IndexError):
        pass
    return (f"{os.cpu_count()} CPUs ({cpu}){memory}; Python {platform.python_version()} "
            f"({platform.python_implementation()}); {platform.platform()}")


def _commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True,
                              timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=HERE, capture_output=True, text=True,
                               timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    if head.returncode != 0:
        return ""
    return head.stdout.strip() + (" with uncommitted changes" if dirty.stdout.strip() else "")


def render(outcomes: list[Outcome], quick: bool, seconds: float, command: str) -> str:
    commit = _commit()
    lines = [
        "# Benchmark results",
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M %Z')} by `{command}` in {seconds / 60:.1f} min"
        + (f", at commit {commit}" if commit else "") + ".",
        "",
        f"Machine: {_machine()}.",
        "",
        "Every figure is a ratio to its comparison, both measured side by side in this one run on this "
        "machine (variants interleaved in rounds; figures are medians with min–max across rounds). The host "
        "may be noisy: read the ranges too." + (" This was a `--quick` run: fewer rounds, smaller samples."
                                                 if quick else ""),
        "",
        "## Summary",
        "",
    ]
    summary: list[tuple[str, dict[str, Any]]] = [(o.name, row) for o in outcomes for row in o.rows]
    lines += _table(summary, with_module=True) or ["(no figures)"]
    status = []
    for outcome in outcomes:
        if outcome.absent:
            status.append(f"- {outcome.absent}")
        elif outcome.problem:
            status.append(f"- {outcome.problem}")
        else:
            judged = [row for row in outcome.rows if row.get("passed") is not None]
            failed = [row for row in judged if row.get("passed") is False]
            status.append(f"- {outcome.name}: {len(outcome.rows)} figures in {outcome.seconds:.0f} s"
                          + (f", {len(failed)} of {len(judged)} with a target failed" if failed else
                             f", {len(judged)} with a target, all passed" if judged else ""))
    lines += ["", "Modules:", "", *status, ""]
    for outcome in outcomes:
        if outcome.section:
            lines += [outcome.section.rstrip("\n"), ""]
    return "\n".join(lines).rstrip("\n") + "\n"


# -- entry -------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and smaller samples (~3 minutes)")
    parser.add_argument("--only", nargs="+", action="extend", choices=MODULES, metavar="NAME",
                        help=f"run only these modules ({', '.join(MODULES)})")
    arguments = parser.parse_args(argv)
    names = [name for name in MODULES if not arguments.only or name in arguments.only]
    command = "python -m bench" + (" --quick" if arguments.quick else "") + \
        (" --only " + " ".join(names) if arguments.only else "")

    # ``python -m bench`` from the checkout has it on sys.path; ``ctxrt bench`` imports bench from the
    # current directory. Either way the modules import as ``bench.<name>``.
    if str(HERE.parent) not in sys.path:
        sys.path.insert(0, str(HERE.parent))

    started = time.perf_counter()
    outcomes: list[Outcome] = []
    for name in names:
        print(f"== {name}{' (quick)' if arguments.quick else ''}", file=sys.stderr, flush=True)
        outcome = run_module(name, arguments.quick)
        outcomes.append(outcome)
        line = outcome.absent or outcome.problem or f"{name}: {len(outcome.rows)} figures in {outcome.seconds:.0f} s"
        print(line, file=sys.stderr, flush=True)
    seconds = time.perf_counter() - started

    text = render(outcomes, arguments.quick, seconds, command)
    RESULTS_PATH.write_text(text)
    print(text)
    print(f"written to {RESULTS_PATH} ({seconds / 60:.1f} min)", file=sys.stderr)
    failed = any(o.problem for o in outcomes) or any(
        row.get("passed") is False for o in outcomes for row in o.rows
    )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
