"""Peers: the same chat workload on ctxrt and on two peers, measured side by side in one run.

    python -m bench.peers [--quick]

Systems (the peers are the optional ``bench`` extra: ``pip install -e '.[bench]'``; a peer that
isn't installed is skipped with one line, and the rest still runs):

- ctxrt: ``open_runtime(path, durability="sync")`` (the default), one namespace per conversation
  (``isolate=True``: its own message slot),
  the default ``Passthrough`` strategy.
- LangGraph's SQLite checkpointer (``langgraph-checkpoint-sqlite``): ``SqliteSaver`` for turns,
  ``AsyncSqliteSaver`` (its asyncio sibling, on aiosqlite) for concurrent writers. One thread id
  per conversation; the history is the ``messages`` channel of the latest checkpoint.
- The OpenAI Agents SDK's ``agents.SQLiteSession`` (``openai-agents``): one session id per
  conversation, on asyncio. ctxrt runs on trio, so the asyncio peers run under one
  ``asyncio.Runner`` driven from the same process and thread, between ctxrt's steps.

Both peers use SQLite as they configure it: WAL journal, and the library's default
``synchronous`` (FULL on this build, reported in the results), so each commit syncs the WAL
and every acknowledged write is durable, as ctxrt's ``durability="sync"``. A message is
~200 B of text: ``add_message("user", text)`` on ctxrt, ``{"role": "user", "content": text}``
on the peers (a plain dict: the cheapest value either peer stores).

(i) A turn = append one message, then load the full history for the next model call, with
    1,000 and 20,000 messages already present.
    - ctxrt: ``add_message``, then ``compile`` with a budget that holds everything (Passthrough
      returns every message); the plain load is ``get_all_messages``.
    - LangGraph: ``get_tuple`` (the latest checkpoint of the thread), append the message to the
      ``messages`` channel, ``put`` a new checkpoint. The load is ``get_tuple``.
    - SQLiteSession: ``add_items([message])``, then ``get_items()``. The load is ``get_items``.
    Histories are built quickly: ctxrt with durability "os" and concurrent adds (then reopened
    "sync" for measuring), LangGraph with one checkpoint holding them all, SQLiteSession with
    one ``add_items`` of them all. Ratios: peer time / ctxrt time (how many times faster ctxrt is).
(ii) Concurrent writers on one thread: N = 10 and N = 100 writer tasks (trio tasks on ctxrt,
    asyncio tasks on the peers), each appending a fixed count of messages to its own
    conversation in one store, awaiting each append. Fresh stores each round; each writer's
    conversation is opened and written once before the clock starts. Ratio: ctxrt
    throughput / peer throughput.

Every variant runs in every round, in a shuffled order each round (for turns, 3 consecutive turns
whose median is the round's figure); figures are medians (with min-max) across rounds. Results
are printed and written to ``bench/results-peers.md``. Set ``CTXRT_BENCH_DIR`` to choose where
the stores live (a real disk, not tmpfs).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import gc
import importlib
import importlib.metadata
import random
import shutil
import sqlite3
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

import ctxrt

from . import harness
from .harness import interleave, scratch, summary, versus

RESULTS_PATH = Path(__file__).with_name("results-peers.md")
SIZES = (1_000, 20_000)
WRITERS = (10, 100)
TURNS_PER_ROUND = 3  # consecutive turns per variant per round; the round's figure is their median
EVERYTHING = ctxrt.Budget(max_tokens=1_000_000_000, reserve_for_response=0)

# name -> (the distribution to install, the module to import, a short label)
PEERS = {
    "langgraph": ("langgraph-checkpoint-sqlite", "langgraph.checkpoint.sqlite", "LangGraph SqliteSaver"),
    "agents": ("openai-agents", "agents", "Agents SDK SQLiteSession"),
}


def _text(n: int) -> str:
    """A ~200 B chat message."""
    head = f"message {n:08d} "
    return head + "x" * (200 - len(head))


def _item(n: int) -> dict[str, str]:
    return {"role": "user", "content": _text(n)}


def skipped_line(name: str) -> str:
    return f"skipped: {PEERS[name][0]} not installed (pip install -e '.[bench]')"


def available_peers() -> tuple[list[str], list[str]]:
    """(installed peer names, one "skipped: ..." line per missing peer)."""
    present, missing = [], []
    for name, (_, module, _) in PEERS.items():
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(skipped_line(name))
        else:
            present.append(name)
    return present, missing


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "?"


# -- ctxrt --------------------------------------------------------------------------------------


async def ctxrt_build(path: Path, count: int) -> None:
    """``count`` messages in namespace "chat", added by 20 concurrent tasks with durability "os"."""
    async with ctxrt.open_runtime(path, durability="os") as rt:
        manager = await rt.open("chat", isolate=True)
        tasks = 20

        async def adder(first: int) -> None:
            for n in range(first, count, tasks):
                await manager.add_message("user", _text(n))

        async with trio.open_nursery() as nursery:
            for first in range(tasks):
                nursery.start_soon(adder, first)


class CtxrtTurns:
    """A durable runtime over a built store; ``turn`` appends, compiles, then loads."""

    def __init__(self, manager: Any, count: int) -> None:
        self.manager = manager
        self.count = count

    async def turn(self) -> dict[str, float]:
        manager = self.manager
        self.count += 1
        started = time.perf_counter()
        await manager.add_message("user", _text(self.count))
        appended = time.perf_counter()
        compiled = await manager.compile(EVERYTHING)
        loaded = time.perf_counter()
        messages = await manager.get_all_messages()
        listed = time.perf_counter()
        if len(compiled.messages) != self.count or len(messages) != self.count:
            raise AssertionError(f"ctxrt: {len(compiled.messages)} compiled, {len(messages)} listed, not {self.count}")
        return {"append": appended - started, "compile": loaded - appended, "turn": loaded - started,
                "load": listed - loaded, "plain turn": (appended - started) + (listed - loaded)}


async def ctxrt_writers(path: Path, writers: int, each: int) -> float:
    """Appends/s of ``writers`` trio tasks, each appending ``each`` messages to its own namespace."""
    async with ctxrt.open_runtime(path, durability="sync") as rt:
        managers = [await rt.open(f"w{index}", isolate=True) for index in range(writers)]
        for index, manager in enumerate(managers):  # warm-up: each conversation written once
            await manager.add_message("user", _text(index))

        async def writer(manager: Any, index: int) -> None:
            for n in range(each):
                await manager.add_message("user", _text(index * each + n))

        gc.collect()
        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for index, manager in enumerate(managers):
                nursery.start_soon(writer, manager, index)
        elapsed = time.perf_counter() - started
        for manager in managers[:3]:
            assert len(await manager.get_all_messages()) == each + 1
    return writers * each / elapsed


# -- LangGraph's SQLite checkpointer ------------------------------------------------------------


def _lg_checkpoint(
    previous: dict[str, Any] | None, messages: list[Any], step: int
) -> tuple[dict[str, Any], dict[str, Any], dict[str, int]]:
    """(checkpoint, metadata, new_versions) for a checkpoint whose ``messages`` channel is ``messages``."""
    from datetime import datetime, timezone

    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.base.id import uuid6

    checkpoint = empty_checkpoint() if previous is None else dict(previous)
    version = (previous or {}).get("channel_versions", {}).get("messages", 0) + 1
    checkpoint.update(
        id=str(uuid6(clock_seq=step)),
        ts=datetime.now(timezone.utc).isoformat(),
        channel_values={**checkpoint["channel_values"], "messages": messages},
        channel_versions={**checkpoint["channel_versions"], "messages": version},
        updated_channels=["messages"],
    )
    return checkpoint, {"source": "loop", "step": step, "parents": {}}, {"messages": version}


class CheckpointerTurns:
    """A LangGraph checkpointer holding one conversation in one thread: the turn both LangGraph
    peers take (``LangGraphTurns`` on SQLite here, ``PostgresSaverTurns`` in bench.postgres)."""

    label = "LangGraph"

    def start(self, saver: Any) -> None:
        self.saver = saver
        self.saver.setup()
        self.config = {"configurable": {"thread_id": "chat", "checkpoint_ns": ""}}
        self.count = 0
        self.step = 0

    def build(self, count: int) -> None:
        checkpoint, metadata, versions = _lg_checkpoint(None, [_item(n) for n in range(count)], 0)
        self.saver.put(self.config, checkpoint, metadata, versions)
        self.count = count

    def turn(self) -> dict[str, float]:
        saver = self.saver
        self.count += 1
        self.step += 1
        started = time.perf_counter()
        found = saver.get_tuple(self.config)
        read = time.perf_counter()
        messages = [*found.checkpoint["channel_values"]["messages"], _item(self.count)]
        checkpoint, metadata, versions = _lg_checkpoint(found.checkpoint, messages, self.step)
        saver.put(found.config, checkpoint, metadata, versions)
        put = time.perf_counter()
        loaded = saver.get_tuple(self.config)
        listed = time.perf_counter()
        history = loaded.checkpoint["channel_values"]["messages"]
        if len(history) != self.count or len(messages) != self.count:
            raise AssertionError(f"{self.label}: {len(history)} messages, not {self.count}")
        return {"get_tuple": read - started, "append": put - read, "turn": put - started, "load": listed - put}


class LangGraphTurns(CheckpointerTurns):
    """A ``SqliteSaver`` on its own connection; one thread holds the conversation."""

    def __init__(self, path: Path) -> None:
        from langgraph.checkpoint.sqlite import SqliteSaver

        self.connection = sqlite3.connect(str(path), check_same_thread=False)
        self.start(SqliteSaver(self.connection))

    def pragmas(self) -> dict[str, Any]:
        return _pragmas(self.connection)

    def close(self) -> None:
        self.connection.close()


async def langgraph_writers(path: Path, writers: int, each: int) -> float:
    """Appends/s of ``writers`` asyncio tasks on ``AsyncSqliteSaver``, each on its own thread id.

    An append = ``aget_tuple`` of the thread's latest checkpoint, then ``aput`` of one with the
    message appended to ``messages`` (read-modify-write, the checkpointer's only way to append).
    """
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    async with AsyncSqliteSaver.from_conn_string(str(path)) as saver:
        configs = [{"configurable": {"thread_id": f"w{index}", "checkpoint_ns": ""}} for index in range(writers)]
        for index, config in enumerate(configs):  # warm-up: each conversation written once
            checkpoint, metadata, versions = _lg_checkpoint(None, [_item(index)], 0)
            await saver.aput(config, checkpoint, metadata, versions)

        async def writer(config: dict[str, Any], index: int) -> None:
            for n in range(each):
                found = await saver.aget_tuple(config)
                messages = [*found.checkpoint["channel_values"]["messages"], _item(index * each + n)]
                checkpoint, metadata, versions = _lg_checkpoint(found.checkpoint, messages, n + 1)
                await saver.aput(found.config, checkpoint, metadata, versions)

        gc.collect()
        started = time.perf_counter()
        await asyncio.gather(*(writer(config, index) for index, config in enumerate(configs)))
        elapsed = time.perf_counter() - started
        found = await saver.aget_tuple(configs[0])
        assert len(found.checkpoint["channel_values"]["messages"]) == each + 1
    return writers * each / elapsed


# -- the OpenAI Agents SDK's SQLiteSession -------------------------------------------------------


class AgentsTurns:
    """A ``SQLiteSession`` on a file; ``turn`` runs under the shared asyncio runner."""

    def __init__(self, path: Path, runner: asyncio.Runner) -> None:
        from agents import SQLiteSession

        self.path = path
        self.runner = runner
        self.session = SQLiteSession("chat", str(path))
        self.count = 0

    def build(self, count: int) -> None:
        _in_asyncio(self.runner, self.session.add_items([_item(n) for n in range(count)]))
        self.count = count

    async def _turn(self) -> dict[str, float]:
        session = self.session
        started = time.perf_counter()
        await session.add_items([_item(self.count)])
        appended = time.perf_counter()
        items = await session.get_items()
        loaded = time.perf_counter()
        again = await session.get_items()
        listed = time.perf_counter()
        if len(items) != self.count or len(again) != self.count:
            raise AssertionError(f"SQLiteSession: {len(items)} items, not {self.count}")
        return {"append": appended - started, "turn": loaded - started, "load": listed - loaded}

    def turn(self) -> dict[str, float]:
        self.count += 1
        return _in_asyncio(self.runner, self._turn())

    def pragmas(self) -> dict[str, Any]:
        # SQLiteSession sets only journal_mode=WAL on its connections; a fresh connection shows
        # the library default it leaves in place for ``synchronous``.
        with contextlib.closing(sqlite3.connect(str(self.path))) as connection:
            return _pragmas(connection)

    def close(self) -> None:
        self.session.close()


async def agents_writers(path: Path, writers: int, each: int) -> float:
    """Appends/s of ``writers`` asyncio tasks, each appending to its own ``SQLiteSession``."""
    from agents import SQLiteSession

    sessions = [SQLiteSession(f"w{index}", str(path)) for index in range(writers)]
    try:
        for index, session in enumerate(sessions):  # warm-up: each conversation written once
            await session.add_items([_item(index)])

        async def writer(session: Any, index: int) -> None:
            for n in range(each):
                await session.add_items([_item(index * each + n)])

        gc.collect()
        started = time.perf_counter()
        await asyncio.gather(*(writer(session, index) for index, session in enumerate(sessions)))
        elapsed = time.perf_counter() - started
        assert len(await sessions[0].get_items()) == each + 1
    finally:
        for session in sessions:
            session.close()
    return writers * each / elapsed


def _in_asyncio(runner: asyncio.Runner, coroutine: Any) -> Any:
    """Run an asyncio coroutine to completion from the trio thread (trio waits meanwhile).

    A fresh context keeps trio's context variables (sniffio's among them) out of asyncio.
    """
    return runner.run(coroutine, context=contextvars.Context())


def _pragmas(connection: sqlite3.Connection) -> dict[str, Any]:
    synchronous = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
    level = connection.execute("PRAGMA synchronous").fetchone()[0]
    journal = connection.execute("PRAGMA journal_mode").fetchone()[0]
    return {"synchronous": synchronous.get(level, str(level)), "journal_mode": journal}


# -- the run ----------------------------------------------------------------------------------


def _ratio_row(
    measure: str, unit: str, ctxrt_values: list[float], peer_values: list[float], peer_label: str,
    *, higher_is_better: bool, quick: bool,
) -> dict[str, Any]:
    """A row whose ratio says how many times better ctxrt is: peer/ctxrt for times, ctxrt/peer for rates.

    The issue sets no target against peers: these rows are reported, not judged.
    """
    made = versus(measure, unit, ctxrt_values, peer_values, peer_label, inverse=not higher_is_better,
                  ratio_means="ctxrt/peer throughput" if higher_is_better else "peer time / ctxrt time",
                  target=None, op=None)
    made["quick"] = quick
    return made


async def _run(quick: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    rng = random.Random(20240612)
    present, missing = available_peers()
    for line in missing:
        print(line, file=sys.stderr)
    info: dict[str, Any] = {"skipped": missing, "peers": present, "pragmas": {}, "quick": quick,
                            "versions": {"ctxrt": _version("ctxrt"), "trio": trio.__version__,
                                         "sqlite": sqlite3.sqlite_version}}
    for name in present:
        info["versions"][PEERS[name][0]] = _version(PEERS[name][0])
    turn_rounds = 5 if quick else 21
    writer_rounds = 3 if quick else 7
    each = {10: 30, 100: 8} if quick else {10: 100, 100: 40}  # appends per writer, by writer count
    labels = {"ctxrt": "ctxrt", **{name: PEERS[name][2] for name in present}}
    runner = asyncio.Runner()
    turn_figures: dict[tuple[str, int], list[dict[str, float]]] = {}
    build_s: dict[tuple[str, int], float] = {}
    writer_figures: dict[tuple[str, int], list[float]] = {}
    try:
        with scratch("ctxrt-bench-peers-") as root:
            # (i) turns: every (system, size) is built, then all stay open while the rounds run.
            async with contextlib.AsyncExitStack() as stack:
                turners: dict[tuple[str, int], Callable[[], Any]] = {}
                for size in SIZES:
                    started = time.perf_counter()
                    await ctxrt_build(root / f"ctxrt-{size}", size)
                    build_s["ctxrt", size] = time.perf_counter() - started
                    rt = await stack.enter_async_context(ctxrt.open_runtime(root / f"ctxrt-{size}", durability="sync"))
                    manager = await rt.open("chat", isolate=True)
                    turns = CtxrtTurns(manager, size)
                    turners["ctxrt", size] = turns.turn
                    for name in list(present):
                        try:
                            if name == "langgraph":
                                peer: Any = LangGraphTurns(root / f"langgraph-{size}.sqlite")
                            else:
                                peer = AgentsTurns(root / f"agents-{size}.sqlite", runner)
                            stack.callback(peer.close)
                            started = time.perf_counter()
                            peer.build(size)
                            build_s[name, size] = time.perf_counter() - started
                            info["pragmas"][name] = peer.pragmas()
                            peer.turn()  # a first turn: an API the installed version lacks fails here
                        except Exception as exc:  # a peer version this bench doesn't fit: a line, not a crash
                            line = f"skipped: {PEERS[name][0]} failed: {type(exc).__name__}: {exc}"
                            print(line, file=sys.stderr)
                            missing.append(line)
                            present.remove(name)
                            info["pragmas"].pop(name, None)
                            turners.pop((name, SIZES[0]), None)
                        else:
                            turners[name, size] = peer.turn

                await harness.warm_up(turners)  # two turns each, not counted

                async def turns_round(key: tuple[str, int]) -> dict[str, float]:
                    batch = [await harness.take_turn(turners[key]) for _ in range(TURNS_PER_ROUND)]
                    # the round's figure for each part: the median of its turns in this round
                    return {part: statistics.median(f[part] for f in batch) for part in batch[0]}

                turn_figures = await interleave(
                    turn_rounds, {key: (lambda _, key=key: turns_round(key)) for key in turners}, rng
                )

            # (ii) concurrent writers: a fresh store per variant and round.
            fresh = iter(range(1_000_000))

            async def writers_round(system: str, writers: int) -> float:
                path = root / f"w-{system}-{next(fresh)}"
                try:
                    if system == "ctxrt":
                        return await ctxrt_writers(path, writers, each[writers])
                    path.mkdir()
                    body = langgraph_writers if system == "langgraph" else agents_writers
                    return _in_asyncio(runner, body(path / "store.sqlite", writers, each[writers]))
                finally:
                    shutil.rmtree(path, ignore_errors=True)

            variants = [(system, writers) for writers in WRITERS for system in ["ctxrt", *present]]
            writer_figures = await interleave(
                writer_rounds, {key: (lambda _, key=key: writers_round(*key)) for key in variants}, rng
            )
    finally:
        runner.close()

    rows: list[dict[str, Any]] = []
    for size in SIZES:
        mine = turn_figures["ctxrt", size]
        for name in present:
            theirs = turn_figures[name, size]
            rows.append(_ratio_row(
                f"(i) turn at {size:,} messages: append 1, load the full history (ctxrt: add_message + compile)",
                "ms", [f["turn"] * 1e3 for f in mine], [f["turn"] * 1e3 for f in theirs], labels[name],
                higher_is_better=False, quick=quick))
        for name in present:
            theirs = turn_figures[name, size]
            rows.append(_ratio_row(
                f"(i) turn at {size:,} messages: append 1, load the full history (ctxrt: add_message + "
                "get_all_messages)", "ms",
                [f["plain turn"] * 1e3 for f in mine], [f["turn"] * 1e3 for f in theirs], labels[name],
                higher_is_better=False, quick=quick))
        for name in present:
            theirs = turn_figures[name, size]
            rows.append(_ratio_row(
                f"(i) load the full history alone at {size:,} messages (ctxrt: get_all_messages)", "ms",
                [f["load"] * 1e3 for f in mine], [f["load"] * 1e3 for f in theirs], labels[name],
                higher_is_better=False, quick=quick))
    for writers in WRITERS:
        for name in present:
            rows.append(_ratio_row(
                f"(ii) {writers} concurrent writers on one thread, {each[writers]} durable appends each",
                "appends/s",
                writer_figures["ctxrt", writers], writer_figures[name, writers], labels[name],
                higher_is_better=True, quick=quick))
    # per-system figures, for the section's detail table
    info["turns"] = {
        f"{labels[key[0]]} @ {key[1]:,}": {part: summary([f[part] * 1e3 for f in figures]) for part in figures[0]}
        for key, figures in turn_figures.items()
    }
    info["writers"] = {f"{labels[key[0]]} N={key[1]}": summary(values) for key, values in writer_figures.items()}
    info["build_s"] = {f"{labels[key[0]]} @ {key[1]:,}": seconds for key, seconds in build_s.items()}
    info["turn_rounds"], info["writer_rounds"], info["each"] = turn_rounds, writer_rounds, each
    for line in missing:
        rows.append({"measure": "peers", "skipped": line})
    return rows, info


_LAST_INFO: dict[str, Any] = {}


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Measure the peer comparison; one dict per ratio, plus one ``{"skipped": line}`` per missing peer."""
    rows, info = trio.run(_run, quick)
    _LAST_INFO.clear()
    _LAST_INFO.update(info)
    for row in rows:
        row.setdefault("module", "peers")
    return rows


