"""Forks' inherited copy entries against a fresh runtime (docs/behaviours.md P17, S1, K2, A3).

A fork's slot cache starts with its parent's messages and their copy entries, and every reader
view of a slot shares the entries of the messages it sees as stored. Whatever a host does after
(edits and removals on either side, a fork of the fork, a branch at an old message, managers
switching back and forth), each branch's compile for each reader must be what a read-only runtime
opened afresh on the same store compiles (no entry of one branch's or one reader's message shows
in another's), and no reader's compile holds a line for another reader. Store-backed, public API.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import trio

import ctxrt
from ctxrt import Budget, Text

GUARD_S = 60
READERS = {"plain": None, "ann": "ann", "bob": "bob"}


def shape(result: ctxrt.CompileResult) -> object:
    return ([(m.participant, m.content, m.cache_breakpoint) for m in result.messages],
            [tuple((s.kind, s.id, s.complete) for s in row) for row in result.provenance.messages])


def lines(result: ctxrt.CompileResult) -> list[str]:
    return [block.text for message in result.messages for block in message.content if isinstance(block, Text)]


def content(rng: random.Random, tag: str) -> list[Text]:
    blocks = [Text(f"line {tag}")]
    for reader in ("ann", "bob"):
        if rng.random() < 0.3:
            blocks.append(Text(f"for {reader} {tag}", audience=(reader,)))
    return blocks


async def fresh_compiles(path: Path, keys: list[tuple[str, str]], budget: Budget) -> dict[tuple[str, str], object]:
    async with ctxrt.open_runtime(path, readonly=True) as fresh:
        found = {}
        for namespace, branch in keys:
            manager = await fresh.open(namespace, branch=branch, view_reader=READERS[namespace])
            found[(namespace, branch)] = shape(await manager.compile(budget))
            await manager.aclose()
        return found


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
async def test_every_branchs_compile_for_every_reader_is_a_fresh_runtimes_through_forks(
    store_path: Path, seed: int,
) -> None:
    """P17, S1, K2, A3: random adds (some with a line for one reader), edits, removals, forks (of
    forks), branches at old messages and switches back and forth, by managers of three readers
    over one slot; after each, every manager's compile equals a fresh read-only runtime's for its
    namespace and branch, at a budget holding everything or a few messages, and holds no line
    for another reader."""
    rng = random.Random(seed)
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store_path) as rt:
            managers = {(ns, "main"): await rt.open(ns, view_reader=reader) for ns, reader in READERS.items()}
            for k in range(5):
                await managers[("plain", "main")].add_message("user", content(rng, f"s{k}"))
            made = 0
            for step in range(30):
                key = rng.choice(sorted(managers))
                manager, (namespace, branch) = managers[key], key
                held = await manager.get_all_messages()
                action = rng.choice(["add", "add", "edit", "remove", "fork", "branch_at", "switch"])
                if action == "add" or not held:
                    await manager.add_message(rng.choice(["user", "Claude"]), content(rng, str(step)))
                elif action == "edit":
                    try:
                        await manager.edit_message(rng.choice(held).id, content(rng, f"e{step}"))
                    except ctxrt.NarrowingRefusedError:
                        pass  # a refused edit changes nothing
                elif action == "remove" and len(held) > 3:
                    await manager.remove_message(rng.choice(held).id)
                elif action in ("fork", "branch_at"):
                    made += 1
                    if action == "fork":
                        name = await manager.fork(f"f{made}")
                        managers[(namespace, name)] = managers.pop(key)
                    else:
                        name = await manager.branch_at(rng.choice(held).id, f"b{made}")
                    for ns, reader in READERS.items():
                        if (ns, name) not in managers:
                            managers[(ns, name)] = await rt.open(ns, branch=name, view_reader=reader)
                elif action == "switch":
                    there = sorted({b for (ns, b) in managers if ns == namespace and b != branch})
                    if there:
                        target = rng.choice(there)
                        await manager.switch_branch(target)
                        await manager.compile(Budget(max_tokens=100_000, reserve_for_response=0))
                        await manager.switch_branch(branch)
                budget = rng.choice([Budget(max_tokens=100_000, reserve_for_response=0),
                                     Budget(max_tokens=rng.randrange(20, 200), reserve_for_response=0)])
                ours = {}
                for (ns, b), each in sorted(managers.items()):
                    result = await each.compile(budget)
                    others = [r for r in ("ann", "bob") if r != READERS[ns]]
                    assert not [line for line in lines(result) if any(f"for {r}" in line for r in others)]
                    ours[(ns, b)] = shape(result)
                assert ours == await fresh_compiles(store_path, sorted(managers), budget), (step, action)
            for manager in managers.values():
                await manager.aclose()
