"""R4 attack: appender processes on ns/main while this process switches main back and forth,
forks+switches, switches to a branch then deleted. Checks every acked append is stored exactly
once on the branch its manager reported, no private exception reached a host."""
from __future__ import annotations
import json, subprocess, sys, os, collections
import trio
import ctxrt
from ctxrt.pgcluster import temporary_cluster

HERE = os.path.dirname(os.path.abspath(__file__))
ROUNDS = int(os.environ.get("ROUNDS", "30"))
WORKERS = int(os.environ.get("WORKERS", "2"))


async def run(url: str) -> int:
    deleted: set[str] = set()
    async with ctxrt.open_runtime(url) as rt:
        s = await rt.open("ns")
        await s.add_message("user", "seed")
        await rt.create_branch("b1")
        procs = [await trio.lowlevel.open_process(
            [sys.executable, os.path.join(HERE, "pg_switch_worker.py"), url, f"w{k}"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE) for k in range(WORKERS)]
        await trio.sleep(2.0)  # let them open
        for r in range(ROUNDS):
            kind = r % 3
            if kind == 0:
                await rt.switch_branch("main", "b1"); await trio.sleep(0.02)
                await rt.switch_branch("b1", "main"); await trio.sleep(0.02)
            elif kind == 1:
                name = await s.fork(f"f{r}")
                await rt.switch_branch("main", name); await trio.sleep(0.02)
                await rt.switch_branch(name, "main"); await trio.sleep(0.02)
                await s.switch_branch("main")
            else:
                await rt.create_branch(f"t{r}")
                await rt.switch_branch("main", f"t{r}"); await trio.sleep(0.01)
                await rt.delete_branch(f"t{r}"); deleted.add(f"t{r}"); await trio.sleep(0.03)
                await s.aclose(); s = await rt.open("ns")
        await trio.sleep(0.3)
        outs = []
        await s.aclose()
        for p in procs:
            await p.stdin.send_all(b"stop\n")
        for p in procs:
            data = b""
            while chunk := await p.stdout.receive_some():
                data += chunk
            await p.wait()
            outs.append(json.loads(data.decode().strip().splitlines()[-1]))
        # stored state
        stored: dict[str, dict[str, str]] = {}
        for b in await rt.list_branches():
            mb = await rt.open("ns", branch=b.name)
            stored[b.name] = {m.id: m.content[0].text
                              for m in await mb.get_all_messages()}
            await mb.aclose()
    bad = 0
    by_text = collections.defaultdict(set)
    for name, msgs in stored.items():
        for mid, text in msgs.items():
            by_text[text].add(mid)
    total = tried = 0
    kinds = collections.Counter()
    for o in outs:
        tried += o["tried"]
        for e in o["errors"]:
            kinds[e[0]] += 1
            if e[0] != "BranchNotFound":
                bad += 1; print("ERROR", e)
        for text, mid, branch in o["acked"]:
            total += 1
            if branch in deleted:
                continue
            if len(by_text[text]) != 1:
                bad += 1; print("NOT ONCE", text, mid, branch, by_text[text])
            if stored.get(branch, {}).get(mid) != text:
                bad += 1; print("WRONG PLACE", text, mid, branch, [n for n, ms in stored.items() if mid in ms])
        for e in o["errors"]:
            if len(by_text[e[1]]) > 1:
                bad += 1; print("DOUBLED unacked", e[1])
    print(f"tried {tried} acked {total} errors {dict(kinds)} bad {bad}")
    return bad


def main() -> None:
    with temporary_cluster() as cluster:
        url = cluster.create_database("att")
        if os.environ.get("POOLER"):
            from ctxrt.testing import start_pooler
            with start_pooler(cluster) as pooler:
                purl = pooler.url("att") if hasattr(pooler, "url") else None
                print("pooler", purl)
                sys.exit(1 if trio.run(run, purl) else 0)
        sys.exit(1 if trio.run(run, url) else 0)


main()
