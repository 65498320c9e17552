"""A PostgreSQL store's server goes away and comes back (issue 21, item 3): a namespace waits out
the outage and recovers by itself, its strategy never taken for one that failed to start (C5).

Real parts: the outage is the real server refusing this test's database (its connections dropped,
new ones refused), or the session's server stopped and started again; the processes are real.
"""

from __future__ import annotations

import base64
import json
import queue
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

import ctxrt
from ctxrt import Entry, Image, Text
from ctxrt.testing import Cluster, ScriptedModel

GUARD_S = 30


class Outage:
    """This test's database refuses every connection while ``on``: the server drops the ones open
    and turns new ones away (``ALLOW_CONNECTIONS false``), as a client sees a restart."""

    def __init__(self, url: str) -> None:
        self.database = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
        self.admin = url.replace(f"/{self.database}?", "/postgres?", 1)

    def begin(self) -> None:
        self._allow(False)

    def end(self) -> None:
        self._allow(True)

    def _allow(self, allowed: bool) -> None:
        with psycopg.connect(self.admin, autocommit=True) as conn:
            conn.execute(psycopg.sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS {}").format(
                psycopg.sql.Identifier(self.database), psycopg.sql.SQL("true" if allowed else "false")))
            if not allowed:
                conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                             (self.database,))


class Ledger(ctxrt.Strategy):
    """Every message raw; each compile appends the count of lines it has to its ledger, which its
    start reads back. ``interrupt`` (once) runs after a compile's select, before the actor commits
    the line it wrote: there the test takes the store away."""

    name = "ledger"
    marks_compression_reads = True

    def __init__(self, *, auto_tick: bool = False) -> None:
        self.auto_tick = auto_tick
        self.lines: list[int] = []
        self.started = trio.Event()
        self.interrupt: Callable[[], None] | None = None

    def initialize(self, ctx: ctxrt.StrategyContext) -> None:
        self.lines = ctx.read_log("ledger")
        self.started.set()

    def select(self, view: ctxrt.MessageView, budget: Any, options: ctxrt.SelectOptions) -> list[Entry]:
        entries = [Entry(m.participant, m.content, (m.id,)) for m in view.get_all()]
        if not options.dry_run and options.context is not None:
            options.context.append_log("ledger", len(self.lines))
            self.lines.append(len(self.lines))
            interrupt, self.interrupt = self.interrupt, None
            if interrupt is not None:
                interrupt()
        return entries


@pytest.mark.parametrize("auto_tick", [True, False], ids=["auto-ticking", "ticked by the host"])
async def test_a_strategy_commit_lost_in_an_outage_waits_for_the_store_and_recovers_by_itself(
    pg_url: str, auto_tick: bool,
) -> None:
    """C5, L10: the store going away between a strategy's select and its commit is no failed start. During
    the outage health() says the namespace waits for the store (no strategy_error) and compile()
    raises StoreUnavailableError; once the server takes connections again, an auto-ticking
    namespace starts its strategy again by itself (a host-ticked one at its next call), compiles,
    and its memory is what the store holds (the lost commit's line is written again, not skipped)."""
    outage = Outage(pg_url)
    ledger = Ledger(auto_tick=auto_tick)
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(pg_url) as rt:
            manager = await rt.open("ns", strategy=ledger)
            await manager.add_message("user", "before")
            await manager.compile()  # ledger line 0, committed
            ledger.interrupt = outage.begin
            try:
                try:
                    await manager.compile()  # line 1 is lost with the store
                except ctxrt.StoreUnavailableError:
                    pass  # or the compile's own reads met the outage after its commit failed
                ledger.started = trio.Event()
                health = await manager.health()
                assert health.strategy_error is None, health
                assert health.waiting_for is not None and "is unavailable" in health.waiting_for, health
                assert not health.ready
                with pytest.raises(ctxrt.StoreUnavailableError, match="is unavailable"):
                    await manager.compile()
            finally:
                outage.end()
            if auto_tick:
                await ledger.started.wait()  # no call of ours: the actor's back-off timer
            compiled = await manager.compile()
            assert [m.content[0].text for m in compiled.messages] == ["before"]
            health = await manager.health()
            assert (health.waiting_for, health.strategy_error) == (None, None)
            assert ledger.lines == [0, 1]
        async with ctxrt.open_runtime(pg_url) as again:
            reread = Ledger()
            await again.open("ns", strategy=reread)
            assert reread.lines == [0, 1], "the store holds what the strategy remembered"


