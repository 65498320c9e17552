"""A host process under attack: a runtime on a PostgreSQL store doing everything at once.

argv: url, close_bound_s, read_cut_s, front ("trio" | "aio"), seed.
Sets ctxrt.store.postgres.CLOSE_BATCH_S / READ_CUT_S before the open. Tasks: two appenders (one
namespace with ledger=True and a compile + record_request after each append, one plain), a
forker, a compiler, and appends into an auto-ticking Autobiographical namespace (ScriptedModel).
Prints JSON lines: {"ready"}, {"try": text}, {"ack": text}, {"err": ...}; stops on a line
"close" on stdin (the tasks cancelled, the block ends) or on a SIGINT sent by the driver.
At its end: {"end": how, "after_s": seconds since stdin "close" (or since the SIGINT)}.
"""

from __future__ import annotations

import faulthandler
import json
import random
import signal
import sys
import time

import trio

import ctxrt
import ctxrt.store.postgres
from ctxrt.testing import ScriptedModel

T0: list[float] = []


def say(**what: object) -> None:
    print(json.dumps(what), flush=True)


def summary(request: ctxrt.ModelRequest) -> str:
    return "SUMMARY " + "remembered " * 30


async def appender(manager: ctxrt.ContextManager, tag: str, record: bool, rng: random.Random) -> None:
    i = 0
    while True:
        text = f"{tag}-{i}"
        say(**{"try": text})
        try:
            await manager.add_message("user", text + " " + "filler " * rng.randint(1, 60))
        except ctxrt.StoreUnavailableError as exc:
            say(err=f"{tag}: {exc}")
            i += 1
            await trio.sleep(0.2)
            continue
        say(ack=text)
        if record:
            try:
                result = await manager.compile(ctxrt.Budget(max_tokens=200_000))
                await manager.record_request(result, form="anthropic", model="m", response="ok")
            except ctxrt.StoreUnavailableError as exc:
                say(err=f"{tag} compile/record: {exc}")
        i += 1
        await trio.sleep(rng.random() * 0.02)


async def forker(manager: ctxrt.ContextManager) -> None:
    while True:
        try:
            await manager.add_message("user", "before a fork")
            name = await manager.fork()
            say(fork=name)
        except ctxrt.StoreUnavailableError as exc:
            say(err=f"fork: {exc}")
        await trio.sleep(0.3)


async def compiler(manager: ctxrt.ContextManager) -> None:
    while True:
        try:
            await manager.compile(ctxrt.Budget(max_tokens=6_000))
        except ctxrt.StoreUnavailableError as exc:
            say(err=f"compile: {exc}")
            await trio.sleep(0.2)
        await trio.sleep(0.05)


async def body(rt: object, seed: int) -> None:
    rng = random.Random(seed)
    w0 = await rt.open("w0", isolate=True, ledger=True)
    w1 = await rt.open("w1", isolate=True)
    config = ctxrt.Autobiographical("m", target_chunk_tokens=300, recent_window_tokens=0, head_window_tokens=0,
                                    l1_holdback_chunks=0, auto_tick=True)
    auto = await rt.open("auto", isolate=True, strategy=config, model=ScriptedModel(summary, delay_s=0.05))
    forked = await rt.open("f", isolate=True)  # forks move it off main: not checked
    await w0.add_message("user", "warm")
    say(ready=True)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(appender, w0, "w0", True, rng)
        nursery.start_soon(appender, w1, "w1", False, rng)
        nursery.start_soon(appender, auto, "auto", False, rng)
        nursery.start_soon(forker, forked)
        nursery.start_soon(compiler, auto)
        await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
        T0.append(time.monotonic())
        say(closing=True)
        nursery.cancel_scope.cancel()


async def main_trio(url: str, seed: int) -> None:
    async with ctxrt.open_runtime(url, durability="sync") as rt:
        await body(rt, seed)


async def main_aio(url: str, seed: int) -> None:
    import asyncio

    import ctxrt.aio
    # The aio front: the same calls from asyncio tasks (only appends and compiles here).
    async with ctxrt.aio.open_runtime(url, durability="sync") as rt:
        w0 = await rt.open("w0", isolate=True, ledger=True)
        w1 = await rt.open("w1", isolate=True)
        await w0.add_message("user", "warm")
        say(ready=True)

        async def app(manager: object, tag: str, record: bool) -> None:
            i = 0
            while True:
                text = f"{tag}-{i}"
                say(**{"try": text})
                try:
                    await manager.add_message("user", text)
                    say(ack=text)
                    if record:
                        result = await manager.compile(ctxrt.Budget(max_tokens=200_000))
                        await manager.record_request(result, form="anthropic", model="m")
                except ctxrt.StoreUnavailableError as exc:
                    say(err=f"{tag}: {exc}")
                    await asyncio.sleep(0.2)
                i += 1
                await asyncio.sleep(0.005)

        tasks = [asyncio.ensure_future(app(w0, "w0", True)), asyncio.ensure_future(app(w1, "w1", False))]
        # A daemon thread reads stdin: an executor's thread blocked there would hold asyncio.run's
        # shutdown (it waits for the default executor) after a Ctrl-C.
        loop, line = asyncio.get_running_loop(), asyncio.Event()
        import threading
        threading.Thread(target=lambda: (sys.stdin.readline(), loop.call_soon_threadsafe(line.set)), daemon=True).start()
        await line.wait()
        T0.append(time.monotonic())
        say(closing=True)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


if __name__ == "__main__":
    url, bound, cut, front, seed = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], int(sys.argv[5])
    faulthandler.register(signal.SIGUSR2, all_threads=True)  # the driver's dump of a hung host
    ctxrt.store.postgres.CLOSE_BATCH_S = bound
    ctxrt.store.postgres.READ_CUT_S = cut
    if hasattr(ctxrt.store.postgres, "BATCH_CUT_S"):  # the running write cut (this branch's fix)
        ctxrt.store.postgres.BATCH_CUT_S = cut
    import logging
    logging.basicConfig(format="@%(created).3f %(message)s", level=logging.WARNING)
    try:
        if front == "aio":
            import asyncio
            asyncio.run(main_aio(url, seed))  # its own Ctrl-C handling, as a real asyncio host's
        else:
            trio.run(main_trio, url, seed)
    except KeyboardInterrupt:
        say(end="interrupted", after_s=(time.monotonic() - T0[0]) if T0 else None)
        sys.exit(130)
    except BaseException as exc:  # noqa: BLE001 - the driver reports what the host saw
        say(end="raised", error=f"{type(exc).__name__}: {exc}"[:500], after_s=(time.monotonic() - T0[0]) if T0 else None)
        sys.exit(1)
    say(end="closed", after_s=(time.monotonic() - T0[0]) if T0 else None)
