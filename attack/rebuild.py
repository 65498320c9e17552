"""rebuild_request while messages are edited/removed concurrently, on a fork, after a switch;
cancelled at increasing deadlines (worker step included): no thread left running, no stuck state (Q5, Q10)."""
import tempfile, threading
import trio
from ctxrt import Budget, Text, open_runtime
from ctxrt import request_ledger as rl

BUDGET = Budget(max_tokens=10_000_000)

async def main():
    stats = dict(rebuilds=0, cancelled=0, edited_named=0, matches=0, errors={})
    in_thread = []
    orig = rl.rebuilt_digested
    def watched(*a):
        in_thread.append(1)
        try:
            return orig(*a)
        finally:
            in_thread.pop()
    import ctxrt.manager as mm
    mm.request_ledger.rebuilt_digested = watched
    with tempfile.TemporaryDirectory() as d:
        async with open_runtime(d, durability="os") as rt:
            m = await rt.open("agents/ann", view_reader="ann", ledger=True)
            ids = []
            for i in range(600):
                ids.append(await m.add_message("user" if i % 2 else "Claude",
                                               [Text(f"message {i} " * 20), Text(f"secret {i}", audience=("ann",))]))
            rec = await m.record_request(await m.compile(BUDGET), form="anthropic")
            body0 = (await m.rebuild_request(rec)).body
            # concurrent edits/removals while rebuilding
            async def mutate(k):
                for j in range(k, 600, 37):
                    if j % 3 == 0:
                        await m.remove_message(ids[j])
                    else:
                        await m.edit_message(ids[j], f"edited {j}")
            for k in range(3):
                async with trio.open_nursery() as n:
                    n.start_soon(mutate, k)
                    rb = await m.rebuild_request(rec)
                    stats["rebuilds"] += 1
                    assert rb.body == body0, "an edit changed the rebuilt body"
                    assert rb.matches
                    stats["edited_named"] = len(rb.edited)
            # on a fork, and after a switch
            name = await m.fork("f1")
            f = await rt.open("agents/ann", view_reader="ann", branch=name, ledger=True)
            rb = await f.rebuild_request(rec)
            assert rb.body == body0 and rb.matches, "fork rebuild differs"
            await f.add_message("user", "on the fork")
            rec_f = await f.record_request(await f.compile(BUDGET), form="openai_chat")
            await m.switch_branch(name)
            rb = await m.rebuild_request(rec)
            assert rb.body == body0 and rb.matches, "rebuild after switch differs"
            assert (await m.rebuild_request(rec_f)).matches
            # cancellation sweep
            deadline = 1e-5
            while deadline < 2.0:
                with trio.move_on_after(deadline) as sc:
                    rb = await m.rebuild_request(rec)
                    stats["matches"] += rb.matches
                stats["rebuilds"] += 1
                if sc.cancelled_caught:
                    stats["cancelled"] += 1
                    assert not in_thread, "a worker thread still runs after a cancelled rebuild"
                deadline *= 1.5
            # still usable
            await m.add_message("user", "after")
            assert (await m.rebuild_request(rec)).matches
            for x in (m, f):
                await x.aclose()
    print(stats, "threads alive:", threading.active_count())
trio.run(main)
