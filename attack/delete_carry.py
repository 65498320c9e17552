"""An append on a live branch carrying a record of a branch deleted meanwhile."""
import tempfile
import trio
from ctxrt import Budget, open_runtime

BUDGET = Budget(max_tokens=10_000)

async def main():
    errors = {}
    with tempfile.TemporaryDirectory() as d:
        async with open_runtime(d, durability="os") as rt:
            ann = await rt.open("agents/ann", view_reader="ann", ledger=True)
            await ann.add_message("user", "hi")
            acked = []
            for k in range(40):
                name = (await rt.create_branch(f"tmp{k}")).name
                x = await rt.open("agents/ann", view_reader="ann", branch=name, ledger=True)
                await x.record_request(await x.compile(BUDGET), form="anthropic")
                acked.append(await ann.record_request(await ann.compile(BUDGET), form="anthropic"))
                async def flush():
                    for _ in range(k % 5):
                        await trio.lowlevel.checkpoint()
                    try:
                        await ann.add_message("user", f"live {k}")
                    except Exception as exc:
                        errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                async with trio.open_nursery() as n:
                    n.start_soon(rt.delete_branch, name); n.start_soon(flush)
                await x.aclose()
            found = {r.id for r in await ann.requests(limit=10_000)}
            print("append on live main refused:", errors, "acknowledged records lost:", len({r.id for r in acked} - found), "of", len(acked))
trio.run(main)
