"""The writer that tests/test_crash.py kills with SIGKILL (K3). Not a test module.

``python crash_writer.py`` starts a fork server. It imports ctxrt once (importing it costs
seconds, far more than a round). Then it reads commands on stdin, one per line:

- ``write <store path> <round> <tasks>`` forks a writer and prints ``writer <pid>``;
- ``reap <pid>`` waits for that writer and prints ``reaped <pid> <wait status>``.

It exits at the end of its stdin. A writer opens the runtime with durability "sync" and
registers ``STATE``. Then ``<tasks>`` concurrent trio tasks append ``payload(round, task,
counter)`` forever. After each acknowledged append, the writer prints ``ack <sequence> <round>
<task> <counter>``. If it fails, it prints ``failed <error>``. Each line is one ``os.write``,
so no line is ever buffered or torn: every ack line that reaches the pipe was acknowledged.
The fork server never opens the store itself.

``python crash_writer.py write <store path> <round> <tasks>`` runs one writer in this process.
"""

from __future__ import annotations

import hashlib
import os
import sys

import trio

from ctxrt import open_runtime
from ctxrt.testing import AppendItem, RegisterState

STATE = "crash-log"


def payload(round_: int, task: int, counter: int) -> bytes:
    """The bytes a writer appends: its identity, then 50 B to ~6 KB of filler (some span overflow pages)."""
    head = f"round={round_} task={task} counter={counter};".encode()
    size = 50 + (round_ * 7919 + task * 104729 + counter * 7727) % 6000
    filler = hashlib.sha256(head).digest() * (size // 32 + 1)
    return head + filler[:size]


def parse_payload(data: bytes) -> tuple[int, int, int]:
    """The (round, task, counter) that ``data`` claims to be; check it with ``payload``."""
    head = data.split(b";", 1)[0].decode()
    fields = dict(part.split("=") for part in head.split())
    return int(fields["round"]), int(fields["task"]), int(fields["counter"])


def emit(line: str) -> None:
    os.write(1, (line + "\n").encode())


async def write_forever(path: str, round_: int, tasks: int) -> None:
    async with open_runtime(path, durability="sync") as rt:
        await rt.store.ask(RegisterState(name=STATE, kind="log"))

        async def appender(task: int) -> None:
            counter = 0
            while True:
                result = await rt.store.ask(
                    AppendItem(state=STATE, branch="main", data=payload(round_, task, counter))
                )
                emit(f"ack {result.sequence} {round_} {task} {counter}")
                counter += 1

        async with trio.open_nursery() as nursery:
            for task in range(tasks):
                nursery.start_soon(appender, task)


def run_writer(path: str, round_: int, tasks: int) -> None:
    try:
        trio.run(write_forever, path, round_, tasks)
    except BaseException as exc:  # noqa: BLE001 - report anything, then die
        emit(f"failed {type(exc).__name__}: {exc!r}".replace("\n", " "))
        os._exit(1)
    os._exit(0)


def serve() -> None:
    for line in sys.stdin:
        command, *arguments = line.split()
        if command == "write":
            path, round_, tasks = arguments[0], int(arguments[1]), int(arguments[2])
            pid = os.fork()
            if pid == 0:
                run_writer(path, round_, tasks)
            emit(f"writer {pid}")
        elif command == "reap":
            pid = int(arguments[0])
            _, status = os.waitpid(pid, 0)
            emit(f"reaped {pid} {status}")
        else:
            emit(f"failed unknown command {line.strip()!r}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["write"]:
        run_writer(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        serve()
