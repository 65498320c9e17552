"""8 writer processes (shared slot + own) and 2 branch racers, a reader checking the horizon contract."""
import json, subprocess, sys, time
from pathlib import Path
import psycopg, trio, ctxrt
from ctxrt.store.postgres import PostgresEngine
from ctxrt.testing import temporary_cluster
from ctxrt.pgcluster import start_pooler

HERE = Path(__file__).parent
WRITERS = int(sys.argv[1]); POOLED = sys.argv[2] == "pooled"

def appended(url):
    with psycopg.connect(url) as conn:
        return dict(conn.execute("SELECT sequence, state FROM ctxrt_items WHERE version = sequence AND branch = 1"))

async def main(url, direct):
    async with ctxrt.open_runtime(url) as rt:
        await rt.open("forker"); await rt.open("shared")
        kids = [subprocess.Popen([sys.executable, str(HERE / "mixwriter.py"), url, str(p), "30"], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for p in range(WRITERS)]
        for k in kids:
            line = k.stdout.readline().strip()
            assert line == "ready", k.stderr.read()
        racers = [subprocess.Popen([sys.executable, str(HERE.parent / "tests" / "pg_branch_racer.py"), url, str(n), "8"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for n in range(2)]
        for k in kids:
            k.stdin.write("go\n"); k.stdin.flush()
        reader = PostgresEngine(url, create=False)
        seen = []
        t0 = time.monotonic()
        while any(k.poll() is None for k in kids) or len(seen) < 3:
            horizon = await trio.to_thread.run_sync(lambda: reader.last_sequence)
            visible = await trio.to_thread.run_sync(appended, direct)
            seen.append((horizon, frozenset(s for s in visible if s <= horizon)))
        outs = [k.communicate(timeout=300) for k in kids]
        routs = [r.communicate(timeout=300) for r in racers]
        reader.close()
    print("writers took", round(time.monotonic() - t0, 1), "s; polls", len(seen))
    bad = [err[-1500:] for k, (_, err) in zip(kids, outs) if k.returncode]
    print("writer failures", bad[:2])
    reports = [json.loads(o.strip().splitlines()[-1]) for o, _ in outs if o.strip()]
    errs = [e for r in reports for e in r["errors"]]
    print("writer errors", len(errs), errs[:5])
    rr = [json.loads(o.strip().splitlines()[-1]) if o.strip() else e[-800:] for o, e in routs]
    print("racers", rr)
    acked = {int(i) for r in reports for i in r["ids"]}
    final = appended(direct)
    print("acked", len(acked), "missing", len(acked - set(final)))
    skipped = sum(1 for h, saw in seen if saw != {s for s in final if s <= h})
    print("polls that missed a message appearing later at or below their horizon:", skipped)
    hs = [h for h, _ in seen]
    print("horizon monotonic", hs == sorted(hs))

with temporary_cluster() as cluster:
    direct = cluster.create_database("mix")
    if POOLED:
        with start_pooler(cluster) as pooler:
            url = pooler.url("mix")
            print("pooled", url)
            trio.run(main, url, direct)
    else:
        trio.run(main, direct, direct)
