"""Many host processes writing one PostgreSQL store (issue 15): real processes, a real server.

Each process runs ``tests/pg_residents.py``: its residents race the other processes' for the same
namespaces, append to the shared slot (some lines only for their own reader) and compile.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

CHILD = Path(__file__).with_name("pg_residents.py")


def start(url: str, process: int, residents: int, messages: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(CHILD), url, str(process), str(residents), str(messages)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def phase(process: subprocess.Popen[str]) -> dict:
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        raise AssertionError(f"a resident process ended early: {process.wait()} {process.stderr.read()[-3000:]}")
    return json.loads(line)


def stored_ids(url: str) -> list[int]:
    """The shared slot's item sequences in slot order, read with SQL (not through ctxrt)."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT i.sequence FROM ctxrt_items i JOIN ctxrt_states s ON s.number = i.state"
            " WHERE s.name = 'messages' AND i.branch = 1 AND i.version = i.sequence ORDER BY i.ordinal"
        ).fetchall()
    return [row[0] for row in rows]


@pytest.mark.soak
def test_four_processes_of_residents_share_one_store(pg_url: str, soak_scale) -> None:
    """4 processes x 25 residents on one store: no acknowledged message lost, ids unique and
    increasing, exactly one claim per namespace across processes, every process sees the others'
    appends at its next compile, and no audience block reaches another process's reader (K1, C1, A1)."""
    residents, messages = 25, soak_scale(4, 20)
    processes = [start(pg_url, number, residents, messages) for number in range(4)]
    try:
        first = [phase(process) for process in processes]
        acknowledged = [int(i) for result in first for i in result["appended"]]
        for process in processes:
            assert process.stdin is not None
            process.stdin.write(f"{len(acknowledged)}\n")
            process.stdin.flush()
        second = [phase(process) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.wait(timeout=60)
    assert all(process.returncode == 0 for process in processes), [p.stderr.read()[-2000:] for p in processes]

    assert len(acknowledged) == 4 * residents * messages
    assert len(set(acknowledged)) == len(acknowledged), "every id is unique"
    ids = stored_ids(pg_url)
    assert sorted(ids) == sorted(acknowledged), "no acknowledged message lost, none extra"
    assert ids == sorted(ids), "ids increase along the slot"

    claims = sorted(number for result in first for number in result["claimed"])
    assert claims == list(range(residents)), "each namespace claimed by exactly one process"

    for result in second:
        assert result["leaks"] == []
        assert result["own_secrets_seen"] == len(result["counts"]), "each reader sees its own lines (the check can see)"
        assert all(count == len(acknowledged) for count in result["counts"].values()), result["counts"]


@pytest.mark.soak
def test_processes_racing_to_make_and_delete_branches_fail_only_their_own_commands(pg_url: str, soak_scale) -> None:
    """3 processes race to create and delete branches of shared names while appending, editing and
    forking: each gets only BranchExistsError / BranchNotFoundError for its lost races, never an
    error that fails other callers' commands in the same group commit (K6 across processes)."""
    seconds = str(soak_scale(3, 30))
    racer = Path(__file__).with_name("pg_branch_racer.py")
    processes = [subprocess.Popen([sys.executable, str(racer), pg_url, str(number), seconds],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for number in range(3)]
    outputs = [process.communicate(timeout=float(seconds) + 120) for process in processes]
    assert all(process.returncode == 0 for process in processes), [err[-2000:] for _, err in outputs]
    reports = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert all(report["unexpected"] == [] for report in reports), reports
    assert all(report["acknowledged"] > 0 for report in reports)
