"""A stalled pooler (K12): holder A reaches the store through PgBouncer, B directly. PgBouncer is
SIGSTOPped while A adds and compresses (its renewals and writes hang); A's lease lapses, B takes it
and compresses. PgBouncer resumed: A's writes that waited in it must be refused (ConfigConflictError),
never land beside B's. Then PgBouncer stopped again and A closes: the close must return within about
a second and a connect timeout (K12), and nothing A held stays locked (B goes on writing).

    PYTHONPATH=. python attack/renewer_hang.py [rounds]
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections import Counter

from common import HERE, Proc, doubled, stored, verify

from ctxrt.testing import start_pooler, temporary_cluster

LEASE_MS = 1500


def holder(url: str, tag: str) -> Proc:
    proc = Proc([str(HERE / "holder.py"), url, tag, str(LEASE_MS), "0.05"])
    proc.expect("ready")
    return proc


def one_round(cluster, pooler, n: int) -> dict[str, object]:
    database = f"hang_{n}"
    direct = cluster.create_database(database)
    pooled = pooler.url(database)
    a, b = holder(pooled, "A"), holder(direct, "B")
    pid = pooler.process.pid
    try:
        assert a.ask("open", "held")["held"] is True
        a.ask("add 12", "added")
        a.send("add 6")  # in flight as the pooler stops
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(LEASE_MS / 1000 * 2)
            began = time.monotonic()
            opened = b.ask("open", None, 120)
            took_s = time.monotonic() - began
            b_added = [b.ask("add 6", None, 120) for _ in range(2)]
        finally:
            os.kill(pid, signal.SIGCONT)
        a_answers = [a.ask("add 3", None, 120) for _ in range(3)]
        a_errors = sorted({x.get("error") for x in a_answers if "error" in x})
        # A close with the pooler stalled.
        b.ask("add 3", None, 120)
        os.kill(pid, signal.SIGSTOP)
        try:
            began = time.monotonic()
            closed = a.ask("close", None, 120)
            close_s = time.monotonic() - began
            b_after = b.ask("add 3", None, 60)  # direct: nothing of A's holds it up
        finally:
            os.kill(pid, signal.SIGCONT)
        b.ask("close", "closed", 60)
        summaries, _ = stored(direct, "agents/a")
        code, said = verify(direct)
        return {"B open": opened, "B open s": round(took_s, 2), "B adds": [sorted(x) for x in b_added],
                "A errors after": a_errors, "A close s": round(close_s, 2), "A closed": closed,
                "B during A's close": sorted(b_after), "summaries by": dict(Counter(s["content"].split()[2] for s in summaries)),
                "doubled": doubled(summaries), "verify": code, "verify out": said if code else "",
                "A log": [line[:200] for line in a.log if "Error" in line or "lease" in line][-4:]}
    finally:
        with_pooler_running = pooler.process.poll() is None
        if with_pooler_running:
            os.kill(pid, signal.SIGCONT)
        a.kill()
        b.kill()


def main(rounds: int) -> None:
    with temporary_cluster() as cluster, start_pooler(cluster) as pooler:
        for n in range(rounds):
            print(one_round(cluster, pooler, n), flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
