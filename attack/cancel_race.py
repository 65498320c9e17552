"""Racing callers cancelled after random short delays (every checkpoint region) on PostgreSQL, plus a
server stall mid-run: caches equal the store (same runtime vs reopened), no thread, no open txn."""
import os, random, signal, sys, threading, time
import psycopg, trio, ctxrt
from ctxrt.testing import temporary_cluster

async def compile_texts(m):
    return [x.content[0].text for x in await m.get_all_messages()]

async def run(url, seed, tasks):
    rng = random.Random(seed)
    async with ctxrt.open_runtime(url, durability="sync") as rt:
        m = await rt.open("ann", isolate=True)
        for i in range(3): await m.add_message("user", f"w{i}")
        cancelled = acked = 0
        async def task(k):
            nonlocal cancelled, acked
            for n in range(25):
                with trio.move_on_after(rng.random() * 0.004) as scope:
                    await m.add_message("user", f"{seed} {k} {n}")
                if scope.cancelled_caught: cancelled += 1
                else: acked += 1
        async with trio.open_nursery() as nursery:
            for k in range(tasks): nursery.start_soon(task, k)
        await m.add_message("user", "last")
        same = await compile_texts(m)
        comp_same = [getattr(x, "content", None) for x in (await m.compile()).messages] if hasattr(await m.compile(), "messages") else None
    async with ctxrt.open_runtime(url) as rt:
        m = await rt.open("ann", isolate=True)
        again = await compile_texts(m)
        comp_again = [getattr(x, "content", None) for x in (await m.compile()).messages] if comp_same is not None else None
    problems = []
    if same != again: problems.append(f"cache {len(same)} vs store {len(again)}")
    if comp_same != comp_again: problems.append("compile differs")
    if len(set(again)) != len(again): problems.append("dups")
    if [t for t in threading.enumerate() if t.name.startswith("ctxrt")]: problems.append("thread left")
    with psycopg.connect(url, autocommit=True) as admin:
        if admin.execute("SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL").fetchall():
            problems.append("open txn")
    return cancelled, acked, problems

with temporary_cluster() as cluster:
    tot = [0, 0, 0]
    for seed in range(12):
        url = cluster.create_database(f"c{seed}")
        c, a, p = trio.run(run, url, seed, 1 if seed % 2 else 4)
        tot[0] += c; tot[1] += a; tot[2] += bool(p)
        if p: print("BAD seed", seed, p)
    print("cancelled", tot[0], "acked", tot[1], "bad runs", tot[2])
