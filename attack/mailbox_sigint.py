"""A real SIGINT at every line of ctxrt/mailbox.py and ctxrt/asks.py (each of its first few
occurrences), in a trio run where many tasks ask one actor, with and without ``alone``. Each run
must end in a bare KeyboardInterrupt (no TrioInternalError), none hangs, and afterwards nobody is
counted inside ask and the unanswered count is the replies left unresolved."""
from __future__ import annotations
import linecache, os, random, signal, sys, threading
import attrs, trio, trio.testing
import ctxrt.mailbox as mb, ctxrt.asks as asks_mod
from ctxrt.testing import Ask, Mailbox

FILES = (mb.__file__, asks_mod.__file__)

@attrs.frozen
class Double(Ask[int]):
    number: int

class Closed(Exception):
    pass

replies: list = []

def scenario(seed: int):
    rng = random.Random(seed)
    box = Mailbox(rng.choice([2, 64]), lambda c: Closed(repr(c)))
    replies.clear()

    async def alone(command):
        if command.number % 3 == 0:
            await trio.lowlevel.checkpoint()
        return True, command.number * 2

    async def actor():
        async for command, reply in box:
            if reply is not None:
                replies.append(reply)
                if command.number % 2:
                    await trio.lowlevel.checkpoint()
                reply.resolve(True, command.number * 2)

    async def caller(i):
        for r in range(40):
            n = i * 100 + r
            assert await box.ask(Double(n), alone=alone if (i + r) % 2 else None) == 2 * n
            if r % 5 == 0:
                await trio.sleep(0)

    async def main():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(actor)
            async with trio.open_nursery() as callers:
                for i in range(rng.choice([1, 3, 8])):
                    callers.start_soon(caller, i)
            box.close()
    return box, main

def lines() -> list[tuple[str, int]]:
    seen: list[tuple[str, int]] = []
    def trace(frame, event, arg):
        if frame.f_code.co_filename not in FILES:
            return None
        if event == "line":
            site = (frame.f_code.co_filename, frame.f_lineno)
            if site not in seen:
                seen.append(site)
        return trace
    box, main = scenario(0)
    sys.settrace(trace)
    try:
        trio.run(main)
    finally:
        sys.settrace(None)
    return [s for s in seen if linecache.getline(*s).strip() != "try:"]

def attempt(site, occurrence: int, seed: int):
    box, main = scenario(seed)
    hits = [0]
    sent = [False]
    def trace(frame, event, arg):
        if sent[0] or frame.f_code.co_filename not in FILES:
            return None
        if event == "line" and (frame.f_code.co_filename, frame.f_lineno) == site:
            hits[0] += 1
            if hits[0] == occurrence:
                sent[0] = True
                os.kill(os.getpid(), signal.SIGINT)
        return trace
    raised = None
    timer = threading.Timer(20, lambda: os._exit(3))
    timer.start()
    sys.settrace(trace)
    try:
        trio.run(main)
    except BaseException as exc:  # noqa
        raised = exc
    finally:
        sys.settrace(None)
        timer.cancel()
    problems = []
    if sent[0]:
        # the scenario's own nurseries wrap a child's interrupt in groups: only interrupts allowed
        leaves = raised.split(KeyboardInterrupt)[1] if isinstance(raised, BaseExceptionGroup) else None
        if not (type(raised) is KeyboardInterrupt or (isinstance(raised, BaseExceptionGroup) and leaves is None)):
            problems.append(f"raised {type(raised).__name__}: {raised!r}"[:300])
    elif raised is not None:
        problems.append(f"not sent, raised {raised!r}")
    if box._asking != 0:
        problems.append(f"_asking={box._asking}")
    unresolved = sum(1 for r in replies if not r.done) + sum(1 for _, r in box._queue if r is not None and not r.done)
    if box._unanswered != unresolved:
        problems.append(f"_unanswered={box._unanswered} unresolved={unresolved}")
    return sent[0], problems

if __name__ == "__main__":
    sites = lines()
    print("sites", len(sites), flush=True)
    runs = fails = 0
    for site in sites:
        for occurrence in (1, 2, 5, 17, 60):
            for seed in (0, 1, 2):
                sent, problems = attempt(site, occurrence, seed)
                if not sent:
                    continue
                runs += 1
                if problems:
                    fails += 1
                    print("FAIL", os.path.basename(site[0]), site[1], linecache.getline(*site).strip(), occurrence, seed, problems, flush=True)
    print("runs", runs, "fails", fails)
