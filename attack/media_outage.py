"""The store going away as a compression request's media is read back (M13) for the model call: the
drain's floor committed, its request made, and the actor reading the messages' image bytes for the
model meets the outage. The namespace must wait for the store (health) and compress again once it is
back; the runtime (and its other namespaces) must live on.

    PYTHONPATH=. python attack/media_outage.py
"""

from __future__ import annotations

import base64
import sys
import traceback

import psycopg
import trio

import ctxrt
from ctxrt import Image, Text
from ctxrt.testing import ScriptedModel, temporary_cluster


def png(n: int) -> str:
    return base64.b64encode(b"\x89PNG\r\n\x1a\n" + n.to_bytes(4, "big") + bytes(range(256)) * 3).decode()


def allow(admin: str, database: str, allowed: bool) -> None:
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS {}").format(
            psycopg.sql.Identifier(database), psycopg.sql.SQL("true" if allowed else "false")))
        if not allowed:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (database,))


async def main() -> None:
    with temporary_cluster() as cluster:
        url = cluster.create_database("media")
        admin = cluster.url()
        async with ctxrt.open_runtime(url) as rt:  # written by another runtime: nothing cached
            m = await rt.open("ns")
            for i in range(12):
                await m.add_message("user", [Text(f"screenshot {i} " + "word " * 20), Image(
                    source={"type": "base64", "media_type": "image/png", "data": png(i)})])
        model = ScriptedModel(lambda request: "what the screenshots showed " * 5)
        try:
            with trio.fail_after(60):
                async with ctxrt.open_runtime(url, model=model) as rt:
                    real = rt.engine.read_blob
                    cut = []

                    def read_blob(sha256: str):
                        if not cut and any(f.name == "_with_media" for f in traceback.extract_stack()):
                            # the first media read for a model call: the server goes away here
                            cut.append(True)
                            allow(admin, "media", False)
                        return real(sha256)
                    rt.engine.read_blob = read_blob
                    other = await rt.open("other")  # a namespace that has nothing to do with it
                    m = await rt.open("ns", strategy=ctxrt.Autobiographical(
                        "test-model", target_chunk_tokens=60, recent_window_tokens=0, head_window_tokens=1500,
                        l1_holdback_chunks=0, auto_tick=True))
                    await m.compile_metadata(ctxrt.Budget(max_tokens=100_000, reserve_for_response=0))  # reads no blob (M13)
                    await m.add_message("user", "one more line " + "word " * 20)  # the drain starts with a message
                    for _ in range(100):
                        if cut:
                            break
                        await trio.sleep(0.05)
                    else:
                        print("no media read; requests:", len(model.requests), await m.health())
                        print([[type(b).__name__ for msg in r.messages for b in msg.content] for r in model.requests][:2])
                        return
                    await trio.sleep(1)
                    try:
                        print("health during:", await m.health())
                    except Exception as exc:
                        print("health during raised", repr(exc))
                    allow(admin, "media", True)
                    for _ in range(100):
                        await trio.sleep(0.2)
                        h = await m.health()
                        if len(model.requests) and h.pending_units == 0 and h.waiting_for is None:
                            break
                    print("after:", h, "requests", len(model.requests))
                    await other.add_message("user", "still here")
                    print("other namespace answers")
        except BaseException:
            traceback.print_exc()
            print("THE RUNTIME FAILED")
            allow(admin, "media", True)


if __name__ == "__main__":
    trio.run(main)
