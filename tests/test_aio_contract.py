"""The contract's key properties under both hosts: trio (``ctxrt.open_runtime``) and asyncio
(``ctxrt.aio.open_runtime``, issue 23). Each body is written once against the public API and run
by the ``host`` fixture (tests/aio_hosts.py) in a fresh loop of each kind.

Determinism rules: real LMDB stores in temp dirs; hypothesis examples are derandomised (the
``ctxrt`` profile); the cancellation sweep cancels the caller after every count of loop passes
from 0 to ``SWEEP``; nothing waits on the clock (a guard timeout bounds every run).
"""

from __future__ import annotations

import os
import random
import re
import select
import signal
import subprocess
import sys
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ctxrt
import aio_writer
from aio_hosts import GUARD_S, HOSTS, Host, host  # noqa: F401 - the fixture
from ctxrt.testing import ScriptedModel

BIG = ctxrt.Budget(max_tokens=10_000_000, reserve_for_response=0)
READERS = ("ann", "bob")
MARKER = re.compile(r"AUD\[([a-z,]*)\]#(\d+)")
SWEEP = 40  # loop passes: past the longest open here, so the sweep ends with opens that completed


def marked(audience: tuple[str, ...] | None, number: int) -> str:
    return f"line AUD[{','.join(audience or ())}]#{number} said"


def foreign(text: str, reader: str | None) -> list[str]:
    """The markers in ``text`` whose block's audience doesn't name ``reader``."""
    return [m.group(0) for m in MARKER.finditer(text) if m.group(1) and reader not in m.group(1).split(",")]


def echo(request: ctxrt.ModelRequest) -> str:
    """A summary holding every marker the request showed: what compression read shows in what it wrote."""
    text = " ".join(getattr(b, "text", "") for m in request.messages for b in m.content)
    return "SUMMARY " + " ".join(dict.fromkeys(m.group(0) for m in MARKER.finditer(text)))


audiences = st.one_of(st.none(), st.lists(st.sampled_from(READERS), min_size=1, max_size=2, unique=True).map(tuple))
operations = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.lists(audiences, min_size=1, max_size=3)),
        st.tuples(st.just("edit"), st.integers(0, 50), audiences),
        st.tuples(st.just("remove"), st.integers(0, 50)),
        st.tuples(st.just("tick"), st.none()),
        st.tuples(st.just("compile"), st.none()),
    ),
    min_size=4, max_size=16,
)


@pytest.mark.parametrize("host_name", ["trio", "asyncio"])
@settings(max_examples=20)
@given(steps=operations)
def test_no_compile_summary_or_model_request_holds_a_block_its_reader_is_not_named_for(
    host_name: str, steps: list[tuple[Any, ...]]
) -> None:
    """Random adds, audience edits, removals, ticks and compiles for ann (Autobiographical, so
    summaries), bob and a manager with no reader (Passthrough): nothing reaches a reader it isn't
    named for, and a Passthrough reader's compile holds every block it is named for (A2-A5), under
    trio and asyncio alike (the smaller form of tests/spec/test_privacy_stateful.py) (H5)."""
    runner = HOSTS[host_name]
    models = {reader: ScriptedModel(echo) for reader in READERS}
    numbers = iter(range(1, 10_000))

    async def body(path: str) -> None:
        autobiographical = ctxrt.Autobiographical("m", target_chunk_tokens=40, recent_window_tokens=40,
                                                  head_window_tokens=0, merge_threshold=3, l1_holdback_chunks=0)
        async with runner.open_runtime(path, durability="os") as rt:
            ann = await rt.open("agents/ann", view_reader="ann", strategy=autobiographical, model=models["ann"])
            bob = await rt.open("agents/bob", view_reader="bob", model=models["bob"])
            nobody = await rt.open("agents/nobody")
            managers = {"ann": ann, "bob": bob, None: nobody}
            current: dict[str, list[tuple[tuple[str, ...] | None, str]]] = {}  # id -> its blocks as stored
            edited: set[str] = set()

            for kind, *args in steps:
                ids = sorted(current, key=int)
                if kind == "add":
                    blocks = [(audience, marked(audience, next(numbers))) for audience in args[0]]
                    content = [{"type": "text", "text": text, **({"audience": list(a)} if a else {})} for a, text in blocks]
                    current[await ann.add_message("user", content)] = blocks
                elif kind == "edit" and ids:
                    message_id = ids[args[0] % len(ids)]
                    blocks = [(args[1], marked(args[1], next(numbers)))]
                    content = [{"type": "text", "text": blocks[0][1], **({"audience": list(args[1])} if args[1] else {})}]
                    try:
                        await ann.edit_message(message_id, content)
                        current[message_id] = blocks
                        edited.add(message_id)
                    except ctxrt.NarrowingRefusedError:
                        pass  # compression read it: refused, and the message is unchanged
                elif kind == "remove" and ids:
                    message_id = ids[args[0] % len(ids)]
                    await bob.remove_message(message_id)
                    del current[message_id]
                elif kind == "tick":
                    await ann.tick()
                for reader, manager in managers.items():
                    blocks = [b for m in (await manager.compile(BIG)).messages for b in m.content]
                    assert all(getattr(b, "audience", None) is None for b in blocks)
                    text = repr(blocks)
                    assert not foreign(text, reader), (runner.name, reader, foreign(text, reader))
                    # Passthrough: every block the reader is named for, raw. Edited messages aside: a reader's
                    # view that compiled while a block was hidden from it misses that block once an edit
                    # widens it, under trio as under asyncio (a fault of the views, reported; not the front's).
                    if reader != "ann":
                        expected = {t for i, stored in current.items() if i not in edited
                                    for a, t in stored if a is None or reader in a}
                        assert all(t in text for t in expected), (runner.name, reader)
            for reader, model in models.items():
                for request in model.requests:
                    assert not foreign(repr(request.messages), reader), (runner.name, reader)

    with tempfile.TemporaryDirectory() as directory:
        runner.run(body, str(Path(directory) / "store"))


