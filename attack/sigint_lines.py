"""Attack: a real SIGINT at each line record_request runs (manager.record_request, the ledger's
encoder and digest memo, LedgerQueue.add): the signal is raised from a line tracer at the N-th line
event in those files, trio's handler raises KeyboardInterrupt where the code runs (or, protected,
at the next checkpoint), the turn catches it and goes on. Then: the next records' digests equal
body_digest from scratch, every record reads back (requests), rebuilds and matches, and verify
finds the store sound. usage: sigint_lines.py MAX_N [STEP [FUNCTION,...]]"""
import copy, signal, subprocess, sys, tempfile, pathlib
import trio
from ctxrt import Budget, open_runtime
from ctxrt.request_ledger import body_digest

FILES = ("request_ledger.py", "manager.py", "registry.py")
# With names: a signal at each bytecode of those functions (a line's stores one by one).
OPS = set(sys.argv[3].split(",")) if len(sys.argv) > 3 else set()
B = Budget(max_tokens=100_000, reserve_for_response=0)


class Tracer:
    def __init__(self, limit):
        self.limit, self.count, self.fired, self.where = limit, 0, False, None
        self.armed = False

    def global_trace(self, frame, event, arg):
        if not self.armed or self.fired:
            return None
        if frame.f_code.co_filename.endswith(FILES) and (not OPS or frame.f_code.co_name in OPS):
            frame.f_trace_opcodes = bool(OPS)
            return self.local
        return None

    def local(self, frame, event, arg):
        if event == ("opcode" if OPS else "line") and self.armed and not self.fired:
            self.count += 1
            if self.count == self.limit:
                self.fired = True
                self.where = f"{pathlib.Path(frame.f_code.co_filename).name}:{frame.f_lineno} {frame.f_code.co_name}"
                signal.raise_signal(signal.SIGINT)
        return self.local


async def one(limit, path):
    problems = []
    async with open_runtime(path, durability="os") as rt:
        m = await rt.open("ns", ledger=True)
        made = []
        for n in range(20):
            await m.add_message("user", f"merged {n}")  # one role: a merged item of many blocks
        for turn in range(8):
            for n in range(3):
                await m.add_message("user", f"turn {turn} {n}")
            result = await m.compile(B)
            truth = body_digest(copy.deepcopy(result.to_anthropic(assistant={"Claude", "assistant"})))
            tracer = Tracer(limit) if turn == 4 else None
            interrupted = False
            if tracer:
                sys.settrace(tracer.global_trace)
                tracer.armed = True
            try:
                record = await m.record_request(result, form="anthropic")
                made.append(record)
                await trio.lowlevel.checkpoint()  # a KeyboardInterrupt deferred (protected code) lands here
                if record.body_digest != truth:
                    problems.append(f"turn {turn}: digest != from scratch")
            except KeyboardInterrupt:
                interrupted = True
            finally:
                if tracer:
                    tracer.armed = False
                    sys.settrace(None)
            if tracer:
                fired = tracer
                if not tracer.fired:
                    return None, []
        back = await m.requests(limit=1000)
        ids = [r.id for r in back]
        for r in made:
            if r.id not in ids:
                problems.append(f"record {r.id[:6]} acknowledged but not read back")
        for r in back:
            rb = await m.rebuild_request(r)
            if not rb.matches:
                problems.append(f"record {r.id[:6]} rebuild doesn't match")
        await m.aclose()
    v = subprocess.run([sys.executable, "-m", "ctxrt", "verify", str(path)], capture_output=True, text=True)
    if "sound" not in v.stdout:
        problems.append("verify: " + v.stdout[-300:] + v.stderr[-300:])
    return fired.where, problems


async def main():
    top = int(sys.argv[1]); step = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    tried = bad = 0
    for limit in range(1, top, step):
        with tempfile.TemporaryDirectory() as d:
            try:
                where, problems = await one(limit, pathlib.Path(d) / "s")
            except BaseException as exc:
                print(f"limit {limit}: run died: {type(exc).__name__}: {exc}", flush=True)
                bad += 1
                continue
        if where is None:
            print(f"limit {limit}: past record_request's lines; stop")
            break
        tried += 1
        print(f"limit {limit} at {where}", flush=True)
        if problems:
            bad += 1
            print(f"limit {limit} at {where}: {problems[:3]}", flush=True)
    print(f"tried {tried} lines, {bad} broke")

trio.run(main)
