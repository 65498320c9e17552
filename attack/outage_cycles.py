"""Many outages (L10, C5, K12): several processes, each with several auto-ticking Autobiographical
residents (attack/resident.py), see the server go away and come back, in turn: a fast stop and start
(``Cluster.down``) short and longer than a lease (10 s), an immediate restart (``pg_ctl restart -m
immediate``), the database refusing connections (``ALLOW_CONNECTIONS false``). After each: every
resident waited, recovered and compression went on (the model's requests grew); at the end their
health shows nothing stuck (pending units drained, no model call in flight) and no call raised
anything but the outage's errors.

    PYTHONPATH=. python attack/outage_cycles.py direct|pooled [cycles] [processes] [residents]
"""

from __future__ import annotations

import sys
import time

from common import HERE, Proc

import psycopg

from ctxrt.testing import start_pooler, temporary_cluster

KINDS = ["down short", "down long", "immediate", "refuse short", "refuse long"]


def refuse(admin: str, database: str, allowed: bool) -> None:
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS {}").format(
            psycopg.sql.Identifier(database), psycopg.sql.SQL("true" if allowed else "false")))
        if not allowed:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (database,))


def outage(cluster, kind: str, database: str, processes: list[Proc], residents: int, direct: bool) -> float:
    """Make one outage of ``kind``; directly, wait for every process to report its residents waiting
    (the immediate restart may come and go before they all notice: not waited for; through PgBouncer
    a statement waits in its queue instead of failing: 2 s then). Its length (s)."""
    began = time.monotonic()
    long = kind.endswith("long")

    def noticed() -> None:
        if not direct:
            time.sleep(2.0)
            return
        for p in processes:
            assert len(p.expect("waiting", 60)["waiting"]) == residents
    if kind.startswith("down"):
        with cluster.down():
            noticed()
            time.sleep(11.0 if long else 0.0)
    elif kind == "immediate":
        with cluster._lock:  # Cluster.down with pg_ctl's immediate mode: a crash, then crash recovery
            cluster._halt("immediate")
        cluster._launch()
        return time.monotonic() - began
    else:
        admin = cluster.url()
        refuse(admin, database, False)
        try:
            noticed()
            time.sleep(11.0 if long else 0.0)
        finally:
            refuse(admin, database, True)
    return time.monotonic() - began


def main(where: str, cycles: int, count: int, residents: int) -> None:
    with temporary_cluster() as cluster, start_pooler(cluster) as pooler:
        database = f"cycles_{where}"
        url = cluster.create_database(database)
        if where == "pooled":
            url = pooler.url(database)
        processes = [Proc([str(HERE / "resident.py"), url, str(n), str(residents)]) for n in range(count)]
        summary: dict[str, list[int]] = {}
        skip = ("calling", "waiting", "recovered", "compressed")
        try:
            for p in processes:
                p.expect("ready", 90)
            for cycle in range(cycles):
                kind = KINDS[cycle % len(KINDS)]
                before = []
                for p in processes:
                    p.send("stats")
                    before.append(p.expect("stats", 60, skip=skip)["requests"])
                took = outage(cluster, kind, database, processes, residents, where == "direct")
                if kind != "immediate" and where == "direct":
                    for p in processes:
                        p.expect("recovered", 30)
                    for p in processes:
                        p.expect("compressed", 30)
                else:  # "waiting" may or may not have been said: read until compression goes on
                    time.sleep(5)
                after = []
                began = time.monotonic()
                for p in processes:
                    while True:
                        p.send("stats")
                        stats = p.expect("stats", 30, skip=("calling", "waiting", "recovered", "compressed"))
                        if stats["requests"] > before[len(after)] or (kind != "immediate" and where == "direct"):
                            break
                        assert time.monotonic() - began < 120, (kind, stats)
                        time.sleep(1)
                    after.append(stats["requests"])
                grew = sum(a > b for a, b in zip(after, before))
                summary.setdefault(kind, [0, 0])
                summary[kind][0] += 1
                summary[kind][1] += grew == count
                print(f"cycle {cycle} {kind} {took:.1f}s: requests {before} -> {after}", flush=True)
            # Nothing stuck: let the residents go on a while, then each one's work drains or moves.
            stuck = []
            for p in processes:
                p.send("stats")
                first = p.expect("stats", 30, skip=("calling", "waiting", "recovered", "compressed"))
                time.sleep(3)
                p.send("stats")
                second = p.expect("stats", 30, skip=("calling", "waiting", "recovered", "compressed"))
                for n, (a, b) in enumerate(zip(first["stats"], second["stats"])):
                    if b[2] is not None or b[3] is not None or (b[0] > 0 and b[0] >= a[0] and
                                                                 second["requests"] == first["requests"]):
                        stuck.append((processes.index(p), n, a, b))
                print("health", first, second, flush=True)
            # Then quiet: every resident's pending work drains (nothing stuck planned or in flight).
            began = time.monotonic()
            for p in processes:
                p.send("quiet")
            drained = []
            for p in processes:
                while True:
                    p.send("stats")
                    stats = p.expect("stats", 30, skip=skip)
                    if all(s[0] == 0 and s[1] == 0 for s in stats["stats"]):
                        drained.append(round(time.monotonic() - began, 1))
                        break
                    if time.monotonic() - began > 180:
                        drained.append(("not drained", stats))
                        break
                    time.sleep(1)
            print(f"drained after quiet (s): {drained}", flush=True)
            reports = []
            for p in processes:
                p.send("stop")
                reports.append(p.expect("done", 60, skip=("calling", "waiting", "recovered", "compressed", "stats")))
            print(f"{where}: cycles by kind (done, every process compressed again): {summary}", flush=True)
            print(f"stuck: {stuck}", flush=True)
            print(f"unexpected: {[r['unexpected'] for r in reports]}", flush=True)
        finally:
            for p in processes:
                p.kill()


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    args = sys.argv[1:]
    main(args[0], int(args[1]) if len(args) > 1 else 5, int(args[2]) if len(args) > 2 else 2,
         int(args[3]) if len(args) > 3 else 3)
