"""A real SIGINT at each line of the lease code (ctxrt/store/postgres.py: close, hold, holds,
release, _on_leases, lapsed, fenced, _Fence) a trio host reaches, each in a fresh process on a
fresh database: the host must end in KeyboardInterrupt with no renewer thread left, and another
engine must take agents/a within the lease's length (given back, or lapsed)."""
import json, os, signal, subprocess, sys, threading, time
HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "ctxrt", "store", "postgres.py")
NAMES = {"close", "hold", "holds", "release", "_lease_arrays", "_on_leases", "overdue", "_cut_leases", "lapsed", "fenced", "check", "around"}
LEASE_MS = 1500

def child(url, target):
    import trio, ctxrt, ctxrt.store.postgres
    from ctxrt.store.postgres import PostgresEngine
    ctxrt.store.postgres.LEASE_MS = LEASE_MS
    reached = []
    fired = [False]
    def trace(frame, event, arg):
        if frame.f_code.co_filename != SRC:
            return None
        if event == "line" and frame.f_code.co_name in NAMES:
            if threading.current_thread() is threading.main_thread():
                reached.append(frame.f_lineno)
                if frame.f_lineno == target and not fired[0]:
                    fired[0] = True
                    os.kill(os.getpid(), signal.SIGINT)
        return trace
    async def host():
        async with ctxrt.open_runtime(url, model=ctxrt.OfflineModel()) as rt:
            m = await rt.open("agents/a", strategy=ctxrt.Autobiographical("x", target_chunk_tokens=50,
                              recent_window_tokens=50, l1_holdback_chunks=0))
            for i in range(6):
                await m.add_message("user", f"words {i} here. " * 20)
            ids = [x.id for x in await m.get_all_messages()]
            await m.pin_range(ids[1], ids[2])
            await m.tick()
            await m.set_strategy(ctxrt.Passthrough())  # gives the lease back
            await m.set_strategy(ctxrt.Autobiographical("x"))  # takes it again
    sys.settrace(trace); threading.settrace(trace)
    try:
        trio.run(host)
        end = "completed"
    except KeyboardInterrupt:
        end = "KeyboardInterrupt"
    except BaseException as exc:
        end = f"{type(exc).__name__}: {str(exc)[:200]}"
    sys.settrace(None); threading.settrace(None)
    renewers = [t.name for t in threading.enumerate() if t.name == "ctxrt lease renewer" and t.is_alive()]
    taker = PostgresEngine(url)
    began = time.monotonic(); taken = None
    while time.monotonic() - began < LEASE_MS / 1000 * 3:
        if taker.hold(1, "agents/a/context"):
            taken = round(time.monotonic() - began, 2); break
        time.sleep(0.05)
    taker.close()
    print(json.dumps({"end": end, "fired": fired[0], "renewers": renewers, "taken_after": taken,
                      "reached": sorted(set(reached)) if target == 0 else None}), flush=True)
    os._exit(0)

if __name__ == "__main__" and len(sys.argv) == 3:
    child(sys.argv[1], int(sys.argv[2]))
elif __name__ == "__main__":
    from ctxrt.pgcluster import temporary_cluster
    env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE))
    def run(url, target):
        p = subprocess.run([sys.executable, __file__, url, str(target)], capture_output=True, text=True, env=env, timeout=120)
        lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
        return json.loads(lines[-1]) if lines else {"end": "NO OUTPUT", "err": p.stderr[-800:]}
    with temporary_cluster() as cluster:
        first = run(cluster.create_database("d0"), 0)
        lines = first["reached"]
        print("lines reached on the main thread:", len(lines), lines, flush=True)
        bad = 0; counts = {}
        for n, target in enumerate(lines):
            r = run(cluster.create_database(f"d{n+1}"), target)
            counts[r["end"]] = counts.get(r["end"], 0) + 1
            ok = r["end"] in ("KeyboardInterrupt", "completed") and not r.get("renewers") and r.get("taken_after") is not None and r["taken_after"] <= LEASE_MS / 1000 + 0.5
            if not ok:
                bad += 1
                print("BAD at line", target, open(SRC).read().splitlines()[target-1].strip(), r, flush=True)
        print("runs:", len(lines), "ends:", counts, "bad:", bad)
