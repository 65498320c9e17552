"""The standby promoted (pg_ctl promote) under a reader."""
import time
import psycopg, trio
import ctxrt
from ctxrt.pgcluster import temporary_cluster

def timed(f):
    t = time.monotonic()
    try:
        r = f(); return ("ok", r, round(time.monotonic() - t, 2))
    except BaseException as exc:
        return (type(exc).__name__, str(exc)[:250], round(time.monotonic() - t, 2))

def top(url):
    with psycopg.connect(url) as c:
        return c.execute("SELECT max(sequence) FROM ctxrt_items").fetchone()[0]

async def main():
    with temporary_cluster() as primary:
        url = primary.create_database("s")
        async with ctxrt.open_runtime(url) as rt:
            await (await rt.open("ann")).add_message("user", "hi")
        with primary.replica() as standby:
            standby.replayed()
            surl = standby.url("s")
            async with ctxrt.open_runtime(surl, readonly=True) as reader:
                eng = reader.engine
                print("before promote:", timed(lambda: eng.last_sequence))
                r = standby._runner
                done = r.run(r.command("pg_ctl", "promote", "-D", str(standby.data_dir), "-w"), cwd=standby.directory, timeout=60)
                print("promote rc", done.returncode)
                print("after promote, old primary idle:", timed(lambda: eng.last_sequence))
                async with ctxrt.open_runtime(surl) as w:
                    for i in range(3):
                        await (await w.open("ann")).add_message("user", f"on the promoted {i}")
                print("max seq on promoted:", top(surl))
                print("after writes on the promoted:", timed(lambda: eng.last_sequence))
                print("reader sees", len(await (await reader.open("ann")).get_all_messages()), "messages")
                async with ctxrt.open_runtime(url) as w:
                    await (await w.open("ann")).add_message("user", "on the old primary")
                print("after a write on the old primary:", timed(lambda: eng.last_sequence))
                with primary._lock:
                    primary._halt("immediate")
                print("old primary down:", timed(lambda: eng.last_sequence))
                primary._launch()

trio.run(main)
