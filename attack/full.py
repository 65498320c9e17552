"""An append refused because the store is full (its own message too big) carries acknowledged records."""
import tempfile
import trio
from ctxrt import Budget, open_runtime

async def main():
    with tempfile.TemporaryDirectory() as d:
        async with open_runtime(d, durability="os", map_size=8 * 2**20) as rt:
            m = await rt.open("agents/ann", view_reader="ann", ledger=True)
            await m.add_message("user", "hi")
            rec = await m.record_request(await m.compile(Budget(max_tokens=10_000)), form="anthropic")
            try:
                await m.add_message("user", "x" * (12 * 2**20))
            except Exception as exc:
                print("big append:", type(exc).__name__, str(exc)[:100])
            await m.add_message("user", "small")
            found = [r.id for r in await m.requests()]
            print("acknowledged record kept:", rec.id in found)
trio.run(main)