# -- report -------------------------------------------------------------------------------------


# Each number at its own precision: no decimals from 100 up, one from 1, three from 0.01, else four.
PRECISION: harness.Precision = ((100, ",.0f"), (1, ".1f"), (0.01, ".3f"), (0, ".4f"))


_figure = functools.partial(harness.figure, precision=PRECISION)


def to_markdown(rows: list[dict[str, Any]], info: dict[str, Any] | None = None) -> str:
    """The results as a markdown section: ratios against each peer, then each system's figures."""
    info = info if info is not None else _LAST_INFO
    measured = [row for row in rows if "skipped" not in row]
    skipped = [row["skipped"] for row in rows if "skipped" in row]
    quick = info.get("quick", measured[0]["quick"] if measured else False)
    versions = ", ".join(f"{name} {version}" for name, version in info.get("versions", {}).items())
    lines = [
        "## Peers",
        "",
        harness.measured("peers", quick, versions)
        + " Every system ran in this one process; every variant ran "
        f"in every round, in a shuffled order; figures are medians (min–max across rounds). Turns: "
        f"{info.get('turn_rounds', '?')} rounds of {TURNS_PER_ROUND} consecutive turns per variant (a round's "
        "figure is the median of its turns), after 2 warm-up turns each; concurrent writers: "
        f"{info.get('writer_rounds', '?')} rounds on fresh stores. Ratios say how many times better ctxrt is: "
        "peer time / ctxrt time for turns and loads, ctxrt / peer throughput for writers.",
        "",
    ]
    for line in skipped:
        lines += [line, ""]
    pragmas = info.get("pragmas", {})
    if pragmas:
        lines += [
            "Durability: ctxrt `durability=\"sync\"` (an fsync'd LMDB commit per group commit). "
            + "; ".join(
                f"{PEERS[name][2]}: SQLite journal_mode={values['journal_mode']}, synchronous={values['synchronous']}"
                for name, values in pragmas.items()
            )
            + " (neither peer sets `synchronous`: this is SQLite's default, and in WAL mode FULL syncs the WAL at "
            "every commit).",
            "",
        ]
    if measured:
        lines += ["| measure | ctxrt | peer | ratio (ctxrt better by) | per-round ratio |", "|---|---|---|---|---|"]
        for row in measured:
            lines.append(
                f"| {row['measure']} | {_figure(row['ctxrt'], row['unit'])} "
                f"| {row['comparison_label']}: {_figure(row['comparison'], row['unit'])} "
                f"| {row['ratio']:,.1f}× ({row['ratio_means']}) | {row['paired_ratio']:,.1f}× |"
            )
        lines.append("")
    turns = info.get("turns", {})
    if turns:
        lines += [
            "Each system's parts of a turn, ms (median, min–max). ctxrt: append = `add_message`, compile = "
            "`compile` of everything (Passthrough), turn = both, load = `get_all_messages`, append + load = "
            "`add_message` + `get_all_messages`."
            + (" LangGraph: turn = `get_tuple` + append to `messages` + `put`, append = building the new "
               "checkpoint + `put`, load = `get_tuple`." if "langgraph" in info.get("peers", []) else "")
            + (" SQLiteSession: append = `add_items`, turn = append + `get_items`, load = `get_items`."
               if "agents" in info.get("peers", []) else ""),
            "",
            "| system @ messages | append | compile | turn | load | append + load |",
            "|---|---|---|---|---|---|",
        ]
        for key, parts in turns.items():
            cells = [_figure(parts[p], "") if p in parts else "–"
                     for p in ("append", "compile", "turn", "load", "plain turn")]
            lines.append(f"| {key} | " + " | ".join(cells) + " |")
        lines.append("")
    writers = info.get("writers", {})
    if writers:
        lines += ["Concurrent writers, appends/s (median, min–max): "
                  + "; ".join(f"{key}: {_figure(value, '')}" for key, value in writers.items()) + ".", ""]
    builds = info.get("build_s", {})
    if builds:
        lines += ["Building the histories (not measured as figures), s: "
                  + "; ".join(f"{key}: {seconds:.1f}" for key, seconds in builds.items())
                  + ". ctxrt built with durability \"os\" and 20 concurrent adders, then reopened \"sync\"; "
                  "LangGraph with one checkpoint holding every message; SQLiteSession with one `add_items`.", ""]
    present = info.get("peers", [])
    notes = []
    if "langgraph" in present:
        notes.append(
            "LangGraph's checkpointer stores the whole `messages` channel in every checkpoint, so each append "
            "rewrites the history; its concurrent writers use `AsyncSqliteSaver` (aiosqlite, the same package), "
            "since `SqliteSaver` is synchronous.")
    if "agents" in present:
        notes.append(
            "SQLiteSession runs each call in a worker thread (`asyncio.to_thread`) under a per-file lock; its "
            "writer tasks are asyncio tasks on one event-loop thread.")
    if present:
        notes.append("Peers store plain dicts; LangChain message objects would cost LangGraph more.")
    notes.append(
        "Every system writes to the same disk in turn, so a durable commit can pay for flushes the one "
        "before it left; durable figures on a shared host vary by several times between rounds (see the ranges).")
    lines.append("Notes: " + " ".join(notes))
    return "\n".join(lines) + "\n"


main = harness.entry("peers", __doc__, run, to_markdown, RESULTS_PATH,
                     quick_help="fewer rounds and fewer appends per writer")


if __name__ == "__main__":
    raise SystemExit(main())
