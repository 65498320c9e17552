"""Differential attack on forks' inherited copy entries (P17) and the window bound.

Random host operations on one LMDB store (adds with and without audience blocks, edits, removals,
forks, branch_at an old message, create_branch at a past sequence, derive, switch_branch back
and forth) by managers of three readers (None, alice, bob) over the shared slot; after every
operation every open manager compiles, strict (build_compile_result(strict=True): the memo's
compile against the reference's), and the result must equal what a fresh read-only runtime
opened on the same store compiles for that (namespace, branch, reader), and no compile holds a
line for another reader.

usage: python attack/fork_diff.py SEEDS STEPS
"""

from __future__ import annotations

import random
import sys
import tempfile
from pathlib import Path

import trio

import ctxrt
from ctxrt import Budget, Text
import ctxrt.namespace.machine as machine

_build = machine.build_compile_result
machine.build_compile_result = lambda *a, **k: _build(*a, **{**k, "strict": True})
from ctxrt.slots import SlotRegistry
SEEDED = [0, 0]
_seed = SlotRegistry._seed


def counted_seed(self, state, branch_id):  # type: ignore[no-untyped-def]
    found = _seed(self, state, branch_id)
    SEEDED[found is not None] += 1
    return found


SlotRegistry._seed = counted_seed  # type: ignore[method-assign]

READERS = {"n0": None, "na": "alice", "nb": "bob", "wa": "alice", "fb": "bob"}
STRATS = {"n0": ctxrt.Passthrough(), "na": ctxrt.Passthrough(), "nb": ctxrt.Passthrough(),
          "wa": ctxrt.WindowedPassthrough(), "fb": ctxrt.Passthrough()}
KEEP = lambda message: message.sequence % 3 != 1  # noqa: E731  (fb's view filter)
FILTERS = {"fb": KEEP}
PNG = __import__("base64").b64encode(b"\x89PNG\r\n\x1a\n" + bytes(range(64))).decode()


def shape(result: ctxrt.CompileResult) -> object:
    prov = result.provenance
    return ([(m.participant, m.content, m.cache_breakpoint) for m in result.messages],
            [tuple((s.kind, s.id, s.complete) for s in row) for row in prov.messages])


def leak(result: ctxrt.CompileResult, reader: str | None) -> list[str]:
    bad = []
    for m in result.messages:
        for b in m.content:
            text = getattr(b, "text", "") or ""
            for other in ("alice", "bob"):
                if other != reader and f"for-{other}" in text:
                    bad.append(text)
    return bad


def content(rng: random.Random, tag: str) -> object:
    r = rng.random()
    if r < 0.12:
        use = f"t{tag}"
        return [Text(f"call {tag}"), ctxrt.ToolUse(use, "look", {"q": tag})] if rng.random() < 0.5 else [
            ctxrt.ToolResult(f"t{rng.randrange(100)}", f"result {tag}"), Text(f"after {tag}")]
    if r < 0.18:
        return [ctxrt.Image({"type": "base64", "media_type": "image/png", "data": PNG}), Text(f"img {tag}")]
    if r < 0.4:
        return f"plain {tag}"
    blocks = [Text(f"body {tag}")]
    if r < 0.7:
        who = rng.choice(["alice", "bob"])
        blocks.append(Text(f"for-{who} {tag}", audience=(who,)))
    elif r < 0.85:
        blocks = [Text(f"for-alice only {tag}", audience=("alice",))]
    else:
        blocks.append(Text(f"for-bob {tag}", audience=("bob",)))
        blocks.append(Text(f"for-alice {tag}", audience=("alice",)))
    return blocks


async def reference(path: Path, keys: list[tuple[str, str]], budget: Budget) -> dict[tuple[str, str], object]:
    out = {}
    async with ctxrt.open_runtime(path, readonly=True) as ro:
        for ns, branch in keys:
            m = await ro.open(ns, branch=branch, view_reader=READERS[ns], view_filter=FILTERS.get(ns), strategy=STRATS[ns])
            try:
                out[(ns, branch)] = shape(await m.compile(budget))
            except ctxrt.OverBudgetError:
                out[(ns, branch)] = "over budget"
            await m.aclose()
    return out


