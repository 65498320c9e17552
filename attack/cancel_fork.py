"""Concurrent forks of one namespace by many managers, cancelled (or interrupted by a real SIGINT)
after every number of task steps, beside an edit, an append and compiles of the parent.

After each round every branch then alive is compiled by the managers that moved there and by new
ones (three readers), each strict, each equal to what a fresh read-only runtime compiles; every
slot cache of the runtime holds what the store holds, and each copy entry it keeps is of its own
message (no half-made cache, no entry of another message).

usage: python attack/cancel_fork.py cancel|sigint ROUNDS_MAX
"""

from __future__ import annotations

import signal
import sys
import tempfile
from pathlib import Path

import trio
import trio.testing

import ctxrt
from ctxrt import Budget, Text
import ctxrt.namespace.machine as machine
from ctxrt.testing import codec

_build = machine.build_compile_result
machine.build_compile_result = lambda *a, **k: _build(*a, **{**k, "strict": True})

BUDGET = Budget(max_tokens=100_000, reserve_for_response=0)
READERS = {"n0": None, "na": "alice", "nb": "bob"}


def shape(result: ctxrt.CompileResult) -> object:
    return ([(m.participant, m.content, m.cache_breakpoint) for m in result.messages],
            [tuple((s.kind, s.id, s.complete) for s in row) for row in result.provenance.messages])


class Steps(trio.abc.Instrument):
    """Does ``act`` once, after the ``at``-th task step from now (any task's)."""

    def __init__(self, at: int, act) -> None:  # type: ignore[no-untyped-def]
        self.left, self.act, self.done = at, act, False

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        self.left -= 1
        if self.left == 0 and not self.done:
            self.done = True
            self.act()


async def fork_and_compile(manager: ctxrt.ContextManager, name: str) -> None:
    await manager.fork(name)
    await manager.compile(BUDGET)
    await manager.add_message("user", f"on {name}")
    await manager.compile(BUDGET)


async def reference(path: Path, keys: list[tuple[str, str]]) -> dict[tuple[str, str], object]:
    out = {}
    async with ctxrt.open_runtime(path, readonly=True) as ro:
        for ns, branch in keys:
            m = await ro.open(ns, branch=branch, view_reader=READERS[ns])
            out[(ns, branch)] = shape(await m.compile(BUDGET))
            await m.aclose()
    return out


def check_caches(rt: ctxrt.Runtime) -> int:
    checked = 0
    for cache in rt.slots.caches():
        held = cache.current()
        stored = [codec.message_from_json(i.data, sequence=i.sequence, store=rt.engine.data_path)
                  for i in rt.engine.read_items(cache.state, cache.branch_id)]
        assert [(m.sequence, m.content) == (s.sequence, s.content) or (m.sequence == s.sequence)
                for m, s in zip(held, stored)] and len(held) == len(stored), (cache.state, cache.branch_id)
        assert [m.sequence for m in held] == [s.sequence for s in stored]
        for key, entry in cache.copies._table.values():  # type: ignore[attr-defined]
            assert entry.content is key.content and entry.source_ids == (key.id,), (cache.branch_id, key.id)
        for reader, own in cache.readers.items():
            for key, entry in own.copies._table.values():  # type: ignore[attr-defined]
                assert entry.content is key.content and entry.source_ids == (key.id,), (reader, key.id)
        checked += 1
    return checked


