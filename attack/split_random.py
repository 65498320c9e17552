"""Split brain at a random moment (K12): holder A adds and compresses without a pause (its commands
queued), and is SIGSTOPped at a random moment: inside a batch (its transaction open on the server,
holding the lease row's share lock), between batches, inside a model call. B then opens the namespace
(it waits for A's transaction to be ended by the server: idle_in_transaction_session_timeout) and
compresses; A resumed must write no strategy state: the store holds no chunk summarised twice and
``ctxrt verify`` passes. Counts the rounds that caught A inside a transaction.

    PYTHONPATH=. python attack/split_random.py [rounds] [direct|pooled]
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time
from collections import Counter

import psycopg

from common import HERE, Proc, doubled, stored, verify

from ctxrt.testing import start_pooler, temporary_cluster

LEASE_MS = 1500


def holder(url: str, tag: str) -> Proc:
    proc = Proc([str(HERE / "holder.py"), url, tag, str(LEASE_MS), "0.0"])
    proc.expect("ready")
    return proc


def one_round(cluster, url: str, database: str, seed: int) -> dict[str, object]:
    rng = random.Random(seed)
    a, b = holder(url, "A"), holder(url, "B")
    try:
        assert a.ask("open", "held")["held"] is True
        for _ in range(400):  # more than it gets through before the stop: busy to the end
            a.send("add 2")
        time.sleep(rng.uniform(0.5, 3.0))
        os.kill(a.process.pid, signal.SIGSTOP)
        with psycopg.connect(cluster.url(), autocommit=True) as admin:
            open_tx = admin.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND state LIKE"
                                    " 'idle in transaction%%'", (database,)).fetchone()[0]
        time.sleep(LEASE_MS / 1000 * 1.5)
        began = time.monotonic()
        opened = b.ask("open", None, 120)
        open_s = time.monotonic() - began
        if opened.get("held"):
            for _ in range(3):
                b.ask("add 3", None, 60)
        os.kill(a.process.pid, signal.SIGCONT)
        a_answers = [a.ask("add 1", None, 120) for _ in range(2)]
        a.ask("close", "closed", 60)
        b.ask("close", "closed", 60)
        summaries, _ = stored(url, "agents/a")
        code, said = verify(url)
        return {"stopped in a transaction": open_tx, "B held": opened.get("held"), "B open s": round(open_s, 1),
                "A last": sorted({x.get("error", "ok") for x in a_answers}),
                "summaries by": dict(Counter(s["content"].split()[2] for s in summaries)),
                "doubled": doubled(summaries), "verify": code, "verify out": said if code else ""}
    finally:
        a.kill()
        b.kill()


def main(rounds: int, where: str) -> None:
    results = []
    with temporary_cluster() as cluster, start_pooler(cluster) as pooler:
        for n in range(rounds):
            database = f"random_{n}"
            url = cluster.create_database(database)
            if where == "pooled":
                url = pooler.url(database)
            result = one_round(cluster, url, database, n)
            results.append(result)
            print(result, flush=True)
    bad = [r for r in results if r["doubled"] or r["verify"]]
    print(f"{where}: rounds {len(results)}, in a transaction {sum(bool(r['stopped in a transaction']) for r in results)},"
          f" B held {sum(bool(r['B held']) for r in results)}, bad {len(bad)}")


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4, sys.argv[2] if len(sys.argv) > 2 else "direct")
