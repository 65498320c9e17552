"""A real SIGINT at each line of rebuild_request (and its worker step): a bare KeyboardInterrupt,
no thread left working, the store readable and the record rebuilt after (Q10)."""
import inspect, os, signal, sys, tempfile, threading, traceback
import trio
import ctxrt.manager as manager_mod
from ctxrt import Budget, Text, open_runtime
from ctxrt import request_ledger

FILE = manager_mod.__file__
src, first = inspect.getsourcelines(manager_mod.ContextManager.rebuild_request)
LINES = range(first, first + len(src))
working = []
orig = request_ledger.rebuilt_digested
def watched(*a):
    working.append(1)
    try:
        return orig(*a)
    finally:
        working.pop()
request_ledger.rebuilt_digested = watched

async def prepare(path):
    async with open_runtime(path, durability="os") as rt:
        m = await rt.open("agents/ann", view_reader="ann", ledger=True)
        for i in range(120):
            await m.add_message("user", [Text(f"line {i} " * 30), Text("s", audience=("ann",))])
        await m.record_request(await m.compile(Budget(max_tokens=1_000_000)), form="anthropic")
        await m.aclose()

async def host(path, line, fired):
    async with open_runtime(path, durability="os") as rt:
        m = await rt.open("agents/ann", view_reader="ann")
        rec = (await m.requests(limit=1))[-1]
        def tracer(frame, event, arg):
            if frame.f_code.co_filename == FILE and frame.f_code.co_name in ("rebuild_request", "find"):
                def local(frame, event, arg):
                    if event == "line" and frame.f_lineno == line and not fired:
                        fired.append(line)
                        os.kill(os.getpid(), signal.SIGINT)
                    return local
                return local
            return None
        sys.settrace(tracer)
        try:
            rb = await m.rebuild_request(rec)
        finally:
            sys.settrace(None)
        assert rb.matches
        await m.aclose()

async def after(path):
    async with open_runtime(path, durability="os") as rt:
        m = await rt.open("agents/ann", view_reader="ann")
        rec = (await m.requests(limit=1))[-1]
        assert (await m.rebuild_request(rec)).matches
        await m.aclose()

def main():
    stats = dict(lines=0, fired=0, bare_ki=0, completed=0, other={})
    with tempfile.TemporaryDirectory() as d:
        trio.run(prepare, d)
        for line in LINES:
            fired = []
            stats["lines"] += 1
            try:
                trio.run(host, d, line, fired)
                stats["completed"] += 1
                outcome = "ok"
            except KeyboardInterrupt:
                stats["bare_ki"] += 1
            except BaseException as exc:
                stats["other"][line] = repr(exc)[:200]
                traceback.print_exc()
            stats["fired"] += bool(fired)
            assert not working, f"line {line}: a worker still works"
            if fired:
                trio.run(after, d)
    print(stats, "threads:", threading.active_count())

main() if "--worker-only" not in sys.argv else None

def in_worker():
    """SIGINT while the worker thread makes the body: the run ends in a bare KeyboardInterrupt once
    the thread is done (to_thread is not abandoned), no thread left working."""
    def killing(*a):
        os.kill(os.getpid(), signal.SIGINT)
        return watched(*a)
    request_ledger.rebuilt_digested = killing
    out = {}
    with tempfile.TemporaryDirectory() as d:
        trio.run(prepare, d)
        for n in range(5):
            try:
                trio.run(host, d, -1, [])
                out["completed"] = out.get("completed", 0) + 1
            except KeyboardInterrupt:
                out["bare_ki"] = out.get("bare_ki", 0) + 1
            assert not working
        request_ledger.rebuilt_digested = watched
        trio.run(after, d)
    print("in worker:", out, "threads:", threading.active_count())

in_worker()
