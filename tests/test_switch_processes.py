"""Switches followed across real processes on a real PostgreSQL store (R4).

A child process (``tests/pg_switch_follower.py``) keeps one manager on main compiling without
pause; this process's runtime switches main and "undo" back and forth. The child's manager follows
each switch at its next compile, and no compile of it reads a mix of the two branches.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import trio

from ctxrt import open_runtime

CHILD = Path(__file__).with_name("pg_switch_follower.py")
GUARD_S = 60
KEPT, LATER = 3, 2
BURST = 12


async def test_a_process_follows_each_switch_another_makes_and_no_compile_reads_a_mix(pg_url: str) -> None:
    """R4, R3: the child's manager moves to each switch's target at its next compile (each move
    waited for in turn), then through a burst of switches made without waiting it ends where the
    last one went; every one of its compiles read one branch whole."""
    async with open_runtime(pg_url) as rt:
        writer = await rt.open("writer")
        ids = [await writer.add_message("user", f"message {i}") for i in range(KEPT)]
        await rt.create_branch("undo", at_sequence=int(ids[-1]))
        ids += [await writer.add_message("user", f"message {i}") for i in range(KEPT, KEPT + LATER)]
        child = subprocess.Popen(
            [sys.executable, str(CHILD), pg_url, json.dumps(ids), str(KEPT)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        assert child.stdout is not None and child.stdin is not None

        async def line() -> dict:
            read = await trio.to_thread.run_sync(child.stdout.readline, abandon_on_cancel=True)
            if not read:
                raise AssertionError(f"the follower ended early: {child.wait()} {child.stderr.read()[-3000:]}")
            return json.loads(read)

        try:
            with trio.fail_after(GUARD_S):
                assert await line() == {"branch": "main"}
                for source, target in [("main", "undo"), ("undo", "main"), ("main", "undo"), ("undo", "main")]:
                    await rt.switch_branch(source, target)
                    assert await line() == {"branch": target}
                for turn in range(BURST):
                    await rt.switch_branch(*(("main", "undo") if turn % 2 == 0 else ("undo", "main")))
                child.stdin.write("stop\n")
                child.stdin.flush()
                while "final" not in (report := await line()):
                    pass
        finally:
            if child.poll() is None:
                child.stdin.close()
                child.wait(timeout=GUARD_S)
        assert child.returncode == 0, child.stderr.read()[-3000:]
        assert report["mixed"] == [] and report["compiles"] > 4
        assert report["final"] == report["manager"] == ("main" if BURST % 2 == 0 else "undo")
