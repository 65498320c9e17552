"""``ctxrt bench``: run the benchmarks of a checkout on a copy, so its committed results stay.

The benchmarks are a checkout's bench/ folder, not part of the installed package; this finds
them, runs ``python -m bench`` on a copy in a scratch folder, and copies the results*.md it
writes to ``--output``. It runs without trio.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ..errors import CtxrtError
from .output import emit, err, out
from .subcommand import Subcommand


class BenchNotFoundError(CtxrtError):
    """The benchmarks' sources (a checkout's bench/ folder) can't be found."""


class BenchFailed(CtxrtError):
    """A benchmark module failed, or a figure missed its target."""


def _options(bench: argparse.ArgumentParser) -> None:
    bench.add_argument("--quick", action="store_true", help="fewer rounds and smaller samples (about 3 minutes)")
    bench.add_argument("--only", nargs="+", metavar="NAME", help="run only these modules (store, context, ...)")
    bench.add_argument("--output", metavar="DIR", help="where to write results*.md (default: a new temporary "
                                                       "directory, printed at the end)")
    bench.add_argument("--source", metavar="DIR", help="the bench/ folder to run (default: the checkout ctxrt "
                                                       "is installed from, else ./bench)")
    bench.add_argument("--dry-run", action="store_true", help="say what would run and where results would go")


def _bench_sources(args: argparse.Namespace) -> Path:
    """The bench/ folder to run: --source, else the checkout ctxrt runs from, else ./bench."""
    candidates = [Path(args.source)] if args.source else [
        Path(__file__).resolve().parents[2] / "bench",  # an editable install runs from its checkout
        Path.cwd() / "bench",
    ]
    for folder in candidates:
        if (folder / "__main__.py").is_file():
            return folder.resolve()
    raise BenchNotFoundError(
        f"no benchmarks at {candidates[0]}" if args.source else
        "the benchmarks ship with the source checkout (its bench/ folder), not with the installed package: "
        "run this from a checkout, or pass --source PATH/TO/bench")


def _bench(args: argparse.Namespace) -> int:
    """Run a copy of the benchmarks, so the results land in --output, not in the checkout.

    bench writes results.md (and some modules results-<name>.md) next to its own code, and the
    checkout's are committed. Running a copy in a scratch folder keeps them, whatever bench does.
    """
    sources = _bench_sources(args)
    command = [sys.executable, "-m", "bench", *(["--quick"] if args.quick else []),
               *(["--only", *args.only] if args.only else [])]
    if args.dry_run:
        output_text = args.output or "a new temporary directory"
        if args.json:
            emit({"sources": str(sources), "command": command, "output": args.output})
        else:
            out.print(f"would run {shlex.join(command)} on a copy of {sources}, writing results to {output_text}",
                      markup=False)
        return 0
    output = Path(args.output) if args.output else Path(tempfile.mkdtemp(prefix="ctxrt-bench-"))
    with tempfile.TemporaryDirectory(prefix="ctxrt-bench-run-") as scratch:
        copy = Path(scratch) / "bench"
        shutil.copytree(sources, copy, ignore=shutil.ignore_patterns("__pycache__", "results*.md"))
        err.print(f"running the benchmarks from {sources} (results go to {output})", markup=False)
        # Under --json the markdown report bench prints would spoil stdout, so it goes to stderr.
        finished = subprocess.run(command, cwd=scratch, check=False, stdout=sys.stderr if args.json else None)
        written = sorted(copy.glob("results*.md"))
        output.mkdir(parents=True, exist_ok=True)
        for result in written:
            shutil.copy2(result, output / result.name)
    files = [str(output / result.name) for result in written]
    if args.json:
        emit({"output": str(output), "files": files, "exit_status": finished.returncode})
    else:
        err.print(f"benchmark results written to {output}: {', '.join(r.name for r in written) or 'none'}",
                  markup=False)
    if finished.returncode != 0:
        raise BenchFailed(f"the benchmarks exited with status {finished.returncode} (a module failed or a "
                          f"figure missed its target); results in {output}")
    return 0


BENCH = Subcommand(
    "bench", "run the benchmarks of a checkout (results go to --output)",
    "Run every benchmark (python -m bench) on a copy of a checkout's bench/ folder, so the "
    "committed bench/results*.md stay as they are; `make bench` updates those.",
    _options, _bench)
