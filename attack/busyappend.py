"""Lone appends' time under a busy loop (the busy-loop test's shape)."""
import time, trio, ctxrt
from ctxrt.testing import temporary_cluster
async def main(url):
    done = False
    async def busy():
        while not done:
            sum(range(200)); await trio.lowlevel.checkpoint()
    async with ctxrt.open_runtime(url, durability="sync") as rt:
        m = await rt.open("ann", isolate=True)
        for i in range(5): await m.add_message("user", "w")
        t = time.perf_counter()
        for i in range(100): await m.add_message("user", "idle")
        idle = time.perf_counter() - t
        async with trio.open_nursery() as n:
            n.start_soon(busy)
            t = time.perf_counter()
            for i in range(100): await m.add_message("user", "x")
            done = True
        print(f"100 lone appends: idle {idle*1000:.0f} ms, busy loop {1000*(time.perf_counter()-t):.0f} ms")
with temporary_cluster() as c:
    trio.run(main, c.create_database("k1"))
