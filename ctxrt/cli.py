"""The ``ctxrt`` command (also ``python -m ctxrt``).

``demo`` runs the main job; ``inspect``, ``messages``, ``compile`` and ``summaries`` open a store
read-only (they work while a host writes it); ``bench`` runs the benchmarks; ``load-test``
drives concurrent opens, claims, adds, compiles and ticks. ``--json`` on each for scripts.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import attrs
import trio
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from . import codec
from .compile import Budget
from .errors import CtxrtError
from .runtime import open_runtime

console = Console()


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


# -- demo -------------------------------------------------------------------------------------


async def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    store = Path(args.store)
    if args.json:
        report = await run_demo(store, messages=args.messages)
    else:
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=console) as progress:
            task = progress.add_task("residents talking", total=args.messages)
            report = await run_demo(store, messages=args.messages,
                                    progress=lambda done, total: progress.update(task, completed=done))
    if args.json:
        _emit({**_jsonable(report), "private": report.private})
        return 0 if report.private else 1
    table = Table(title=f"What each reader's compile holds ({report.messages} messages, model: {report.model})",
                  caption="tokens: head window / middle (summaries + raw not yet compressed) / recent window; "
                          "own = audience lines for this reader; leaks = lines for another reader")
    for column in ("reader", "branch", "msgs", "head", "middle", "recent", "own", "summaries", "leaks"):
        table.add_column(column, justify="right" if column not in ("reader", "branch") else "left")
    for row in report.readers:
        table.add_row(row.reader, row.branch, str(row.messages), str(row.head_tokens), str(row.summary_tokens),
                      str(row.recent_tokens), str(row.audience_blocks_seen), str(row.summaries),
                      "none" if not row.foreign_markers else ", ".join(row.foreign_markers[:3]))
    console.print(table)
    console.print(f"compression requests: {report.model_requests}; fork: {report.fork}; derived: {report.derived}")
    if report.private:
        console.print("[bold green]privacy check passed[/]: no compile, summary or model request held another "
                      "reader's lines")
    else:
        console.print(f"[bold red]privacy check FAILED[/]: {report.leaks[:5]}")
    console.print(f"store left at [bold]{report.store}[/] — try: ctxrt inspect {report.store}")
    return 0 if report.private else 1


# -- read-only commands -----------------------------------------------------------------------


async def _inspect(args: argparse.Namespace) -> int:
    async with open_runtime(args.store, readonly=True) as runtime:
        engine = runtime.engine
        branches = await runtime.list_branches()
        data: dict[str, Any] = {"store": str(runtime.path), "sequence": engine.last_sequence, "branches": []}
        for branch in branches:
            row = engine.branch(branch.name)
            slots = {}
            summaries: dict[str, Counter[int]] = {}
            with engine.reader() as txn:
                for state in engine.list_states():
                    if state.kind != "log":
                        continue
                    if state.name == "messages" or state.name.endswith("/messages"):
                        slots[state.name] = engine.log_head(txn, state.name, row).length
                    elif state.name.endswith(":summaries"):
                        levels = Counter(json.loads(item.data)["level"]
                                         for item in engine.log_items(txn, state.name, row))
                        summaries[state.name.rsplit("/", 1)[0]] = levels
            namespaces = [
                {"namespace": info.namespace, "reader": info.reader, "narrowing_floor": info.narrowing_floor,
                 "summaries_per_level": dict(sorted(summaries.get(info.namespace, Counter()).items())),
                 "quarantined": _quarantined(engine, row, info.namespace)}
                for info in await runtime.list_namespaces(branch.name)
            ]
            data["branches"].append({**_jsonable(branch), "slots": slots, "namespaces": namespaces})
    if args.json:
        _emit(data)
        return 0
    console.print(f"[bold]{data['store']}[/] — store sequence {data['sequence']}")
    for branch in data["branches"]:
        parent = f" (from {branch['parent']} at {branch['fork_sequence']})" if branch["parent"] else ""
        console.print(f"\n[bold]branch {branch['name']}[/]{parent}, head {branch['head_sequence']}")
        for slot, count in branch["slots"].items():
            console.print(f"  slot {slot}: {count} messages")
        table = Table("namespace", "reader", "narrowing floor", "summaries per level", "quarantined")
        for info in branch["namespaces"]:
            table.add_row(info["namespace"], str(info["reader"]), str(info["narrowing_floor"]),
                          ", ".join(f"L{k}: {v}" for k, v in info["summaries_per_level"].items()) or "-",
                          ", ".join(info["quarantined"]) or "-")
        console.print(table)
    return 0


def _quarantined(engine: Any, row: Any, namespace: str) -> list[str]:
    """Compression units a namespace gave up on (chunks, merge groups), from its attempts record."""
    from .strategies.autobiographical import MAX_ATTEMPTS

    found: list[str] = []
    for name in ("autobio", "knowledge"):
        state = f"{namespace}/{name}:attempts"
        if engine.has_state(state):
            with engine.reader() as txn:
                attempts, _ = engine.get_value(txn, state, row)
            if isinstance(attempts, dict):
                found += [key for key, count in attempts.items() if isinstance(count, int) and count >= MAX_ATTEMPTS]
    return found


async def _messages(args: argparse.Namespace) -> int:
    async with open_runtime(args.store, readonly=True) as runtime:
        engine = runtime.engine
        row = engine.branch(args.branch)
        with engine.reader() as txn:
            head = engine.log_head(txn, args.slot, row)
            start = max(0, head.length - args.tail) if args.tail is not None else args.offset
            items = engine.log_items(txn, args.slot, row, start=start, stop=start + args.limit, head=head)
            messages = [codec.message_from_json(item.data, sequence=item.sequence) for item in items]
    if args.json:
        _emit({"total": head.length, "start": start, "messages": [
            {"id": m.id, "participant": m.participant, "timestamp_ms": m.timestamp_ms,
             "content": [codec.to_jsonable(b) for b in m.content], "metadata": m.metadata} for m in messages]})
        return 0
    console.print(f"{args.slot} on {args.branch}: messages {start}..{start + len(messages) - 1} of {head.length}")
    for message in messages:
        parts = []
        for block in message.content:
            text = getattr(block, "text", None) or getattr(block, "name", None) or block.type
            audience = getattr(block, "audience", None)
            parts.append(f"{text}" + (f" [audience: {', '.join(audience)}]" if audience else ""))
        console.print(f"[dim]{message.id:>8}[/] [bold]{escape(message.participant)}[/]: "
                      f"{escape(' | '.join(parts)[:300])}")
    return 0


async def _compile(args: argparse.Namespace) -> int:
    async with open_runtime(args.store, readonly=True) as runtime:
        manager = await runtime.open(args.namespace, view_reader=args.reader, branch=args.branch,
                                     strategy=_stored_strategy(runtime, args))
        result = await manager.compile(Budget(args.budget, args.reserve), dry_run=True)
        body = result.to_anthropic(assistant=args.assistant)
        await manager.aclose()
    if args.json:
        _emit({"reader": manager.view_reader, "request": body})
        return 0
    console.print(f"dry-run compile of {args.namespace} for reader {manager.view_reader!r}: "
                  f"{len(result.messages)} messages (nothing written)")
    for message in body["messages"]:
        text = " ".join(block.get("text", f"[{block['type']}]") for block in message["content"])
        console.print(f"[bold]{message['role']}[/]: {escape(text[:200])}")
    return 0


def _stored_strategy(runtime: Any, args: argparse.Namespace) -> Any:
    """The strategy whose state a namespace holds: Autobiographical if it keeps summaries."""
    from .strategies.autobiographical import Autobiographical
    from .strategies.passthrough import Passthrough

    if args.strategy == "passthrough":
        return Passthrough()
    if args.strategy == "autobiographical" or runtime.engine.has_state(f"{args.namespace}/autobio:summaries"):
        return Autobiographical("inspection", recent_window_tokens=args.budget // 2)
    return Passthrough()


async def _summaries(args: argparse.Namespace) -> int:
    async with open_runtime(args.store, readonly=True) as runtime:
        engine = runtime.engine
        found = []
        with engine.reader() as txn:
            for name in ("autobio", "knowledge"):
                state = f"{args.namespace}/{name}:summaries"
                if engine.has_state(state):
                    found += [json.loads(item.data)
                              for item in engine.log_items(txn, state, engine.branch(args.branch))]
    if args.json:
        _emit(found)
        return 0
    if not found:
        console.print(f"namespace {args.namespace!r} on {args.branch} keeps no summaries")
    for summary in found:
        console.print(f"[bold]{summary['id']}[/] (L{summary['level']}, {summary['tokens']} tokens, messages "
                      f"{summary['first_id']}..{summary['last_id']}): {escape(summary['content'][:240])}")
    return 0


# -- load test and bench ----------------------------------------------------------------------


async def _load_test(args: argparse.Namespace) -> int:
    import tempfile

    from .loadtest import report_json, run_load_test

    store = Path(args.store) if args.store else Path(tempfile.mkdtemp(prefix="ctxrt-load-")) / "store"
    report = await run_load_test(store, namespaces=args.namespaces, managers=args.managers, readers=args.readers,
                                 duration_s=args.duration)
    if args.json:
        _emit(report_json(report))
        return 0 if report.ok else 1
    table = Table("operation", "count", "per second", "p50 ms", "p90 ms", "p99 ms", "max ms",
                  title=f"load test: {args.managers} managers, {args.namespaces} namespaces, {args.readers} readers, "
                        f"{report.seconds:.1f} s")
    for kind, count in sorted(report.operations.items()):
        lat = report.latencies_ms.get(kind, {})
        table.add_row(kind, str(count), f"{count / report.seconds:.0f}",
                      *(f"{lat.get(q, 0):.1f}" for q in ("p50", "p90", "p99", "max")))
    console.print(table)
    console.print(f"refusals: {dict(report.refusals) or 'none'}")
    console.print(f"messages acknowledged {report.messages_acknowledged}, stored {report.messages_stored}; "
                  f"claim conflicts: {report.claim_conflicts or 'none'}; actors left: {report.actors_left}; "
                  f"deadlock: {report.deadlocked}")
    console.print("[bold green]checks passed[/]" if report.ok else "[bold red]checks FAILED[/]")
    return 0 if report.ok else 1


def _bench(args: argparse.Namespace) -> int:
    try:
        import bench.__main__ as entry  # the repository's bench/ package
    except ImportError:
        console.print("the benchmarks live in the repository's bench/ folder: run from a checkout")
        return 2
    return entry.main(["--quick"] if args.quick else [])


# -- entry ------------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="ctxrt", description=__doc__.splitlines()[0])
    commands = top.add_subparsers(dest="command", required=True)

    def command(name: str, help: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help)
        sub.add_argument("--json", action="store_true", help="machine-readable output")
        return sub

    demo = command("demo", "run the multi-resident demo on the embedded store")
    demo.add_argument("--store", default="demo-store")
    demo.add_argument("--messages", type=int, default=2000)
    inspect = command("inspect", "branches, namespaces, readers, slots, summaries and floors of a store")
    inspect.add_argument("store")
    messages = command("messages", "messages of a slot, as stored")
    messages.add_argument("store")
    messages.add_argument("--branch", default="main")
    messages.add_argument("--slot", default="messages")
    messages.add_argument("--offset", type=int, default=0)
    messages.add_argument("--limit", type=int, default=50)
    messages.add_argument("--tail", type=int)
    compile_ = command("compile", "a dry-run compile of a namespace (writes nothing)")
    compile_.add_argument("store")
    compile_.add_argument("--namespace", required=True)
    compile_.add_argument("--reader")
    compile_.add_argument("--branch", default="main")
    compile_.add_argument("--budget", type=int, default=100_000)
    compile_.add_argument("--reserve", type=int, default=4_000)
    compile_.add_argument("--assistant", default="Claude")
    compile_.add_argument("--strategy", choices=("auto", "passthrough", "autobiographical"), default="auto")
    summaries = command("summaries", "a namespace's summaries")
    summaries.add_argument("store")
    summaries.add_argument("--namespace", required=True)
    summaries.add_argument("--branch", default="main")
    bench = command("bench", "run the benchmarks (from a checkout)")
    bench.add_argument("--quick", action="store_true")
    load = command("load-test", "concurrent opens, claims, adds, compiles and ticks, then checks")
    load.add_argument("--store")
    load.add_argument("--namespaces", type=int, default=50)
    load.add_argument("--managers", type=int, default=200)
    load.add_argument("--readers", type=int, default=5)
    load.add_argument("--duration", type=float, default=30.0)
    return top


HANDLERS = {"demo": _demo, "inspect": _inspect, "messages": _messages, "compile": _compile,
            "summaries": _summaries, "load-test": _load_test}


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command == "bench":
            return _bench(args)
        return trio.run(HANDLERS[args.command], args)
    except (CtxrtError, FileNotFoundError) as exc:
        console.print(f"[bold red]error[/]: {exc}")
        return 2
    except BrokenPipeError:  # piped into `head` and the like: the reader stopped, which is fine
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
