"""Split brain: A holds agents/a and writes in a loop; SIGSTOP A at a random moment past its expiry;
B takes over; SIGCONT A; check no write of A's lands after B's take (commit timestamps)."""
import json, os, random, signal, subprocess, sys, time, threading
import psycopg
from ctxrt.pgcluster import temporary_cluster, start_pooler

HERE = os.path.dirname(os.path.abspath(__file__))
LEASE_MS = int(os.environ.get("LEASE_MS", "1500"))
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 10
env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE))

def spawn(url, mode):
    return subprocess.Popen([sys.executable, f"{HERE}/holder.py", url, str(LEASE_MS), mode], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

def reader(p, out):
    for line in p.stdout:
        out.append(json.loads(line))

def late_rows(url, since):
    with psycopg.connect(url, autocommit=True) as c:
        q = ("SELECT s.name, count(*) FROM {t} x JOIN ctxrt_states s ON s.number = x.state"
             " WHERE s.name LIKE 'agents/a/%%' AND s.name NOT LIKE '%%/messages'"
             " AND pg_xact_commit_timestamp(x.xmin) > %s GROUP BY s.name")
        found = {}
        for t in ("ctxrt_items", "ctxrt_values", "ctxrt_heads"):
            for name, n in c.execute(q.format(t=t), (since,)).fetchall():
                found[f"{t}:{name}"] = n
        return found

stats = {"rounds": 0, "violations": 0, "a_refused": 0, "a_writes_after_cont": 0, "verify_bad": 0}
with temporary_cluster(settings={"track_commit_timestamp": "on"}) as cluster, start_pooler(cluster) as pooler:
    for r in range(ROUNDS):
        db = f"r{r}"
        cluster.create_database(db)
        url = pooler.url(db)
        a = spawn(url, "loop"); aout = []
        threading.Thread(target=reader, args=(a, aout), daemon=True).start()
        while not any("ok" in x for x in aout):
            time.sleep(0.01)
            if a.poll() is not None: raise SystemExit(a.stderr.read())
        time.sleep(random.uniform(0, 1.0))
        a.send_signal(signal.SIGSTOP)
        stopped_at = len(aout)
        b = spawn(url, "take"); bout = []
        threading.Thread(target=reader, args=(b, bout), daemon=True).start()
        while not bout:
            time.sleep(0.01)
            if b.poll() is not None: raise SystemExit(b.stderr.read())
        assert bout[0].get("held"), bout
        with psycopg.connect(url, autocommit=True) as c:
            (taken,) = c.execute("SELECT pg_xact_commit_timestamp(xmin) FROM ctxrt_leases WHERE name='agents/a/context'").fetchone()
        a.send_signal(signal.SIGCONT)
        time.sleep(LEASE_MS / 1000)
        late = late_rows(url, taken)
        if r == 0:
            with psycopg.connect(url, autocommit=True) as c:
                print(c.execute("SELECT name, kind FROM ctxrt_states").fetchall())
        after = aout[stopped_at:]
        oks = [x for x in after if "ok" in x]
        errs = [x for x in after if "error" in x]
        stats["a_writes_after_cont"] += len(oks)
        stats["a_refused"] += bool(errs)
        if late:
            stats["violations"] += 1
            print("VIOLATION round", r, late, after[:5], flush=True)
        b.stdin.write("go\n"); b.stdin.flush()
        try:
            b.wait(timeout=60)
        except subprocess.TimeoutExpired:
            print("B HUNG", r, bout[-3:], flush=True)
            subprocess.run(["/work/main/.venv/bin/py-spy", "dump", "--pid", str(b.pid)])
            with psycopg.connect(url, autocommit=True) as c:
                for row in c.execute("SELECT pid, state, wait_event_type, wait_event, left(query, 120), now()-xact_start FROM pg_stat_activity WHERE datname = current_database()"):
                    print(row)
            print("A:", a.poll(), aout[-3:])
            b.kill(); b.wait()
            raise SystemExit(1)
        a.wait(timeout=60) if a.poll() is None and errs else None
        if a.poll() is None: a.kill(); a.wait()
        berrs = [x for x in bout if "error" in x]
        v = subprocess.run([sys.executable, "-m", "ctxrt", "verify", url], capture_output=True, text=True, env=env)
        if v.returncode: stats["verify_bad"] += 1; print("VERIFY", r, v.stdout[-500:], v.stderr[-500:])
        stats["rounds"] += 1
        print(r, "A after cont:", [x.get("ok") or x.get("error") for x in after][:6], "B errs:", berrs[:2], flush=True)
print(stats)
