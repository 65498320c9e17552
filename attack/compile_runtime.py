"""Through the public API: long windows (past the 64 entries _head looks back over), random edits
that keep the entry count (at the newest, the first, 63/64/65 from the newest, anywhere; several
between compiles; an edit plus a removal plus an append; edits that change a message's size;
edits of tool_use / tool_result messages keeping their ids; audience changes; compression
summaries landing), on the four strategies. Every compile runs strict (the memo's result checked
against the reference compile) and is compared with a fresh read-only runtime's compile."""
from __future__ import annotations
import functools, random, sys, tempfile
from pathlib import Path
from typing import Any
import trio
import ctxrt
import ctxrt.namespace.machine as machine
from ctxrt.testing import ScriptedModel

machine.build_compile_result = functools.partial(machine.build_compile_result, strict=True)

READER = "Claude"
NS = "att"
COMPRESSING = {"target_chunk_tokens": 40, "recent_window_tokens": 3000, "head_window_tokens": 30,
               "merge_threshold": 2, "summary_target_tokens": 10, "l1_holdback_chunks": 0}
CONFIGS = {
    "passthrough": lambda cap: ctxrt.Passthrough(),
    "windowed": lambda cap: ctxrt.WindowedPassthrough(max_message_tokens=cap),
    "autobiographical": lambda cap: ctxrt.Autobiographical("m", max_message_tokens=cap, **COMPRESSING),
    "knowledge": lambda cap: ctxrt.Knowledge("m", max_message_tokens=cap, **COMPRESSING),
}
WORDS = ["alpha", "beta", "gamma", "delta", "x" * 40, "1234567", "def f(): pass"]

def words(rng: random.Random, lo: int = 1, hi: int = 8) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))

async def compiled(cm: Any, budget: Any) -> Any:
    try:
        return await cm.compile(budget)
    except ctxrt.OverBudgetError as error:
        return ("over budget", str(error))

async def run(name: str, seed: int, store: Path, steps: int) -> int:
    rng = random.Random(seed)
    cap = rng.choice([0, 0, 40])
    config = CONFIGS[name](cap)
    model = ScriptedModel(lambda reply: f"summary {len(reply.messages)}")
    budget = ctxrt.Budget(max_tokens=rng.choice([4000, 20000, 200000]), reserve_for_response=0)
    compares = 0
    async with ctxrt.open_runtime(store, model=model, durability="os") as runtime:
        cm = await runtime.open(NS, strategy=config, view_reader=READER)
        ids: list[str] = []
        tools: dict[str, str] = {}  # message id -> its kind ("use"/"result") for tool messages
        calls = 0
        for k in range(rng.choice([66, 80, 130])):
            if rng.random() < 0.15:
                calls += 1
                ids.append(await cm.add_message(READER, [{"type": "text", "text": words(rng)},
                    {"type": "tool_use", "id": f"t{calls}", "name": "search", "input": {"q": words(rng)}}]))
                tools[ids[-1]] = f"use t{calls}"
                ids.append(await cm.add_message("user", [{"type": "tool_result", "tool_use_id": f"t{calls}", "content": words(rng)}]))
                tools[ids[-1]] = f"result t{calls}"
            else:
                ids.append(await cm.add_message(rng.choice(["user", READER, "bob"]), words(rng)))
        await compiled(cm, budget)
        for step in range(steps):
            for _ in range(rng.choice([1, 1, 2, 3])):
                n = len(ids)
                where = rng.choice(["newest", "first", "63", "64", "65", "any", "any"])
                at = {"newest": n - 1, "first": 0, "63": n - 63, "64": n - 64, "65": n - 65}.get(where, rng.randrange(n))
                at = max(0, min(n - 1, at))
                target = ids[at]
                op = rng.choice(["edit", "edit", "grow", "audience", "editremove", "tick"])
                try:
                    if target in tools:
                        kind, tid = tools[target].split()
                        if kind == "use":
                            await cm.edit_message(target, [{"type": "text", "text": words(rng, 1, 30)},
                                {"type": "tool_use", "id": tid, "name": "search", "input": {"q": words(rng)}}])
                        else:
                            await cm.edit_message(target, [{"type": "tool_result", "tool_use_id": tid, "content": words(rng, 1, 30)}])
                    elif op == "edit":
                        await cm.edit_message(target, words(rng))
                    elif op == "grow":  # the size changes a lot: the window may move
                        await cm.edit_message(target, words(rng, 40, 200))
                    elif op == "audience":
                        aud = rng.choice([READER, "bob"])
                        await cm.edit_message(target, [{"type": "text", "text": words(rng), "audience": [aud]},
                                                       {"type": "text", "text": words(rng)}] if rng.random() < 0.5 else
                                              [{"type": "text", "text": words(rng), "audience": [aud]}])
                    elif op == "editremove":
                        await cm.edit_message(target, words(rng))
                        victim = rng.choice([i for i in ids if i not in tools] or [None])
                        if victim is not None:
                            await cm.remove_message(victim)
                            ids.remove(victim)
                            ids.append(await cm.add_message("user", words(rng)))
                    elif op == "tick":
                        await cm.tick()
                except (ctxrt.NarrowingRefusedError,) as e:
                    pass
            if rng.random() < 0.2:
                await cm.wait_ready()
            kept = await compiled(cm, budget)
            async with ctxrt.open_runtime(store, readonly=True) as fresh:
                fm = await fresh.open(NS, strategy=config, view_reader=READER)
                afresh = await compiled(fm, budget)
                fresh_stats = fm.render_stats()
            if isinstance(kept, tuple) or isinstance(afresh, tuple):
                assert kept == afresh, (name, seed, step)
                continue
            assert kept.messages == afresh.messages, (name, seed, step)
            assert [kept.provenance.messages, kept.provenance.completeness] == [afresh.provenance.messages, afresh.provenance.completeness], (name, seed, step)
            assert dict(kept.provenance.raw_bodies) == dict(afresh.provenance.raw_bodies), (name, seed, step)
            assert cm.render_stats() == fresh_stats, (name, seed, step)
            compares += 1
    return compares

if __name__ == "__main__":
    names = sys.argv[1].split(",")
    lo, hi, steps = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    total = fails = 0
    for name in names:
        for seed in range(lo, hi):
            with tempfile.TemporaryDirectory() as d:
                try:
                    total += trio.run(run, name, seed, Path(d) / "store", steps)
                except BaseException as e:  # noqa
                    fails += 1
                    print("FAIL", name, seed, type(e).__name__, repr(e)[:500], flush=True)
    print("compared", total, "fails", fails)
