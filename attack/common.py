"""Shared bits of the attack scripts: the payloads writers append, the ack log they write, and the
check a parent runs on a store after killing its writer. Public ctxrt names only."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import trio

import ctxrt

HERE = Path(__file__).resolve().parent
TREE = HERE.parent
PYTHON = sys.executable
# Where stores go (a tmpfs makes the flush free: the durable committer's lone-caller path then runs),
# and the durability a1's and a2's writers open with.
BASE = os.environ.get("ATT35_DIR", "/var/tmp")
DURABILITY = os.environ.get("ATT35_DURABILITY", "sync")


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(TREE) + os.pathsep + e.get("PYTHONPATH", "")
    return e


def say(line: str) -> None:
    """One ``os.write`` per line: a line that reached the pipe is whole, never buffered."""
    os.write(1, (line + "\n").encode())


def payload(round_: int, ns: str, task: int, n: int, pad: int = 0) -> str:
    text = f"r{round_}|{ns}|t{task}|n{n}|"
    return text + ("x" * pad if pad else "")


def parse(text: str) -> tuple[int, str, int, int] | None:
    parts = text.split("|")
    if len(parts) < 4 or not parts[0].startswith("r"):
        return None
    return int(parts[0][1:]), parts[1], int(parts[2][1:]), int(parts[3][1:])


class Acks:
    """What the parent read from its writers' pipes: (branch, ns) -> {(round, task): [n acked...]}."""

    def __init__(self) -> None:
        self.acked: dict[tuple[str, str], dict[tuple[int, int], set[int]]] = defaultdict(lambda: defaultdict(set))
        self.ids: dict[tuple[str, str, int, int, int], str] = {}
        self.forks: dict[str, tuple[str, int]] = {}  # fork branch -> (ns, round)
        self.count = 0

    def feed(self, line: str) -> None:
        words = line.split()
        if not words:
            return
        if words[0] == "ack":  # ack <branch> <ns> <round> <task> <n> <id>
            _, branch, ns, r, t, n, mid = words
            self.acked[(branch, ns)][(int(r), int(t))].add(int(n))
            self.ids[(branch, ns, int(r), int(t), int(n))] = mid
            self.count += 1
        elif words[0] == "fork":  # fork <ns> <round> <branch>
            self.forks[words[3]] = (words[1], int(words[2]))


def text_of(message: ctxrt.Message) -> str:
    block = message.content[0]
    return getattr(block, "text", "")


def isolated(ns: str) -> bool:
    """Namespaces named shared* share the slot ``messages``; the others have their own."""
    return not ns.startswith("shared")


async def check_store(path: Path, acks: Acks, namespaces: list[str]) -> list[str]:
    """Reopen ``path`` as a writer (it runs the page walk a killed writer leaves due) and check
    every acknowledged append is there, once, in order, with no unacknowledged gap before it."""
    problems: list[str] = []
    async with ctxrt.open_runtime(path) as rt:
        branches = {info.name for info in await rt.list_branches()}
        wanted = {("main", ns) for ns in namespaces} | set(acks.acked)
        for branch, ns in sorted(wanted):
            if branch not in branches:
                if acks.acked.get((branch, ns)):
                    problems.append(f"branch {branch} missing, with acked appends")
                continue
            async with await rt.open(ns, branch=branch, isolate=isolated(ns)) as manager:
                messages = await manager.get_all_messages()
            problems += check_messages(branch, ns, messages, acks, isolate=isolated(ns))
    return problems


def check_messages(branch: str, ns: str, messages, acks: Acks, *, isolate: bool) -> list[str]:
    problems: list[str] = []
    seen: dict[tuple[int, int], list[int]] = defaultdict(list)
    last_seq = -1
    for message in messages:
        if message.sequence <= last_seq:
            problems.append(f"{branch}/{ns}: sequence not rising at {message.id}")
        last_seq = message.sequence
        key = parse(text_of(message))
        if key is None:
            continue
        r, mns, t, n = key
        if isolate and mns != ns and not branch.startswith("f"):
            problems.append(f"{branch}/{ns}: holds {mns}'s message {message.id}")
        if mns != ns:
            continue
        problems += check_image(branch, message)
        seen[(r, t)].append(n)
    acked = acks.acked.get((branch, ns), {})
    # A fork holds its parent's history up to the fork point: count the parent's acks there too.
    for (r, t), ns_seen in seen.items():
        if ns_seen != sorted(ns_seen):
            problems.append(f"{branch}/{ns} r{r} t{t}: out of order {ns_seen[:20]}")
        if len(set(ns_seen)) != len(ns_seen):
            problems.append(f"{branch}/{ns} r{r} t{t}: duplicate")
        # No gap: what is present is 0..k for some k (the writer appends one at a time, in order).
        s = sorted(set(ns_seen))
        if s and s != list(range(s[0], s[-1] + 1)):
            problems.append(f"{branch}/{ns} r{r} t{t}: gap in {s[:5]}..{s[-5:]}")
    for (r, t), ns_acked in acked.items():
        present = set(seen.get((r, t), ()))
        missing = ns_acked - present
        if missing:
            problems.append(f"{branch}/{ns} r{r} t{t}: {len(missing)} acked missing, e.g. {sorted(missing)[:5]}")
        top = max(ns_acked)
        extra = {n for n in present if n > top + 1 and branch == "main"}
        if extra:
            problems.append(f"{branch}/{ns} r{r} t{t}: present beyond the one in flight: {sorted(extra)[:5]}")
    return problems


def check_image(branch: str, message: ctxrt.Message) -> list[str]:
    """A message written with an image names its sha256 in its metadata: the stored image must match."""
    want = (message.metadata or {}).get("sha256")
    if want is None:
        return []
    if len(message.content) != 2:
        return [f"{branch}: {message.id} lost its image"]
    source = dict(message.content[1].source)
    if "data" in source:
        got = hashlib.sha256(base64.b64decode(source["data"])).hexdigest()
    else:
        got = source.get("sha256")
    return [] if got == want else [f"{branch}: {message.id} image {got} != {want} ({sorted(source)})"]


def verify_cli(path: Path, timeout: float = 120) -> tuple[int, str]:
    run = subprocess.run([PYTHON, "-m", "ctxrt", "verify", "--json", str(path)], env=env(), capture_output=True,
                         text=True, timeout=timeout)
    try:
        report = json.loads(run.stdout)
        status = report.get("status")
        detail = f"{status} pages={report.get('pages')} records={report.get('records')} damage={report.get('damage')}"
    except ValueError:
        detail = (run.stdout + run.stderr)[-500:]
    return run.returncode, detail
