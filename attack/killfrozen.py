"""Attack (issue 35): SIGKILL a process whose lone commit is held by a frozen disk, then thaw.

    python attack/killfrozen.py SEED ROUNDS

Each round: an ext4 image without a journal in /dev/shm (the flush measures fast: the lone path),
a child appending in its main task (attack/kill.py's child), frozen after a drawn number of acks
so that its next commit is out, SIGKILL, a drawn pause, thaw. Checks: the store verifies sound and
every acknowledged append is stored (K3), and a later writer appends.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

from ctxrt.testing import verify_store

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kill import check  # noqa: E402
from stall import Disk  # noqa: E402


def main() -> int:
    seed, rounds = int(sys.argv[1]), int(sys.argv[2])
    rng = random.Random(seed)
    os.environ["NOJOURNAL"] = "1"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    failures = 0
    for number in range(rounds):
        base = Path(tempfile.mkdtemp(prefix="attcm-kf-", dir="/dev/shm"))
        disk = Disk(base)
        path = disk.mount / "store"
        wanted, pause = rng.randint(5, 40), rng.uniform(0, 0.05)
        proc = subprocess.Popen([sys.executable, str(Path(__file__).parent / "kill.py"), "child", str(path), "1"],
                                stdout=subprocess.PIPE, env=env)
        assert proc.stdout is not None
        acks: list[tuple[int, str]] = []
        while len(acks) < wanted:
            line = proc.stdout.readline()
            if not line:
                break
            who, message_id = line.split()
            acks.append((int(who), message_id.decode()))
        subprocess.run(["fsfreeze", "-f", str(disk.mount)], check=True)
        disk.frozen = True
        time.sleep(pause)
        proc.send_signal(signal.SIGKILL)
        time.sleep(0.05)
        disk.thaw()
        rest, _ = proc.communicate()
        for line in rest.splitlines():
            who, message_id = line.split()
            acks.append((int(who), message_id.decode()))
        problems = []
        report = verify_store(path)
        if report.status != "sound":
            problems.append(f"verify {report}")
        else:
            lost = trio.run(check, path, acks)
            if lost:
                problems.append(f"lost {len(lost)}: {lost[:3]}")
        if problems:
            failures += 1
        status = "FAIL " + "; ".join(problems) if problems else "ok"
        print(f"{status} round {number} acks {len(acks)} pause {pause * 1000:.1f}ms (seed {seed})", flush=True)
        disk.remove()
        shutil.rmtree(base, ignore_errors=True)
    print(f"# done: {rounds} rounds, {failures} failures", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
