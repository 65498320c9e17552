"""Shared pieces of the lease/outage attacks: a host process driven line by line, and the store read back."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import trio

import ctxrt
from ctxrt import Entry

HERE = Path(__file__).parent


class Proc:
    """A child process writing one JSON line per event, read on a thread."""

    def __init__(self, argv: list[str]) -> None:
        self.process = subprocess.Popen([sys.executable, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.log: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_log, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            try:
                self.lines.put(json.loads(line))
            except json.JSONDecodeError:
                self.log.append("STDOUT " + line)
        self.lines.put(None)

    def _read_log(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.log.append(line)

    def expect(self, key: str, within_s: float = 60, skip: tuple[str, ...] = ("calling",)) -> dict[str, Any]:
        while True:
            try:
                found = self.lines.get(timeout=within_s)
            except queue.Empty:
                raise AssertionError(f"no {key!r} within {within_s} s; log: {''.join(self.log)[-3000:]}") from None
            if found is None:
                raise AssertionError(f"ended: {self.process.wait()} {''.join(self.log)[-3000:]}")
            if key in found:
                return found
            if not any(k in found for k in skip):
                raise AssertionError((key, found))

    def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def ask(self, line: str, key: str | None = None, within_s: float = 60) -> dict[str, Any]:
        """The answer to ``line`` (other lines passed over); with ``key``, it must hold it."""
        self.send(line)
        deadline = time.monotonic() + within_s
        while True:
            try:
                found = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no answer to {line!r} within {within_s} s; log: {''.join(self.log)[-3000:]}") from None
            if found is None:
                raise AssertionError(f"ended: {self.process.wait()} {''.join(self.log)[-3000:]}")
            if found.get("cmd") == line and "calling" not in found:
                if key is not None and key not in found:
                    raise AssertionError((line, key, found))
                return found

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


class Reader(ctxrt.Strategy):
    """Reads the Autobiographical strategy's logs as stored (same strategy name), keeping nothing."""

    name = "autobio"

    def __init__(self) -> None:
        self.summaries: list[dict[str, Any]] = []
        self.chunks: list[dict[str, Any]] = []

    def initialize(self, ctx: ctxrt.StrategyContext) -> None:
        self.summaries = ctx.read_log("summaries")
        self.chunks = ctx.read_log("chunks")

    def select(self, view: ctxrt.MessageView, budget: Any, options: ctxrt.SelectOptions) -> list[Entry]:
        return [Entry(m.participant, m.content, (m.id,)) for m in view.get_all()]


def stored(url: str, namespace: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    async def read() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        async with ctxrt.open_runtime(url, readonly=True) as rt:
            reader = Reader()
            await rt.open(namespace, strategy=reader)
            return reader.summaries, reader.chunks
    return trio.run(read)


def doubled(summaries: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """Sources (a chunk's messages, or children) summarised more than once at one level."""
    counts = Counter((s["level"], tuple(s["source_ids"])) for s in summaries)
    return [key for key, n in counts.items() if n > 1]


def verify(url: str) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-m", "ctxrt", "verify", url], capture_output=True, text=True, timeout=300)
    return done.returncode, (done.stdout + done.stderr)[-2000:]
