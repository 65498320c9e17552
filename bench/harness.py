"""The benchmarks' shared harness: the one copy of what every bench module measures and reports with.

- ``interleave``: run every variant once per round, in a shuffled order each round; ``run_trio``:
  a module's whole run, its settings put into every row.
- ``summary``, ``ratios``, ``row``, ``versus``: figures into the row dicts ``bench/__main__.py`` reads
  (``{"measure", "unit", "ctxrt", ..., "target", "op", "passed", "rounds"}``).
- ``number``, ``figure``: a figure as text, at the precision a module's table uses.
- ``measured``, ``TABLE_HEAD``, ``paired_line``: the lines every module's markdown section shares.
- ``scratch``: a temporary directory for the stores, under ``CTXRT_BENCH_DIR`` if it is set;
  ``fill``: a store built fast through ``add_message``.
- ``entry``: the ``main(argv)`` of ``python -m bench.<name> [--quick]``, for every module.
- ``tree_at``: a past commit's ``ctxrt``, extracted to measure beside the current one.

Standard library only at import (``fill`` and ``run_trio`` import ctxrt and trio when called), so
``bench/__main__.py`` can import it before any module's dependencies.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import operator
import os
import platform
import random
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Awaitable, Callable, Hashable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")

# -- running -----------------------------------------------------------------------------------


async def interleave(
    rounds: int, variants: Mapping[K, Callable[[int], Awaitable[T]]], rng: random.Random, *, collect: bool = True
) -> dict[K, list[T]]:
    """Run every variant once per round, in a shuffled order each round; return each one's figures.

    Each variant is called with the round's index (0, 1, ...). With ``collect`` (the default) a full
    ``gc.collect()`` runs before each variant, so no variant pays for another's garbage.
    """
    figures: dict[K, list[T]] = {name: [] for name in variants}
    for round_ in range(rounds):
        order = list(variants)
        rng.shuffle(order)
        for name in order:
            if collect:
                gc.collect()
            figures[name].append(await variants[name](round_))
    return figures


def run_trio(
    body: Callable[[bool], Awaitable[tuple[list[dict[str, Any]], dict[str, Any]]]], quick: bool
) -> list[dict[str, Any]]:
    """``body(quick)`` under trio. It returns (rows, info); info's fields (the run's settings, its build
    times) go into every row."""
    import trio  # here, not above: ``bench/__main__.py`` imports this module before any bench module's deps

    rows, info = trio.run(body, quick)
    for each in rows:
        each.update(info)
    return rows


@contextlib.contextmanager
def scratch(prefix: str) -> Iterator[Path]:
    """A temporary directory for the stores, removed after; under ``CTXRT_BENCH_DIR`` when that is set
    (it must be a real disk, not tmpfs, or durable figures mean nothing)."""
    with tempfile.TemporaryDirectory(
        prefix=prefix, dir=os.environ.get("CTXRT_BENCH_DIR") or None, ignore_cleanup_errors=True
    ) as tmp:
        yield Path(tmp)


async def fill(
    directory: Path, count: int, content: Callable[[int], Any], *, concurrency: int = 500,
    participant: Callable[[int], str] = lambda n: "user",
) -> float:
    """Build a store fast: ``count`` messages (``content(n)``, from ``participant(n)``: user unless
    given) through ``add_message`` in namespace "builder", ``concurrency`` at once (the store actor
    group-commits them), durability "os". Returns the seconds it took."""
    import trio  # here, not above: ``bench/__main__.py`` imports this module before any bench module's deps

    from ctxrt.runtime import open_runtime

    started = time.perf_counter()
    async with open_runtime(directory, durability="os") as rt:
        writer = await rt.open("builder")
        for first in range(0, count, concurrency):
            async with trio.open_nursery() as nursery:
                for n in range(first, min(count, first + concurrency)):
                    nursery.start_soon(writer.add_message, participant(n), content(n))
    return time.perf_counter() - started


def tree_at(root: Path, commit: str, directory: Path, what: str) -> Path | str:
    """Extract commit ``commit``'s ``ctxrt`` of the git checkout ``root`` under ``directory`` (``what``
    names it in messages); the directory that holds it, or why it can't be (an installed copy, a
    shallow clone, no git)."""

    def git(*arguments: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "-C", str(root), *arguments], capture_output=True, text=True, timeout=60,
                              check=False)

    try:
        top = git("rev-parse", "--show-toplevel")
        if top.returncode != 0 or Path(top.stdout.strip()).resolve() != root:
            return f"{root} is not a git checkout of ctxrt (an installed copy?): no {what} to compare with"
        if git("cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
            return f"commit {commit} ({what}) is not in this checkout's history (a shallow clone?)"
        archive = directory / f"{commit}.tar"
        with archive.open("wb") as out:
            made = subprocess.run(["git", "-C", str(root), "archive", commit, "ctxrt"], stdout=out,
                                  stderr=subprocess.PIPE, timeout=120, check=False)
        if made.returncode != 0:
            return f"git archive {commit} ctxrt failed: {made.stderr.decode(errors='replace').strip()[:200]}"
    except (OSError, subprocess.SubprocessError) as exc:
        return f"git is not available to extract {what} ({type(exc).__name__}: {exc})"
    tree = directory / f"{commit}-tree"
    tree.mkdir()
    with tarfile.open(archive) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(tree, filter="data")
        else:  # Python before 3.11.4: the archive is git's own, of a commit of this repository
            tar.extractall(tree)
    archive.unlink()
    if not (tree / "ctxrt" / "__init__.py").exists():
        return f"commit {commit} holds no ctxrt package"
    return tree


# -- rows --------------------------------------------------------------------------------------

OPS: dict[str, Callable[[Any, Any], bool]] = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


async def take_turn(turn: Callable[[], Any]) -> dict[str, float]:
    """One turn of a system whose turn method is sync or async, then a schedule point."""
    import trio

    result = turn()
    if not isinstance(result, dict):
        result = await result
    await trio.lowlevel.checkpoint()
    return result


async def warm_up(turners: dict[Any, Callable[[], Any]], turns: int = 2) -> None:
    """Uncounted turns of every system, so the first counted one finds caches and connections warm."""
    for turn in turners.values():
        for _ in range(turns):
            await take_turn(turn)


def summary(values: Iterable[float]) -> dict[str, float]:
    """``{"median", "min", "max"}`` of a figure's values (one per round)."""
    values = list(values)
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def ratios(top: list[float], bottom: list[float]) -> tuple[float, float]:
    """(ratio of the medians, median of the per-round ratios) of two figures measured in the same rounds.

    Both variants ran in the same rounds, so the per-round ratios cancel slow drift of the host.
    """
    return (statistics.median(top) / statistics.median(bottom),
            statistics.median(a / b for a, b in zip(top, bottom)))


