"""The asyncio host tests/test_aio_guest.py runs to lose a Ctrl-C in a weakref callback. Not a test module.

``python aio_lost_ctrl_c_host.py <store path>`` runs a loop by hand (Python's default SIGINT
handler left in place, so the guest run's trio installs its own) and compiles with a token
estimator that, once, drops an object whose weakref callback raises SIGINT: the handler runs
inside the callback, in the namespace actor's trio task. Prints ``caught KeyboardInterrupt`` if
the loop's run ended so, else what it returned; then whether the unraisable hook is Python's again.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import weakref
from typing import Any

import ctxrt
import ctxrt.aio


class Thing:
    pass


class Estimator:
    def __init__(self) -> None:
        self.fired = False

    def estimate(self, message: Any) -> int:
        if not self.fired:
            self.fired = True
            thing = Thing()
            watch = weakref.ref(thing, lambda _: signal.raise_signal(signal.SIGINT))  # noqa: F841 (held to fire)
            del thing
        return 1

    def observe(self, model: Any, estimated: int, actual: int) -> None:
        pass


async def host(path: str) -> str:
    async with ctxrt.aio.open_runtime(path) as runtime:
        manager = await runtime.open("agents/a", token_estimator=Estimator())
        await manager.add_message("user", "before")
        await manager.compile(ctxrt.Budget(1_000, 0))
        for _ in range(100):
            await asyncio.sleep(0)
        return "ran on"


def main(path: str) -> None:
    loop = asyncio.new_event_loop()
    try:
        print(loop.run_until_complete(host(path)), flush=True)
    except KeyboardInterrupt:
        print("caught KeyboardInterrupt", flush=True)
    finally:
        loop.close()
    print("hook restored", sys.unraisablehook is sys.__unraisablehook__, flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
