"""A message append racing its branch's deletion carries other branches' acknowledged records: are
they lost when the append is refused?"""
import tempfile
import trio
from ctxrt import Budget, open_runtime
from ctxrt.errors import BranchNotFoundError

BUDGET = Budget(max_tokens=10_000)

async def main():
    lost_total = 0; refused = 0
    with tempfile.TemporaryDirectory() as d:
        async with open_runtime(d, durability="os") as rt:
            ann = await rt.open("agents/ann", view_reader="ann", ledger=True)
            await ann.add_message("user", "hi")
            acked = []
            for k in range(40):
                name = (await rt.create_branch(f"tmp{k}")).name
                x = await rt.open("agents/x", branch=name)
                acked.append(await ann.record_request(await ann.compile(BUDGET), form="anthropic"))
                async def add():
                    nonlocal refused
                    try:
                        for _ in range(k % 5):
                            await trio.lowlevel.checkpoint()
                        await x.add_message("user", "on tmp")
                    except Exception as exc:
                        refused += 1; print(type(exc).__name__, str(exc)[:120])
                async def delete():
                    await rt.delete_branch(name)
                async with trio.open_nursery() as n:
                    n.start_soon(delete); n.start_soon(add)
                await x.aclose()
            found = {r.id for r in await ann.requests(limit=10_000)}
            lost_total = len({r.id for r in acked} - found)
    print("appends refused:", refused, "acknowledged records lost:", lost_total, "of", len(acked))
trio.run(main)
