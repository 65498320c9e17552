"""200 namespaces leased by one engine: the cost of a renewal round, and whether renewals keep up
while a writer commits under the leases (each batch's fence locks its rows FOR SHARE)."""
import statistics, threading, time
from ctxrt.pgcluster import temporary_cluster, start_pooler
from ctxrt.store.postgres import PostgresEngine, _RENEW
from ctxrt.testing import RegisterState, SetValue, execute

with temporary_cluster() as cluster, start_pooler(cluster) as pooler:
    for label, url in (("direct", cluster.create_database("m")), ("pooler", pooler.url("m"))):
        e = PostgresEngine(url, lease_ms=1500)
        names = [f"agents/n{i}/context" for i in range(200)]
        t = time.perf_counter()
        assert all(e.hold(1, n) for n in names)
        took = time.perf_counter() - t
        times = []
        for _ in range(30):
            with e._lease_lock:
                t = time.perf_counter()
                arrays = (*e._lease_arrays(dict(e._held)), e._holder)
                rows = e._on_leases(_RENEW, (*arrays, e._lease_ms, *arrays), every=True)
                times.append(time.perf_counter() - t)
            assert len(rows) == 200
        if label == "direct":
            e.apply([RegisterState(name=f"agents/n{i}/notes", kind="value") for i in range(200)], execute)
        stop = time.monotonic() + 6
        lost = 0; writes = 0
        while time.monotonic() < stop:  # batches each writing 20 namespaces under their leases
            i = writes % 10
            res, _ = e.apply([SetValue(state=f"agents/n{j}/notes", branch=1, value=writes) for j in range(i*20, i*20+20)], execute)
            writes += 1
            lost += sum(not ok for ok, _ in res)
        held = sum(e.holds(1, n) for n in names)
        print(f"{label}: 200 takes {took*1000:.0f} ms; renewal of 200: median {statistics.median(times)*1000:.2f} ms,"
              f" max {max(times)*1000:.2f} ms; {writes} batches over 6 s (4 lease lengths), refused writes {lost},"
              f" still held {held}/200", flush=True)
        e.close()
