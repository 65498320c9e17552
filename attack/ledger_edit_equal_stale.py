"""An edit from {"n": 1} to {"n": True} (equal in Python, not in JSON): the next compile hands back
the old message (compile/pipeline.py compares entries with ==), so the body sends 1 while the store
holds true; a fresh runtime compiles true. usage: ledger_edit_equal_stale.py STORE"""
import sys, trio, ctxrt
from ctxrt import Budget, Text, ToolUse, ToolResult
from ctxrt import request_ledger as rl
B = Budget(max_tokens=20000, reserve_for_response=500)
async def main():
    async with ctxrt.open_runtime(sys.argv[1]) as rt:
        m = await rt.open("agents/a", ledger=True)
        await m.add_message("user", "hi")
        call = await m.add_message("Claude", [Text("calling"), ToolUse("t1", "set", {"n": 1})])
        await m.add_message("user", [ToolResult("t1", "ok")])
        r1 = await m.compile(B)
        await m.edit_message(call, [Text("calling"), ToolUse("t1", "set", {"n": True})])
        print("stored:", (await m.get_message(call)).content[1].input)
        r2 = await m.compile(B)
        print("compiled:", r2.messages[1].content[1].input, r2.messages[1] is r1.messages[1])
        rec = await m.record_request(r2, form="anthropic", options={"assistant": "Claude"})
        rb = await m.rebuild_request(rec)
        print("rebuilt:", rb.body["messages"][1]["content"][1]["input"], rb.matches, rb.edited)
    async with ctxrt.open_runtime(sys.argv[1]) as rt:
        m = await rt.open("agents/a")
        r3 = await m.compile(B)
        print("fresh runtime compiled:", r3.messages[1].content[1].input)
trio.run(main)
