"""Split brain (K12): holder A SIGSTOPped in the middle of a compression's model call, past its lease's
expiry; B opens the namespace (takes the lapsed lease) and compresses; A resumed: its summary write
must be refused (ConfigConflictError, nothing written), the store must hold no chunk summarised by
both, and ``ctxrt verify`` must pass. Direct and through PgBouncer; ``rounds`` rounds each.

    PYTHONPATH=. python attack/split_brain.py [rounds]
"""

from __future__ import annotations

import os
import signal
import sys
import time
import urllib.parse

from common import HERE, Proc, doubled, stored, verify

from ctxrt.testing import start_pooler, temporary_cluster

LEASE_MS = 1500


def holder(url: str, tag: str, delay_s: float) -> Proc:
    proc = Proc([str(HERE / "holder.py"), url, tag, str(LEASE_MS), str(delay_s)])
    proc.expect("ready")
    return proc


def one_round(url: str, where: str) -> dict[str, object]:
    a = holder(url, "A", 2.0)  # A's model call is slow: it is stopped inside it
    b = None
    try:
        assert a.ask("open", "held")["held"] is True
        a.send("add 12")
        a.expect("calling", 60, skip=("added",))  # a compression in flight
        os.kill(a.process.pid, signal.SIGSTOP)
        time.sleep(LEASE_MS / 1000 * 1.5)  # A's lease lapses (nobody renews it)
        b = holder(url, "B", 0.0)
        opened = b.ask("open", "held")
        assert opened["held"] is True, opened
        b.ask("add 6", "added")
        deadline = time.monotonic() + 30
        while True:  # B's drain summarises what is pending
            stats = b.ask("stats", "calls")
            if stats["pending"] == 0 and stats["in_flight"] == 0 and stats["calls"] > 0:
                break
            assert time.monotonic() < deadline, stats
            time.sleep(0.2)
        os.kill(a.process.pid, signal.SIGCONT)
        time.sleep(3.0)  # A's model call ends, its commit goes out
        got = a.ask("add 2", None, 30)  # its managers are closed by now (the refused write), or the write is refused
        a.ask("close", "closed")
        b.ask("close", "closed")
        a_warned = [line for line in a.log if "lease" in line]
        summaries, chunks = stored(url, "agents/a")
        by = {tag: sum(1 for s in summaries if f"summary by {tag}" in s["content"]) for tag in "AB"}
        twice = doubled(summaries)
        code, said = verify(url)
        return {"where": where, "A summaries stored": by["A"], "B summaries stored": by["B"],
                "doubled": twice, "verify": code, "A after": got, "A lease log": a_warned[-3:],
                "verify out": said if code else ""}
    finally:
        a.kill()
        if b is not None:
            b.kill()


def main(rounds: int) -> None:
    with temporary_cluster() as cluster, start_pooler(cluster) as pooler:
        results = []
        for n in range(rounds):
            for where in ("direct", "pooled"):
                url = cluster.create_database(f"split_{where}_{n}")
                if where == "pooled":
                    url = pooler.url(f"split_{where}_{n}")
                result = one_round(url, where)
                results.append(result)
                print(result, flush=True)
        bad = [r for r in results if r["doubled"] or r["verify"]]
        print(f"rounds {len(results)}, bad {len(bad)}")


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
