"""The asyncio front: racing record_request/add_message/compile with asyncio timeouts, Q9 refusals,
a rebuild cancelled at increasing deadlines."""
import asyncio, copy, random, tempfile
import attrs
import ctxrt.aio
from ctxrt import Budget, Text

B = Budget(max_tokens=1_000_000)

async def main():
    rng = random.Random(3)
    stats = dict(acked=0, timeouts=0, rebuild_cancels=0)
    with tempfile.TemporaryDirectory() as d, tempfile.TemporaryDirectory() as d2:
        async with ctxrt.aio.open_runtime(d, durability="os") as rt, ctxrt.aio.open_runtime(d2, durability="os") as rt2:
            ann = await rt.open("agents/ann", view_reader="ann", ledger=True)
            twin = await rt.open("agents/ann", view_reader="ann")
            bob = await rt.open("agents/bob", view_reader="bob", ledger=True)
            for i in range(300):
                await ann.add_message("user", [Text(f"line {i} " * 10), Text(f"ann secret {i}", audience=("ann",))])
            made = {"agents/ann": [], "agents/bob": []}
            async def turn(m, k):
                try:
                    await asyncio.wait_for(one(m, k), rng.choice([1e-4, 1e-3, 5e-3, 2e-2, 1.0]))
                except asyncio.TimeoutError:
                    stats["timeouts"] += 1
            async def one(m, k):
                rec = await m.record_request(await m.compile(B), form="anthropic")
                made[m.namespace].append(rec)
                await m.add_message("Claude", f"reply {k}", hold_compression=k % 3 == 0)
            for rnd in range(10):
                await asyncio.gather(*(turn(rng.choice([ann, twin, bob]), k) for k in range(8)))
            for m in (ann, bob):
                found = await m.requests(limit=100_000)
                ids = [r.id for r in found]
                assert len(ids) == len(set(ids))
                assert not {r.id for r in made[m.namespace]} - set(ids), "lost"
                assert [r.sequence for r in found] == sorted(r.sequence for r in found)
                if m is bob:
                    for r in found:
                        assert "ann secret" not in str((await bob.rebuild_request(r)).body)
                stats[m.namespace] = len(ids)
            stats["acked"] = sum(map(len, made.values()))
            # Q9 through the front
            o = await rt2.open("agents/ann", view_reader="ann", ledger=True)
            await o.add_message("user", "x")
            r = await ann.compile(B)
            for label, res, m in (("other runtime", await o.compile(B), ann), ("deepcopy", copy.deepcopy(r), ann),
                                  ("relabelled", attrs.evolve(r, provenance=attrs.evolve(r.provenance, namespace="agents/bob", reader="bob")), bob),
                                  ("other namespace", r, bob)):
                try:
                    await m.record_request(res, form="anthropic"); print(label, "accepted")
                except ValueError as exc:
                    print(label, "refused:", str(exc)[:90])
            rec = (await ann.requests(limit=1))[-1]
            t = 1e-5
            while t < 1:
                try:
                    rb = await asyncio.wait_for(ann.rebuild_request(rec), t)
                    assert rb.matches or rb.edited
                except asyncio.TimeoutError:
                    stats["rebuild_cancels"] += 1
                t *= 2
            assert (await ann.rebuild_request(rec)).matches
            for m in (ann, twin, bob, o):
                await m.aclose()
    print(stats)

asyncio.run(main())
