"""K1 attack: refused appends (deleted branch by another process, lapsed lease) must move no sequence."""
import sys, psycopg, trio, ctxrt
from ctxrt.testing import temporary_cluster

def seq(url):
    with psycopg.connect(url, autocommit=True) as c:
        return c.execute("SELECT last_value, is_called FROM ctxrt_sequence").fetchone()

async def main(url):
    async with ctxrt.open_runtime(url) as a, ctxrt.open_runtime(url) as b:
        await a.create_branch("b")
        m = await a.open("ann", branch="b", isolate=True)
        for i in range(3):
            await m.add_message("user", f"x{i}")
        await b.delete_branch("b")
        before = seq(url)
        try:
            await m.add_message("user", "after delete")
            print("deleted: NOT refused")
        except Exception as exc:
            print("deleted: refused", type(exc).__name__)
        print("deleted branch: seq", before, "->", seq(url))
        # lease
        h = await a.open("agents/a", strategy=ctxrt.Autobiographical("claude-haiku-4-5"))
        for i in range(3):
            await h.add_message("user", f"l{i}")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("UPDATE ctxrt_leases SET expires = now() - interval '1 second'")
        t = await b.open("agents/a", strategy=ctxrt.Autobiographical("claude-haiku-4-5"))
        before = seq(url)
        try:
            await h.add_message("user", "fenced")
            print("fenced: NOT refused")
        except Exception as exc:
            print("fenced: refused", type(exc).__name__)
        print("fenced: seq", before, "->", seq(url))

with temporary_cluster() as cluster:
    url = cluster.create_database("k1")
    print(url)
    trio.run(main, url)
