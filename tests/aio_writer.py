"""The writer tests/test_aio_contract.py kills with SIGKILL (K3), under trio or asyncio. Not a test module.

``python aio_writer.py <host> <store path> <round> <tasks>`` opens the store with durability
"sync" through ``<host>``'s ``open_runtime`` (tests/aio_hosts.py: ``trio`` or ``asyncio``), opens
a manager per task, and has ``<tasks>`` concurrent tasks append ``text(round, task, counter)``
through the public API forever. After each acknowledged append it prints ``ack <id> <round>
<task> <counter>``, in one ``os.write``, so every ack line that reaches the pipe was acknowledged.
"""

from __future__ import annotations

import os
import sys
from functools import partial

from aio_hosts import HOSTS, Host


def text(round_: int, task: int, counter: int) -> str:
    return f"round={round_} task={task} counter={counter}"


async def write_forever(host: Host, path: str, round_: int, tasks: int) -> None:
    async with host.open_runtime(path, durability="sync") as rt:
        managers = [await rt.open(f"writers/{task}") for task in range(tasks)]

        async def appender(task: int) -> None:
            counter = 0
            while True:
                message_id = await managers[task].add_message("user", text(round_, task, counter))
                os.write(1, f"ack {message_id} {round_} {task} {counter}\n".encode())
                counter += 1

        await host.gather(*(partial(appender, task) for task in range(tasks)))


if __name__ == "__main__":
    name, path, round_, tasks = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    HOSTS[name].run(write_forever, HOSTS[name], path, round_, tasks)
