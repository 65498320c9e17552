"""A writer that appends forever (own slot and shared slot), edits now and then, prints each id it got."""
import sys, trio, ctxrt

async def main(url, p):
    async with ctxrt.open_runtime(url) as rt:
        own = await rt.open(f"own-{p}", isolate=True)
        shared = await rt.open(f"shared-{p}")
        print("ready", flush=True)
        async def task(k):
            m = own if k % 2 else shared
            n = 0
            while True:
                i = await m.add_message("user", f"p{p} t{k} m{n}")
                print(i, flush=True)
                n += 1
                if n % 17 == 0:
                    await m.edit_message(i, content="edited")
        async with trio.open_nursery() as ns:
            for k in range(4):
                ns.start_soon(task, k)

trio.run(main, sys.argv[1], sys.argv[2])
