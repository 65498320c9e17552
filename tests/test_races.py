"""Requests that interleave at an await: each is judged in the namespace actor's turn order.

Determinism: real LMDB in a temp dir, the real clock under ``trio.fail_after``; the interleavings
are forced by strategies that wait inside the actor's turn.
"""

from pathlib import Path
from typing import Any

import trio

import ctxrt
from ctxrt.strategies.base import Entry, SelectOptions, Strategy

GUARD_S = 20


async def test_an_edit_waiting_its_turn_is_judged_against_the_message_as_it_is_then(tmp_path: Path) -> None:
    """D1, D5: a widening lands first, so the edit queued behind it, which would re-narrow, is refused."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "s") as rt:
            alice = await rt.open("agents/alice", view_reader="alice")
            target = await alice.add_message("user", [{"type": "text", "text": "secret", "audience": ["alice"]}])
            outcomes: dict[str, BaseException | None] = {}

            async def edit(name: str, content: list[dict[str, Any]]) -> None:
                try:
                    await alice.edit_message(target, content)
                    outcomes[name] = None
                except ctxrt.NarrowingRefusedError as exc:
                    outcomes[name] = exc

            async with trio.open_nursery() as nursery:
                async with alice._actor.lock:  # both read the message, then queue for the turn, in this order
                    nursery.start_soon(edit, "widen", [{"type": "text", "text": "secret"}])
                    await trio.sleep(0.01)
                    nursery.start_soon(edit, "keep", [{"type": "text", "text": "secret", "audience": ["alice"]}])
                    await trio.sleep(0.01)
            stored = await alice.get_message(target)
            assert stored is not None and stored.content[0].audience is None  # seen by every reader, as widened
            assert outcomes["widen"] is None and isinstance(outcomes["keep"], ctxrt.NarrowingRefusedError)


class SlowStart(Strategy):
    """Passthrough that waits inside initialize and records what on_new_message is handed."""

    name = "slow-start"
    marks_compression_reads = True

    def __init__(self, release: trio.Event) -> None:
        self.release = release
        self.handed: list[str] = []

    async def initialize(self, ctx: Any) -> None:
        await self.release.wait()

    async def on_new_message(self, message: ctxrt.Message, ctx: Any) -> None:
        self.handed.append(message.id)

    async def select(self, view: Any, budget: Any, options: SelectOptions) -> list[Entry]:
        return [Entry(m.participant, m.content, (m.id,)) for m in view.get_all()]


async def test_messages_appended_while_a_strategy_starts_still_reach_on_new_message(tmp_path: Path) -> None:
    """A4, T3: what lands during initialize's awaits is handed to on_new_message afterwards, not lost."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "s") as rt:
            writer = await rt.open("writer")
            before = await writer.add_message("user", "before the open")
            release = trio.Event()
            strategy = SlowStart(release)
            opened: list[ctxrt.ContextManager] = []

            async def open_slow() -> None:
                opened.append(await rt.open("slow", strategy=strategy))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(open_slow)
                await trio.sleep(0.05)  # the slow open is inside initialize now
                during = [await writer.add_message("user", f"during {i}") for i in range(3)]
                release.set()
            await opened[0].compile()
            assert set(during) <= set(strategy.handed)
            assert before not in strategy.handed  # initialize read it: not handed again


class SlowSelect(Strategy):
    name = "slow-select"
    marks_compression_reads = True

    def __init__(self) -> None:
        self.entered = trio.Event()
        self.release = trio.Event()

    async def select(self, view: Any, budget: Any, options: SelectOptions) -> list[Entry]:
        self.entered.set()
        await self.release.wait()  # holds the actor's turn
        return []


async def test_an_open_whose_actor_stops_while_it_waits_starts_a_fresh_one(tmp_path: Path) -> None:
    """C2, L3: the last manager leaving while another open waits never leaves that open on a dead actor."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "s") as rt:
            strategy = SlowSelect()
            first = await rt.open("ns", strategy=strategy)
            second: list[ctxrt.ContextManager] = []

            async def compile_slowly() -> None:
                try:  # a compile already in its turn finishes with what it read, or says it was closed
                    await first.compile()
                except ctxrt.ManagerClosedError:
                    pass

            async def open_again() -> None:
                second.append(await rt.open("ns"))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(compile_slowly)
                await strategy.entered.wait()
                nursery.start_soon(open_again)  # waits for the turn the slow compile holds
                await trio.sleep(0.05)
                await first.aclose()  # the actor's last manager leaves: it stops
                strategy.release.set()
            manager = second[0]
            assert not manager._actor.stopped
            assert rt.statistics().namespace_actors == 1
            await manager.add_message("user", "still served")
            # The fresh actor runs this open's own config (Passthrough), not the stopped one's.
            assert [m.content[0].text for m in (await manager.compile()).messages] == ["still served"]
