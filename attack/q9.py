"""Q9 refusal cases and the memory of tracking compiles by raw bodies."""
import copy, gc, pickle, tempfile, tracemalloc
import attrs, trio
import ctxrt
from ctxrt import Budget, Text, open_runtime, Autobiographical
from ctxrt.compile import provenance as _p

BUDGET = Budget(max_tokens=10_000)

async def outcome(m, result, label):
    before = [r.id for r in await m.requests(limit=10_000)]
    try:
        await m.record_request(result, form="anthropic")
        what = "accepted"
    except Exception as exc:
        what = f"refused {type(exc).__name__}: {str(exc)[:150]}"
    after = [r.id for r in await m.requests(limit=10_000)]
    unchanged = after == before
    print(f"{label:45s} {what}  ledger_unchanged={unchanged}")
    return what

async def main():
    with tempfile.TemporaryDirectory() as d, tempfile.TemporaryDirectory() as d2:
        async with open_runtime(d, durability="os") as rt, open_runtime(d2, durability="os") as rt2:
            ann = await rt.open("agents/ann", view_reader="ann", ledger=True)
            ann2 = await rt.open("agents/ann", view_reader="ann")
            bob = await rt.open("agents/bob", view_reader="bob", ledger=True)
            await ann.add_message("user", [Text("for ann", audience=("ann",)), Text("all")])
            r = await ann.compile(BUDGET)
            await outcome(ann, r, "own result")
            await outcome(ann2, r, "other manager same ns")
            o = await rt2.open("agents/ann", view_reader="ann", ledger=True)
            await o.add_message("user", "x")
            await outcome(ann, await o.compile(BUDGET), "another runtime (other store)")
            await outcome(bob, await ann.compile(BUDGET), "another namespace same runtime")
            await outcome(ann, await bob.compile(BUDGET), "bob result into ann")
            anon = await rt.open("agents/ann2", ledger=True)
            await outcome(anon, await ann.compile(BUDGET), "ann result into reader-less ns")
            r = await ann.compile(BUDGET)
            await outcome(ann, copy.copy(r), "copy.copy")
            await outcome(ann, copy.deepcopy(r), "copy.deepcopy")
            try:
                await outcome(ann, pickle.loads(pickle.dumps(r)), "pickle round trip")
            except Exception as exc:
                print("pickle round trip: cannot pickle", type(exc).__name__, exc)
            from ctxrt.integrations.blocks import without
            await outcome(ann, without(r, lambda s: False), "blocks.without")
            hand = attrs.evolve(r, provenance=attrs.evolve(r.provenance, raw_bodies={}))
            await outcome(ann, hand, "hand-made (evolved provenance, new bodies)")
            # forged: ann's bodies relabelled as bob's
            forged = attrs.evolve(r, provenance=attrs.evolve(r.provenance, namespace="agents/bob", reader="bob"))
            w = await outcome(bob, forged, "ann result relabelled as bob's (same bodies)")
            if w == "accepted":
                rec = (await bob.requests(limit=1))[-1]
                rb = await bob.rebuild_request(rec)
                print("   forged rebuild holds 'for ann':", "for ann" in str(rb.body), "matches:", rb.matches)
            # closed manager
            m3 = await rt.open("agents/ann", view_reader="ann")
            r3 = await m3.compile(BUDGET)
            await m3.aclose()
            await outcome(ann, r3, "result from a closed manager")
            # strategy changed
            r4 = await ann.compile(BUDGET)
            for m in (ann, ann2):
                await m.aclose()
            ann = await rt.open("agents/ann", view_reader="ann", ledger=True,
                                strategy=Autobiographical("m", target_chunk_tokens=40))
            await outcome(ann, r4, "result before strategy change")
            # another branch
            try:
                name = await ann.fork("f1")
                f = await rt.open("agents/ann", view_reader="ann", branch=name, ledger=True)
                await outcome(f, r4, "main result into fork")
            except Exception as exc:
                print("fork:", type(exc).__name__, exc)
            # memory: 10,000 compiles never recorded
            gc.collect()
            tracemalloc.start()
            s0 = tracemalloc.take_snapshot()
            for i in range(10_000):
                await ann.compile(BUDGET)
                if i == 999:
                    gc.collect(); s1 = tracemalloc.take_snapshot()
            gc.collect()
            s2 = tracemalloc.take_snapshot()
            size = lambda s: sum(st.size for st in s.statistics("filename"))
            print("tracked compiles:", len(rt._namespaces.ledger._compiled),
                  "mem after 1k:", size(s1) - size(s0), "after 10k:", size(s2) - size(s0))
            kept = []
            for i in range(2000):
                kept.append(await ann.compile(BUDGET))
            print("tracked with 2000 held by host:", len(rt._namespaces.ledger._compiled))
trio.run(main)
