"""The renewer under outages: server restart (fast/immediate), pooler SIGSTOP (a black hole) and
SIGTERM+start again, with an engine holding a lease through the pooler. Checks holds() goes False
by the expiry, writes are refused or fail clearly, recovery, close doesn't hang, no thread left."""
import os, signal, subprocess, sys, threading, time
import psycopg
from ctxrt.pgcluster import temporary_cluster, start_pooler
from ctxrt.store.postgres import PostgresEngine
from ctxrt.testing import RegisterState, SetValue, execute

LEASE_MS = 1500
NAME = "agents/a/context"

def attempt(engine, v):
    try:
        (ok, res), = engine.apply([SetValue(state="agents/a/notes", branch=1, value=v)], execute)[0]
        return "ok" if ok else f"refused:{type(res).__name__}:{str(res)[:60]}"
    except Exception as exc:
        return f"raised:{type(exc).__name__}:{str(exc)[-160:]}"

def close_bounded(engine, limit=20.0):
    t = threading.Thread(target=engine.close); began = time.monotonic(); t.start(); t.join(limit)
    return ("HUNG" if t.is_alive() else f"closed in {time.monotonic()-began:.2f}s")

def threads():
    return [t.name for t in threading.enumerate() if t is not threading.main_thread()]

def scenario(name, url, outage, seconds):
    e = PostgresEngine(url, lease_ms=LEASE_MS)
    e.apply([RegisterState(name="agents/a/notes", kind="value")], execute)
    assert e.hold(1, NAME)
    print(f"-- {name}: before:", attempt(e, 0), flush=True)
    began = time.monotonic()
    log = []
    with outage():
        while time.monotonic() - began < seconds:
            log.append((round(time.monotonic() - began, 2), e.holds(1, NAME)))
            time.sleep(0.1)
        mid = close_bounded(e, 8.0) if name.endswith("close") else None
    if mid is not None:
        print("   close during outage:", mid, "threads:", threads(), flush=True)
        return
    lost_at = next((t for t, h in log if not h), None)
    print(f"   holds False from {lost_at}s (lease {LEASE_MS/1000}s); after outage holds:", e.holds(1, NAME), flush=True)
    time.sleep(0.3)
    print("   write after:", attempt(e, 1), "holds:", e.holds(1, NAME), flush=True)
    time.sleep(LEASE_MS / 1000)
    print("   write later:", attempt(e, 2), "holds:", e.holds(1, NAME), flush=True)
    began = time.monotonic()
    while True:  # PgBouncer refuses logins for a while after the server's were failing (server_login_retry)
        try:
            taken = e.hold(1, NAME); break
        except Exception as exc:
            if time.monotonic() - began > 30: taken = repr(exc); break
            time.sleep(0.5)
    print(f"   retake after {time.monotonic() - began:.1f}s:", taken, "write:", attempt(e, 3), flush=True)
    print("  ", close_bounded(e), "threads:", threads(), flush=True)

with temporary_cluster() as cluster, start_pooler(cluster) as pooler:
    import contextlib
    def restart(mode, hold_s):
        @contextlib.contextmanager
        def cm():
            with cluster._lock:
                cluster._halt(mode)
            time.sleep(hold_s)
            cluster._launch()
            yield
        return cm
    @contextlib.contextmanager
    def down():
        with cluster.down():
            yield
    @contextlib.contextmanager
    def pool_stop():
        pooler.process.send_signal(signal.SIGSTOP)
        try: yield
        finally: pooler.process.send_signal(signal.SIGCONT)
    @contextlib.contextmanager
    def pool_gone():
        pooler.process.send_signal(signal.SIGKILL); pooler.process.wait()
        try: yield
        finally:
            pooler.process = subprocess.Popen([ "/usr/sbin/pgbouncer", str(pooler.directory / "pgbouncer.ini")],
                cwd=pooler.directory, env=cluster._runner.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, user=cluster._runner.uid, group=cluster._runner.gid,
                extra_groups=[] if cluster._runner.as_root else None)
            time.sleep(0.5)
    ONLY = os.environ.get("ONLY")
    for i, (name, oc, secs) in enumerate([
            ("server down (fast) 3s", down, 3.0),
            ("server restart fast, short", restart("fast", 0.0), 0.3),
            ("server restart immediate", restart("immediate", 2.0), 0.5),
            ("pooler SIGSTOP 3s", pool_stop, 3.0),
            ("pooler killed 3s", pool_gone, 3.0),
            ("pooler SIGSTOP close", pool_stop, 0.5),
            ("server down close", down, 0.5)]):
        if ONLY and ONLY not in name: continue
        cluster.create_database(f"d{i}")
        scenario(name, pooler.url(f"d{i}"), oc, secs)
