"""A busy loop's passes per second while a batch is out on a stalled server vs none out."""
import os, signal, sys, time, psycopg, trio, ctxrt
from ctxrt.testing import temporary_cluster

def backends(url):
    with psycopg.connect(url, autocommit=True) as c:
        return [p for (p,) in c.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")]

async def spin(seconds):
    n = 0; end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        await trio.sleep(0); n += 1
    return n / seconds

async def main(url):
    async with ctxrt.open_runtime(url, durability="sync") as rt:
        m = await rt.open("ann", isolate=True)
        for i in range(5):
            await m.add_message("user", f"warm {i}")
        pids = backends(url)
        print(f"idle store: {await spin(0.5):.0f} passes/s")
        for p in pids: os.kill(p, signal.SIGSTOP)
        async with trio.open_nursery() as n:
            n.start_soon(m.add_message, "user", "stalled")
            await trio.sleep(0.05)
            print(f"stalled batch out: {await spin(0.5):.0f} passes/s")
            for p in pids: os.kill(p, signal.SIGCONT)
        print(f"after: {await spin(0.5):.0f} passes/s")

with temporary_cluster() as cluster:
    trio.run(main, cluster.create_database("k1"))
