"""A close while the server is down (K12, L10): holder A (auto-ticking, compressing) closes its runtime
while the server is stopped; the close must return promptly (its lease statement cut after about a
second, plus a connect timeout), direct and through PgBouncer (which queues statements for a server
that is down), and a process opening the namespace once the server is back takes it after the lease.

    PYTHONPATH=. python attack/close_down.py [rounds]
"""

from __future__ import annotations

import sys
import time

from common import HERE, Proc, verify

from ctxrt.testing import start_pooler, temporary_cluster

LEASE_MS = 1500


def holder(url: str, tag: str) -> Proc:
    proc = Proc([str(HERE / "holder.py"), url, tag, str(LEASE_MS), "0.05"])
    proc.expect("ready")
    return proc


def main(rounds: int) -> None:
    with temporary_cluster() as cluster, start_pooler(cluster) as pooler:
        for n in range(rounds):
            for where in ("direct", "pooled"):
                database = f"close_{where}_{n}"
                url = cluster.create_database(database)
                if where == "pooled":
                    url = pooler.url(database)
                a = holder(url, "A")
                b = None
                try:
                    assert a.ask("open", "held")["held"] is True
                    a.ask("add 12", "added")  # its drain compresses on as the server stops
                    with cluster.down():
                        began = time.monotonic()
                        closed = a.ask("close", None, 120)
                        close_s = time.monotonic() - began
                        code = a.process.wait(timeout=60)
                    deadline = time.monotonic() + 60
                    while b is None:  # PgBouncer refuses logins a while after the server came back
                        try:
                            b = holder(url, "B")
                        except AssertionError:
                            assert time.monotonic() < deadline
                            time.sleep(1)
                    deadline = time.monotonic() + 60
                    while True:
                        opened = b.ask("open", None, 60)
                        if opened.get("held") or time.monotonic() > deadline:
                            break
                        time.sleep(0.2)
                    b.ask("add 3", None, 60)
                    b.ask("close", "closed", 60)
                    verified, said = verify(url)
                    print({"where": where, "A close s": round(close_s, 2), "A closed": closed, "A exit": code,
                           "B then": opened, "verify": verified, "out": said if verified else ""}, flush=True)
                finally:
                    a.kill()
                    if b is not None:
                        b.kill()


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
