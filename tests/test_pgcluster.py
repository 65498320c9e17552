"""The real-PostgreSQL test fixtures give a working, private, socket-only server (spec issue 15, real parts).

Determinism rules: nothing is mocked. ``pg_cluster`` is one real server for the session, started
by ``ctxrt.pgcluster`` from the machine's PostgreSQL binaries; ``pg_url`` is a fresh database of
it per test. The tests that need a cluster of their own (stopping one, killing its owner) start
it in a temporary directory and wait on real process state, each with a bounded deadline.
"""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from ctxrt.testing import Cluster, ClusterError, temporary_cluster


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_until_gone(pid: int, path: Path, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while (alive(pid) or path.exists()) and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_row_committed_in_one_connection_is_read_back_in_another(pg_url: str) -> None:
    """Spec issue 15 (real parts): the fixture's database is a working server: a table created
    and a row committed through one connection are read back through a second one."""
    with psycopg.connect(pg_url) as writer:
        writer.execute("CREATE TABLE notes (id int PRIMARY KEY, body text NOT NULL)")
        writer.execute("INSERT INTO notes VALUES (%s, %s)", (1, "héllo"))
        writer.commit()
    with psycopg.connect(pg_url) as reader:
        assert reader.execute("SELECT id, body FROM notes").fetchall() == [(1, "héllo")]
        assert reader.execute("SELECT current_user").fetchone() == ("ctxrt",)


def test_two_fresh_databases_are_independent(pg_url: str, pg_cluster: Cluster) -> None:
    """Spec issue 15 (real parts): each ``pg_url`` is its own database: a table made in one
    doesn't exist in another made the same way."""
    second = pg_cluster.create_database("independent_b")
    with psycopg.connect(pg_url, autocommit=True) as a, psycopg.connect(second, autocommit=True) as b:
        a.execute("CREATE TABLE only_here (x int)")
        a.execute("INSERT INTO only_here VALUES (1)")
        names = a.execute("SELECT current_database()").fetchone(), b.execute("SELECT current_database()").fetchone()
        assert names[0] != names[1] and names[1] == ("independent_b",)
        assert b.execute("SELECT to_regclass('only_here')").fetchone() == (None,)
        assert a.execute("SELECT count(*) FROM only_here").fetchone() == (1,)


def test_each_test_gets_an_empty_database_of_its_own(pg_url: str, pg_cluster: Cluster) -> None:
    """Spec issue 15 (real parts): ``pg_url`` is a database no other test used: it has no tables,
    and it is not the cluster's maintenance database."""
    with psycopg.connect(pg_url) as conn:
        name = conn.execute("SELECT current_database()").fetchone()
        assert name is not None and name[0] not in ("postgres", "template0", "template1")
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone() == (0,)
    assert pg_url.startswith("postgresql://ctxrt@/") and f"host={pg_cluster.socket_dir}" in pg_url


def test_the_server_accepts_no_tcp_connection(pg_url: str, pg_cluster: Cluster) -> None:
    """Spec issue 15 (real parts): the cluster listens on no TCP address: nothing answers on its
    port over IPv4 or IPv6, libpq can't reach it over TCP, and the postmaster holds no TCP socket;
    the Unix socket is the only way in."""
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SHOW listen_addresses").fetchone() == ("",)
        assert conn.execute("SELECT inet_server_addr()").fetchone() == (None,)  # a Unix socket
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.settimeout(5)
            try:
                probe.connect((host, pg_cluster.port))
            except OSError as exc:
                assert exc.errno in (errno.ECONNREFUSED, errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT), exc
            else:
                pytest.fail(f"something answers on {host} port {pg_cluster.port}")
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(f"postgresql://ctxrt@127.0.0.1:{pg_cluster.port}/postgres", connect_timeout=5)
    pid = pg_cluster.pid
    assert pid is not None
    inodes = {os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1] for fd in os.listdir(f"/proc/{pid}/fd")
              if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:[")}
    assert inodes, "the postmaster should hold its Unix socket"
    tcp = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if os.path.exists(table):
            with open(table, encoding="ascii") as rows:
                tcp |= {row.split()[9] for row in list(rows)[1:]}
    assert inodes & tcp == set()


def test_commits_are_durable_by_default(pg_url: str) -> None:
    """Spec issue 15 (real parts): the throwaway cluster keeps PostgreSQL's durable defaults
    (the benches measure durable commits) and has room for 4 processes x 25 residents x 2
    connections plus the benches."""
    with psycopg.connect(pg_url) as conn:
        settings: dict[str, str] = dict(conn.execute(
            "SELECT name, setting FROM pg_settings WHERE name IN "
            "('fsync', 'synchronous_commit', 'full_page_writes', 'max_connections')").fetchall())
    assert settings == {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on",
                        "max_connections": "300"}


def test_a_stopped_cluster_leaves_no_server_and_no_directory() -> None:
    """Spec issue 15 (real parts): leaving ``temporary_cluster`` stops the server (its process
    is gone) and removes its directory; the settings argument reaches the server."""
    with temporary_cluster(settings={"synchronous_commit": "off"}) as cluster:
        with psycopg.connect(cluster.url()) as conn:
            assert conn.execute("SHOW synchronous_commit").fetchone() == ("off",)
        pid = cluster.pid
        assert pid is not None and alive(pid)
    assert not cluster.running
    assert not alive(pid)
    assert not cluster.directory.exists()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(cluster.url(), connect_timeout=5)


OWNER = """
import os, sys
from ctxrt.testing import temporary_cluster
with temporary_cluster() as cluster:
    print(cluster.pid, cluster.directory, flush=True)
    sys.stdin.read()
"""


def test_a_cluster_whose_owner_is_killed_is_stopped_all_the_same() -> None:
    """Spec issue 15 (real parts): no stray servers: when the process that started a cluster dies
    by SIGKILL (no atexit, no context manager exit), its server stops and its directory goes."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, env=env)
    try:
        assert owner.stdout is not None
        line = owner.stdout.readline().split()
        assert len(line) == 2, line
        pid, directory = int(line[0]), Path(line[1])
        assert alive(pid)
        owner.kill()
        owner.wait(timeout=10)
        wait_until_gone(pid, directory)
        assert not alive(pid)
        assert not directory.exists()
    finally:
        owner.kill()
        owner.wait(timeout=10)


def test_missing_binaries_are_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Spec issue 15 (real parts): without server binaries, starting a cluster fails with a
    ClusterError that names what was looked for and how to install it, never a skip."""
    monkeypatch.setenv("PG_BINDIR", str(tmp_path))
    with pytest.raises(ClusterError, match=r"(?s)initdb.*PG_BINDIR.*apt-get install postgresql"), \
            temporary_cluster():
        pass


def test_a_cluster_down_refuses_connections_and_comes_back_with_its_data(pg_cluster: Cluster, pg_url: str) -> None:
    """Spec issue 21 (real parts): ``down()`` stops the server (connections dropped, new ones
    refused) and starts it again with its data, on the same socket, even though its log holds
    the last run's FATAL lines (a client's refused connection)."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (n int)")
        conn.execute("INSERT INTO kept VALUES (7)")
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(pg_url.replace("/t", "/no_such_database_t", 1))  # FATAL in the server's log
    idle = psycopg.connect(pg_url, autocommit=True)
    with pg_cluster.down():
        assert not pg_cluster.running
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(pg_url, connect_timeout=5)
    assert pg_cluster.running
    with pytest.raises(psycopg.OperationalError):
        idle.execute("SELECT 1")  # dropped with the server
    idle.close()
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT n FROM kept").fetchall() == [(7,)]
