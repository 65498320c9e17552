"""With HEAD: read the format-1 records format1_make.py made, verify the store, rebuild each record
(body equal to what was sent, matches, edits named), then record format-2 records on top (kept
against a format-1 base? the encoder starts whole after an open) and read them all back.
usage: format1_read.py STORE MADE.json"""
import json, subprocess, sys, pathlib
import trio
from ctxrt import Budget, open_runtime
from ctxrt.request_ledger import body_digest, body_digest_v1


def canon(x):
    return json.loads(json.dumps(x, sort_keys=True, default=list))


async def main():
    store, made = pathlib.Path(sys.argv[1]), json.loads(pathlib.Path(sys.argv[2]).read_text())
    sent = {r["id"]: r for r in made["records"]}
    edited = set(made["edited"])
    out = {"records": 0, "body==sent": 0, "matches": 0, "v1 digest == recorded": 0, "edits named right": 0}
    async with open_runtime(store, durability="os") as rt:
        for branch in ("main", "side"):
            m = await rt.open("ns", branch=branch)
            records = await m.requests(limit=100_000)
            for record in records:
                out["records"] += 1
                rebuilt = await m.rebuild_request(record)
                out["matches"] += rebuilt.matches
                was = sent[record.id]["body"]
                out["body==sent"] += canon(rebuilt.body) == canon(was)
                out["v1 digest == recorded"] += body_digest_v1(was) == record.body_digest
                held = {h.id for h in record.held if h.kind == "message"}
                out["edits named right"] += set(rebuilt.edited) == (held & edited if branch == "side" else set())
            # format-2 records on top of format-1 ones
            result = await m.compile(Budget(max_tokens=100_000, reserve_for_response=0))
            r2 = await m.record_request(result, form="anthropic")
            await m.add_message("user", "more")
            r3 = await m.record_request(await m.compile(Budget(max_tokens=100_000, reserve_for_response=0)), form="anthropic")
            back = await m.requests(limit=2)
            assert [r.id for r in back] == [r2.id, r3.id], (back, r2.id, r3.id)
            for r in (r2, r3):
                assert (await m.rebuild_request(r)).matches
            holding = await m.requests(holding=records[-1].held[-1].id, limit=100_000)
            out[f"holding on {branch}"] = len(holding)
            await m.aclose()
    print(out)
    print(subprocess.run([sys.executable, "-m", "ctxrt", "verify", str(store)], capture_output=True, text=True).stdout[-600:])

trio.run(main)
