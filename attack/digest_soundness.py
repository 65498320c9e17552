"""Attack: the record format 2 digest (Q1, Q5, P14, P15). Seeded random turns of adds (texts, tool
calls and results, images, runs of one role's messages merged into one item), edits, removals,
forks, switches and budget changes; each turn the host makes its body, edits it as P15 lets it
(cache_control on the last block, a block appended to the last turn's content, a key on the body)
and records the result. Checked: the recorded digest equals body_digest of the body as the form
made it (no memo), computed from scratch; rebuild_request reproduces that body, matches, and names
the messages edited since. Mode "forbidden": the host also edits a shared (read-only) block in place.

usage: digest_soundness.py SEEDS TURNS [forbidden]"""
import copy, json, random, sys, tempfile, pathlib
import trio
import ctxrt
from ctxrt import Budget, Text, Image, ToolUse, ToolResult, open_runtime
from ctxrt.request_ledger import body_digest

FORMS = ("anthropic", "openai_chat", "openai_responses")
ASSISTANTS = (None, ["Claude"], ["Claude", "bot"])


def canon(x):
    return json.loads(json.dumps(x, sort_keys=True, default=lambda v: list(v) if isinstance(v, tuple) else dict(v)))


def items_of(body):
    return body.get("messages", body.get("input"))


def host_edit(rnd, body, form, forbidden):
    """Edits P15 lets the host make (and, if ``forbidden``, one it doesn't). Returns what it did."""
    did = []
    items = items_of(body)
    if not items:
        return did
    last = items[-1]
    content = last.get("content") if isinstance(last, dict) else None
    r = rnd.random()
    if form == "anthropic" and isinstance(content, list) and content and r < 0.4:
        block = content[-1]
        if isinstance(block, dict):
            block["cache_control"] = {"type": "ephemeral"}
            did.append("cache_control on last block")
    elif form == "anthropic" and isinstance(content, list) and r < 0.55:
        content.append({"type": "text", "text": "host added"})
        did.append("block appended to last turn")
    elif r < 0.7:
        body["metadata"] = {"user_id": "u"}
        did.append("key on body")
    if forbidden and rnd.random() < 0.5 and len(items) > 1:
        victim = items[rnd.randrange(len(items) - 1)]
        c = victim.get("content") if isinstance(victim, dict) else None
        if isinstance(c, list) and c and isinstance(c[0], dict) and "text" in c[0]:
            c[0]["text"] += " FORBIDDEN"
            did.append("FORBIDDEN: shared block edited in place")
        elif isinstance(c, str):
            victim["content"] = c + " FORBIDDEN"
            did.append("FORBIDDEN: shared item edited in place")
    return did