CHILD = Path(__file__).with_name("pg_outage_resident.py")
RECOVERY_S = 20.0  # from the server's start to every resident compiling again


class Resident:
    """A ``pg_outage_resident.py`` process; its JSON lines read on a thread of their own."""

    def __init__(self, url: str, number: int, residents: int, *, ledger: bool = False) -> None:
        self.number = number
        self.process = subprocess.Popen([sys.executable, str(CHILD), url, str(number), str(residents),
                                         *(["ledger"] if ledger else [])],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True)
        self.lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.logged: list[str] = []  # its stderr (ctxrt's warnings), for a failure's message
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_log, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(json.loads(line))
        self.lines.put(None)

    def _read_log(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.logged.append(line)

    def expect(self, key: str, within_s: float) -> dict[str, Any]:
        try:
            found = self.lines.get(timeout=within_s)
        except queue.Empty:
            raise AssertionError(f"process {self.number} said no {key!r} within {within_s} s; its log ends: "
                                 f"{''.join(self.logged)[-5000:]}") from None
        if found is None:
            raise AssertionError(f"process {self.number} ended: {self.process.wait()} {''.join(self.logged)[-5000:]}")
        assert key in found, (key, found)
        return found

    def stop(self) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write("stop\n")
        self.process.stdin.flush()
        done = self.expect("done", 60)
        assert self.process.wait(timeout=60) == 0
        return done

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.mark.soak
@pytest.mark.parametrize("ledger", [False, True], ids=["no ledger", "keeping a ledger"])
def test_every_process_compiles_again_after_the_server_restarts(
    pg_cluster: Cluster, pg_url: str, soak_scale, ledger: bool,
) -> None:
    """L10, C5, Q6: several processes, each serving auto-ticking Autobiographical namespaces while they add
    and compile (keeping a request ledger, whose records ask the store's horizon, or not), see the
    server stop and start again (commits in flight when it stops). During
    the outage every namespace's health() says it waits for the store; once the server is back,
    every namespace in every process compiles again within RECOVERY_S and compression goes on, and
    no call was refused for a failed start (StrategyRefusedError) or anything else but the outage."""
    count, residents, restarts = soak_scale(3, 4), soak_scale(3, 6), soak_scale(1, 5)
    processes = [Resident(pg_url, number, residents, ledger=ledger) for number in range(count)]
    try:
        for process in processes:
            process.expect("ready", 60)
        for _ in range(restarts):
            with pg_cluster.down():
                for process in processes:
                    waiting = process.expect("waiting", 60)["waiting"]
                    assert len(waiting) == residents
                    assert all(text.startswith("the store: ") and "is unavailable" in text for text in waiting)
            for process in processes:
                process.expect("recovered", RECOVERY_S)
            for process in processes:
                process.expect("compressed", RECOVERY_S)  # the drains went on by themselves
        reports = [process.stop() for process in processes]
    finally:
        for process in processes:
            process.kill()
    assert all(report["unexpected"] == [] for report in reports), reports


def png(n: int) -> str:
    return base64.b64encode(b"\x89PNG\r\n\x1a\n" + n.to_bytes(4, "big") + bytes(range(256)) * 3).decode()


class Screenshots(ctxrt.Strategy):
    """Every message raw; one compression unit, whose request is the messages themselves, images and
    all (their bytes read from the store as the call goes out, M13). ``interrupt`` (once) runs as the
    request is made, after the floor's commit: there the test takes the store away."""

    name = "screenshots"
    marks_compression_reads = True

    def __init__(self) -> None:
        self.auto_tick = True
        self.replies: list[str] = []
        self.interrupt: Callable[[], None] | None = None

    def select(self, view: ctxrt.MessageView, budget: Any, options: ctxrt.SelectOptions) -> list[Entry]:
        return [Entry(m.participant, m.content, (m.id,)) for m in view.get_all()]

    def next_unit(self, ctx: ctxrt.StrategyContext) -> ctxrt.Unit | None:
        return None if self.replies or not ctx.view.get_all() else ctxrt.Unit("shots", ctx.view.get_all()[-1].sequence)

    def request_for(self, unit: ctxrt.Unit, ctx: ctxrt.StrategyContext) -> ctxrt.ModelRequest:
        interrupt, self.interrupt = self.interrupt, None
        if interrupt is not None:
            interrupt()
        return ctxrt.ModelRequest("test-model", None, [ctxrt.CompiledMessage(m.participant, m.content)
                                                       for m in ctx.view.get_all()], 16)

    def apply_unit(self, unit: ctxrt.Unit, outcome: Any, ctx: ctxrt.StrategyContext) -> bool:
        if isinstance(outcome, ctxrt.ModelResponse):
            self.replies.append(outcome.text)
        return True


async def test_a_compression_request_whose_media_meets_the_outage_waits_for_the_store_and_goes_out_after(
    pg_url: str,
) -> None:
    """C5, L10, M13: the store going away as an auto-ticking namespace's compression call goes out, its
    messages' images still to be read back for the model, is an outage like any other: health() says
    the namespace waits for the store, the runtime and its other namespaces live on, and once the
    server takes connections again the unit's call goes out with the images' bytes."""
    async with ctxrt.open_runtime(pg_url) as writer:  # written by another runtime: no bytes cached
        await (await writer.open("ns")).add_message("user", [Text("the screen"), Image(
            source={"type": "base64", "media_type": "image/png", "data": png(1)})])
    outage = Outage(pg_url)
    strategy = Screenshots()
    strategy.interrupt = outage.begin
    seen: list[ctxrt.ModelRequest] = []
    called = trio.Event()

    def reply(request: ctxrt.ModelRequest) -> str:
        seen.append(request)
        called.set()
        return "a screenshot"
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(pg_url, model=ScriptedModel(reply)) as rt:
            other = await rt.open("other")
            manager = await rt.open("ns", strategy=strategy)
            try:
                await manager.add_message("user", "look")  # the drain starts: the outage begins in request_for
                while (await manager.health()).waiting_for is None:
                    await trio.sleep(0.01)
                assert not seen
            finally:
                outage.end()
            await called.wait()  # no call of ours: the actor's back-off timer
            images = [block for block in seen[0].messages[0].content if isinstance(block, Image)]
            assert [image.source["data"] for image in images] == [png(1)]
            await other.add_message("user", "still served")
            assert strategy.replies == ["a screenshot"]


async def test_a_subscription_rides_out_an_outage_and_reports_what_was_written_after_it(
    pg_url: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """L10, A7: a subscription on a PostgreSQL store (its poller looks at the slot's head) goes on
    looking while the server refuses connections, saying once that it waits for the store; once
    the server answers, what another process appends reaches it, each once, in order, and the
    block never raised."""
    outage = Outage(pg_url)
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(pg_url) as rt:
            manager = await rt.open("ns")
            await manager.add_message("user", "before")
            async with manager.subscribe(poll_interval_s=0.01) as events:
                outage.begin()
                try:
                    while not any("waits for the store" in r.getMessage() for r in caplog.records):
                        await trio.sleep(0.01)  # until the poller met the outage
                finally:
                    outage.end()
                async with ctxrt.open_runtime(pg_url) as writer:
                    other = await writer.open("ns")
                    for text in ("after 1", "after 2"):
                        await other.add_message("user", text)
                seen = [await events.receive(), await events.receive()]
            assert [type(event) for event in seen] == [ctxrt.Added, ctxrt.Added]
            assert [event.message.content[0].text for event in seen] == ["after 1", "after 2"]
            assert any("answers again" in r.getMessage() for r in caplog.records)
