"""The ``ctxrt`` command (also ``python -m ctxrt``).

``demo`` runs the main job; ``inspect``, ``messages``, ``compile`` and ``summaries`` open a store
read-only (they work while a host writes it); ``bench`` runs the benchmarks of a checkout;
``load-test`` drives concurrent opens, claims, adds, compiles and ticks.

Conventions, after well-liked Python CLIs: results go to stdout; errors and progress bars to
stderr. An error is one line (``ctxrt: error: ...``), never a traceback, whatever raised it
(a ctxrt error, LMDB refusing a damaged file, an OS error); ``CTXRT_TRACEBACK=1`` shows the
traceback instead. Exit status 0 on success, 1 when the command failed, 2 for a usage error
(a bad option or combination). With ``--json`` stdout holds only JSON, and an error is one JSON
object on stderr: ``{"error": "<type>", "message": "<text>"}``. Output is wrapped to the
terminal on a tty and never wrapped when piped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, NoReturn

import attrs
import trio
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from . import codec
from .selection import Budget
from .errors import BranchNotFoundError, CtxrtError, StoreFormatError
from .inspector.pages import quarantined, recorded_strategy
from .namespace import states
from .runtime import Runtime, open_runtime
from .store.engine import BACKEND_ERRORS
from .store.environment import close_store, open_store
from .store.urls import driver_missing, is_postgres_url, redact

TRACEBACK_VARIABLE = "CTXRT_TRACEBACK"
LOG_LEVEL_VARIABLE = "CTXRT_LOG_LEVEL"
UNWRAPPED_WIDTH = 100_000  # "never wrap" for rich, which always lays text out to some width


class _Console(Console):
    """rich's console, with a closed stdout reported as BrokenPipeError."""

    def on_broken_pipe(self) -> None:
        # rich exits with status 1 here; a reader that stopped early (`| head`) is no failure,
        # so main handles it like any other BrokenPipeError.
        raise BrokenPipeError


def _console(*, stderr: bool) -> Console:
    """A console that wraps to the terminal on a tty, and not at all when piped or redirected."""
    console = _Console(stderr=stderr)
    if console.is_terminal:
        return console
    # Off a tty rich falls back to 80 columns (or $COLUMNS) and wraps there, which breaks
    # grep, cut and every line-based tool; a width nothing reaches lays each line out whole.
    return _Console(stderr=stderr, width=UNWRAPPED_WIDTH, soft_wrap=True)


out = _console(stderr=False)
err = _console(stderr=True)


class UsageError(Exception):
    """A bad option, value or combination: reported with the command's usage, exit status 2."""

    def __init__(self, message: str, *, prog: str = "ctxrt", usage: str = "") -> None:
        self.prog = prog
        self.usage = usage
        super().__init__(message)


class NotFoundError(CtxrtError):
    """The store has no namespace or slot of the name the command was given."""


class DemoFailed(CtxrtError):
    """The demo ran but didn't show what it is for: a privacy leak, or no summaries."""


class LoadTestStoreError(CtxrtError):
    """``load-test --store`` named a path that already holds something."""


class LoadTestFailed(CtxrtError):
    """The load test ran and a check failed: a lost message, a second claim, a leak or a deadlock."""


class InspectorMissingError(CtxrtError):
    """``serve`` without the inspector's packages (Starlette, Hypercorn, Jinja2) installed."""


class BenchNotFoundError(CtxrtError):
    """The benchmarks' sources (a checkout's bench/ folder) can't be found."""


class BenchFailed(CtxrtError):
    """A benchmark module failed, or a figure missed its target."""


def _jsonable(value: Any) -> Any:
    if attrs.has(type(value)):
        return {key: _jsonable(item) for key, item in attrs.asdict(value, recurse=False).items()}
    if isinstance(value, dict):
        return {str(key): _jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_jsonable(item) for item in value]
    if isinstance(value, Path):
        return str(value)
    return value


def _emit(data: Any) -> None:
    print(json.dumps(_jsonable(data), indent=2, ensure_ascii=False, default=str))


def _progress(done: ProgressColumn, *, transient: bool) -> Progress | None:
    """A progress bar on stderr, or None when stderr is not a terminal (logs want no bars)."""
    if not err.is_terminal:
        return None
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), done, TimeElapsedColumn(),
                    TextColumn("{task.fields[note]}"), console=err, transient=transient)


def _invocation() -> str:
    """How to run ctxrt again from here, as a shell command that works as printed."""
    script = Path(sys.executable).parent / "ctxrt"  # the script this interpreter's install made
    on_path = shutil.which("ctxrt")
    if script.is_file() and on_path and Path(on_path).resolve() == script.resolve():
        return "ctxrt"
    if script.is_file():
        return shlex.quote(_relative(script))
    return f"{shlex.quote(_relative(Path(sys.executable)))} -m ctxrt"