def row(
    measure: str, unit: str, values: list[float] | Mapping[str, float], *, target: float | str | None = None,
    op: str | None = "<=", judged: float | None = None, limit: float | None = None, **fields: Any,
) -> dict[str, Any]:
    """One figure in the shape ``bench/__main__.py`` reads.

    ``values`` (one per round) become ``ctxrt`` (their ``summary``) and ``rounds``; or ``values`` is
    the figure already summarised (``{"median", "min", "max"}``: an estimate and its interval, no
    rounds). ``fields`` (comparison, ratio, ...) come next, in the order given; then ``target``,
    ``op`` and ``passed``: whether ``judged`` (by default the median) is ``op`` the target, or
    ``limit`` when the target is text naming it; None without a target (or without an ``op``).
    """
    ours = dict(values) if isinstance(values, Mapping) else summary(values)
    value = ours["median"] if judged is None else judged
    bound = target if limit is None else limit
    passed = None if bound is None or op is None else OPS[op](value, bound)
    return {"measure": measure, "unit": unit, "ctxrt": ours, **fields, "target": target, "op": op, "passed": passed,
            "rounds": None if isinstance(values, Mapping) else len(values)}


def versus(
    measure: str, unit: str, mine: list[float], theirs: list[float], label: str, *, inverse: bool = False,
    target: float | None = None, op: str | None = "<=", by_round: bool = False, **fields: Any,
) -> dict[str, Any]:
    """A row of ``mine`` against ``theirs`` (``comparison``, labelled ``label``), measured in the same rounds.

    ``ratio`` is the ratio of their medians, mine / theirs (theirs / mine if ``inverse``), and is what
    ``target`` judges; ``paired_ratio`` is the median of the per-round ratios, and what it judges
    instead with ``by_round`` (for figures that drift with the disk, which a round's pair shares).
    ``fields`` go between the two.
    """
    ratio, paired = ratios(theirs, mine) if inverse else ratios(mine, theirs)
    return row(measure, unit, mine, target=target, op=op, judged=paired if by_round else ratio,
               comparison=summary(theirs), comparison_label=label, ratio=ratio, **fields, paired_ratio=paired,
               by_round=by_round)


