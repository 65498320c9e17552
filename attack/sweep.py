"""Checkpoint-level cancellation sweep: cancel a compile+record_request+add_message sequence at its
n-th schedule point, for each n, while another manager records; then verify the ledger (Q11)."""
import sys, tempfile
import trio
from ctxrt import Budget, Text, open_runtime

BUDGET = Budget(max_tokens=10_000)

class CancelAtStep(trio.abc.Instrument):
    def __init__(self):
        self.task = None; self.scope = None; self.n = 0; self.limit = 0
    def before_task_step(self, task):
        if task is self.task:
            self.n += 1
            if self.n == self.limit:
                self.scope.cancel()

async def main(kind: str) -> None:
    ins = CancelAtStep()
    trio.lowlevel.add_instrument(ins)
    acked = []; victims = []
    stats = dict(cancel_points=0, kept_when_cancelled=0)
    with tempfile.TemporaryDirectory() as d:
        async with open_runtime(d, durability="os") as rt:
            a = await rt.open("agents/ann", view_reader="ann", ledger=True)
            b = await rt.open("agents/ann", view_reader="ann")
            c = await rt.open("agents/bob", view_reader="bob", ledger=True)
            await a.add_message("user", "hi")
            for limit in range(1, 80):
                made = []
                async def victim():
                    ins.task = trio.lowlevel.current_task(); ins.n = 0; ins.limit = limit
                    with trio.CancelScope() as scope:
                        ins.scope = scope
                        r = await a.compile(BUDGET)
                        made.append(await a.record_request(r, form="anthropic"))
                        await a.add_message("Claude", f"reply {limit}", hold_compression=(kind == "hold"))
                        made.append(await a.record_request(await a.compile(BUDGET), form="openai_chat"))
                        await a.requests(limit=1)
                    ins.task = None
                    if scope.cancelled_caught:
                        stats["cancel_points"] += 1
                async def other():
                    acked.append(await b.record_request(await b.compile(BUDGET), form="anthropic"))
                    await b.add_message("user", f"b {limit}")
                    acked.append(await c.record_request(await c.compile(BUDGET), form="anthropic"))
                    await c.add_message("user", f"c {limit}")
                async with trio.open_nursery() as n:
                    n.start_soon(victim); n.start_soon(other)
                acked.extend(made); victims.extend(made)
            for m, ns in ((a, "agents/ann"), (c, "agents/bob")):
                found = await m.requests(limit=100_000)
                ids = [r.id for r in found]
                assert len(ids) == len(set(ids)), "dup"
                allmine = [r.id for r in acked if r.namespace == ns]
                assert not set(allmine) - set(ids), f"{ns}: lost {len(set(allmine) - set(ids))}"
                assert [r.sequence for r in found] == sorted(r.sequence for r in found)
                # per-caller order: each caller's records appear in the order it made them
                pos = {i: k for k, i in enumerate(ids)}
                for mine in ([r.id for r in victims if r.namespace == ns], [r.id for r in acked if r.namespace == ns and r.id not in {v.id for v in victims}]):
                  assert [pos[i] for i in mine] == sorted(pos[i] for i in mine), f"{ns}: made order broken"
                for r in found[::10]:
                    rb = await m.rebuild_request(r)
                    assert rb.matches or rb.edited, f"{ns}: rebuild mismatch"
                stats[ns] = len(found)
            stats["kept_when_cancelled"] = len({r.id for r in await a.requests(limit=100_000)}) - len([r for r in acked if r.namespace == "agents/ann"])
            for m in (a, b, c):
                await m.aclose()
    print(kind, stats)

if __name__ == "__main__":
    for kind in sys.argv[1:] or ["plain", "hold"]:
        trio.run(main, kind)
