"""Does a standby's last_sequence stall when the primary's last WAL record ends exactly at a page boundary?"""
import time, sys
import psycopg, trio
import ctxrt
from ctxrt.pgcluster import temporary_cluster

def lsn_int(s):
    hi, lo = s.split("/"); return (int(hi, 16) << 32) | int(lo, 16)

with temporary_cluster() as primary:
    url = primary.create_database("s")
    async def setup():
        async with ctxrt.open_runtime(url) as rt:
            await (await rt.open("ann")).add_message("user", "hi")
    trio.run(setup)
    with primary.replica() as standby:
        standby.replayed()
        surl = standby.url("s")
        from ctxrt.store.postgres import PostgresEngine
        eng = PostgresEngine(surl, create=False)
        t = time.monotonic(); print("idle horizon", eng.last_sequence, round(time.monotonic() - t, 3))
        with psycopg.connect(url, autocommit=True) as c:
            def ins():
                return lsn_int(c.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0])
            def emit(n):
                c.execute("SELECT pg_logical_emit_message(false, 'p', repeat('x', %s))", (n,))
            for attempt in range(200):
                a = ins(); emit(1000); b = ins()
                if a // 8192 != b // 8192:
                    continue
                per = b - a  # the size of a 1000-byte message record
                room = 8192 - b % 8192
                if room < per:
                    continue
                emit(1000 + room - per - (attempt % 16))
                e = ins()
                if e % 8192 in (24, 40):
                    print("insert lsn at page offset", e % 8192, "after", attempt + 1, "tries")
                    break
            else:
                print("never landed on a boundary"); sys.exit(1)
        time.sleep(1)
        with psycopg.connect(surl, autocommit=True) as s:
            print("standby replay", s.execute("SELECT pg_last_wal_replay_lsn()::text").fetchone()[0])
        t = time.monotonic()
        try:
            print("horizon", eng.last_sequence, "after", round(time.monotonic() - t, 2), "s")
        except Exception as exc:
            print("raised after", round(time.monotonic() - t, 2), "s:", type(exc).__name__, exc)
        eng.close()
