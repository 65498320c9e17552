"""The fork server tests/test_failsafe_*.py open damaged stores through (K7). Not a test module.

``python failsafe_child.py`` imports ctxrt once (that costs far more than a case), then reads
commands on stdin, one per line, and answers each with exactly one line:

- ``open <store path> <ro|rw>`` forks a child that opens the store (read-only or writing),
  reads every record a runtime can reach (every log state and value on every live branch) and,
  writing, appends one item. It answers ``ok <digest of what it read>``, ``error <exception
  class> <message>`` if the child raised, or ``signal <NAME>`` if a signal killed it;
- ``verify <store path>`` forks a child that runs ``verify_store``; it answers ``report <JSON>``
  or ``signal <NAME>``;
- ``create <store path>`` forks a child that opens a new store as a writer, registers a log
  state, appends one item and holds the store a moment; it answers ``created <pid>`` at once
  (before the child is done) and, later, nothing: ``reap <pid>`` waits for it and answers
  ``reaped <status>``.

Every answer is one ``os.write``; the server exits at the end of its stdin.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys

import trio

from ctxrt import open_runtime
from ctxrt.testing import AppendItem, RegisterState, verify_store

PROBE_STATE = "failsafe-probe"


def emit(line: str) -> None:
    os.write(1, (line.replace("\n", " ") + "\n").encode())


def digest(engine) -> str:  # type: ignore[no-untyped-def]
    """A hash of everything the runtime reads: each live branch's log items and values."""
    summary = hashlib.sha256()
    for branch in engine.list_branches():
        for info in engine.list_states():
            if info.name == PROBE_STATE:
                continue
            with engine.reader() as txn:
                if info.kind == "log":
                    for item in engine.log_items(txn, info.name, branch):
                        summary.update(f"{branch.name}/{info.name}/{item.sequence}:".encode() + bytes(item.data))
                else:
                    value, sequence = engine.get_value(txn, info.name, branch)
                    summary.update(f"{branch.name}/{info.name}@{sequence}={json.dumps(value)}".encode())
    return summary.hexdigest()


async def open_and_read(path: str, readonly: bool) -> str:
    async with open_runtime(path, readonly=readonly) as rt:
        found = digest(rt.engine)
        if not readonly:
            await rt.store.ask(RegisterState(name=PROBE_STATE, kind="log"))
            await rt.store.ask(AppendItem(state=PROBE_STATE, branch="main", data=b"probe"))
    return found


async def create(path: str) -> None:
    async with open_runtime(path) as rt:
        await rt.store.ask(RegisterState(name=PROBE_STATE, kind="log"))
        await rt.store.ask(AppendItem(state=PROBE_STATE, branch="main", data=b"first"))
        await trio.sleep(0.02)


def in_child(work, answer_pipe: int) -> None:  # type: ignore[no-untyped-def]
    """Run ``work`` and write its one-line answer to the pipe; never return."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)  # LMDB's assertion text would clutter the test output
    try:
        line = work()
    except BaseException as exc:  # noqa: BLE001 - every failure is an answer
        line = f"error {type(exc).__module__}.{type(exc).__qualname__} {exc}"
    os.write(answer_pipe, line.replace("\n", " ").encode())
    os._exit(0)


def run_forked(work) -> str:  # type: ignore[no-untyped-def]
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        in_child(work, write_end)
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 65536):
        chunks.append(chunk)
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return f"signal {signal.Signals(os.WTERMSIG(status)).name}"
    return b"".join(chunks).decode() or f"error exit status {os.waitstatus_to_exitcode(status)}"


def serve() -> None:
    for line in sys.stdin:
        command, *arguments = line.split()
        if command == "open":
            path, mode = arguments
            emit(run_forked(lambda: "ok " + trio.run(open_and_read, path, mode == "ro")))
        elif command == "verify":
            (path,) = arguments
            emit(run_forked(lambda: "report " + json.dumps(verify_store(path).to_json())))
        elif command == "create":
            (path,) = arguments
            pid = os.fork()
            if pid == 0:
                try:
                    trio.run(create, path)
                finally:
                    os._exit(0)
            emit(f"created {pid}")
        elif command == "reap":
            _, status = os.waitpid(int(arguments[0]), 0)
            emit(f"reaped {status}")
        else:
            emit(f"error unknown command {line.strip()!r}")


if __name__ == "__main__":
    serve()