async def main() -> None:
    mode, rounds = sys.argv[1], int(sys.argv[2])
    stats = {"rounds": 0, "interrupted": 0, "branches compiled": 0, "caches checked": 0, "forks made": 0}
    with tempfile.TemporaryDirectory(prefix="attfork-cancel-") as root:
        path = Path(root)
        async with ctxrt.open_runtime(path) as rt:
            keeper = await rt.open("n0")
            ids = []
            for k in range(30):
                content: object = f"m{k}" if k % 3 else [Text(f"m{k}"), Text(f"for alice {k}", audience=("alice",))]
                ids.append(await keeper.add_message("user", content))
            calm = 0
            for at in range(1, rounds + 1):
                forkers = [await rt.open("na", view_reader="alice") for _ in range(4)]
                others = [await rt.open("nb", view_reader="bob")]
                for m in forkers + others + [keeper]:
                    await m.compile(BUDGET)
                names = [f"r{at}-{i}" for i in range(len(forkers))]
                interrupted = False
                with trio.CancelScope() as scope:
                    act = scope.cancel if mode == "cancel" else (lambda: signal.raise_signal(signal.SIGINT))
                    instrument = Steps(at, act)
                    trio.lowlevel.add_instrument(instrument)
                    try:
                        async with trio.open_nursery() as nursery:
                            for m, name in zip(forkers, names):
                                nursery.start_soon(fork_and_compile, m, name)
                            nursery.start_soon(keeper.edit_message, ids[at % len(ids)], f"edit {at}")
                            nursery.start_soon(keeper.add_message, "user", f"add {at}")
                            for m in others:
                                nursery.start_soon(m.compile, BUDGET)
                    except KeyboardInterrupt:
                        interrupted = True
                    except BaseExceptionGroup as group:
                        interrupts, rest = group.split(KeyboardInterrupt)
                        if interrupts is None or rest is not None and rest.subgroup(
                                lambda e: not isinstance(e, (BaseExceptionGroup, trio.Cancelled))) is not None:
                            raise
                        interrupted = True
                    finally:
                        trio.lowlevel.remove_instrument(instrument)
                    if instrument.done and not interrupted:  # raised after the forks were done: take it here
                        for _ in range(5):
                            try:
                                await trio.lowlevel.checkpoint()
                            except KeyboardInterrupt:
                                break
                interrupted = interrupted or scope.cancelled_caught
                # A write cancelled after it was sent may still land (api.md): let every one land
                # before reading, behind a write of the keeper's through the same store actor.
                await trio.testing.wait_all_tasks_blocked()
                await keeper.add_message("user", f"barrier {at}")
                await trio.testing.wait_all_tasks_blocked()
                stats["interrupted"] += interrupted
                calm = 0 if interrupted else calm + 1
                # What each manager reads now, and new managers on every branch.
                branches = [b.name for b in await rt.list_branches()]
                stats["forks made"] += sum(name in branches for name in names)
                keys = sorted({(ns, b) for ns in READERS for b in branches})
                mine = {}
                fresh = []
                for ns, b in keys:
                    m = await rt.open(ns, branch=b, view_reader=READERS[ns])
                    fresh.append(m)
                    mine[(ns, b)] = shape(await m.compile(BUDGET))
                for m in forkers + others + [keeper]:
                    got = shape(await m.compile(BUDGET))
                    assert got == mine[(m.namespace, m.branch)], ("a moved manager", m.branch)
                ref = await reference(path, keys)
                for key in keys:
                    if mine[key] != ref[key]:
                        cache = rt.slots.cache("messages", rt.engine.branch(key[1]).id)
                        head = cache.head_now()
                        print("MISMATCH round", at, key, "mine", len(mine[key][0]), "ref", len(ref[key][0]))
                        print(" cache", cache.figures(), "users", cache.users)
                        print(" head", head)
                        print(" branch", rt.engine.branch(key[1]))
                        print(" held tail", [m.sequence for m in cache.messages[-3:]])
                        m = next(f for f in fresh if (f.namespace, f.branch) == key)
                        print(" again", len((await m.compile(BUDGET)).messages))
                        other = await rt.open("n0x", branch=key[1])
                        print(" another namespace, no reader", len((await other.compile(BUDGET)).messages))
                        own = cache.readers.get(None)
                        if own is not None:
                            w = own.listing.window(1)
                            print(" None's listing", len(w.messages), w.messages[-1].sequence, own.users, own.listing._newest, own.listing._stamp)
                        print(" snapshot", await m.inspect())
                        raise SystemExit(1)
                stats["branches compiled"] += len(keys)
                stats["caches checked"] += check_caches(rt)
                for m in forkers + others + fresh:
                    await m.aclose()
                for b in branches:
                    if b != "main":
                        await rt.delete_branch(b)
                stats["rounds"] += 1
                if calm >= 5:
                    break
    print("ok", mode, stats)


trio.run(main, restrict_keyboard_interrupt_to_checkpoints=True)
