"""Writer killed with SIGKILL mid record batch by attack/kill.py."""
import os, sys
import trio
from ctxrt import Budget, open_runtime

def emit(line):
    os.write(1, (line + "\n").encode())

async def main(path, rnd):
    async with open_runtime(path, durability="sync") as rt:
        ms = [await rt.open(ns, view_reader=r, ledger=True) for ns, r in (("agents/ann", "ann"), ("agents/bob", "bob"))]
        emit("ready")
        async def worker(m, t):
            k = 0
            while True:
                k += 1
                await m.add_message("user", f"round {rnd} task {t} turn {k}", hold_compression=(k % 3 == 0))
                rec = await m.record_request(await m.compile(Budget(max_tokens=100_000)), form="anthropic")
                emit(f"made {m.namespace} {t} {rec.id}")
                if k % 4 == 0:
                    await m.requests(limit=1)
                    emit(f"durable {m.namespace} {t} {rec.id}")
        async with trio.open_nursery() as n:
            for t in range(4):
                n.start_soon(worker, ms[t % 2], t)

trio.run(main, sys.argv[1], int(sys.argv[2]))