async def run(seed, turns, forbidden, stats):
    rnd = random.Random(seed)
    with tempfile.TemporaryDirectory() as d:
        async with open_runtime(pathlib.Path(d) / "s", durability="os") as rt:
            m = await rt.open("ns", ledger=True)
            ids = []
            records = []  # (record, truth body, ids at record)
            tool_n = 0
            budget = 100_000
            branches = ["main"]
            for turn in range(turns):
                op = rnd.random()
                try:
                    if op < 0.45:
                        n = rnd.choice((1, 1, 1, 3, 12))
                        for _ in range(n):
                            if rnd.random() < 0.1:
                                content = [Text(f"look {turn}"), Image({"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="})]
                            else:
                                content = f"user says {turn} {rnd.random():.3f}"
                            ids.append(await m.add_message("user", content))
                    elif op < 0.6:
                        ids.append(await m.add_message(rnd.choice(("Claude", "bot")), f"reply {turn}"))
                    elif op < 0.68:
                        tool_n += 1
                        tid = f"toolu_{seed}_{tool_n}"
                        ids.append(await m.add_message("Claude", [Text("calling"), ToolUse(tid, "lookup", {"q": turn})]))
                        ids.append(await m.add_message("user", [ToolResult(tid, f"result {turn}")]))
                    elif op < 0.78 and ids:
                        target = rnd.choice(ids[-30:])
                        await m.edit_message(target, f"edited {turn}")
                        stats["edits"] += 1
                    elif op < 0.84 and ids:
                        target = rnd.choice(ids[-30:])
                        await m.remove_message(target)
                        ids.remove(target)
                        stats["removals"] += 1
                    elif op < 0.88:
                        name = await m.fork()
                        branches.append(name)
                        stats["forks"] += 1
                    elif op < 0.91 and len(branches) > 1:
                        await m.switch_branch(rnd.choice(branches))
                        ids = [mm.id for mm in await m.get_all_messages()]
                        stats["switches"] += 1
                    elif op < 0.97:
                        budget = rnd.choice((150, 400, 1_500, 100_000))
                        stats["budgets"] += 1
                except (ctxrt.MessageNotFoundError, ValueError) as exc:
                    stats["op errors"] += 1
                try:
                    result = await m.compile(Budget(max_tokens=budget, reserve_for_response=0))
                except Exception as exc:
                    stats[f"compile {type(exc).__name__}"] += 1
                    continue
                for _ in range(rnd.choice((1, 1, 2))):  # a result recorded twice, or in two forms
                    form = rnd.choice(FORMS)
                    assistant = rnd.choice(ASSISTANTS)
                    options = None if assistant is None else {"assistant": assistant}
                    kwargs = {"assistant": {"Claude", "assistant"}} if assistant is None else {"assistant": assistant}
                    try:
                        host = getattr(result, f"to_{form}")(**kwargs)
                    except Exception as exc:
                        stats[f"body {type(exc).__name__}"] += 1
                        continue
                    truth = copy.deepcopy(host)
                    did = host_edit(rnd, host, form, forbidden)
                    for what in did:
                        stats[what] += 1
                    try:
                        record = await m.record_request(result, form=form, options=options)
                    except Exception as exc:
                        stats[f"record {type(exc).__name__}: {exc}"[:120]] += 1
                        continue
                    stats["records"] += 1
                    fresh = body_digest(truth)
                    sent = body_digest(host)
                    if record.body_digest != fresh:
                        stats["DIGEST != from scratch of the form's body"] += 1
                        if record.body_digest == sent:
                            stats["  ... but == the host's edited body"] += 1
                    if did and sent != fresh:
                        stats["host-edited body's digest differs from the record's (host edits unseen)"] += 1
                    records.append((record, canon(truth), set(ids)))
                    if rnd.random() < 0.15:
                        rebuilt = await m.rebuild_request(record)
                        stats["rebuilds"] += 1
                        if canon(rebuilt.body) != canon(truth):
                            stats["REBUILD body != sent"] += 1
                        if not rebuilt.matches:
                            stats["REBUILD no match"] += 1
                        if rebuilt.edited:
                            stats["REBUILD names edits right after record"] += 1
            # every record of this branch rebuilt at the end; edited ones named
            mine = {r.id for r in await m.requests(limit=100_000)}
            for record, truth, _ in records:
                if record.id not in mine:
                    continue
                try:
                    rebuilt = await m.rebuild_request(record)
                except ValueError:
                    continue
                stats["final rebuilds"] += 1
                if not rebuilt.matches:
                    stats["FINAL no match"] += 1
                if canon(rebuilt.body) != truth:
                    stats["FINAL body != sent"] += 1
                # edited: those held whose current content differs
                held = {h.id for h in record.held if h.kind == "message"}
                current = {}
                for mid in held:
                    msg = await m.get_message(mid)
                    current[mid] = msg
                changed = set()
                for mid in held:
                    was = await m.get_message_at(mid, next(h.version for h in record.held if h.id == mid)) if hasattr(m, "get_message_at") else None
                    now = current[mid]
                    if now is None or (was is not None and now.content != was.content):
                        changed.add(mid)
                if changed - set(rebuilt.edited):
                    stats["FINAL edited not named"] += 1
                if set(rebuilt.edited) - held:
                    stats["FINAL names unheld"] += 1
            await m.aclose()


async def main():
    seeds, turns = int(sys.argv[1]), int(sys.argv[2])
    forbidden = len(sys.argv) > 3
    from collections import Counter
    stats = Counter()
    for seed in range(seeds):
        await run(seed, turns, forbidden, stats)
    for k, v in sorted(stats.items()):
        print(f"{v:7d}  {k}")

trio.run(main)
