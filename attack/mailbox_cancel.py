"""Many tasks ask one actor at once (with and without ``alone``), each cancelled after a chosen
number of the scheduler's steps; the actor answers at random points (some answers after a yield,
some batched). Checks: every caller not cancelled gets its own answer; no caller hangs; after all
are done the next lone caller runs alone (so nobody is still counted inside ask, nothing
unanswered); the mailbox closes and drains."""
from __future__ import annotations
import random, sys
import attrs, trio, trio.testing
from ctxrt.testing import Ask, Mailbox

@attrs.frozen
class Double(Ask[int]):
    number: int

class Closed(Exception):
    pass

async def run(seed: int) -> dict[str, int]:
    rng = random.Random(seed)
    box = Mailbox(rng.choice([1, 2, 4, 64]), lambda c: Closed(repr(c)))
    handled_alone: list[int] = []
    handled_actor: list[int] = []
    figures = {"answered": 0, "cancelled": 0, "alone": 0}

    async def alone(command: Double):
        # sometimes waits (a writer thread), sometimes declines
        r = rng.random()
        if r < 0.2:
            return None
        if r < 0.5:
            await trio.lowlevel.checkpoint()
        handled_alone.append(command.number)
        return True, command.number * 2

    async def actor() -> None:
        async for command, reply in box:
            if rng.random() < 0.3:
                await trio.lowlevel.checkpoint()  # the actor's own step may yield
            handled_actor.append(command.number)
            if reply is not None:
                reply.resolve(True, command.number * 2)

    n = rng.choice([2, 5, 20, 50])
    async def caller(i: int, steps: int | None, use_alone: bool) -> None:
        with trio.CancelScope() as scope:
            async def canceller() -> None:
                for _ in range(steps):
                    await trio.lowlevel.cancel_shielded_checkpoint()
                scope.cancel()
            async with trio.open_nursery() as inner:
                if steps is not None:
                    inner.start_soon(canceller)
                for r in range(rng.choice([1, 2, 3])):
                    number = i * 10 + r
                    got = await box.ask(Double(number), alone=alone if use_alone else None)
                    assert got == number * 2, (seed, got, number)
                    figures["answered"] += 1
                inner.cancel_scope.cancel()
        if scope.cancelled_caught:
            figures["cancelled"] += 1

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(actor)
            async with trio.open_nursery() as callers:
                for i in range(n):
                    steps = None if rng.random() < 0.3 else rng.randrange(0, 12)
                    callers.start_soon(caller, i, steps, rng.random() < 0.7)
            await trio.testing.wait_all_tasks_blocked()
            assert box.unanswered == 0, (seed, box.unanswered)
            # nobody asking now: a lone caller runs alone (the actor receives nothing)
            received = box.statistics().received
            before = len(handled_alone)
            async def sure(command: Double):
                handled_alone.append(command.number)
                return True, command.number * 2
            assert await box.ask(Double(-1), alone=sure) == -2
            assert len(handled_alone) == before + 1 and box.statistics().received == received, seed
            figures["alone"] += 1
            box.close()
    assert box.statistics().depth == 0
    return figures

if __name__ == "__main__":
    lo, hi = int(sys.argv[1]), int(sys.argv[2])
    totals = {"answered": 0, "cancelled": 0, "alone": 0}
    fails = 0
    for s in range(lo, hi):
        try:
            f = trio.run(run, s)
            for k in totals: totals[k] += f[k]
        except BaseException as e:  # noqa
            fails += 1
            print("FAIL", s, type(e).__name__, repr(e)[:400], flush=True)
    print("runs", hi - lo, totals, "fails", fails)
