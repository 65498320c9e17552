"""Cancel `ctxrt serve`'s app (as Ctrl-C does) while its index waits on a paused replay; sweep cancel points."""
import sys, time
from functools import partial
import psycopg, trio
import ctxrt
from ctxrt.inspector import app
from ctxrt.pgcluster import temporary_cluster
sys.path.insert(0, "tests")
from test_inspector import get

async def main():
    with temporary_cluster() as primary:
        url = primary.create_database("s")
        async with ctxrt.open_runtime(url) as rt:
            await (await rt.open("ann")).add_message("user", "x")
        with primary.replica() as standby:
            standby.replayed()
            surl = standby.url("s")
            with psycopg.connect(surl, autocommit=True) as s:
                s.execute("SELECT pg_wal_replay_pause()")
                async with ctxrt.open_runtime(url) as rt:
                    await (await rt.open("ann")).add_message("user", "y")
                worst = 0.0
                for delay in [0.0, 0.001, 0.005, 0.01, 0.05, 0.1, 0.3, 1.0]:
                    async with ctxrt.open_runtime(surl, readonly=True) as runtime:
                        async with trio.open_nursery() as outer:
                            with trio.CancelScope() as scope:
                                async with trio.open_nursery() as ns:
                                    base = await ns.start(partial(app.serve, runtime, "s", port=0))
                                    async def ask():
                                        with trio.move_on_after(60):
                                            try:
                                                await get(base + "/")
                                            except Exception:
                                                pass
                                    outer.start_soon(ask)
                                    await trio.sleep(delay)
                                    t = time.monotonic()
                                    scope.cancel()
                            took = time.monotonic() - t
                            outer.cancel_scope.cancel()
                        worst = max(worst, took)
                        print(f"cancel after {delay}s: the app stopped in {took:.2f} s")
                    # direct: trio.move_on_after around a to_thread horizon
                s.execute("SELECT pg_wal_replay_resume()")
                print("worst", worst)

import faulthandler; faulthandler.dump_traceback_later(70, exit=True)
trio.run(main)
