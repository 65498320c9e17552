"""A record of main made after a fork, rebuilt by a manager on the fork (or switched to it)."""
import tempfile
import trio
from ctxrt import Budget, open_runtime

B = Budget(max_tokens=10_000)
async def main():
    with tempfile.TemporaryDirectory() as d:
        async with open_runtime(d, durability="os") as rt:
            m = await rt.open("agents/ann", view_reader="ann", ledger=True)
            await m.add_message("user", "before fork")
            name = (await rt.create_branch("f1")).name
            f = await rt.open("agents/ann", view_reader="ann", branch=name)
            await m.add_message("user", "main only after fork")
            await f.add_message("user", "fork only")
            rec = await m.record_request(await m.compile(B), form="anthropic")
            for who, mgr in (("fork manager", f),):
                try:
                    rb = await mgr.rebuild_request(rec)
                    print(who, "matches:", rb.matches, "edited:", rb.edited, "fork text in body:", "fork only" in str(rb.body))
                except Exception as exc:
                    print(who, type(exc).__name__, exc)
            # an edit on the fork of a shared message: does rebuilding main's record on the fork name it edited?
            first = (rec.held[0].id)
            await f.edit_message(first, "edited on fork")
            print("main rebuild edited:", (await m.rebuild_request(rec)).edited)
            try:
                print("fork rebuild edited:", (await f.rebuild_request(rec)).edited)
            except Exception as exc:
                print("fork rebuild:", type(exc).__name__, exc)
trio.run(main)
