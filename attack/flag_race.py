"""Attack: the ledger flag trust (Q2). An open with ledger=False cancelled at each schedule point
(its Attach may still be handled by the actor after the cancel), then record_request from a
manager that read the flag on: must raise LedgerOffError once the flag is off in the store."""
import sys, tempfile, pathlib
import trio
import ctxrt
from ctxrt import Budget, open_runtime
from ctxrt.errors import LedgerOffError

B = Budget(max_tokens=10_000)


class CancelAt(trio.abc.Instrument):
    def __init__(self, task, scope, limit):
        self.task, self.scope, self.limit, self.steps = task, scope, limit, 0

    def before_task_step(self, task):
        if task is self.task:
            self.steps += 1
            if self.steps == self.limit:
                self.scope.cancel()


async def one(limit: int) -> str:
    with tempfile.TemporaryDirectory() as d:
        async with open_runtime(pathlib.Path(d) / "s", durability="sync") as rt:
            m = await rt.open("ns", ledger=True)
            await m.add_message("user", "hi")
            res = await m.compile(B)
            await m.record_request(res, form="anthropic")  # flag read on, trusted
            other = None
            scope = trio.CancelScope()

            async def opener():
                nonlocal other
                with scope:
                    other = await rt.open("ns", ledger=False)

            async def canceller():
                for _ in range(limit):
                    await trio.lowlevel.checkpoint()
                scope.cancel()

            async with trio.open_nursery() as n:
                n.start_soon(opener)
                n.start_soon(canceller)
            cancelled = scope.cancelled_caught
            from ctxrt.namespace import states as _st
            _e = rt._namespaces.engine
            now = _e.read_value(_st.ledger_flag_state("ns"), _e.branch("main").id)
            led = rt._namespaces.ledger
            print("  after open: flag", now, "switching", led.switching, "switches", led.switches)
            # a record right after, while the actor may still be switching
            early = "?"
            try:
                await m.record_request(res, form="anthropic")
                early = "kept"
            except LedgerOffError:
                early = "refused"
            # let the actor finish whatever it was sent: a compile is answered after the attach
            await m.add_message("user", "again")
            res = await m.compile(B)
            eng = rt._namespaces.engine
            from ctxrt.namespace import states
            branch = eng.branch("main").id
            flag = eng.read_value(states.ledger_flag_state("ns"), branch)
            try:
                await m.record_request(res, form="anthropic")
                late = "kept"
            except LedgerOffError:
                late = "refused"
            if other is not None:
                await other.aclose()
            await m.aclose()
            bad = flag is not True and late == "kept"
            return f"limit={limit} cancelled={cancelled} early={early} flag={flag} late={late}{'  <-- BUG' if bad else ''}"


async def main():
    for limit in range(1, int(sys.argv[1]) if len(sys.argv) > 1 else 30):
        print(await one(limit), flush=True)

trio.run(main)