def test_a_cancelled_open_makes_no_manager_and_a_claim_that_landed_stands(host: Host, tmp_path: Path) -> None:
    """An open with a reader, its caller cancelled after every count of loop passes from 0 to
    SWEEP (a cancel scope under trio, ``Task.cancel`` under asyncio): either it returned a
    manager, or no manager is attached afterwards; the namespace records the reader or nothing,
    and another reader is refused exactly when it does; the runtime keeps serving (L4, C1, H5)."""
    outcomes: list[str] = []

    async def body() -> None:
        async with host.open_runtime(tmp_path / "store", durability="os") as rt:
            writer = await rt.open("writer")
            for passes in range(SWEEP + 1):
                namespace = f"swept/{passes}"
                kind, value = await host.cancelled_after(passes, partial(rt.open, namespace, view_reader="ann"))
                outcomes.append(kind)
                assert kind in ("returned", "cancelled"), (passes, kind, value)
                if kind == "returned":
                    await value.aclose()
                observer = await rt.open(namespace)  # compiles for whatever the namespace records
                assert (await observer.health()).managers == 1, f"{host.name}: a manager left attached after {passes}"
                # Read after the observer's turn, which comes after the cancelled open's: a claim it
                # sent may still have been committing when the cancel came.
                records = {info.namespace: info.reader for info in await rt.list_namespaces()}
                assert records.get(namespace) in ("ann", None), (passes, records.get(namespace))
                if kind == "returned":
                    assert records[namespace] == "ann", passes
                await observer.aclose()
                if records.get(namespace) == "ann":
                    with pytest.raises(ctxrt.ReaderConflictError):
                        await rt.open(namespace, view_reader="bob")
                else:
                    await (await rt.open(namespace, view_reader="bob")).aclose()
                message_id = await writer.add_message("user", f"still serving after {passes}")
                assert (await writer.get_message(message_id)) is not None

    host.run(body)
    assert outcomes[0] == "cancelled" and outcomes[-1] == "returned", outcomes


def test_a_subscription_delivers_every_change_once_in_order(host: Host, tmp_path: Path) -> None:
    """Concurrent appends by two managers, an edit and a removal reach a subscriber as Added,
    Edited and Removed, each once, in commit order, with the messages as stored (A7, H5)."""

    async def body() -> None:
        async with host.open_runtime(tmp_path / "store", durability="os") as rt:
            ann = await rt.open("agents/ann", view_reader="ann")
            bob = await rt.open("agents/bob", view_reader="bob")
            async with ann.subscribe() as events:

                async def append(manager: Any, who: str) -> list[str]:
                    return [await manager.add_message("user", f"{who} {n}") for n in range(15)]

                written = await host.gather(lambda: append(ann, "ann"), lambda: append(bob, "bob"))
                ids = sorted(written[0] + written[1], key=int)
                await bob.edit_message(ids[3], [{"type": "text", "text": "edited"}, {"type": "text", "text": "for bob",
                                                                                "audience": ["bob"]}])
                await ann.remove_message(ids[5])
                seen: list[Any] = []
                while len(seen) < len(ids) + 2:
                    seen.append(await events.receive())
            added = [e.message.id for e in seen if isinstance(e, ctxrt.Added)]
            assert added == ids
            assert [type(e).__name__ for e in seen[len(ids):]] == ["Edited", "Removed"]
            edited = seen[len(ids)]
            assert edited.message.id == ids[3] and edited.message.content[1].audience == ("bob",)  # as stored
            assert seen[-1].ids == (ids[5],)
            stored = [m.id for m in await ann.get_all_messages()]
            assert stored == [i for i in ids if i != ids[5]]

    host.run(body)


