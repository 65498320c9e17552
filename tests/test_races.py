"""Requests that race: each is judged in the namespace actor's turn order, whatever order the
callers' tasks run in.

Trio runs ready tasks in an order it deliberately varies, so each test starts the racing calls
together in every round of a loop and asserts what must hold in every order.
Determinism of outcome: real LMDB in a temp dir, the real clock under ``trio.fail_after``.
"""

from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
import trio

import ctxrt
from ctxrt import Entry, SelectOptions, Strategy

GUARD_S = 30
ROUNDS = 12


async def test_an_edit_is_judged_against_the_message_as_it_is_when_its_turn_comes(tmp_path: Path) -> None:
    """D1, D5: a widening and an edit that keeps the old audience race; whichever lands first, the
    message ends widened: the second is judged against the message as the first left it."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "s", durability="os") as rt:
            alice = await rt.open("agents/alice", view_reader="alice")
            for _ in range(ROUNDS):
                target = await alice.add_message("user", [{"type": "text", "text": "secret", "audience": ["alice"]}])
                outcomes: dict[str, BaseException | None] = {}

                async def edit(name: str, content: list[dict[str, Any]]) -> None:
                    try:
                        await alice.edit_message(target, content)
                        outcomes[name] = None
                    except ctxrt.NarrowingRefusedError as exc:
                        outcomes[name] = exc

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(edit, "widen", [{"type": "text", "text": "secret"}])
                    nursery.start_soon(edit, "keep", [{"type": "text", "text": "secret", "audience": ["alice"]}])
                stored = await alice.get_message(target)
                assert stored is not None and stored.content[0].audience is None  # widened, in every order
                assert outcomes["widen"] is None
                assert outcomes["keep"] is None or isinstance(outcomes["keep"], ctxrt.NarrowingRefusedError)


@pytest.mark.parametrize("where", ["lmdb", "postgres, one runtime", "postgres, two runtimes"])
async def test_concurrent_edits_from_two_namespaces_are_each_judged_against_the_other(
    tmp_path: Path, request: pytest.FixtureRequest, where: str
) -> None:
    """D1, D5, K4: ann's and bob's namespaces share the slot; message M is [x]. ann edits M to [x, y]
    while bob edits it to [x, y for bob]. Whichever lands first, the second is judged against the
    message the first left: bob's narrowing after ann's is refused, so y never hides from ann
    without a verdict; on PostgreSQL also when the two editors are two runtimes (processes)."""
    x = {"type": "text", "text": "x"}
    y, y_bob = {"type": "text", "text": "y"}, {"type": "text", "text": "y", "audience": ["bob"]}
    location = tmp_path / "s" if where == "lmdb" else request.getfixturevalue("pg_url")
    with trio.fail_after(GUARD_S * 2):
        async with AsyncExitStack() as stack:
            first = await stack.enter_async_context(ctxrt.open_runtime(location, durability="os"))
            second = (await stack.enter_async_context(ctxrt.open_runtime(location, durability="os"))
                      if where == "postgres, two runtimes" else first)
            ann = await first.open("ann", view_reader="ann")
            bob = await second.open("bob", view_reader="bob")
            orders = set()
            for _ in range(ROUNDS * 2):
                target = await ann.add_message("user", [x])
                outcomes: dict[str, str] = {}

                async def edit(name: str, manager: ctxrt.ContextManager, content: list[dict[str, Any]]) -> None:
                    try:
                        await manager.edit_message(target, content)  # noqa: B023 - this round's
                        outcomes[name] = "edited"  # noqa: B023 - this round's
                    except ctxrt.NarrowingRefusedError:
                        outcomes[name] = "refused"  # noqa: B023 - this round's

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(edit, "ann", ann, [x, y])
                    nursery.start_soon(edit, "bob", bob, [x, y_bob])
                stored = await ann.get_message(target)
                assert stored is not None
                assert [(b.text, b.audience) for b in stored.content] == [("x", None), ("y", None)], outcomes
                assert outcomes["ann"] == "edited"
                orders.add(outcomes["bob"])
            # Both orders happened: bob's edit first (then widened by ann's), and bob's refused after ann's.
            assert orders == {"edited", "refused"}, orders


class Recording(Strategy):
    """Passthrough that records what initialize read and what on_new_message is handed."""

    name = "recording"
    marks_compression_reads = True

    def __init__(self) -> None:
        self.read_at_start: list[str] = []
        self.handed: list[str] = []

    def initialize(self, ctx: Any) -> None:
        self.read_at_start = [m.id for m in ctx.view.get_all()]

    def on_new_message(self, message: ctxrt.Message, ctx: Any) -> None:
        self.handed.append(message.id)

    def select(self, view: Any, budget: Any, options: SelectOptions) -> list[Entry]:
        return [Entry(m.participant, m.content, (m.id,)) for m in view.get_all()]


async def test_messages_appended_around_a_strategys_start_reach_it_exactly_once(tmp_path: Path) -> None:
    """A4, T3: a message is either read by initialize or handed to on_new_message once, whatever
    races the open: never lost, never handed twice."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "s", durability="os") as rt:
            writer = await rt.open("writer")
            await writer.add_message("user", "before the opens")
            for round_ in range(ROUNDS):
                strategy = Recording()
                opened: list[ctxrt.ContextManager] = []
                written: list[str] = []

                async def open_it() -> None:
                    opened.append(await rt.open(f"ns-{round_}", strategy=strategy))

                async def write() -> None:
                    for i in range(3):
                        written.append(await writer.add_message("user", f"round {round_} message {i}"))

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(open_it)
                    nursery.start_soon(write)
                await opened[0].compile()
                every = [m.id for m in await writer.get_all_messages()]
                assert sorted(strategy.read_at_start + strategy.handed, key=int) == every
                await opened[0].aclose()


async def test_an_open_racing_the_last_manager_leaving_gets_a_live_actor(tmp_path: Path) -> None:
    """C2, L3: the last manager closing while another open is queued never leaves that open on a
    stopped actor: it attaches to a fresh one running its own config."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "s", durability="os") as rt:
            for round_ in range(ROUNDS):
                namespace = f"ns-{round_}"
                first = await rt.open(namespace, strategy=ctxrt.WindowedPassthrough())
                mid = await first.add_message("user", "first")
                second: list[ctxrt.ContextManager] = []

                async def open_again() -> None:
                    second.append(await rt.open(namespace))

                async def edit() -> None:
                    try:  # an edit in its turn finishes, or says its manager closed
                        await first.edit_message(mid, "edited")
                    except ctxrt.ManagerClosedError:
                        pass

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(edit)
                    nursery.start_soon(first.aclose)
                    nursery.start_soon(open_again)
                manager = second[0]
                assert (await manager.health()).managers == 1
                await manager.add_message("user", "still served")
                compiled = await manager.compile()
                assert compiled.messages[-1].content[0].text == "still served"
                await manager.aclose()
            assert rt.statistics().namespace_actors == 0
