"""An edit that leaves a message equal (Python ==) but not the same JSON: 1 -> True -> 1.0 in a
tool call's input. Does the recorded digest follow what is sent?"""
import copy, sys
import trio
import ctxrt
from ctxrt import Budget, CompileResult, Text, ToolUse, ToolResult
from ctxrt import request_ledger as rl

B = Budget(max_tokens=20000, reserve_for_response=500)
OPTS = {"assistant": "Claude"}


def fresh(result, form):
    alone = CompileResult(list(result.messages), list(result.system_injections), result.provenance,
                          result.stable_prefix_tokens)
    return rl.make_body(alone, form, dict(OPTS))


async def main(path, forms):
    async with ctxrt.open_runtime(path) as rt:
        m = await rt.open("agents/a", ledger=True)
        for n in range(6):
            await m.add_message("user" if n % 2 else "Claude", f"m{n}")
        call = await m.add_message("Claude", [Text("calling"), ToolUse("t1", "set", {"n": 1})])
        await m.add_message("user", [ToolResult("t1", "ok")])
        for n in range(4):
            await m.add_message("user" if n % 2 else "Claude", f"after{n}")
        for form in forms:
            r = await m.compile(B)
            await m.record_request(r, form=form, options=OPTS)
        for value in (True, 1.0, 1, -0.0, 0, False):
            await m.edit_message(call, [Text("calling"), ToolUse("t1", "set", {"n": value})])
            await m.add_message("user", f"next {value!r}")
            for form in forms:
                r = await m.compile(B)
                sent = rl.make_body(r, form, dict(OPTS))
                scratch = fresh(r, form)
                rec = await m.record_request(r, form=form, options=OPTS)
                same_body = rl.canonical_json(sent) == rl.canonical_json(scratch)
                ok = rec.body_digest == rl.body_digest(copy.deepcopy(scratch))
                rb = await m.rebuild_request(rec)
                print(f"{value!r:6} {form:17} body==scratch(JSON): {same_body}  digest ok: {ok}  rebuild matches: {rb.matches}")
        await m.aclose()

trio.run(main, sys.argv[1], sys.argv[2].split(","))
