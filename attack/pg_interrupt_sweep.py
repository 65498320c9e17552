"""A real SIGINT at every line of add_message, _switched, commit_lone and WorkerCommitter's lone
path, on PostgreSQL (K16, L8): the host ends in a bare KeyboardInterrupt within the guard, every
acknowledged append is stored once, and a new runtime on the store appends at once."""
from __future__ import annotations
import inspect, itertools, os, signal, sys, types
import trio
import ctxrt
from ctxrt import manager as mgr
from ctxrt.store import actor, committer
from ctxrt.pgcluster import temporary_cluster

GUARD_S = 30
HITS = [int(h) for h in os.environ.get("HITS", "1,4").split(",")]
TARGETS = [mgr.ContextManager.add_message, mgr.ContextManager._switched, actor.commit_lone,
           committer.WorkerCommitter.commit, committer.WorkerCommitter._commit_lone, committer.WorkerCommitter._lone,
           committer.WorkerCommitter.settle]
HOST_STATE = bool(os.environ.get("HOST_STATE"))


def sites():
    out = []
    for f in TARGETS:
        f = inspect.unwrap(f)
        lines, first = inspect.getsourcelines(f)
        fn = inspect.getsourcefile(f)
        for k, text in enumerate(lines):
            t = text.strip()
            if not t or t.startswith("#") or t.startswith('"""') or t == "try:" or k == 0:
                continue
            out.append((fn, first + k))
    return out


async def host(url: str, acks: list) -> None:
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(url) as rt:
            ms = [await rt.open(f"n{k}") for k in range(2)]

            async def loop(m, tag):
                for i in range(40):
                    kw = {"host_state": {"turn": i}} if HOST_STATE else {}
                    mid = await m.add_message("user", f"{tag}-{i}", **kw)
                    acks.append((m.branch, mid, f"{tag}-{i}"))
                    if tag == "a" and i == 10:
                        await rt.create_branch("b")
                    if tag == "a" and i == 12:
                        await rt.switch_branch("main", "b")
            async with trio.open_nursery() as n:
                n.start_soon(loop, ms[0], "a")
                n.start_soon(loop, ms[1], "b")


def interrupt(url: str, site, hit: int):
    count = 0
    sent = False

    def trace(frame: types.FrameType, event: str, arg):
        nonlocal count, sent
        if sent:
            return None
        if event == "call":
            return trace if frame.f_code.co_filename == site[0] else None
        if event == "line" and frame.f_lineno == site[1] and frame.f_code.co_filename == site[0]:
            count += 1
            if count == hit:
                sent = True
                os.kill(os.getpid(), signal.SIGINT)
        return trace

    acks: list = []
    raised = None
    sys.settrace(trace)
    try:
        trio.run(host, url, acks)
    except BaseException as exc:
        raised = exc
    finally:
        sys.settrace(None)
    return raised, sent, acks


async def check(url: str, acks: list) -> list[str]:
    problems = []
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(url) as rt:
            texts = {}
            for b in await rt.list_branches():
                for ns in ("n0", "n1"):
                    m = await rt.open(ns, branch=b.name)
                    for x in await m.get_all_messages():
                        texts.setdefault(x.content[0].text, set()).add(x.id)
                    await m.aclose()
            for branch, mid, text in acks:
                if texts.get(text) != {mid}:
                    problems.append(f"ack {text} {mid} on {branch}: stored {texts.get(text)}")
            for text, ids in texts.items():
                if len(ids) > 1:
                    problems.append(f"doubled {text} {ids}")
            m = await rt.open("n0")
            await m.add_message("user", "next")
    return problems


def main() -> None:
    all_sites = sites()
    only = os.environ.get("ONLY")
    if only:
        all_sites = [s for s in all_sites if only in s[0]]
    print(len(all_sites), "sites x", HITS)
    bad = runs = unreached = 0
    with temporary_cluster() as cluster:
        counter = itertools.count()
        for site in all_sites:
            for hit in HITS:
                url = cluster.create_database(f"s{next(counter)}")
                raised, sent, acks = interrupt(url, site, hit)
                runs += 1
                where = f"{os.path.basename(site[0])}:{site[1]} hit {hit}"
                if not sent:
                    unreached += 1
                    if raised is not None:
                        bad += 1; print(where, "unreached but raised", repr(raised)[:200])
                    continue
                if type(raised) is not KeyboardInterrupt:
                    bad += 1; print(where, "raised", repr(raised)[:300])
                del raised
                try:
                    problems = trio.run(check, url, acks)
                except BaseException as exc:
                    problems = [f"check failed: {exc!r}"[:300]]
                if problems:
                    bad += 1; print(where, problems[:3])
    print(f"runs {runs} unreached {unreached} bad {bad}")


main()
