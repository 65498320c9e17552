"""Stall/kill the server while the commit thread holds a batch; measure loop responsiveness (ticker)."""
import os, signal, sys, time, threading, psycopg, trio, ctxrt
from ctxrt.testing import temporary_cluster

MODE = sys.argv[1]  # stop | stoppm | kill | restart
TASKS = int(sys.argv[2])

def backends(url):
    with psycopg.connect(url, autocommit=True) as c:
        return [p for (p,) in c.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")]

import traceback, functools
from ctxrt.store import writer as W
slow = []
def timed(name):
    orig = getattr(W.CommitThread, name)
    @functools.wraps(orig)
    def f(self, *a, **k):
        t = time.perf_counter()
        try:
            return orig(self, *a, **k)
        finally:
            d = time.perf_counter() - t
            if d > 0.003 and name != "stop":
                slow.append((name, a, round(d*1000, 2), self._due, self._turns_handed, self._turns_ended))
    setattr(W.CommitThread, name, f)
if os.environ.get("TIMED"):
    for name in ("offer_turn", "wait", "landed", "hand_over", "_run"):
        timed(name)
import atexit
atexit.register(lambda: print("SLOW", slow[:20]))
beat = [time.perf_counter()]
seen = set()
def watchdog():
    while True:
        time.sleep(0.001)
        if time.perf_counter() - beat[0] > 0.02:
            start = beat[0]
            stacks = []
            while beat[0] == start:
                frames = sys._current_frames()
                f = frames[threading.main_thread().ident]
                st = "".join(l for l in traceback.format_stack(f)[-3:])
                for t in threading.enumerate():
                    if t.name == "ctxrt-store-committer" and t.ident in frames:
                        st += "  COMMITTER:\n" + "".join(traceback.format_stack(frames[t.ident])[-5:])
                stacks.append(st)
                time.sleep(0.005)
            if (time.perf_counter() - start) > 0.05:
                print(f"BLOCKED {1000*(time.perf_counter()-start):.0f} ms; stacks sampled {len(stacks)}; distinct:", file=sys.stderr)
                for st in dict.fromkeys(stacks): print(st, file=sys.stderr)

async def main(cluster, url):
    lat = []
    acked = []
    errors = {}
    async def ticker(stop):
        while not stop.is_set():
            t = time.perf_counter()
            await trio.sleep(0.001)
            lat.append(time.perf_counter() - t - 0.001)
            beat[0] = time.perf_counter()
    async with ctxrt.open_runtime(url, durability="sync") as rt:
        m = await rt.open("ann", isolate=True)
        for i in range(5):
            await m.add_message("user", f"warm {i}")
            acked.append(f"warm {i}")
        stop = trio.Event()
        async with trio.open_nursery() as n:
            n.start_soon(ticker, stop)
            if os.environ.get("WD"): threading.Thread(target=watchdog, daemon=True).start()
            await trio.sleep(0.05)
            pids = backends(url)
            await trio.sleep(0.05)
            base = max(lat); lat.clear()
            async def app(k):
                for j in range(20):
                    text = f"t{k} {j}"
                    try:
                        with trio.fail_after(5 if MODE != 'longstop' else 1):
                            await m.add_message("user", text)
                        acked.append(text)
                    except BaseException as exc:
                        errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                        if isinstance(exc, ctxrt.RuntimeClosedError):
                            return
            async def disturb():
                await trio.sleep(0.01)
                if MODE in ("stop", "longstop"):
                    for p in pids: os.kill(p, signal.SIGSTOP)
                    await trio.sleep(0.5 if MODE == "stop" else 3)
                    for p in pids: os.kill(p, signal.SIGCONT)
                elif MODE == "stoppm":  # the backends end (terminated), the postmaster stalls: reconnects wait
                    pm = int((cluster.data_dir / "postmaster.pid").read_text().split()[0])
                    with psycopg.connect(url, autocommit=True) as admin:
                        os.kill(pm, signal.SIGSTOP)
                        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")
                    await trio.sleep(3)
                    os.kill(pm, signal.SIGCONT)
                elif MODE == "kill":
                    for p in pids: os.kill(p, signal.SIGKILL)
                elif MODE == "restart":
                    r = cluster._runner
                    def restart():
                        out = r.run(r.command("pg_ctl", "restart", "-D", str(cluster.data_dir), "-m", "immediate", "-w", "-l", "/tmp/attpg-restart.log"), cwd=cluster.directory, timeout=60)
                        print("restart rc", out.returncode, out.stderr[-200:])
                    await trio.to_thread.run_sync(restart)
            async with trio.open_nursery() as n2:
                n2.start_soon(disturb)
                for k in range(TASKS):
                    n2.start_soon(app, k)
            stop.set()
        print(f"{MODE} tasks={TASKS}: baseline max lateness {base*1000:.2f} ms; during max {max(lat)*1000:.2f} ms; ticks {len(lat)}; >3ms: {sum(l>0.003 for l in lat)}; >10ms {sum(l>0.01 for l in lat)}")
        print("errors", errors, "acked", len(acked))
    beat[0] = 1e18
    print("threads after close:", [t.name for t in threading.enumerate()])
    stop_beat = True
    for _ in range(100):
        try:
            with psycopg.connect(url): break
        except psycopg.Error: time.sleep(0.1)
    async with ctxrt.open_runtime(url, readonly=True) as rt:
        m = await rt.open("ann", isolate=True)
        texts = [x.content[0].text for x in await m.get_all_messages()]
    dup = len(texts) - len(set(texts))
    missing = set(acked) - set(texts)
    print("stored", len(texts), "dups", dup, "missing acked", len(missing), "unacked stored", len(set(texts) - set(acked)))
    with psycopg.connect(url, autocommit=True) as c:
        print("open txns", c.execute("SELECT pid, state FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL").fetchall())

with temporary_cluster() as cluster:
    url = cluster.create_database("k1")
    trio.run(main, cluster, url)
