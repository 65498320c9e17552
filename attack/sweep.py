"""Every write API through a standby runtime; reads blocked behind a horizon wait; a role without pg_read_all_stats."""
import sys, time, threading
import psycopg, trio
import ctxrt
from ctxrt.pgcluster import temporary_cluster
from ctxrt.errors import ReadOnlyStoreError

def snapshot(url):
    with psycopg.connect(url) as c:
        out = {}
        for t in ("ctxrt_items", "ctxrt_heads", "ctxrt_values", "ctxrt_branches", "ctxrt_states", "ctxrt_blobs", "ctxrt_meta"):
            out[t] = c.execute(f"SELECT md5(string_agg(t::text, ',' ORDER BY t::text)), count(*) FROM {t} t").fetchone()
        out["seq"] = c.execute("SELECT last_value FROM ctxrt_sequence").fetchone()
        return out

async def main():
    with temporary_cluster() as primary:
        url = primary.create_database("s")
        async with ctxrt.open_runtime(url) as rt:
            ann = await rt.open("ann", ledger=True)
            a = await ann.add_message("user", "hi")
            b = await ann.add_message("assistant", "hello")
            await rt.create_branch("feat")
            hs = await rt.host_state("cfg")
            await hs.set({"x": 1})
        with primary.replica() as standby:
            standby.replayed()
            surl = standby.url("s")
            before = snapshot(url)
            ok, bad = 0, []
            async with ctxrt.open_runtime(surl, readonly=True) as reader:
                m = await reader.open("ann", ledger=True)
                res = await m.compile()
                hs = await reader.host_state("cfg")
                calls = {
                    "add_message": lambda: m.add_message("user", "x"),
                    "edit_message": lambda: m.edit_message(a, "y"),
                    "remove_message": lambda: m.remove_message(a),
                    "remove_messages": lambda: m.remove_messages(a, b),
                    "fork": lambda: m.fork("f2"),
                    "branch_at": lambda: m.branch_at(a, "f3"),
                    "derive": lambda: m.derive("d"),
                    "set_strategy": lambda: m.set_strategy(ctxrt.StrategyConfig() if hasattr(ctxrt, "StrategyConfig") else None),
                    "pin_range": lambda: m.pin_range(a, b),
                    "mark_document": lambda: m.mark_document(a, b, "t"),
                    "set_anchor": lambda: m.set_anchor(a),
                    "reset_head_window": lambda: m.reset_head_window("t"),
                    "update_context_settings": lambda: m.update_context_settings(),
                    "hold_compression": lambda: m.hold_compression([a]),
                    "record_request": lambda: m.record_request(res, form="anthropic", model="m"),
                    "switch_branch(m)": lambda: m.switch_branch("feat"),
                    "host_state.set": lambda: hs.set({"x": 2}),
                    "host_state.append": lambda: hs.append({"y": 1}),
                    "create_branch": lambda: reader.create_branch("g"),
                    "delete_branch": lambda: reader.delete_branch("feat"),
                    "switch_branch(rt)": lambda: reader.switch_branch("main", "feat"),
                    "open new namespace": lambda: reader.open("newone"),
                    "tick": lambda: m.tick(),
                    "retry_quarantined": lambda: m.retry_quarantined(),
                    "unpin": lambda: m.unpin("pin-0"),
                }
                for name, call in calls.items():
                    try:
                        r = await call()
                        bad.append((name, "answered", repr(r)[:80]))
                    except ReadOnlyStoreError as exc:
                        if "standby" in str(exc) or "read-only" in str(exc) or "readonly" in str(exc):
                            ok += 1
                        else:
                            bad.append((name, "ReadOnlyStoreError w/o naming", str(exc)[:150]))
                        print(f"{name}: {str(exc)[:160]}")
                    except Exception as exc:
                        bad.append((name, type(exc).__name__, str(exc)[:200]))
                # the runtime still serves
                print("still reads:", len(await m.get_all_messages()))
            primary_after = snapshot(url)
            standby.replayed()
            print("refused:", ok, "of", len(calls))
            for x in bad: print("  NOT REFUSED:", x)
            print("store unchanged on the primary:", before == primary_after)
            print("  diffs:", [k for k in before if before[k] != primary_after[k]])

            # reads in the same process while a horizon waits on a paused replay
            async with ctxrt.open_runtime(surl, readonly=True) as reader:
                m = await reader.open("ann")
                with psycopg.connect(surl, autocommit=True) as s:
                    s.execute("SELECT pg_wal_replay_pause()")
                    async with ctxrt.open_runtime(url) as w:
                        await (await w.open("ann")).add_message("user", "more")
                    th = threading.Thread(target=lambda: print("horizon thread:", (lambda: (reader.engine.last_sequence))() if False else None))
                    res = {}
                    def wait():
                        t = time.monotonic()
                        try: reader.engine.last_sequence
                        except Exception as exc: res["e"] = type(exc).__name__
                        res["t"] = time.monotonic() - t
                    th = threading.Thread(target=wait); th.start()
                    time.sleep(0.5)
                    t = time.monotonic()
                    n = len(await m.get_all_messages())
                    print(f"a read beside a horizon waiting on a paused replay took {time.monotonic() - t:.2f} s")
                    s.execute("SELECT pg_wal_replay_resume()")
                    th.join()
                    print("the horizon:", res)

            # a role without pg_read_all_stats
            with psycopg.connect(primary.url("s"), autocommit=True) as c:
                c.execute("CREATE ROLE plain LOGIN")
                c.execute("GRANT SELECT ON ALL TABLES IN SCHEMA public TO plain")
                c.execute("GRANT SELECT ON ALL SEQUENCES IN SCHEMA public TO plain")
            standby.replayed()
            purl = surl.replace("ctxrt@", "plain@")
            try:
                async with ctxrt.open_runtime(purl, readonly=True) as r2:
                    print("plain role reads:", len(await (await r2.open("ann")).get_all_messages()))
                    try:
                        print("plain role horizon:", r2.engine.last_sequence)
                    except Exception as exc:
                        print("plain role horizon:", type(exc).__name__, str(exc)[:400])
            except Exception as exc:
                print("plain role open:", type(exc).__name__, str(exc)[:400])

trio.run(main)
