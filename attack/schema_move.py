"""A schema-2 writer (ctxrt at b43611c, /tmp/att-lease-old) holding agents/a while a new writer opens
the same store: does the new one move the store and serve agents/a too (two writers of its memory)?"""
import json, os, subprocess, sys, time
from ctxrt.pgcluster import temporary_cluster
HERE = os.path.dirname(os.path.abspath(__file__))
OLD, NEW = "/tmp/att-lease-old", os.path.dirname(HERE)

def spawn(tree, url):
    return subprocess.Popen([sys.executable, f"{HERE}/holder.py", url, "3000", "take"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=tree))

with temporary_cluster() as cluster:
    url = cluster.create_database("s")
    old = spawn(OLD, url)
    print("old:", old.stdout.readline().strip(), flush=True)
    new = spawn(NEW, url)
    t0 = time.monotonic()
    line = None
    import select
    r, _, _ = select.select([new.stdout], [], [], 8)
    print("new:", new.stdout.readline().strip() if r else "(no answer in 8 s: refused and retrying)", flush=True)
    import psycopg
    with psycopg.connect(url, autocommit=True) as c:
        print("format:", c.execute("SELECT value FROM ctxrt_meta WHERE key='format'").fetchone(),
              "leases:", c.execute("SELECT name, expires > now() FROM ctxrt_leases").fetchall())
    for p, name in ((old, "old"), (new, "new")):
        if p.poll() is None:
            p.stdin.write("go\n"); p.stdin.flush()
    time.sleep(3)
    for p, name in ((old, "old"), (new, "new")):
        p.kill(); out, err = p.communicate()
        lines = [json.loads(l) for l in out.splitlines() if l.strip()]
        print(name, "ops ok:", sum("ok" in l for l in lines), "errors:", [l.get("error") for l in lines if "error" in l][:3], err[-300:] if not lines else "")
