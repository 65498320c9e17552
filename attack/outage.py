"""The primary stopped (immediate) / restarted under a standby reader; replay paused; a ledger namespace."""
import sys, time, threading
import psycopg, trio
import ctxrt
from ctxrt.pgcluster import temporary_cluster

def timed(f):
    t = time.monotonic()
    try:
        r = f(); return ("ok", r, round(time.monotonic() - t, 2))
    except BaseException as exc:
        return (type(exc).__name__, str(exc)[:300], round(time.monotonic() - t, 2))

async def main(which):
    with temporary_cluster() as primary:
        url = primary.create_database("s")
        async with ctxrt.open_runtime(url) as rt:
            ann = await rt.open("ann", ledger=True)
            await ann.add_message("user", "hi")
        with primary.replica() as standby:
            standby.replayed()
            surl = standby.url("s")
            async with ctxrt.open_runtime(surl, readonly=True) as reader:
                eng = reader.engine
                print("first", timed(lambda: eng.last_sequence))
                if "primary" in which:
                    # a thread calling last_sequence in a loop while the primary goes down immediate
                    results = []
                    stop = threading.Event()
                    def loop():
                        while not stop.is_set():
                            results.append((round(time.monotonic(), 2),) + timed(lambda: eng.last_sequence))
                    th = threading.Thread(target=loop); th.start()
                    time.sleep(0.3)
                    t0 = time.monotonic()
                    with primary._lock:
                        primary._halt("immediate")
                    print("primary halted", round(time.monotonic() - t0, 2))
                    time.sleep(3)
                    # reads that need no horizon still work?
                    m = await reader.open("ann")
                    print("read during outage", timed(lambda: None), len(await m.get_all_messages()))
                    t1 = time.monotonic()
                    primary._launch()
                    print("primary restarted", round(time.monotonic() - t1, 2))
                    time.sleep(3)
                    stop.set(); th.join()
                    kinds = {}
                    for r in results:
                        kinds.setdefault(r[1], []).append(r)
                    for k, v in kinds.items():
                        print(k, len(v), "max dur", max(x[3] for x in v), "first", v[0][:4], "last", v[-1][:4])
                    errs = [r for r in results if r[1] != "ok"]
                    if errs:
                        print("error samples:", {e[2] for e in errs})
                    oks_after = [r for r in results if r[1] == "ok" and r[0] > t1]
                    print("recovered after restart:", bool(oks_after), (oks_after[0][0] - t1) if oks_after else None)
                if "standby" in which:
                    results = []
                    stop = threading.Event()
                    def loop():
                        while not stop.is_set():
                            results.append((round(time.monotonic(), 2),) + timed(lambda: eng.last_sequence))
                    th = threading.Thread(target=loop); th.start()
                    time.sleep(0.3)
                    for mode in ("fast", "immediate"):
                        with standby._lock:
                            standby._halt(mode)
                        time.sleep(1)
                        try:
                            m = await reader.open("ann")
                            print(mode, "read during standby outage:", len(await m.get_all_messages()))
                        except Exception as exc:
                            print(mode, "read during standby outage:", type(exc).__name__, str(exc)[:200])
                        t1 = time.monotonic()
                        standby._launch()
                        time.sleep(2)
                        print(mode, "read after:", len(await (await reader.open("ann")).get_all_messages()))
                    stop.set(); th.join()
                    kinds = {}
                    for r in results:
                        kinds.setdefault((r[1], str(r[2])[:150] if r[1] != "ok" else ""), []).append(r)
                    for k, v in kinds.items():
                        print(len(v), k, "max dur", max(x[3] for x in v))
                    print("last:", results[-1])
                if "pause" in which:
                    with psycopg.connect(surl, autocommit=True) as s:
                        s.execute("SELECT pg_wal_replay_pause()")
                        async with ctxrt.open_runtime(url) as w:
                            await (await w.open("ann", ledger=True)).add_message("user", "more")
                        print("paused; last_sequence:", timed(lambda: eng.last_sequence))
                        # trio cancellation around the public path that reaches it: the inspector's index
                        # and a ledger namespace's compile on the read-only runtime
                        m = await reader.open("ann", ledger=True)
                        t = time.monotonic()
                        with trio.move_on_after(0.5) as cs:
                            try:
                                await m.compile()
                                print("compile with ledger answered")
                            except Exception as exc:
                                print("compile raised", type(exc).__name__, str(exc)[:200])
                        print("compile with ledger, move_on_after(0.5): cancelled", cs.cancelled_caught, "after", round(time.monotonic() - t, 2))
                        s.execute("SELECT pg_wal_replay_resume()")
                    print("resumed:", timed(lambda: eng.last_sequence))
                if "ledger" in which:
                    m = await reader.open("ann", ledger=True)
                    print("compile ok", timed(lambda: None))
                    await m.compile()
                    with primary._lock:
                        primary._halt("immediate")
                    t = time.monotonic()
                    try:
                        await m.compile()
                        print("compile with ledger during outage ok", round(time.monotonic() - t, 2))
                    except Exception as exc:
                        print("compile with ledger during outage:", type(exc).__name__, str(exc)[:300], round(time.monotonic() - t, 2))
                    try:
                        print("messages during outage", len(await m.get_all_messages()))
                    except Exception as exc:
                        print("messages during outage:", type(exc).__name__, str(exc)[:300])
                    primary._launch()
                    try:
                        await m.compile(); print("compile after restart ok")
                    except Exception as exc:
                        print("compile after restart:", type(exc).__name__, str(exc)[:300])

trio.run(main, sys.argv[1])