def test_each_refusal_reaches_the_caller_as_its_own_class(host: Host, tmp_path: Path) -> None:
    """Bad calls raise the documented class itself, the same under both hosts, never a group:
    nothing reaches an asyncio caller wrapped (api.md, Errors) (H1, H5)."""
    found: dict[str, type[BaseException]] = {}

    async def body() -> None:
        async with host.open_runtime(tmp_path / "store", durability="os") as rt:
            ann = await rt.open("agents/ann", view_reader="ann")
            first = await ann.add_message("user", "one")
            second = await ann.add_message("user", "two")
            closed = await rt.open("agents/closed")
            await closed.aclose()
            calls: dict[str, Any] = {
                "empty reader": lambda: rt.open("x", view_reader=""),
                "other reader": lambda: rt.open("agents/ann", view_reader="bob"),
                "bad content": lambda: ann.add_message("user", [{"type": "bogus"}]),
                "no message": lambda: ann.edit_message("999999", "x"),
                "no branch": lambda: ann.switch_branch("nope"),
                "branch taken": lambda: rt.create_branch("main"),
                "wrong order": lambda: ann.remove_messages(second, first),
                "not a budget": lambda: ann.compile("x"),
                "bad regex": lambda: ann.search_summaries(regex="("),
                "closed manager": lambda: closed.add_message("user", "x"),
                "second writer": lambda: _enter(host.open_runtime(tmp_path / "store")),
            }
            for name, call in calls.items():
                try:
                    await call()
                except BaseException as exc:  # noqa: BLE001 - recorded, then compared
                    found[name] = type(exc)
                else:
                    found[name] = type(None)

    host.run(body)
    assert found == {
        "empty reader": ctxrt.MalformedContentError, "other reader": ctxrt.ReaderConflictError,
        "bad content": ctxrt.MalformedContentError, "no message": ctxrt.MessageNotFoundError,
        "no branch": ctxrt.BranchNotFoundError, "branch taken": ctxrt.BranchExistsError,
        "wrong order": ValueError, "not a budget": TypeError, "bad regex": re.error,
        "closed manager": ctxrt.ManagerClosedError, "second writer": ctxrt.StoreLockedError,
    }


async def _enter(block: Any) -> None:
    async with block:
        pass


WRITER = Path(__file__).with_name("aio_writer.py")


def _acks_until(child: subprocess.Popen[bytes], count: int, acks: dict[str, tuple[int, int, int]]) -> None:
    """Read ack lines from the writer until ``count`` more arrived (or it ended)."""
    assert child.stdout is not None
    wanted = len(acks) + count
    while len(acks) < wanted:
        ready, _, _ = select.select([child.stdout], [], [], GUARD_S)
        assert ready, "the writer stopped acknowledging"
        line = child.stdout.readline().decode()
        if not line:
            pytest.fail(f"the writer ended: {child.wait()} {child.stderr.read().decode() if child.stderr else ''}")
        kind, message_id, *identity = line.split()
        assert kind == "ack" and message_id not in acks, line
        acks[message_id] = (int(identity[0]), int(identity[1]), int(identity[2]))


@pytest.mark.soak
def test_a_writer_killed_with_sigkill_loses_no_acknowledged_message(
    host: Host, tmp_path: Path, soak_scale: Any
) -> None:
    """A writer process appending from 4 tasks through the public API, killed with SIGKILL after
    a random number of acknowledged appends, loses none of them and leaves no torn or extra write
    beyond one unacknowledged append per task, under trio and asyncio (K3). The seed is in every
    failure message; ``CTXRT_CRASH_SEED`` replays a run (H5)."""
    seed = int(os.environ.get("CTXRT_CRASH_SEED") or random.randrange(1 << 32))
    rng = random.Random(seed)
    store = tmp_path / "store"
    acks: dict[str, tuple[int, int, int]] = {}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(WRITER.parent), os.environ.get("PYTHONPATH", "")])}
    for round_ in range(soak_scale(3, 30)):
        child = subprocess.Popen([sys.executable, str(WRITER), host.name, str(store), str(round_), "4"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        try:
            _acks_until(child, rng.randrange(5, 150), acks)
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
        assert child.stdout is not None and child.stderr is not None
        for line in child.stdout.read().decode().splitlines():  # acks written before the kill, still unread
            if line.startswith("ack "):
                _, message_id, *identity = line.split()
                acks[message_id] = (int(identity[0]), int(identity[1]), int(identity[2]))
        child.stdout.close()
        child.stderr.close()

        async def check() -> None:
            async with host.open_runtime(store) as rt:  # the lock is free again
                stored = {m.id: m.content[0].text for m in await (await rt.open("writers/0")).get_all_messages()}
            context = f"seed {seed}, round {round_}"
            lost = [i for i in acks if stored.get(i) != aio_writer.text(*acks[i])]
            assert not lost, f"{context}: acknowledged messages lost: {lost[:10]}"
            counters: dict[tuple[int, int], list[int]] = {}
            for body in stored.values():
                fields = dict(part.split("=") for part in body.split())
                counters.setdefault((int(fields["round"]), int(fields["task"])), []).append(int(fields["counter"]))
            acked: dict[tuple[int, int], int] = {}
            for identity in acks.values():
                acked[identity[:2]] = acked.get(identity[:2], 0) + 1
            for key, found in counters.items():
                assert found == list(range(len(found))), f"{context}: task {key} has gaps or duplicates"
                assert len(found) - acked.get(key, 0) in (0, 1), f"{context}: task {key} has unacknowledged extras"

        host.run(check)