def _relative(path: Path) -> str:
    try:
        shown = str(path.absolute().relative_to(Path.cwd()))
    except ValueError:
        return str(path)
    return shown if os.sep in shown else f".{os.sep}{shown}"  # a bare name would be looked up on PATH


# -- demo -------------------------------------------------------------------------------------


async def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    store = Path(args.store)
    progress = _progress(MofNCompleteColumn(), transient=args.json)
    with progress or contextlib.nullcontext():
        callback = None
        if progress is not None:
            task = progress.add_task("residents talking", total=args.messages, note="")
            callback = lambda done, total: progress.update(task, completed=done)  # noqa: E731
        report = await run_demo(store, messages=args.messages, progress=callback)
    hint = f"{_invocation()} inspect {shlex.quote(str(store))}"
    serve_hint = f"{_invocation()} serve {shlex.quote(str(store))}"
    if args.json:
        _emit({**_jsonable(report), "private": report.private, "ok": report.ok, "problems": report.problems,
               "inspect_command": hint, "serve_command": serve_hint})
    else:
        _demo_table(report, hint)
        out.print(f"see what each resident saw, in a browser: {serve_hint}", markup=False)
    if report.problems:
        raise DemoFailed("; ".join(report.problems))
    return 0


def _demo_table(report: Any, hint: str) -> None:
    table = Table(title=f"What each reader's compile holds ({report.messages:,} turns written, "
                        f"model: {escape(report.model)})")
    for column in ("reader", "branch", "msgs stored", "msgs sent raw", "summaries stored", "summaries sent",
                   "head", "middle", "recent", "own", "leaks"):
        table.add_column(column, justify="left" if column in ("reader", "branch", "summaries stored") else "right")
    for row in report.readers:
        levels = ", ".join(f"L{level}: {count}" for level, count in row.summaries_per_level.items()) or "none"
        table.add_row(row.reader, row.branch, str(row.stored_messages), str(row.raw_messages), levels,
                      str(row.summaries_used), str(row.head_tokens), str(row.summary_tokens),
                      str(row.recent_tokens), str(row.audience_blocks_seen),
                      "none" if not row.foreign_markers else escape(", ".join(row.foreign_markers[:3])))
    out.print(table)
    out.print("msgs stored: messages in the shared slot on the reader's branch; summaries stored: by the reader's "
              "namespace on that branch, per level, merged ones included (both as `inspect` counts them)", markup=False)
    out.print("msgs sent raw / summaries sent: those of them this reader's compile sends; head / middle / recent: "
              "its tokens in the head window, the summarised middle and the recent window", markup=False)
    out.print("own: audience lines for this reader in its compile; leaks: lines for another reader (none expected)",
              markup=False)
    out.print(f"msgs stored on main ({report.written:,}) is more than the {report.messages:,} turns: each of the "
              f"{report.tool_cycles} tool cycles is two messages, a call and its result; the fork and the derived "
              f"branch each add one line of their own", markup=False)
    out.print(f"compression requests: {report.model_requests} ({report.model_failures} failed); "
              f"fork: {report.fork}; derived: {report.derived}", markup=False)
    if report.sample is not None:
        _demo_sample(report.sample)
    if report.private:
        out.print("[bold green]privacy check passed[/]: no compile, summary or model request held another "
                  "reader's lines")
    else:
        out.print("[bold red]privacy check FAILED[/]")
    out.print(f"store left at {report.store}; look inside with: {hint}", markup=False)


def _demo_sample(sample: Any) -> None:
    """One turn as two readers' requests carry it, side by side, and a summary one of them sends."""
    table = Table(title=f"Message {sample.message_id} in one turn's request", show_lines=True)
    table.add_column(f"as {sample.reader}'s request carries it", overflow="fold")
    table.add_column(f"as {sample.other}'s request carries it", overflow="fold")
    table.add_row(escape("\n".join(sample.as_reader)), escape("\n".join(sample.as_other)))
    out.print(table)
    out.print(f"the line meant for {sample.reader} alone is in {sample.reader}'s request and not in "
              f"{sample.other}'s", markup=False)
    if sample.summary_id is not None:
        opening = " ".join(sample.summary_text.split())
        opening = opening if len(opening) <= 300 else opening[:300] + " ..."
        out.print(f"a summary {sample.reader}'s request sends instead of older messages ({sample.summary_id}, "
                  f"{sample.summary_covers}): {opening}", markup=False)


# -- read-only commands -----------------------------------------------------------------------


