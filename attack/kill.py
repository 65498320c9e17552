"""Writers SIGKILLed mid-batch on the primary, a reader and subscribers on the standby."""
import os, random, signal, subprocess, sys, time, json
import psycopg, trio
import ctxrt
from ctxrt.pgcluster import temporary_cluster
from ctxrt.verification import verify_postgres

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 10
HERE = os.path.dirname(os.path.abspath(__file__))

def appended(url):
    with psycopg.connect(url) as c:
        return dict(c.execute("SELECT sequence, state FROM ctxrt_items WHERE version = sequence AND branch = 1"))

def spawn(url, p):
    return subprocess.Popen([sys.executable, os.path.join(HERE, "killwriter.py"), url, str(p)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

async def main():
    with temporary_cluster() as primary:
        url = primary.create_database("s")
        async with ctxrt.open_runtime(url) as rt:
            await rt.open("setup")
        with primary.replica() as standby:
            standby.replayed()
            surl = standby.url("s")
            seen, events, problems = [], {}, []
            async with ctxrt.open_runtime(surl, readonly=True) as reader:
                eng = reader.engine
                done = trio.Event()
                async def subscribe(name, isolate):
                    m = await reader.open(name, isolate=isolate)
                    got = events.setdefault(name, [])
                    async with m.subscribe(poll_interval_s=0.01) as ch:
                        async for ev in ch:
                            if type(ev).__name__ == "Added":
                                got.append(ev.message.sequence)
                async def horizons():
                    while not done.is_set():
                        h = await trio.to_thread.run_sync(lambda: eng.last_sequence)
                        vis = await trio.to_thread.run_sync(appended, surl)
                        seen.append((h, frozenset(s for s in vis if s <= h)))
                async def compiles():
                    n = 0
                    while not done.is_set():
                        for p in range(3):
                            m = await reader.open(f"own-{p}", isolate=True)
                            try:
                                await m.compile()
                            except Exception as exc:
                                problems.append(f"compile: {type(exc).__name__}: {exc}")
                            n += 1
                        await trio.sleep(0.05)
                async with trio.open_nursery() as ns:
                    # the writers' slots exist after their first open; start them once first
                    procs = [spawn(url, p) for p in range(3)]
                    for pr in procs:
                        assert (await trio.to_thread.run_sync(pr.stdout.readline)).strip() == "ready"
                    await trio.to_thread.run_sync(standby.replayed)
                    for p in range(3):
                        ns.start_soon(subscribe, f"own-{p}", True)
                    ns.start_soon(subscribe, "shared-0", False)
                    ns.start_soon(horizons)
                    ns.start_soon(compiles)
                    kills = 0
                    for r in range(ROUNDS):
                        await trio.sleep(random.uniform(0.2, 1.0))
                        victim = random.randrange(3)
                        procs[victim].send_signal(signal.SIGKILL)
                        await trio.to_thread.run_sync(procs[victim].wait)
                        kills += 1
                        procs[victim] = spawn(url, victim)
                    await trio.sleep(0.5)
                    for pr in procs:
                        pr.send_signal(signal.SIGKILL); pr.wait()
                    final_h = await trio.to_thread.run_sync(lambda: eng.last_sequence)
                    await trio.sleep(1)
                    done.set()
                    ns.cancel_scope.cancel()
            final = appended(url)
            on_standby = appended(surl)
            hs = [h for h, _ in seen]
            bad_back = sum(1 for a, b in zip(hs, hs[1:]) if b < a)
            bad_skip = [h for h, saw in seen if saw != {s for s in final if s <= h}]
            print(f"kills {kills}, horizons {len(seen)}, messages {len(final)}, final horizon {final_h} max {max(final)}")
            print("horizon went back:", bad_back, "| horizons with a later-appearing message:", len(bad_skip))
            print("standby == primary:", set(on_standby) == set(final))
            for name, got in events.items():
                state_rows = sorted(got)
                print(f"subscribe {name}: {len(got)} events, in order: {got == sorted(got)}, dupes: {len(got) - len(set(got))}")
            # each subscription saw every message of its slot? compare with the slot's rows
            with psycopg.connect(url) as c:
                for name, got in events.items():
                    rows = [r[0] for r in c.execute(
                        "SELECT i.sequence FROM ctxrt_items i JOIN ctxrt_states s ON s.number = i.state "
                        "WHERE i.version = i.sequence AND i.branch = 1 AND s.name LIKE %s ORDER BY i.ordinal",
                        (f"%{name}%",))]
                    missing = {r for r in rows if got and r > min(got)} - set(got)
                    print(f"  {name}: slot rows {len(rows)}, missed by subscriber after its first event {len(missing)}")
            print("problems:", problems[:5], len(problems))
            report = verify_postgres(url)
            print("verify primary:", report)

trio.run(main)
