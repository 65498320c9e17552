"""Prepared-statement attacks on PostgreSQL append batches: restarts, backend kills, DISCARD ALL on
the writer's session, states registered by another runtime, batches mixing appends and refusals."""
from __future__ import annotations
import collections, os, sys
import psycopg
import trio
import ctxrt
from ctxrt.pgcluster import temporary_cluster

N = int(os.environ.get("N", "300"))
errors: collections.Counter[str] = collections.Counter()
acked: list[tuple[str, str, str]] = []
failed: list[tuple[str, str]] = []


def note(exc: BaseException) -> None:
    errors[f"{type(exc).__name__}: {str(exc)[:150]}"] += 1


async def appender(m, tag: str, stop: trio.Event) -> None:
    i = 0
    while not stop.is_set():
        text = f"{tag}-{i}"; i += 1
        try:
            acked.append((text, await m.add_message("user", text), m.namespace))
        except Exception as exc:
            note(exc)
            failed.append((text, str(exc)[-90:]))
            await trio.sleep(0.05)


async def run(cluster, url: str) -> int:
    async with ctxrt.open_runtime(url) as rt, ctxrt.open_runtime(url) as other:
        ms = [await rt.open(f"a{k}") for k in range(3)]
        for m in ms:
            await m.add_message("user", "seed")
        stop = trio.Event()
        async with trio.open_nursery() as n:
            for k, m in enumerate(ms):
                n.start_soon(appender, m, f"a{k}", stop)
            await trio.sleep(0.5)
            engine = rt.engine
            if os.environ.get("DISCARD"):  # as a pooler's reset would: the session forgets its statements
                real, calls = engine._apply, [0]
                def apply(*a, **k):
                    calls[0] += 1
                    if calls[0] % 7 == 0:
                        engine._writer.pgconn.exec_(b"DISCARD ALL")
                    return real(*a, **k)
                engine._apply = apply
            for r in range(N):
                what = r % 6
                if os.environ.get("ONLY") and what != int(os.environ["ONLY"]):
                    what = 5
                try:
                    if what == 0 and r % 30 == 0:
                        def bounce():
                            with cluster.down():
                                pass
                        await trio.to_thread.run_sync(bounce)
                    elif what == 1:
                        with psycopg.connect(url, autocommit=True) as admin:
                            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                                          " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                                          " AND %s", (r % 12 == 1,))
                    elif what == 2:
                        x = await other.open(f"o{r}")  # a new state, registered by another runtime
                        await x.add_message("user", "o")
                        await x.aclose()
                    elif what == 3:
                        try:
                            await rt.create_branch("dup")
                        except Exception as exc:
                            errors["expected " + type(exc).__name__] += 1
                        try:
                            await ms[r % 3].edit_message("999999999", "x")
                        except Exception as exc:
                            errors["expected " + type(exc).__name__] += 1
                except Exception as exc:
                    errors["attack " + type(exc).__name__ + str(exc)[:80]] += 1
                await trio.sleep(0.01)
            stop.set()
        # next append works
        for m in ms:
            await m.add_message("user", "after")
        stored = {}
        for m in ms:
            stored.update({x.content[0].text: x.id for x in await m.get_all_messages()})
    bad = 0
    for text, mid, ns in acked:
        if stored.get(text) != mid:
            bad += 1; print("MISSING", text, mid, ns)
    landed = collections.Counter(why for text, why in failed if text in stored)
    print("failed yet stored:", dict(landed))
    for k, v in errors.most_common():
        print(v, k)
    print("acked", len(acked), "bad", bad)
    return bad + sum(v for k, v in errors.items() if "prepared" in k)


import contextlib
_null = contextlib.nullcontext

with temporary_cluster() as cluster:
    url = cluster.create_database("att")
    sys.exit(1 if trio.run(run, cluster, url) else 0)
