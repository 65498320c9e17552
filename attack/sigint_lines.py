"""A real SIGINT at each line of record_request and the request_ledger code it runs (and each line
of LedgerQueue.take/add), one turn after another in one trio host: KeyboardInterrupt caught where it
lands; afterwards every record's digest is the from-scratch one, requests() reads, rebuilds match,
verify sound. usage: sigint_lines.py STORE"""
import os, signal, sys, copy
import trio
import ctxrt
from ctxrt import Budget, open_runtime, CompileResult, Text
from ctxrt import request_ledger as rl
from ctxrt.verification import verify

store = sys.argv[1]
FILES = ("request_ledger.py", "manager.py", "registry.py")
FUNCS_MANAGER = {"record_request"}
FUNCS_REGISTRY = {"take", "add", "landed", "lost", "commit", "encoder", "flag_known", "flag_read_on", "compiled_for"}


def wanted(code):
    f = code.co_filename
    if f.endswith("request_ledger.py"):
        return True
    if f.endswith(os.sep + "manager.py"):
        return code.co_name in FUNCS_MANAGER
    if f.endswith(os.sep + "registry.py"):
        return code.co_name in FUNCS_REGISTRY
    return False


class Tracer:
    def __init__(self, target=None):
        self.sites, self.target, self.fired = [], target, False

    def calls(self, frame, event, arg):
        return self.lines if wanted(frame.f_code) else None

    def lines(self, frame, event, arg):
        if event == "line":
            site = (frame.f_code.co_filename.rsplit(os.sep, 1)[-1], frame.f_lineno)
            if self.target is None:
                if site not in self.sites:
                    self.sites.append(site)
            elif site == self.target and not self.fired:
                self.fired = True
                os.kill(os.getpid(), signal.SIGINT)
        return self.lines


def fresh(result, form, options):
    alone = CompileResult(list(result.messages), list(result.system_injections), result.provenance,
                          result.stable_prefix_tokens)
    return rl.body_digest(copy.deepcopy(rl.make_body(alone, form, dict(options))))


async def main():
    B = Budget(max_tokens=20000, reserve_for_response=500)
    opts = {"assistant": "Claude"}
    stats = {"sites": 0, "fired": 0, "interrupted": 0, "late": 0, "records": 0, "bad": 0}
    async with open_runtime(store, durability="os") as rt:
        m = await rt.open("agents/a", ledger=True)
        for n in range(40):
            await m.add_message("user" if n % 3 else "Claude", f"seed {n} " + "w " * n)
        first = Tracer()
        sys.settrace(first.calls)
        try:
            for _ in range(70):  # past LEDGER_WAITING: a commit inside record_request
                await m.add_message("user", "probe")
                await m.record_request(await m.compile(B), form="anthropic", options=opts)
        finally:
            sys.settrace(None)
        await m.requests()
        stats["sites"] = len(first.sites)
        made = []
        for k, site in enumerate(first.sites):
            for rep in range(2):
                await m.add_message("Claude" if (k + rep) % 4 == 0 else "user", f"turn {k} {rep}")
                result = await m.compile(B)
                tracer = Tracer(site)
                sys.settrace(tracer.calls)
                try:
                    try:
                        made.append((result, await m.record_request(result, form="anthropic", options=opts)))
                    finally:
                        sys.settrace(None)
                    await trio.lowlevel.checkpoint()  # a deferred KI lands here at the latest
                    await trio.lowlevel.checkpoint()
                except KeyboardInterrupt:
                    stats["interrupted"] += 1
                stats["fired"] += tracer.fired
                # the next record, untouched
                await m.add_message("user", f"after {k} {rep}")
                result = await m.compile(B)
                record = await m.record_request(result, form="anthropic", options=opts)
                stats["records"] += 1
                if record.body_digest != fresh(result, "anthropic", opts):
                    stats["bad"] += 1
                    print("BAD digest after", site, file=sys.stderr)
                made.append((result, record))
                if k % 10 == 0:
                    await m.requests(limit=5)
        for result, record in made:
            if record.body_digest != fresh(result, "anthropic", opts):
                stats["bad"] += 1
                print("BAD digest", record.id, file=sys.stderr)
        found = {r.id: r for r in await m.requests(limit=100000)}
        for _, record in made:
            if found.get(record.id) != record:
                stats["bad"] += 1
                print("MISSING/DIFF", record.id, file=sys.stderr)
                continue
            if not (await m.rebuild_request(record)).matches:
                stats["bad"] += 1
                print("NOMATCH", record.id, file=sys.stderr)
        await m.aclose()
    report = verify(store)
    print(stats, report.status)
    assert report.status == "sound" and not stats["bad"]

if __name__ == "__main__":
    trio.run(main)
