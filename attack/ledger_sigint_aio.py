"""A real SIGINT at each line of record_request (and the ledger code it runs) in an asyncio.run host
through ctxrt.aio: each run opens the store, checks what earlier runs acknowledged reads back and
rebuilds, records a turn with the signal sent at one site, and ends in KeyboardInterrupt. After it,
the next run's record digest == from scratch; at the end verify. usage: ledger_sigint_aio.py STORE"""
import asyncio, copy, os, signal, sys
import ctxrt, ctxrt.aio
from ctxrt import Budget, CompileResult
from ctxrt import request_ledger as rl
from ctxrt.verification import verify
sys.path.insert(0, os.path.dirname(__file__))
from sigint_lines import Tracer  # noqa: E402  (trio.run at import is guarded below)

store = sys.argv[1]
B = Budget(max_tokens=20000, reserve_for_response=500)
OPTS = {"assistant": "Claude"}
acked = []
stats = {"runs": 0, "ki": 0, "fired": 0, "bad": 0}


def fresh(result):
    alone = CompileResult(list(result.messages), list(result.system_injections), result.provenance,
                          result.stable_prefix_tokens)
    return rl.body_digest(copy.deepcopy(rl.make_body(alone, "anthropic", dict(OPTS))))


async def host(site, k):
    async with ctxrt.aio.open_runtime(store, durability="os") as rt:
        m = await rt.open("agents/a", ledger=True)
        found = {r.id: r for r in await m.requests(limit=100000)}
        for record in acked[-3:]:
            if record.id in found and not (await m.rebuild_request(found[record.id])).matches:
                stats["bad"] += 1
        for n in range(3):
            await m.add_message("user" if n % 2 else "Claude", f"run {k} {n}")
        result = await m.compile(B)
        record = await m.record_request(result, form="anthropic", options=OPTS)
        if record.body_digest != fresh(result):
            stats["bad"] += 1
            print("BAD", k, file=sys.stderr)
        acked.append(record)
        await m.add_message("user", f"run {k} traced")
        result = await m.compile(B)
        if site is None:
            return
        tracer = Tracer(site)
        sys.settrace(tracer.calls)
        try:
            acked.append(await m.record_request(result, form="anthropic", options=OPTS))
        finally:
            sys.settrace(None)
            stats["fired"] += tracer.fired
        for _ in range(5):
            await asyncio.sleep(0)
        await m.add_message("user", f"run {k} end")


def main():
    import trio
    first = Tracer()
    async def probe():
        async with ctxrt.open_runtime(store + "-probe") as rt:
            m = await rt.open("agents/a", ledger=True)
            await m.add_message("user", "x")
            sys.settrace(first.calls)
            try:
                for _ in range(3):
                    await m.add_message("user", "y")
                    await m.record_request(await m.compile(B), form="anthropic", options=OPTS)
            finally:
                sys.settrace(None)
    trio.run(probe)
    sites = [s for s in first.sites if s[0] in ("manager.py", "request_ledger.py")]
    for k, site in enumerate(sites):
        stats["runs"] += 1
        try:
            asyncio.run(host(site, k))
        except KeyboardInterrupt:
            stats["ki"] += 1
    asyncio.run(host(None, len(sites)))
    report = verify(store)
    print(stats, len(sites), report.status)
    assert report.status == "sound" and not stats["bad"]


main()
