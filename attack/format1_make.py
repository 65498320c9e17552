"""Run with the base tree (20470cf) on the path: make a store whose ledger holds format-1 records
(all-user merged turns, tool calls, images, edits, a fork, every form), and write what each record's
body was (JSON) beside it. usage: format1_make.py STORE OUT.json"""
import json, random, sys, pathlib
import trio
import ctxrt
from ctxrt import Budget, Text, Image, ToolUse, ToolResult, open_runtime

FORMS = ("anthropic", "openai_chat", "openai_responses")


async def main():
    store, out = pathlib.Path(sys.argv[1]), sys.argv[2]
    rnd = random.Random(7)
    made = []
    async with open_runtime(store, durability="os") as rt:
        m = await rt.open("ns", ledger=True)
        ids = []
        for turn in range(120):
            if turn % 5 == 4:
                ids.append(await m.add_message("Claude", [Text("call"), ToolUse(f"t{turn}", "f", {"x": turn})]))
                ids.append(await m.add_message("user", [ToolResult(f"t{turn}", "ok")]))
            elif turn % 7 == 6:
                ids.append(await m.add_message("user", [Text("img"), Image({"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="})]))
            else:
                for _ in range(rnd.choice((1, 4, 12))):
                    ids.append(await m.add_message("user", f"u {turn} {rnd.random():.4f}"))
            if turn == 60:
                await m.fork("side")
            budget = rnd.choice((6_000, 100_000))
            result = await m.compile(Budget(max_tokens=budget, reserve_for_response=0))
            form = FORMS[turn % 3]
            body = getattr(result, f"to_{form}")(assistant={"Claude", "assistant"})
            record = await m.record_request(result, form=form)
            made.append({"id": record.id, "branch": record.branch, "body": body})
        # edits after: their records' rebuilds must name them
        for target in ids[::17]:
            await m.edit_message(target, "edited later")
        await m.aclose()
    pathlib.Path(out).write_text(json.dumps({"records": made, "edited": ids[::17]}, default=list))

trio.run(main)
