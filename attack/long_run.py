"""A long run: is what the compile path keeps bounded? (the window bound, P17, memos.outgrown)

TURNS turns of: an add (some with an audience block), every 7th turn an edit of a recent
message, every 31st a removal, every 97th a fork that is compiled a few times and closed (its
slot cache seeded from the parent's), and a compile by each of four namespaces (no reader,
alice, bob, a windowed alice) at a budget that holds a few hundred messages. At checkpoints:
tracemalloc's current size, and the sizes of the tables a slot cache and its readers keep
against what they hold (``outgrown``: at most twice what is in use plus SLACK).

usage: python attack/long_run.py TURNS
"""

from __future__ import annotations

import random
import sys
import tempfile
import tracemalloc

import trio

import ctxrt
from ctxrt import Budget, Text
from ctxrt.testing import SLACK

BUDGET = Budget(max_tokens=6_000, reserve_for_response=0)


def tables(rt: ctxrt.Runtime) -> dict[str, int]:
    cache = rt.slots.cache("messages", rt.engine.branch("main").id)
    out = {"held": len(cache.messages), "slot copies": len(cache.copies)}
    for reader, own in cache.readers.items():
        out[f"{reader} own copies"] = len(own.copies._table)  # type: ignore[attr-defined]
        out[f"{reader} prepared"] = max(len(t) for t in own.compiled.prepared)  # type: ignore[attr-defined]
    return out


async def main() -> None:
    turns = int(sys.argv[1])
    rng = random.Random(7)
    tracemalloc.start()
    with tempfile.TemporaryDirectory(prefix="attfork-long-") as root:
        async with ctxrt.open_runtime(root, durability="os") as rt:
            mgrs = [await rt.open("n0"), await rt.open("na", view_reader="alice"),
                    await rt.open("nb", view_reader="bob"),
                    await rt.open("wa", view_reader="alice", strategy=ctxrt.WindowedPassthrough())]
            writer = mgrs[0]
            ids: list[str] = []
            worst: dict[str, float] = {}
            base = None
            for turn in range(1, turns + 1):
                content: object = f"turn {turn} " + "word " * rng.randrange(1, 20)
                if turn % 5 == 0:
                    content = [Text(f"turn {turn}"), Text(f"for alice {turn}", audience=("alice",))]
                ids.append(await writer.add_message("user" if turn % 2 else "Claude", content))
                if turn % 7 == 0:
                    await writer.edit_message(rng.choice(ids[-300:]), f"edited at {turn}")
                if turn % 31 == 0:
                    gone = ids.pop(rng.randrange(max(0, len(ids) - 300), len(ids)))
                    await writer.remove_message(gone)
                for m in mgrs:
                    await m.compile(BUDGET)
                if turn % 97 == 0:
                    fork = await rt.open("na", view_reader="alice")
                    await fork.fork(f"f{turn}")
                    for _ in range(3):
                        await fork.add_message("user", "on the fork")
                        await fork.compile(BUDGET)
                    await fork.aclose()
                    await rt.delete_branch(f"f{turn}")
                if turn % 500 == 0 or turn == turns:
                    t = tables(rt)
                    held = t["held"]
                    for name, size in t.items():
                        if name != "held":
                            worst[name] = max(worst.get(name, 0), size / (2 * held + SLACK))
                    current, peak = tracemalloc.get_traced_memory()
                    if base is None:
                        base = current
                    print(f"turn {turn}: {current / 1e6:.1f} MB (peak {peak / 1e6:.1f}), "
                          f"{(current - base) / max(1, held):.0f} B/held message past turn 500, {t}", flush=True)
            print("largest table / (2*held + SLACK):", {k: round(v, 3) for k, v in worst.items()})
            snapshot = tracemalloc.take_snapshot()
            for stat in snapshot.statistics("lineno")[:12]:
                print(stat)


trio.run(main)
