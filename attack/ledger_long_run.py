"""A host's long run against the ledger: every recorded digest == the from-scratch digest of the
body the form makes; rebuilds match; verify sound. usage: ledger_long_run.py STORE TURNS SEED [--write-only]"""
import random, sys, copy, os
import trio
import ctxrt
from ctxrt import Budget, Text, Image, ToolUse, ToolResult, open_runtime, Injection, MessageInjection, CompileResult, Passthrough
from ctxrt import request_ledger as rl
from ctxrt.verification import verify

store, TURNS, SEED = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
WRITE_ONLY = "--write-only" in sys.argv


def STRATEGY():
    if os.environ.get("AUTOBIO"):
        return {"strategy": ctxrt.Autobiographical("model-x", target_chunk_tokens=200, recent_window_tokens=400,
                                                   l1_holdback_chunks=0, summary_target_tokens=60,
                                                   head_window_tokens=100),
                "model": ctxrt.OfflineModel()}
    return {"strategy": Passthrough()}
rng = random.Random(SEED)
PIX = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}
FORMS = {"anthropic": {"assistant": "Claude"}, "openai_chat": {"assistant": ["Claude"], "system": "sys"},
         "openai_responses": {"assistant": "Claude", "system": "be"}}
stats = {"records": 0, "digest_checks": 0, "rebuilds": 0, "edited_named": 0, "forks": 0, "switches": 0, "mismatch": 0}


def content(n):
    r = rng.random()
    if r < 0.05:
        return [Text(f"look {n}"), Image(PIX)]
    if os.environ.get("MARKS") and r < 0.2:  # many cache markers: the 4-marker cap edits copies
        return [Text(f"marked {n}", cache_control={"type": "ephemeral"}), Text("and more")]
    return f"message {n} " + "word " * rng.randint(1, 40)


def fresh_digest(result, form, options):
    """The body made from scratch (a result with its own cache) and digested without a memo."""
    alone = CompileResult(list(result.messages), list(result.system_injections), result.provenance,
                          result.stable_prefix_tokens)
    return rl.body_digest(copy.deepcopy(rl.make_body(alone, form, dict(options))))


async def host(m, name, form_choice, made, n_turns):
    budget = Budget(max_tokens=rng.choice([3000, 30000, 60000]), reserve_for_response=500)
    tool = 0
    ids = []
    for turn in range(n_turns):
        r = rng.random()
        if r < 0.1:  # a tool call and its result
            tool += 1
            ids.append(await m.add_message("Claude", [Text("calling"), ToolUse(f"t{SEED}{name[-1]}{tool}", "grep", {"q": turn})]))
            ids.append(await m.add_message("user", [ToolResult(f"t{SEED}{name[-1]}{tool}", f"found {turn}")]))
        elif r < 0.25:  # all-user run (merged into one item)
            for k in range(rng.randint(2, 6)):
                ids.append(await m.add_message("user", content(turn * 10 + k)))
        else:
            ids.append(await m.add_message(rng.choice(["user", "Claude"]), content(turn)))
        if rng.random() < 0.03 and len(ids) > 5:  # an edit of an older message
            await m.edit_message(rng.choice(ids[-50:]), f"edited at {turn}")
        if rng.random() < 0.01 and len(ids) > 5:
            victim = rng.choice(ids[-30:-2])
            try:
                await m.remove_message(victim)
                ids.remove(victim)
            except ctxrt.CtxrtError:
                pass
        if rng.random() < 0.02:  # a budget change: the window jumps
            budget = Budget(max_tokens=rng.choice([1500, 3000, 20000, 60000, 100000]), reserve_for_response=500)
        inj, minj = [], []
        if rng.random() < 0.2:
            inj.append(Injection(name, rng.choice(["system", "before_user", "after_user"]), f"note {turn}"))
        if rng.random() < 0.1:
            minj.append(MessageInjection("Claude", f"aside {turn}", depth=rng.randint(0, 3)))
        if os.environ.get("AUTOBIO") and turn % 25 == 0:
            await m.wait_ready()
        result = await m.compile(budget, injections=inj, message_injections=minj)
        form = form_choice()
        options = FORMS[form]
        try:
            host_body = rl.make_body(result, form, dict(options))  # what the host sends
        except ctxrt.EmptyRequestError:
            continue
        # the host follows P14: edits its last item in place, and appends to its list
        items = host_body.get("messages", host_body.get("input"))
        last = items[-1]
        if form == "anthropic" and isinstance(last.get("content"), list) and last["content"]:
            last["content"][-1]["cache_control"] = {"type": "ephemeral"}
            last["content"].append({"type": "text", "text": "host added"})
        else:
            last["host_note"] = "x"
        expected = fresh_digest(result, form, options)
        record = await m.record_request(result, form=form, options=options, usage={"input_tokens": turn})
        items.append({"role": "user", "content": "appended by host after"})  # reuse of the host's list
        stats["records"] += 1
        stats["digest_checks"] += 1
        if record.body_digest != expected:
            stats["mismatch"] += 1
            print("MISMATCH", name, turn, form, file=sys.stderr)
        seen = {}
        for sources in result.provenance.messages:
            seen.update((src.id, None) for src in sources if src.kind != "injection")
        if [h.id for h in record.held] != list(seen) or len(record.parts) != len(result.messages):
            stats["mismatch"] += 1
            print("HELD MISMATCH", name, turn, file=sys.stderr)
        made.append((m, record))


async def main():
    async with open_runtime(store, durability="os") as rt:
        made = []
        ms = {}
        for name, choose in (("agents/a", lambda: "anthropic"), ("agents/c", lambda: "openai_chat"),
                             ("agents/r", lambda: "openai_responses"), ("agents/x", lambda: rng.choice(list(FORMS)))):
            ms[name] = await rt.open(name, view_reader=None, ledger=True, **STRATEGY())
        per = max(TURNS // 10, 1)
        for block in range(10):
            for name, choose in (("agents/a", lambda: "anthropic"), ("agents/c", lambda: "openai_chat"),
                                 ("agents/r", lambda: "openai_responses"), ("agents/x", lambda: rng.choice(list(FORMS)))):
                m = ms[name]
                await host(m, name, choose, made, per)
                if block in (3, 6) and name == "agents/x":  # fork, work on it, switch back
                    fork = await m.fork(f"f{SEED}-{block}")
                    stats["forks"] += 1
                    await m.switch_branch(fork)
                    await host(m, name, choose, made, 20)
                    await m.switch_branch("main")
                    stats["switches"] += 1
        if not WRITE_ONLY:
            for m in ms.values():
                for branch in [b.name for b in await m.list_branches()]:
                    await m.switch_branch(branch)
                    records = await m.requests(limit=100000)
                    mine = {r.id: r for _, r in made}
                    for r in records:
                        if r.id in mine and mine[r.id] != r:
                            stats["mismatch"] += 1
                            print("DECODED DIFFERS", r.id, file=sys.stderr)
                        stats["decoded_eq"] = stats.get("decoded_eq", 0) + (r.id in mine)
                    for record in records[:: max(1, len(records) // 60)] + records[-5:]:
                        rebuilt = await m.rebuild_request(record)
                        stats["rebuilds"] += 1
                        if not rebuilt.matches and not rebuilt.edited:
                            stats["mismatch"] += 1
                            print("REBUILD MISMATCH", record.id, file=sys.stderr)
                        stats["edited_named"] += bool(rebuilt.edited)
                    await m.switch_branch("main")
        for m in ms.values():
            await m.aclose()
    report = verify(store)
    print(stats, report.status)
    assert report.status == "sound", report
    assert not stats["mismatch"]

trio.run(main)