async def _inspect(args: argparse.Namespace) -> int:
    async with open_runtime(args.store, readonly=True, check_pages=True) as runtime:
        engine = runtime.engine
        branches = await runtime.list_branches()
        data: dict[str, Any] = {"store": str(runtime.path), "sequence": engine.last_sequence, "branches": []}
        for branch in branches:
            row = engine.branch(branch.name)
            slots = {}
            summaries: dict[str, Counter[int]] = {}
            for state in engine.list_states():
                if state.kind != "log":
                    continue
                if states.is_slot(state.name):
                    slots[state.name] = len(engine.read_log(state.name, row.id))
                elif (owner := states.namespace_of_strategy_state(state.name, "summaries")) is not None:
                    summaries[owner] = Counter(json.loads(item.data)["level"]
                                               for item in engine.read_log(state.name, row.id))
            namespaces = [
                {"namespace": info.namespace, "reader": info.reader, "narrowing_floor": info.narrowing_floor,
                 "summaries_per_level": dict(sorted(summaries.get(info.namespace, Counter()).items())),
                 "quarantined": quarantined(runtime, row, info.namespace)}
                for info in await runtime.list_namespaces(branch.name)
            ]
            data["branches"].append({**_jsonable(branch), "slots": slots, "namespaces": namespaces})
    if args.json:
        _emit(data)
        return 0
    out.print(f"[bold]{escape(data['store'])}[/] — store sequence {data['sequence']}")
    for branch in data["branches"]:
        parent = f" (from {branch['parent']} at {branch['fork_sequence']})" if branch["parent"] else ""
        out.print(f"\n[bold]branch {escape(branch['name'])}[/]{escape(parent)}, head {branch['head_sequence']}")
        for slot, count in branch["slots"].items():
            out.print(f"  slot {slot}: {count} messages", markup=False)
        table = Table("namespace", "reader", "narrowing floor", "summaries per level", "quarantined")
        for info in branch["namespaces"]:
            table.add_row(escape(info["namespace"]), escape(str(info["reader"])), str(info["narrowing_floor"]),
                          ", ".join(f"L{k}: {v}" for k, v in info["summaries_per_level"].items()) or "-",
                          escape(", ".join(info["quarantined"])) or "-")
        out.print(table)
    return 0


async def _require_branch(runtime: Runtime, args: argparse.Namespace) -> None:
    """Raises BranchNotFoundError naming the store's branches, if ``--branch`` isn't one."""
    names = [info.name for info in await runtime.list_branches()]
    if args.branch not in names:
        raise BranchNotFoundError(f"no branch {args.branch!r} in {args.store}; its branches: {', '.join(names)}")


async def _require_namespace(runtime: Runtime, args: argparse.Namespace) -> str:
    """The namespace ``--namespace`` names, normalised; NotFoundError if the store has none such.

    A read-only open of an unknown namespace would compile the shared slot as if it existed.
    """
    await _require_branch(runtime, args)
    namespace = args.namespace or "default"  # "" and "default" are one namespace (API.md)
    known = sorted(info.namespace for info in await runtime.list_namespaces(args.branch))
    if namespace not in known:
        listing = f"its namespaces: {', '.join(known)}" if known else "it has no namespaces yet"
        raise NotFoundError(f"no namespace {namespace!r} in {args.store} on branch {args.branch!r}; {listing}")
    return namespace


async def _messages(args: argparse.Namespace) -> int:
    async with open_runtime(args.store, readonly=True, check_pages=True) as runtime:
        await _require_branch(runtime, args)
        engine = runtime.engine
        slots = sorted(state.name for state in engine.list_states() if state.kind == "log" and states.is_slot(state.name))
        if args.slot not in slots:
            raise NotFoundError(f"no slot {args.slot!r} in {args.store}; its slots: {', '.join(slots) or 'none'}")
        branch_id = engine.branch(args.branch).id
        head = engine.read_head(args.slot, branch_id)
        if args.tail is not None:
            start, stop = max(0, head.length - args.tail), head.length
        else:
            start = args.offset or 0
            stop = start + (args.limit if args.limit is not None else DEFAULT_LIMIT)
        items = engine.read_items(args.slot, branch_id, at=head.revision, start=start, stop=stop)
        messages = [codec.message_from_json(item.data, sequence=item.sequence, store=engine.data_path)
                    for item in items]
    if args.json:
        _emit({"total": head.length, "start": start, "messages": [
            {"id": m.id, "participant": m.participant, "timestamp_ms": m.timestamp_ms,
             "content": [codec.to_jsonable(b) for b in m.content], "metadata": m.metadata} for m in messages]})
        return 0
    if messages:
        out.print(f"{args.slot} on {args.branch}: messages {start}..{start + len(messages) - 1} "
                  f"(counting from 0) of {head.length}", markup=False)
    else:
        out.print(f"{args.slot} on {args.branch}: no messages from {start} on; it holds {head.length}", markup=False)
    for message in messages:
        parts = []
        for block in message.content:
            text = getattr(block, "text", None) or getattr(block, "name", None) or block.type
            audience = getattr(block, "audience", None)
            parts.append(f"{text}" + (f" [audience: {', '.join(audience)}]" if audience else ""))
        line = " | ".join(parts)
        line = line if len(line) <= 300 else line[:299] + "…"
        out.print(f"[dim]{escape(message.id):>8}[/] [bold]{escape(message.participant)}[/]: {escape(line)}")
    return 0