# -- formatting --------------------------------------------------------------------------------

Precision = tuple[tuple[float, str], ...]
"""(floor, format spec) steps, largest floor first: a number at least the floor in size takes the
spec; the last step takes whatever the others don't (NaN too)."""

GENERAL: Precision = ((100, ",.0f"), (1, ".1f"), (0.01, ".3f"), (0, ".3g"))
# Every number of a figure at its median's precision: no decimals from 100 up, one from 1, else three.
MEDIANS: Precision = ((100, ",.0f"), (1, ",.1f"), (0, ",.3f"))


def _spec(value: float, precision: Precision) -> str:
    size = abs(value)
    for floor, spec in precision:
        if size >= floor:
            return spec
    return precision[-1][1]


def number(value: float, precision: Precision = GENERAL) -> str:
    return format(value, _spec(value, precision))


def figure(value: Any, unit: str, precision: Precision = GENERAL, *, shared: bool = False, none: str = "–") -> str:
    """A figure as text: a summary as ``median unit (min–max)``, a number as ``number unit``, ``none``
    for None, anything else as it is. ``shared``: min and max take the median's precision (else each
    number takes its own)."""
    unit = f" {unit}" if unit else ""
    if isinstance(value, dict) and "median" in value:
        spec = _spec(value["median"], precision) if shared else None

        def text(x: float) -> str:
            return format(x, spec) if spec is not None else number(x, precision)

        out = f"{text(value['median'])}{unit}"
        if "min" in value and "max" in value:
            out += f" ({text(value['min'])}–{text(value['max'])})"
        return out
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{number(value, precision)}{unit}"
    return none if value is None else str(value)


def median_figure(value: Any, unit: str) -> str:
    """``figure`` with every number at the median's ``MEDIANS`` precision (the modules' tables)."""
    return figure(value, unit, MEDIANS, shared=True)


TABLE_HEAD = ["| measure | ctxrt | comparison | ratio | target | pass/fail |", "|---|---|---|---|---|---|"]


def measured(name: str, quick: bool, *versions: str) -> str:
    """The opening sentence of a module's section: when, by which command, on what."""
    return (f"Measured {time.strftime('%Y-%m-%d %H:%M')} by `python -m bench.{name}{' --quick' if quick else ''}`: "
            f"Python {platform.python_version()}, {', '.join(versions)}, {os.cpu_count()} CPUs, "
            f"{platform.system()} {platform.release()}.")


def paired_line(rows: list[dict[str, Any]]) -> str:
    """``Median of the per-round ratios ...: (a) 0.82; (b) 15.29.`` over the rows that have one."""
    return ("Median of the per-round ratios (each round ran both variants): "
            + "; ".join(f"{each['measure'].split(' ', 1)[0]} {each['paired_ratio']:.2f}"
                        for each in rows if each.get("paired_ratio") is not None) + ".")


# -- entry -------------------------------------------------------------------------------------


def entry(
    name: str, doc: str | None, run: Callable[..., list[dict[str, Any]]],
    to_markdown: Callable[[list[dict[str, Any]]], str], path: Path, *, quick_help: str,
) -> Callable[..., int]:
    """The ``main(argv)`` of ``python -m bench.<name> [--quick]``: run, write the section (``to_markdown``)
    to ``path`` and print it. Its exit status is 1 if a figure missed its target (rows without one,
    ``passed`` None, don't count), else 0."""

    def main(argv: list[str] | None = None) -> int:
        parser = argparse.ArgumentParser(prog=f"python -m bench.{name}", description=(doc or "").split("\n\n")[0])
        parser.add_argument("--quick", action="store_true", help=quick_help)
        arguments = parser.parse_args(argv)
        rows = run(quick=arguments.quick)
        text = to_markdown(rows)
        path.write_text(text)
        print(text)
        print(f"written to {path}", file=sys.stderr)
        return 0 if all(each.get("passed") is not False for each in rows) else 1

    return main
