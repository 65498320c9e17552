"""record_request cancelled at its k-th schedule point (trio: a racing task's cancel after k
checkpoints; asyncio via ctxrt.aio: task.cancel() after k loop iterations), every k until a call
completes uncancelled, over several turns including the LEDGER_WAITING-th record's commit. After
each, the next record's digest == from scratch; requests() reads; rebuilds match; verify sound.
usage: ledger_cancel_points.py STORE trio|aio"""
import asyncio, copy, sys
import trio
import ctxrt, ctxrt.aio
from ctxrt import Budget, CompileResult
from ctxrt import request_ledger as rl
from ctxrt.verification import verify

store, mode = sys.argv[1], sys.argv[2]
B = Budget(max_tokens=20000, reserve_for_response=500)
OPTS = {"assistant": "Claude"}


def fresh(result):
    alone = CompileResult(list(result.messages), list(result.system_injections), result.provenance,
                          result.stable_prefix_tokens)
    return rl.body_digest(copy.deepcopy(rl.make_body(alone, "anthropic", dict(OPTS))))


stats = {"cancelled": 0, "completed": 0, "records": 0, "bad": 0, "turns": 0}


async def trio_main():
    async with ctxrt.open_runtime(store, durability="os") as rt:
        m = await rt.open("agents/a", ledger=True)
        made = []
        for turn in range(150):
            await m.add_message("user" if turn % 3 else "Claude", f"turn {turn} " + "w " * (turn % 17))
            result = await m.compile(B)
            for k in range(0, 50):
                scope = trio.CancelScope()
                got = []

                async def call():
                    with scope:
                        got.append(await m.record_request(result, form="anthropic", options=OPTS))

                async def cancel():
                    for _ in range(k):
                        await trio.lowlevel.checkpoint()
                    scope.cancel()

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(call)
                    nursery.start_soon(cancel)
                if got:
                    made.append((result, got[0]))
                    stats["completed"] += 1
                    break
                stats["cancelled"] += 1
            stats["turns"] += 1
            await m.add_message("user", f"after {turn}")
            result = await m.compile(B)
            record = await m.record_request(result, form="anthropic", options=OPTS)
            made.append((result, record))
        await check(m, made)
        await m.aclose()


async def aio_main():
    async with ctxrt.aio.open_runtime(store, durability="os") as rt:
        m = await rt.open("agents/b", ledger=True)
        made = []
        for turn in range(150):
            await m.add_message("user" if turn % 3 else "Claude", f"turn {turn} " + "w " * (turn % 17))
            result = await m.compile(B)
            for k in range(0, 60):
                task = asyncio.ensure_future(m.record_request(result, form="anthropic", options=OPTS))
                for _ in range(k):
                    await asyncio.sleep(0)
                task.cancel()
                try:
                    made.append((result, await task))
                    stats["completed"] += 1
                    break
                except asyncio.CancelledError:
                    stats["cancelled"] += 1
            stats["turns"] += 1
            await m.add_message("user", f"after {turn}")
            result = await m.compile(B)
            made.append((result, await m.record_request(result, form="anthropic", options=OPTS)))
        await check(m, made)
        await m.aclose()


async def check(m, made):
    for result, record in made:
        stats["records"] += 1
        if record.body_digest != fresh(result):
            stats["bad"] += 1
            print("BAD digest", record.id, file=sys.stderr)
    found = {r.id: r for r in await m.requests(limit=100000)}
    for _, record in made:
        if found.get(record.id) != record:
            stats["bad"] += 1
            print("MISSING", record.id, file=sys.stderr)
        elif not (await m.rebuild_request(record)).matches:
            stats["bad"] += 1
            print("NOMATCH", record.id, file=sys.stderr)


if mode == "trio":
    trio.run(trio_main)
else:
    asyncio.run(aio_main())
report = verify(store)
print(mode, stats, report.status)
assert report.status == "sound" and not stats["bad"]