async def _compile(args: argparse.Namespace) -> int:
    async with open_runtime(args.store, readonly=True, check_pages=True) as runtime:
        namespace = await _require_namespace(runtime, args)
        manager = await runtime.open(namespace, view_reader=args.reader, branch=args.branch,
                                     strategy=_stored_strategy(runtime, namespace, args))
        result = await manager.compile(Budget(args.budget, args.reserve), dry_run=True)
        body = result.to_anthropic(assistant=args.assistant)
        await manager.aclose()
    if args.json:
        _emit({"reader": manager.view_reader, "request": body})
        return 0
    out.print(f"dry-run compile of {namespace} on {args.branch} for reader {manager.view_reader!r}: "
              f"{len(result.messages)} messages (nothing written)", markup=False)
    for message in body["messages"]:
        text = " ".join(block.get("text", f"[{block['type']}]") for block in message["content"])
        out.print(f"[bold]{message['role']}[/]: {escape(text[:200])}")
    return 0


def _stored_strategy(runtime: Runtime, namespace: str, args: argparse.Namespace) -> Any:
    """The strategy config the namespace recorded on its branch (what its residents run); for a
    store from before configs were recorded, or a host's own strategy, Autobiographical if it keeps
    summaries, else Passthrough. ``--strategy`` overrides."""
    from .strategies.autobiographical import Autobiographical
    from .strategies.passthrough import Passthrough

    if args.strategy == "passthrough":
        return Passthrough()
    found = recorded_strategy(runtime, namespace, args.branch, args.budget)
    if args.strategy == "auto" or isinstance(found, Autobiographical):
        return found
    return Autobiographical("inspection", recent_window_tokens=args.budget // 2)


async def _summaries(args: argparse.Namespace) -> int:
    async with open_runtime(args.store, readonly=True, check_pages=True) as runtime:
        namespace = await _require_namespace(runtime, args)
        engine = runtime.engine
        found = []
        row = engine.branch(args.branch)
        for name in ("autobio", "knowledge"):
            state = states.strategy_state(namespace, name, "summaries")
            found += [json.loads(item.data) for item in engine.read_log(state, row.id)]
    if args.json:
        _emit(found)
        return 0
    if not found:
        out.print(f"namespace {namespace!r} on {args.branch} keeps no summaries", markup=False)
    for summary in found:
        out.print(f"[bold]{escape(summary['id'])}[/] (L{summary['level']}, {summary['tokens']} tokens, messages "
                  f"{summary['first_id']}..{summary['last_id']}): {escape(summary['content'][:240])}")
    return 0


# -- serve ------------------------------------------------------------------------------------


async def _serve(args: argparse.Namespace) -> int:
    try:
        from .inspector.app import serve
    except ImportError as exc:
        raise InspectorMissingError(f"ctxrt serve needs the inspector extra: pip install 'ctxrt[inspector]' "
                                    f"({exc})") from None
    async with open_runtime(args.store, readonly=True, check_pages=True) as runtime:
        label = redact(args.store) if is_postgres_url(args.store) else str(runtime.path)
        async with trio.open_nursery() as nursery:
            url = await nursery.start(partial(serve, runtime, label, port=args.port))
            err.print(f"inspecting {label} (read-only) at {url}/ ; Ctrl-C stops", markup=False)
            if args.json:
                print(json.dumps({"url": url, "store": label}), flush=True)
    return 0


# -- load test --------------------------------------------------------------------------------


async def _load_test(args: argparse.Namespace) -> int:
    from .loadtest import report_json, run_load_test

    store: Path | str
    if args.store and is_postgres_url(args.store):
        store, scratch = args.store, None
        try:
            close_store(open_store(store, readonly=True))
        except StoreFormatError:
            pass  # no ctxrt store in that database yet: the run makes one
        else:
            raise LoadTestStoreError(f"load-test store {redact(args.store)} already holds a ctxrt store; the load test "
                                     f"needs a fresh one")
    elif args.store:
        store, scratch = Path(args.store), None
        if store.exists() and (not store.is_dir() or any(store.iterdir())):
            # The checks compare what was acknowledged with what the slot holds: it must start empty.
            raise LoadTestStoreError(f"load-test store {store} is not new or empty; the load test needs a fresh store")
    else:
        scratch = Path(tempfile.mkdtemp(prefix="ctxrt-load-"))
        store = scratch / "store"
    try:
        progress = _progress(TextColumn("{task.completed:.0f} of {task.total:.0f} s"), transient=True)
        with progress or contextlib.nullcontext():
            callback = None
            if progress is not None:
                task = progress.add_task("load test", total=args.duration, note="")
                callback = lambda elapsed, operations: progress.update(  # noqa: E731
                    task, completed=min(elapsed, args.duration), note=f"{operations:,} operations")
            report = await run_load_test(store, namespaces=args.namespaces, managers=args.managers,
                                         readers=args.readers, duration_s=args.duration, progress=callback)
    finally:
        kept = scratch is None or args.keep
        if scratch is not None and not args.keep:  # not kept
            shutil.rmtree(scratch, ignore_errors=True)  # ours: made by mkdtemp above
    if args.json:
        _emit({**report_json(report), "store": str(store), "store_kept": kept})
    else:
        _load_table(report, args)
        if scratch is not None:
            out.print(f"store kept at {store}" if kept else "store removed (--keep keeps it)", markup=False)
    if not report.ok:
        raise LoadTestFailed("the load test's checks failed (see the report)")
    return 0


def _load_table(report: Any, args: argparse.Namespace) -> None:
    from .loadtest import refusal_lines

    table = Table("operation", "count", "per second", "p50 ms", "p90 ms", "p99 ms", "max ms",
                  title=f"load test: {args.managers} managers, {args.namespaces} namespaces, {args.readers} readers, "
                        f"{report.seconds:.1f} s")
    for kind, count in sorted(report.operations.items()):
        lat = report.latencies_ms.get(kind, {})
        table.add_row(kind, str(count), f"{count / report.seconds:.0f}",
                      *(f"{lat.get(q, 0):.1f}" for q in ("p50", "p90", "p99", "max")))
    out.print(table)
    for line in refusal_lines(report.refusals) or ["no call was refused"]:
        out.print(line, markup=False)
    out.print(f"messages acknowledged {report.messages_acknowledged}, stored {report.messages_stored}; "
              f"claim conflicts: {report.claim_conflicts or 'none'}; actors left: {report.actors_left}; "
              f"deadlock: {report.deadlocked}", markup=False)
    out.print("[bold green]checks passed[/]" if report.ok else "[bold red]checks FAILED[/]")


# -- bench ------------------------------------------------------------------------------------


def _bench_sources(args: argparse.Namespace) -> Path:
    """The bench/ folder to run: --source, else the checkout ctxrt runs from, else ./bench."""
    candidates = [Path(args.source)] if args.source else [
        Path(__file__).resolve().parent.parent / "bench",  # an editable install runs from its checkout
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
            _emit({"sources": str(sources), "command": command, "output": args.output})
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
        _emit({"output": str(output), "files": files, "exit_status": finished.returncode})
    else:
        err.print(f"benchmark results written to {output}: {', '.join(r.name for r in written) or 'none'}",
                  markup=False)
    if finished.returncode != 0:
        raise BenchFailed(f"the benchmarks exited with status {finished.returncode} (a module failed or a "
                          f"figure missed its target); results in {output}")
    return 0


# -- options ----------------------------------------------------------------------------------

DEFAULT_LIMIT = 50

DESCRIPTION = """\
ctxrt: a context runtime for multi-agent LLM hosts. Run the demo, look inside
a store, dry-run a compile, or run the load test and the benchmarks."""

EPILOG = f"""\
Read-only commands (inspect, messages, compile, summaries, serve) work while a host writes the store.

output: results on stdout, errors and progress on stderr; no wrapping when piped.
  --json puts only JSON on stdout; an error is then one JSON object on stderr:
  {{"error": "<type>", "message": "<text>"}}.
exit status: 0 success, 1 failure (a missing or damaged store, a refused
  compile, a failed check), 2 usage error (a bad option or combination).
  Set {TRACEBACK_VARIABLE}=1 to see a traceback instead of the one-line error,
  {LOG_LEVEL_VARIABLE}=WARNING (or INFO, DEBUG) to see the runtime's log on stderr.

examples:
  ctxrt demo --messages 500
  ctxrt inspect demo-store
  ctxrt messages demo-store --tail 20
  ctxrt compile demo-store --namespace agents/ann --budget 20000 --json
  ctxrt serve demo-store
"""


class _Parser(argparse.ArgumentParser):
    """argparse, with its complaints raised (so main reports them, as JSON under --json)."""

    subcommands: dict[str, argparse.ArgumentParser]

    def error(self, message: str) -> NoReturn:
        raise UsageError(message, prog=self.prog, usage=self.format_usage())


def _verify(args: argparse.Namespace) -> int:
    from .store.verify import verify_in_child

    if is_postgres_url(args.store):
        try:
            from .store.verify_postgres import verify_postgres
        except ImportError as exc:
            raise driver_missing(exc) from None
        report = verify_postgres(args.store)
    else:
        report = verify_in_child(args.store, timeout=args.timeout)
    if args.json:
        _emit(attrs.asdict(report) | {"exit_code": report.exit_code})
        return report.exit_code
    out.print(f"{report.path}: {report.status} ({report.pages} pages, {report.records} records checked)",
              markup=False)
    for damage in report.damage:
        out.print(f"  damaged: {damage.place}: {damage.what}", markup=False)
    for note in report.notes:
        out.print(f"  note: {note}", markup=False)
    return report.exit_code


def _whole(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {minimum} or more, got {value}")
        return value

    return parse


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ctxrt")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def parser() -> _Parser:
    top = _Parser(prog="ctxrt", description=DESCRIPTION, epilog=EPILOG,
                  formatter_class=argparse.RawDescriptionHelpFormatter)
    top.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    top.add_argument("--json", action="store_true", dest="json_anywhere", help=argparse.SUPPRESS)
    commands = top.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND")

    top.subcommands = {}

    def command(name: str, summary: str, description: str) -> argparse.ArgumentParser:
        sub = top.subcommands[name] = commands.add_parser(name, help=summary, description=description)
        sub.add_argument("--json", action="store_true",
                         help="print JSON on stdout; an error is a JSON object on stderr")
        return sub

    demo = command("demo", "run the multi-resident demo on the embedded store",
                   "Three residents share one slot; compression, a fork and a derive run; each reader's compile "
                   "is checked for another reader's lines. 2,000 messages take about 10-30 s offline (longer "
                   "with a real model: ANTHROPIC_API_KEY set, CTXRT_DEMO_MODEL picks it). Exits 1 if the privacy "
                   "check fails or compression made no summaries.")
    demo.add_argument("--store", default="demo-store", metavar="PATH",
                      help="where to put the store (default: %(default)s). A new or empty directory, or one an "
                           "earlier demo made, which is replaced; anything else is refused, never deleted")
    demo.add_argument("--messages", type=_whole(1), default=2000, metavar="N",
                      help="messages to write (default: %(default)s)")

    inspect = command("inspect", "branches, namespaces, readers, slots, summaries and floors of a store",
                      "Each branch with its slots (messages stored) and namespaces (reader, narrowing floor, "
                      "summaries per level, quarantined compression units). Opens the store read-only.")
    inspect.add_argument("store", metavar="STORE", help="the store's directory")

    messages = command("messages", "messages of a slot, as stored",
                       "Messages of a slot on a branch as stored (audience included). Shows --limit messages "
                       "from --offset, or the last --tail ones. Opens the store read-only.")
    messages.add_argument("store", metavar="STORE", help="the store's directory")
    messages.add_argument("--branch", default="main", help="the branch to read (default: %(default)s)")
    messages.add_argument("--slot", default="messages",
                          help="the slot: 'messages' (shared) or '<namespace>/messages' for an isolated "
                               "namespace; `inspect` lists them (default: %(default)s)")
    messages.add_argument("--offset", type=_whole(0), metavar="N",
                          help="the first message to show, counting from 0 (default: 0)")
    messages.add_argument("--limit", type=_whole(0), metavar="N",
                          help=f"how many messages to show from --offset (default: {DEFAULT_LIMIT})")
    messages.add_argument("--tail", type=_whole(0), metavar="N",
                          help="show the last N messages instead (not with --offset or --limit)")

    compile_ = command("compile", "a dry-run compile of a namespace (writes nothing)",
                       "Compile a namespace for its reader as a host would, without writing anything, and print "
                       "the request body. Opens the store read-only.")
    compile_.add_argument("store", metavar="STORE", help="the store's directory")
    compile_.add_argument("--namespace", required=True, help="the namespace to compile (`inspect` lists them)")
    compile_.add_argument("--reader", help="the reader to compile for (default: the one the namespace records)")
    compile_.add_argument("--branch", default="main", help="the branch (default: %(default)s)")
    compile_.add_argument("--budget", type=_whole(1), default=100_000, metavar="TOKENS",
                          help="max tokens, the response's reserve included (default: %(default)s)")
    compile_.add_argument("--reserve", type=_whole(0), default=4_000, metavar="TOKENS",
                          help="tokens kept for the response; must be less than --budget (default: %(default)s)")
    compile_.add_argument("--assistant", default="Claude",
                          help="the participant who speaks as the assistant (default: %(default)s)")
    compile_.add_argument("--strategy", choices=("auto", "passthrough", "autobiographical"), default="auto",
                          help="auto: the strategy config the namespace records (a store from before that: "
                               "autobiographical if it keeps summaries, else passthrough) (default: %(default)s)")

    summaries = command("summaries", "a namespace's summaries",
                        "Every summary a namespace stores on a branch, merged ones included. Opens the store "
                        "read-only.")
    summaries.add_argument("store", metavar="STORE", help="the store's directory")
    summaries.add_argument("--namespace", required=True, help="the namespace (`inspect` lists them)")
    summaries.add_argument("--branch", default="main", help="the branch (default: %(default)s)")

    serve = command("serve", "a read-only web inspector of a store, on 127.0.0.1",
                    "Serve a read-only web inspector of the store on 127.0.0.1: branches and fork points, "
                    "namespaces (reader, strategy, floor, health, quarantined units), a paged timeline with "
                    "audience badges that follows the writer, each reader's request broken down, summary trees "
                    "and two readers' views side by side. Works beside a live writer; writes nothing. Needs "
                    "pip install 'ctxrt[inspector]'.")
    serve.add_argument("store", metavar="STORE", help="the store's directory, or a postgresql:// URL")
    serve.add_argument("--port", type=_whole(0), default=8765, metavar="PORT",
                       help="the port on 127.0.0.1 (0: any free one; default: %(default)s)")

    verify = command("verify", "walk every page and record of a store and report damage",
                     "Check a store in a child process (a damaged file can crash whatever reads it; here only "
                     "the child): the files, every page, then every record. Exit status 0: sound; 1: damaged; "
                     "2: not checked (no store there, or not a ctxrt store). Never writes.")
    verify.add_argument("store", metavar="STORE", help="the store's directory")
    verify.add_argument("--timeout", type=_seconds, default=600.0, metavar="SECONDS",
                        help="give up (exit 1) after this long (default: %(default)s)")

    bench = command("bench", "run the benchmarks of a checkout (results go to --output)",
                    "Run every benchmark (python -m bench) on a copy of a checkout's bench/ folder, so the "
                    "committed bench/results*.md stay as they are; `make bench` updates those.")
    bench.add_argument("--quick", action="store_true", help="fewer rounds and smaller samples (about 3 minutes)")
    bench.add_argument("--only", nargs="+", metavar="NAME", help="run only these modules (store, context, ...)")
    bench.add_argument("--output", metavar="DIR", help="where to write results*.md (default: a new temporary "
                                                       "directory, printed at the end)")
    bench.add_argument("--source", metavar="DIR", help="the bench/ folder to run (default: the checkout ctxrt "
                                                       "is installed from, else ./bench)")
    bench.add_argument("--dry-run", action="store_true", help="say what would run and where results would go")

    load = command("load-test", "concurrent opens, claims, adds, compiles and ticks, then checks",
                   "Managers open namespaces as readers and add, compile and tick concurrently, then the run "
                   "checks: no lost message, one claim per namespace, no leaked actor, no deadlock. Exits 1 if a "
                   "check fails.")
    load.add_argument("--store", metavar="PATH|URL",
                      help="a new or empty directory for the store, or a postgresql:// URL of a database without "
                           "a ctxrt store, kept afterwards (default: a temporary store, removed afterwards unless "
                           "--keep)")
    load.add_argument("--keep", action="store_true", help="keep the temporary store and print where it is")
    load.add_argument("--namespaces", type=_whole(1), default=50, metavar="N",
                      help="namespaces (default: %(default)s)")
    load.add_argument("--managers", type=_whole(1), default=200, metavar="N",
                      help="concurrent managers (default: %(default)s)")
    load.add_argument("--readers", type=_whole(1), default=5, metavar="N",
                      help="distinct readers (default: %(default)s)")
    load.add_argument("--duration", type=_seconds, default=30.0, metavar="SECONDS",
                      help="how long to run (default: %(default)s)")
    return top


def _check(top: _Parser, args: argparse.Namespace) -> None:
    """Rules across options, which argparse can't state; raises UsageError."""
    sub = top.subcommands[args.command]
    if args.command == "messages" and args.tail is not None and (args.offset is not None or args.limit is not None):
        sub.error("--tail shows the last N messages: give it alone, or --offset and --limit instead")
    if args.command == "compile":
        try:
            Budget(args.budget, args.reserve)
        except ValueError:
            sub.error(f"--budget {args.budget} leaves no room after --reserve {args.reserve} (the tokens kept "
                      f"for the response): --budget must be more than --reserve")
    if args.command == "load-test" and args.keep and args.store:
        sub.error("--keep is for the temporary store; a --store is always kept")


HANDLERS = {"demo": _demo, "inspect": _inspect, "messages": _messages, "compile": _compile,
            "summaries": _summaries, "serve": _serve, "load-test": _load_test}


def _configure_logging() -> None:
    """The runtime's log on stderr at CTXRT_LOG_LEVEL; off by default.

    Each command reports its outcome itself (the demo counts failed compression requests, for
    one); the log would repeat it line by line: a failing model logs every attempt.
    """
    level = os.environ.get(LOG_LEVEL_VARIABLE, "").upper()
    logger = logging.getLogger("ctxrt")
    logger.propagate = False
    if level in logging.getLevelNamesMapping():
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("ctxrt: %(levelname)s: %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(level)
    else:
        logger.addHandler(logging.NullHandler())  # also keeps logging's last-resort handler quiet


def run() -> NoReturn:
    """The ``ctxrt`` command's process: ``main()``, then exit with its status. A Ctrl-C after the
    command has done its work (while Python shuts down, when its default handler is back) would
    kill the process by its signal, with no line said: it is ignored from then on."""
    try:
        status = main()
    finally:  # argparse's --help and --version leave through SystemExit
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(status)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    as_json = "--json" in argv  # known even when parsing fails, so a usage error can be JSON too
    top = parser()
    _configure_logging()
    try:
        args = top.parse_args(argv)
        args.json = args.json or args.json_anywhere  # --json before the command works too
        _check(top, args)
        if args.command == "bench":
            return _bench(args)
        if args.command == "verify":
            return _verify(args)
        # Ctrl-C is raised in the command's own task at an await, never inside an actor's step.
        return trio.run(HANDLERS[args.command], args, restrict_keyboard_interrupt_to_checkpoints=True)
    except UsageError as exc:
        if not as_json:
            sys.stderr.write(exc.usage)
        _report("UsageError", f"{exc.prog}: error: {exc}" if not as_json else str(exc), as_json)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: one line, whatever was running (the runtime raises it as itself, L8)
        return _interrupted(as_json)
    except BaseExceptionGroup as group:
        if any(isinstance(leaf, KeyboardInterrupt) for leaf in _leaves(group)):  # a second Ctrl-C as trio closed
            return _interrupted(as_json)
        raise
    except Exception as exc:  # the edge: one line for anything, unless asked for the traceback
        if all(isinstance(leaf, BrokenPipeError) for leaf in _leaves(exc)):
            # Piped into `head` and the like: the reader stopped, which is fine. Point stdout at
            # devnull so the interpreter's final flush doesn't fail too.
            with contextlib.suppress(OSError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        if os.environ.get(TRACEBACK_VARIABLE) == "1":
            raise
        kind, message = _describe(exc)
        _report(kind, message if as_json else f"ctxrt: error: {message}", as_json)
        return 1


def _interrupted(as_json: bool) -> int:
    """Ctrl-C: later ones are ignored (trio has put Python's handler back, and another would
    kill the process before its one line), then the line and status 130."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _report("KeyboardInterrupt", "interrupted" if as_json else "ctxrt: interrupted", as_json)
    return 130


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc


def _describe(exc: BaseException) -> tuple[str, str]:
    """An error's type name and a one-line message saying what failed."""
    leaves = list(_leaves(exc))
    first = leaves[0]
    if isinstance(first, BACKEND_ERRORS):
        kind = type(first).__name__
        message = f"the store can't be read (damaged, or not a ctxrt store): {first}"
    elif isinstance(first, (CtxrtError, OSError)):
        kind, message = type(first).__name__, str(first)
    else:  # not an error ctxrt means to raise: say what it was, and how to see where
        kind = type(first).__name__
        message = f"{kind}: {first} (set {TRACEBACK_VARIABLE}=1 to see the traceback)"
    if len(leaves) > 1:
        message += f" (and {len(leaves) - 1} more error{'s' if len(leaves) > 2 else ''})"
    return kind, " ".join(message.split())  # one line, whatever the message held


def _report(kind: str, message: str, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"error": kind, "message": message}, ensure_ascii=False), file=sys.stderr)
    else:
        print(message, file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