async def run(seed: int, steps: int, root: Path) -> dict[str, int]:
    rng = random.Random(seed)
    path = root / f"s{seed}"
    counts: dict[str, int] = {}
    compiles = 0
    async with ctxrt.open_runtime(path) as rt:
        mgrs: dict[tuple[str, str], ctxrt.ContextManager] = {}
        for ns in READERS:
            mgrs[(ns, "main")] = await rt.open(ns, view_reader=READERS[ns], strategy=STRATS[ns],
                                               view_filter=FILTERS.get(ns))
        writer = mgrs[("n0", "main")]
        for k in range(6):
            await writer.add_message("user", content(rng, f"seed{k}"))
        nb = 0
        for step in range(steps):
            key = rng.choice(sorted(mgrs))
            m = mgrs[key]
            ns, branch = key
            op = rng.choice(["add", "add", "add", "edit", "edit", "remove", "fork", "branch_at", "create",
                             "switch", "derive", "close"])
            try:
                if op == "add":
                    await m.add_message(rng.choice(["user", "Claude"]), content(rng, f"{step}"))
                elif op == "edit":
                    msgs = await m.get_all_messages()
                    if msgs:
                        await m.edit_message(rng.choice(msgs).id, content(rng, f"e{step}"))
                elif op == "remove":
                    msgs = await m.get_all_messages()
                    if len(msgs) > 3:
                        i = rng.randrange(len(msgs))
                        j = min(len(msgs) - 1, i + rng.randrange(3))
                        await m.remove_messages(msgs[i].id, msgs[j].id)
                elif op == "fork":
                    nb += 1
                    name = await m.fork(f"f{nb}")
                    del mgrs[key]
                    mgrs[(ns, name)] = m
                    for other in READERS:
                        if (other, name) not in mgrs and rng.random() < 0.8:
                            mgrs[(other, name)] = await rt.open(other, branch=name, view_reader=READERS[other],
                                                                strategy=STRATS[other], view_filter=FILTERS.get(other))
                elif op == "branch_at":
                    msgs = await m.get_all_messages()
                    if msgs:
                        nb += 1
                        name = await m.branch_at(rng.choice(msgs).id, f"b{nb}")
                        for other in READERS:
                            if rng.random() < 0.8:
                                mgrs[(other, name)] = await rt.open(other, branch=name, view_reader=READERS[other],
                                                                    strategy=STRATS[other], view_filter=FILTERS.get(other))
                elif op == "create":
                    info = next(b for b in await rt.list_branches() if b.name == branch)
                    nb += 1
                    at = rng.randrange(0, rt.engine.last_sequence + 1)
                    try:
                        made = await rt.create_branch(f"c{nb}", from_branch=branch, at_sequence=at)
                    except ctxrt.MalformedContentError:
                        made = None
                    if made is not None:
                        for other in READERS:
                            if rng.random() < 0.8:
                                mgrs[(other, made.name)] = await rt.open(other, branch=made.name,
                                                                         view_reader=READERS[other],
                                                                         strategy=STRATS[other], view_filter=FILTERS.get(other))
                    del info
                elif op == "derive":
                    nb += 1
                    at = None if rng.random() < 0.5 else rng.randrange(0, rt.engine.last_sequence + 1)
                    try:
                        child = await m.derive(branch=f"d{nb}", at_sequence=at)
                    except ctxrt.MalformedContentError:
                        child = None
                    if child is not None:
                        mgrs[(ns, f"d{nb}")] = child
                elif op == "switch":
                    targets = sorted({b for (n, b) in mgrs if n == ns and b != branch})
                    free = [b for b in targets if (ns, b) not in mgrs]
                    if free:
                        target = rng.choice(free)
                        await m.switch_branch(target)
                        del mgrs[key]
                        mgrs[(ns, target)] = m
                    elif targets:
                        # switch there and back: the other manager of (ns, target) stays
                        target = rng.choice(targets)
                        await m.switch_branch(target)
                        await m.compile(Budget(max_tokens=100_000, reserve_for_response=0))
                        await m.switch_branch(branch)
                elif op == "close":
                    if len(mgrs) > 3:
                        await m.aclose()
                        del mgrs[key]
                counts[op] = counts.get(op, 0) + 1
            except (ctxrt.NarrowingRefusedError, ctxrt.MessageNotFoundError,
                    ctxrt.BranchExistsError) as e:
                counts["refused:" + type(e).__name__] = counts.get("refused:" + type(e).__name__, 0) + 1
            budget = rng.choice([Budget(max_tokens=100_000, reserve_for_response=0),
                                 Budget(max_tokens=rng.randrange(30, 400), reserve_for_response=0)])
            mine = {}
            for k2, m2 in sorted(mgrs.items()):
                try:
                    r = await m2.compile(budget)
                except ctxrt.OverBudgetError:
                    mine[k2] = "over budget"
                    continue
                compiles += 1
                bad = leak(r, READERS[k2[0]])
                assert not bad, (seed, step, op, k2, bad)
                mine[k2] = shape(r)
            ref = await reference(path, sorted(mgrs), budget)
            for k2 in mine:
                if mine[k2] != ref[k2]:
                    print("MISMATCH", seed, step, op, key, k2)
                    print(" mine", mine[k2])
                    print(" ref ", ref[k2])
                    raise SystemExit(1)
        for m in mgrs.values():
            await m.aclose()
    counts["compiles"] = compiles
    return counts


async def main() -> None:
    seeds, steps = int(sys.argv[1]), int(sys.argv[2])
    total: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="attfork-") as root:
        for seed in range(int(sys.argv[3]) if len(sys.argv) > 3 else 0, seeds):
            for k, v in (await run(seed, steps, Path(root))).items():
                total[k] = total.get(k, 0) + v
            print("seed", seed, "done:", total.get("compiles"), "compiles so far", flush=True)
    print("ok", total, "seeded (no, yes)", SEEDED)


trio.run(main)
