"""Minimal reproduction: a host cancels its tasks and leaves the runtime's block while a call the
runtime shields (an append carrying a request record, a fork, a ledger commit) waits on a batch
the stalled server never answers; or sends a Ctrl-C then.

python attack/shielded_close.py [MODE ...]   MODE: plain | record | fork  (default: all)
    [--int] a real SIGINT instead of the cancel; [--bound S] CLOSE_BATCH_S in the host (default 1)
Each mode: a fresh database; the host appends "warm" (and for record: compiles and records a
request; for fork: nothing more), says ready; the driver SIGSTOPs the database's backends; the host
starts the call, 0.3 s later cancels it and leaves the block (or raises SIGINT in itself); the
driver waits up to 40 s for the host's exit, then SIGCONTs and reads the store back.
Expected (K16): the host ends within the bound + a few seconds, the store holds "warm" (and
what the host was told landed). Seen before the fix: plain ends after the bound; record and fork
never end (killed at 40 s).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import psycopg
import trio

import ctxrt
import ctxrt.store.postgres


LIMIT = float(os.environ.get("LIMIT", "40"))


def say(**what: object) -> None:
    print(json.dumps(what), flush=True)


async def host(url: str, mode: str, interrupt: bool) -> None:
    async with ctxrt.open_runtime(url, durability="sync") as rt:
        manager = await rt.open("ann", isolate=True, ledger=True)
        await manager.add_message("user", "warm")
        if mode == "record":
            result = await manager.compile(ctxrt.Budget(max_tokens=100_000))
            await manager.record_request(result, form="anthropic", model="m")
        say(ready=True)
        await trio.to_thread.run_sync(sys.stdin.readline)
        async with trio.open_nursery() as nursery:
            if mode == "fork":
                nursery.start_soon(manager.fork)
            else:
                nursery.start_soon(manager.add_message, "user", "stalled")
            await trio.sleep(0.3)
            say(closing=True)
            if interrupt:
                os.kill(os.getpid(), signal.SIGINT)
                await trio.sleep_forever()
            nursery.cancel_scope.cancel()


def drive(url: str, mode: str, interrupt: bool, bound: float) -> dict[str, object]:
    process = subprocess.Popen([sys.executable, __file__, "--host", url, mode, str(int(interrupt)), str(bound)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stopped: list[int] = []
    assert process.stdout is not None and process.stdin is not None
    try:
        assert json.loads(process.stdout.readline()) == {"ready": True}
        with psycopg.connect(url, autocommit=True) as admin:
            stopped = [pid for (pid,) in admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")]
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        process.stdin.write("go\n")
        process.stdin.flush()
        began = time.monotonic()
        try:
            out, err = process.communicate(timeout=LIMIT)
            ended = f"exit {process.returncode} after {time.monotonic() - began:.1f} s"
        except subprocess.TimeoutExpired:
            process.kill()
            out, err = process.communicate()
            ended = f"HUNG: killed after {LIMIT:g} s"
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        if process.poll() is None:
            process.kill()
    return {"mode": mode, "interrupt": interrupt, "ended": ended,
            "logged": [line for line in err.splitlines() if "cutting" in line][-2:], "said": out.splitlines()[-1:], "stderr": err[-1500:] if "-v" in sys.argv else ""}


async def stored(url: str) -> list[str]:
    async with ctxrt.open_runtime(url, readonly=True) as rt:
        manager = await rt.open("ann", isolate=True)
        return [m.content[0].text for m in await manager.get_all_messages()]


def main() -> None:
    from ctxrt.testing import temporary_cluster
    args = [a for a in sys.argv[1:] if not a.startswith("-")]
    interrupt = "--int" in sys.argv
    bound = float(sys.argv[sys.argv.index("--bound") + 1]) if "--bound" in sys.argv else 1.0
    if "--bound" in sys.argv:
        args.remove(str(sys.argv[sys.argv.index("--bound") + 1]))
    modes = args or ["plain", "record", "fork"]
    with temporary_cluster() as cluster:
        for n, mode in enumerate(modes):
            url = cluster.create_database(f"s{n}")
            found = drive(url, mode, interrupt, bound)
            found["stored"] = trio.run(stored, url)
            print(json.dumps(found), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--host"]:
        ctxrt.store.postgres.CLOSE_BATCH_S = float(sys.argv[5])
        for name in ("BATCH_CUT_S", "READ_CUT_S"):  # optional: the running bounds, low for fast rounds
            if name in os.environ and hasattr(ctxrt.store.postgres, name):
                setattr(ctxrt.store.postgres, name, float(os.environ[name]))
        try:
            trio.run(host, sys.argv[2], sys.argv[3], sys.argv[4] == "1")
        except KeyboardInterrupt:
            say(end="interrupted")
            sys.exit(130)
        say(end="closed")
    else:
        main()
