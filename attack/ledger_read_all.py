"""Read every ledger record of a store (each namespace, each branch), rebuild each, verify."""
import sys
import trio
from ctxrt import open_runtime
from ctxrt.verification import verify

store = sys.argv[1]
NAMES = ("agents/a", "agents/c", "agents/r", "agents/x")


async def main():
    counts = {"records": 0, "matches": 0, "edited": 0, "bad": 0}
    async with open_runtime(store) as rt:
        for name in NAMES:
            m = await rt.open(name)
            for branch in [b.name for b in await m.list_branches()]:
                await m.switch_branch(branch)
                records = await m.requests(limit=100000)
                for record in records:
                    rebuilt = await m.rebuild_request(record)
                    counts["records"] += 1
                    counts["matches"] += rebuilt.matches
                    counts["edited"] += bool(rebuilt.edited)
                    if not rebuilt.matches and not rebuilt.edited:
                        counts["bad"] += 1
                        print("BAD", name, branch, record.id, file=sys.stderr)
                await m.switch_branch("main")
            await m.aclose()
    report = verify(store)
    print(counts, report.status)
    assert report.status == "sound" and not counts["bad"]

trio.run(main)
