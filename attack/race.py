"""Racing record_request / add_message / compile across managers of several namespaces, cancelled
at increasing deadlines and at checkpoints, with background compression recording meanwhile (Q11)."""
import random, sys, tempfile
import trio, trio.testing
import ctxrt
from ctxrt import Autobiographical, Budget, OfflineModel, Text, open_runtime

BUDGET = Budget(max_tokens=10_000)
STRAT = Autobiographical("model-x", target_chunk_tokens=40, recent_window_tokens=20, l1_holdback_chunks=0,
                         summary_target_tokens=50, head_window_tokens=20)

async def main(seed: int, rounds: int) -> None:
    rng = random.Random(seed)
    acked: dict[str, list] = {}
    counts = dict(acked=0, cancelled=0, calls=0)
    with tempfile.TemporaryDirectory() as d:
        async with open_runtime(d, durability="os") as rt:
            mgrs = {}
            for ns, reader in (("agents/ann", "ann"), ("agents/bob", "bob")):
                a = await rt.open(ns, view_reader=reader, ledger=True, model=OfflineModel(), strategy=STRAT)
                b = await rt.open(ns, view_reader=reader)
                mgrs[ns] = (reader, [a, b])
                acked[ns] = []
            for i in range(6):
                await mgrs["agents/ann"][1][0].add_message("user", [Text(f"ann secret {i}", audience=("ann",)), Text(f"all {i}")])
                await mgrs["agents/ann"][1][0].add_message("Claude", [Text(f"bob secret {i}", audience=("bob",))])

            async def turn(ns, m, k, deadline):
                counts["calls"] += 1
                with trio.move_on_after(deadline) as scope:
                    if k % 3 == 0:
                        await m.add_message("user", [Text(f"{ns} turn {k} private", audience=(mgrs[ns][0],)), Text("pub")],
                                            hold_compression=(k % 6 == 0))
                    r = await m.compile(BUDGET)
                    rec = await m.record_request(r, form="anthropic")
                    acked[ns].append(rec)
                    await m.add_message("Claude", f"reply {k}", hold_compression=(k % 4 == 1))
                if scope.cancelled_caught:
                    counts["cancelled"] += 1

            for rnd in range(rounds):
                async with trio.open_nursery() as n:
                    for k in range(10):
                        ns = rng.choice(list(mgrs))
                        m = rng.choice(mgrs[ns][1])
                        n.start_soon(turn, ns, m, k, rng.choice([0, 1e-5, 1e-4, 5e-4, 1e-3, 3e-3, 1e-2, 1.0]))
            for ns, (reader, ms) in mgrs.items():
                await ms[0].wait_ready()
                found = await ms[0].requests(limit=100_000)
                ids = [r.id for r in found]
                assert len(ids) == len(set(ids)), f"{ns}: duplicated records"
                missing = {r.id for r in acked[ns]} - set(ids)
                assert not missing, f"{ns}: {len(missing)} acknowledged records lost"
                seqs = [r.sequence for r in found]
                assert seqs == sorted(seqs), f"{ns}: out of sequence order"
                # acked order per namespace: records made in one task order are increasing in found
                pos = {rid: i for i, rid in enumerate(ids)}
                assert all(r.reader == reader and r.namespace == ns for r in found)
                # paging forward
                paged, since = [], 0
                while page := await ms[0].requests(since=since, limit=7):
                    paged += [r.id for r in page]; since = page[-1].sequence
                assert paged == ids, f"{ns}: paging differs"
                # privacy: rebuild a sample, other reader's secrets never present
                other = "bob" if reader == "ann" else "ann"
                for r in found[:: max(1, len(found) // 15)]:
                    rb = await ms[0].rebuild_request(r)
                    assert f"{other} secret" not in str(rb.body), f"{ns}: record holds {other}'s content"
                    if not rb.edited:
                        assert rb.matches, f"{ns}: rebuild mismatch {r.id} {r.form}"
                counts[ns] = (len(found), sum(r.form == "compression" for r in found))
            counts["acked"] = sum(len(v) for v in acked.values())
            for _, ms in mgrs.values():
                for m in ms:
                    await m.aclose()
    print(seed, counts)

if __name__ == "__main__":
    seeds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    for s in range(seeds):
        trio.run(main, s, 8)
