"""`ctxrt serve` on the standby URL, headless: pages under writes, a primary restart, a paused replay, a standby restart."""
import json, os, re, signal, subprocess, sys, time, threading, urllib.request, urllib.error
import psycopg, trio
import ctxrt
from ctxrt.pgcluster import temporary_cluster

def get(url, timeout=60):
    t = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode(), round(time.monotonic() - t, 2)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), round(time.monotonic() - t, 2)
    except Exception as e:
        return type(e).__name__, str(e), round(time.monotonic() - t, 2)

PAGES = ["/", "/timeline?branch=main", "/namespaces?branch=main", "/search?q=line&branch=main"]

def sweep(base, tag, stats):
    for p in PAGES:
        st, body, dt = get(base + p)
        key = (tag, p, st)
        stats.setdefault(key, []).append(dt)
        if st not in (200,) and len(stats[key]) == 1:
            m = re.search(r"<title>(.*?)</title>", body or "", re.S)
            print(f"  {tag} {p}: {st} in {dt}s title={m.group(1).strip() if m else None} body[:200]={re.sub(r'<[^>]+>', ' ', body)[:300]!r}")

async def main():
    with temporary_cluster() as primary:
        url = primary.create_database("s")
        async with ctxrt.open_runtime(url) as rt:
            await (await rt.open("agents/ann")).add_message("user", "the first line")
        with primary.replica() as standby:
            standby.replayed()
            surl = standby.url("s")
            proc = subprocess.Popen([sys.executable, "-m", "ctxrt", "serve", "--json", "--port", "0", surl],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            line = proc.stdout.readline()
            print("serve says:", line.strip()[:200])
            m = re.search(r"http://[0-9.:]+", line)
            base = m.group(0)
            stats = {}
            sweep(base, "idle", stats)
            # writes on the primary while pages are fetched
            stop = threading.Event()
            def writer():
                async def w():
                    async with ctxrt.open_runtime(url) as rt:
                        ann = await rt.open("agents/ann")
                        n = 0
                        while not stop.is_set():
                            try:
                                await ann.add_message("user", f"line {n}"); n += 1
                            except Exception as exc:
                                await trio.sleep(0.2)
                try:
                    trio.run(w)
                except Exception as exc:
                    print("writer ended:", type(exc).__name__, str(exc)[:200])
            th = threading.Thread(target=writer); th.start()
            for _ in range(5):
                sweep(base, "writes", stats)
            stop.set(); th.join()
            # the primary restarted
            with primary._lock:
                primary._halt("immediate")
            for _ in range(2):
                sweep(base, "primary-down", stats)
            primary._launch()
            for _ in range(2):
                sweep(base, "primary-back", stats)
            # paused replay: the index waits for the horizon; do other pages wait with it?
            with psycopg.connect(surl, autocommit=True) as s:
                s.execute("SELECT pg_wal_replay_pause()")
                async with ctxrt.open_runtime(url) as w:
                    await (await w.open("agents/ann")).add_message("user", "not replayed")
                res = {}
                t = threading.Thread(target=lambda: res.update(index=get(base + "/")))
                t.start(); time.sleep(1)
                res["timeline"] = get(base + "/timeline?branch=main")
                t.join()
                s.execute("SELECT pg_wal_replay_resume()")
                print("paused replay: index", res["index"][0], res["index"][2], "s; timeline meanwhile", res["timeline"][0], res["timeline"][2], "s")
                if res["index"][0] != 200:
                    print("   index body:", re.sub(r"<[^>]+>", " ", res["index"][1])[:300])
            # the standby restarted
            with standby._lock:
                standby._halt("fast")
            sweep(base, "standby-down", stats)
            standby._launch()
            for _ in range(2):
                sweep(base, "standby-back", stats)
            print("serve alive:", proc.poll() is None)
            for k, v in sorted(stats.items(), key=str):
                print(k, len(v), "max", max(v))
            proc.send_signal(signal.SIGINT)
            try:
                out, err = proc.communicate(timeout=30)
                print("serve exit", proc.returncode, err[-500:])
            except subprocess.TimeoutExpired:
                print("serve didn't exit on SIGINT in 30 s"); proc.kill()

trio.run(main)
