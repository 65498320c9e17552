"""Renewal against take (K12): holder A serves the remembering namespace; the server stops for longer
than a lease; the moment it is back (or a little later), B opens the namespace while A's renewer tries to renew the
lapsed lease. Exactly one may write from then on: if B took it, A's next strategy write is refused
(ConfigConflictError) and its managers close; if A kept it, B is refused. Either way both go on
adding and compiling, then the store must hold no chunk summarised twice and ``ctxrt verify`` passes.

    PYTHONPATH=. python attack/restart_race.py [rounds]
"""

from __future__ import annotations

import sys
import time
from collections import Counter

from common import HERE, Proc, doubled, stored, verify

from ctxrt.testing import start_pooler, temporary_cluster

LEASE_MS = 1500
DELAYS = [0.0, 0.3, 0.6, 1.2]


def holder(url: str, tag: str) -> Proc:
    proc = Proc([str(HERE / "holder.py"), url, tag, str(LEASE_MS), "0.05"])
    proc.expect("ready")
    return proc


def one_round(cluster, url: str, where: str, delay_s: float) -> dict[str, object]:
    a, b = holder(url, "A"), holder(url, "B")
    try:
        assert a.ask("open", "held")["held"] is True
        a.ask("add 12", "added")
        with cluster.down():
            time.sleep(LEASE_MS / 1000 * 2)  # every lease lapses
        time.sleep(delay_s)  # B comes a little later (A's renewer tries every third of a lease)
        deadline = time.monotonic() + 60
        while True:  # the moment the server is back: against A's renewer (PgBouncer refuses logins a while)
            opened = b.ask("open", None, 120)
            if "held" in opened or time.monotonic() > deadline:
                break
            assert opened["error"] == "StoreUnavailableError", opened
            time.sleep(0.05)
        answers = {"A": [], "B": []}
        for _ in range(4):
            answers["A"].append(a.ask("add 3", None, 120))
            if opened["held"]:
                answers["B"].append(b.ask("add 3", None, 120))
            time.sleep(0.3)
        a_refused = [x for x in answers["A"] if "error" in x]
        b_refused = [x for x in answers["B"] if "error" in x]
        a.ask("close", "closed", 60)
        b.ask("close", "closed", 60)
        summaries, _ = stored(url, "agents/a")
        twice = doubled(summaries)
        code, said = verify(url)
        by = Counter(s["content"].split()[2] for s in summaries)
        return {"where": where, "B delay": delay_s, "B took it": opened["held"], "A refused": len(a_refused),
                "A errors": sorted({x["error"] for x in a_refused}), "B errors": sorted({x["error"] for x in b_refused}),
                "summaries by": dict(by), "doubled": twice, "verify": code, "verify out": said if code else ""}
    finally:
        a.kill()
        b.kill()


def main(rounds: int) -> None:
    results = []
    with temporary_cluster() as cluster, start_pooler(cluster) as pooler:
        for n in range(rounds):
            for where in ("direct", "pooled"):
                url = cluster.create_database(f"race_{where}_{n}")
                if where == "pooled":
                    url = pooler.url(f"race_{where}_{n}")
                result = one_round(cluster, url, where, DELAYS[n % len(DELAYS)])
                results.append(result)
                print(result, flush=True)
    bad = [r for r in results if r["doubled"] or r["verify"] or (r["B took it"] and not r["A refused"])
           or (not r["B took it"] and r["A refused"])]
    print(f"rounds {len(results)}, B took it in {sum(bool(r['B took it']) for r in results)}, bad {len(bad)}")


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
