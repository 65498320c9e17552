"""Attack: another process on the same LMDB store turning the ledger off (Q2). A second writer is
refused (StoreLockedError), so the first process's trust of its flag read holds; a read-only
runtime can't switch the flag (it keeps what is stored) and can't record."""
import multiprocessing, sys, tempfile, pathlib
import trio
from ctxrt import Budget, open_runtime

B = Budget(max_tokens=10_000)

def other(path, readonly, q):
    async def go():
        try:
            async with open_runtime(path, readonly=readonly) as rt:
                m = await rt.open("ns", ledger=False)
                q.put(f"opened readonly={readonly}")
                try:
                    await m.record_request(await m.compile(B), form="anthropic")
                    q.put("recorded")
                except Exception as e:
                    q.put(f"record refused: {type(e).__name__}")
        except Exception as e:
            q.put(f"open refused: {type(e).__name__}: {e}")
    trio.run(go)

async def main():
    with tempfile.TemporaryDirectory() as d:
        path = pathlib.Path(d) / "s"
        async with open_runtime(path) as rt:
            m = await rt.open("ns", ledger=True)
            await m.add_message("user", "hi")
            r = await m.compile(B)
            await m.record_request(r, form="anthropic")
            await m.add_message("user", "commit")
            for readonly in (False, True):
                ctx = multiprocessing.get_context("spawn"); q = ctx.Queue()
                p = ctx.Process(target=other, args=(path, readonly, q))
                p.start()
                await trio.to_thread.run_sync(p.join)
                while not q.empty():
                    print(" other:", q.get())
            await m.record_request(r, form="anthropic")
            print("first still records (flag on in store)")
            await m.aclose()

if __name__ == "__main__":
    trio.run(main)
