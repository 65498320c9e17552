"""A fork at an old message of a long parent: how many copy entries does its slot cache start with,
against what it holds (memos.outgrown: at most 2 * held + SLACK)? usage: python attack/seed_bound.py N"""
import sys, tempfile, trio, ctxrt
from ctxrt import Budget
from ctxrt.testing import SLACK

async def main() -> None:
    n = int(sys.argv[1])
    with tempfile.TemporaryDirectory() as d:
        async with ctxrt.open_runtime(d, durability="os") as rt:
            m = await rt.open("a")
            ids = [await m.add_message("user", f"m{k}") for k in range(n)]
            await m.compile(Budget(max_tokens=10**7, reserve_for_response=0))
            parent = rt.slots.cache("messages", rt.engine.branch("main").id)
            name = await m.branch_at(ids[4], "old")
            child_mgr = await rt.open("a", branch=name, view_filter=lambda message: True)
            await child_mgr.compile(Budget(max_tokens=10**7, reserve_for_response=0))
            child = rt.slots.cache("messages", rt.engine.branch(name).id)
            print(f"parent holds {len(parent.messages)}, {len(parent.copies)} entries; fork holds "
                  f"{len(child.messages)}, {len(child.copies)} entries (outgrown past {2 * len(child.messages) + SLACK})")

trio.run(main)
