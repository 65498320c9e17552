"""A throwaway PostgreSQL cluster for tests and benches.

``temporary_cluster()`` (or ``start_cluster(directory)``) runs ``initdb`` and starts a server
whose data directory, Unix socket and log all live in one directory. It listens on no TCP
address at all (``listen_addresses = ''``), so it can't collide with a system cluster (Debian's
package starts one on port 5432) or be reached from the network; clients connect over the socket
with ``Cluster.url(dbname)``, a libpq URL. ``Cluster.create_database(name)`` gives each test a
fresh database in a few milliseconds. ``with cluster.down():`` is an outage: the server stopped
(its clients' connections dropped) with its data kept, and started again on leaving the block.

Authentication is ``trust`` and the bootstrap superuser is named ``ctxrt`` (``initdb -U``), so any
OS user that can reach the socket connects as ``ctxrt``: the cluster is for this machine's tests
only. Durability settings (``fsync``, ``synchronous_commit``) keep PostgreSQL's defaults unless
the caller's ``settings`` override them: the benches measure durable commits.

PostgreSQL refuses to run as root. When this process is root, ``initdb`` and ``pg_ctl`` run as
the ``postgres`` system user (the Debian package creates it), the cluster directory is given to
that user, and every directory above it must be searchable by it. That is why a temporary
cluster lives in a fresh ``/tmp/ctxrt-pg-*`` directory (mode 0755 under the world-searchable
``/tmp``) and not under pytest's ``tmp_path``: pytest's base ``/tmp/pytest-of-root`` is mode 0700.
``/tmp`` also keeps the socket path well under the 107-byte limit of a Unix socket's name.

``Cluster.replica()`` is a hot standby of a running cluster: ``pg_basebackup -R`` copies its data
directory (streaming the WAL written meanwhile) into a fresh directory and starts a server there
that streams the primary's WAL and answers read-only queries (``hot_standby``, with
``hot_standby_feedback`` so a long read isn't cancelled by the cleanup it would conflict with).
It has a socket and port of its own; ``Cluster.url(dbname)`` reaches the same databases as the
primary's, as of its replay.
``start_pooler(cluster)`` starts Debian's PgBouncer in front of a cluster (transaction mode by
default, its socket only, ``auth_type = trust``): ``Pooler.url(dbname)`` reaches the cluster's
``dbname`` through it. It runs as the server's user when root, and stops on the context's exit.

No stray servers: a running cluster is stopped by ``stop()``, by the context manager's exit, at
interpreter exit (``atexit``), and, if this process dies without any of those (SIGKILL, a
crash), by a small watchdog process that waits for this process's end on a pipe.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "SUPERUSER",
    "Cluster",
    "ClusterError",
    "Pooler",
    "find_binaries",
    "start_cluster",
    "start_pooler",
    "temporary_cluster",
]

SUPERUSER = "ctxrt"
"""The bootstrap superuser every connection uses (``initdb -U``)."""

SERVER_USER = "postgres"
"""The system user that runs the server when this process is root."""

REQUIRED = ("initdb", "pg_ctl", "postgres")  # and pg_basebackup for a replica (same package)

# A throwaway cluster's settings. Durability (fsync, synchronous_commit, full_page_writes) is left
# at PostgreSQL's defaults on purpose. max_connections: 4 processes x 25 residents x 2 connections
# plus the benches' own. shared_buffers is small: many clusters may share a 2-core, small machine.
DEFAULT_SETTINGS: dict[str, str] = {
    "listen_addresses": "",  # no TCP at all: the Unix socket is the only way in
    "max_connections": "300",
    "shared_buffers": "32MB",
    "TimeZone": "UTC",  # the same timestamps' text on every machine
    "log_line_prefix": "%m [%p] ",
}

START_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0
LOG_TAIL_LINES = 30
SOCKET_NAME_LIMIT = 107  # sun_path is 108 bytes with its NUL


class ClusterError(RuntimeError):
    """A cluster could not be found, created, started or stopped.

    ``command`` is the command that failed (empty when none ran), ``returncode`` its exit code
    (None when it didn't exit), and ``log_tail`` the last lines of its output and the server log.
    """

    def __init__(self, message: str, *, command: Sequence[str] = (), returncode: int | None = None,
                 log_tail: str = "") -> None:
        self.message = message
        self.command = tuple(command)
        self.returncode = returncode
        self.log_tail = log_tail
        parts = [message]
        if self.command:
            parts.append(f"command: {subprocess.list2cmdline(self.command)}")
        if returncode is not None:
            parts.append(f"exit code: {returncode}")
        if log_tail:
            parts.append("log tail:\n" + log_tail)
        super().__init__("\n".join(parts))


# A replica's own settings, over the primary's (pg_basebackup copies its postgresql.conf).
REPLICA_SETTINGS: dict[str, str] = {"hot_standby": "on", "hot_standby_feedback": "on"}


# --- finding the binaries ---------------------------------------------------------------------------


def _complete(directory: Path) -> bool:
    return all(os.access(directory / name, os.X_OK) and (directory / name).is_file() for name in REQUIRED)


def _version_key(bindir: Path) -> tuple[int, ...]:
    # /usr/lib/postgresql/<version>/bin: "15" sorts below "16", "9.6" below "10".
    return tuple(int(part) for part in re.findall(r"\d+", bindir.parent.name)) or (0,)


def find_binaries() -> Path | None:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres``, or None if there is none.

    In order: ``$PG_BINDIR`` (when set it is the only answer: an explicit choice isn't silently
    replaced), ``pg_config --bindir`` (Debian's libpq-dev answers even without a server, so the
    directory must really hold the server), ``initdb`` on ``PATH`` with its symlinks resolved
    (``/usr/local/bin/initdb`` may be a link into the real directory, beside which ``postgres``
    lives), then the newest ``/usr/lib/postgresql/*/bin``.
    """
    explicit = os.environ.get("PG_BINDIR")
    if explicit:
        path = Path(explicit).expanduser().resolve()
        return path if _complete(path) else None
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config is not None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, timeout=10,
                                 check=False)
            if out.returncode == 0 and out.stdout.strip():
                candidates.append(Path(out.stdout.strip()))
    initdb = shutil.which("initdb")
    if initdb is not None:
        candidates.append(Path(initdb).resolve().parent)
    candidates.extend(sorted((p.parent for p in Path("/usr/lib/postgresql").glob("*/bin/initdb")),
                             key=_version_key, reverse=True))
    for candidate in candidates:
        resolved = candidate.resolve()
        if _complete(resolved):
            return resolved
    return None


# --- running commands, as the server's user when root --------------------------------------------


class _RunFn(Protocol):
    def __call__(self, argv: list[str], *, cwd: Path, timeout: float) -> object: ...


class _Runner:
    """Runs the PostgreSQL tools as the right user, with PG* variables cleared."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.as_root = os.geteuid() == 0
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        self.uid: int | None = None
        self.gid: int | None = None
        if self.as_root:
            try:
                entry = pwd.getpwnam(SERVER_USER)
            except KeyError:
                raise ClusterError(
                    f"this process is root, PostgreSQL refuses to run as root, and there is no "
                    f"{SERVER_USER!r} system user to run it as (the Debian postgresql package makes one)"
                ) from None
            self.uid, self.gid = entry.pw_uid, entry.pw_gid
            env.update(HOME=entry.pw_dir, USER=SERVER_USER, LOGNAME=SERVER_USER)
        self.env = env

    def command(self, tool: str, *args: str) -> list[str]:
        return [str(self.bindir / tool), *args]

    def run(self, argv: list[str], *, cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                argv, cwd=cwd, env=self.env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                timeout=timeout, check=False,
                user=self.uid, group=self.gid, extra_groups=[] if self.as_root else None,
            )
        except subprocess.TimeoutExpired as exc:
            raise ClusterError(f"{Path(argv[0]).name} did not finish in {timeout:g} s", command=argv,
                               log_tail=_text(exc.stdout) + _text(exc.stderr)) from None
        except OSError as exc:
            raise ClusterError(f"could not run {argv[0]}: {exc}", command=argv) from None

    def give(self, path: Path) -> None:
        """Make ``path`` (a directory this process just made) the server user's."""
        if self.uid is not None and self.gid is not None:
            os.chown(path, self.uid, self.gid)


def _text(data: str | bytes | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def _tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _free_port() -> int:
    # The server binds no TCP port; the number only names its socket file (.s.PGSQL.<port>).
    # A number no TCP listener holds right now means a TCP probe of it can't reach some other
    # server (a system cluster on 5432), so "nothing answers on TCP" is a meaningful check.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _quote_setting(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


# --- the cluster ---------------------------------------------------------------------------------------


_LIVE: set[Cluster] = set()
_LIVE_LOCK = threading.Lock()


def _stop_all_at_exit() -> None:
    with _LIVE_LOCK:
        clusters = list(_LIVE)
    for cluster in clusters:
        with contextlib.suppress(Exception):
            cluster.stop()


atexit.register(_stop_all_at_exit)


class Cluster:
    """A running throwaway cluster. Make one with ``start_cluster`` or ``temporary_cluster``.

    Layout inside ``directory``: ``data/`` (the data directory), ``socket/`` (the Unix socket),
    ``server.log``.
    """

    def __init__(self, directory: Path, *, bindir: Path, settings: Mapping[str, str],
                 remove_directory: bool = False) -> None:
        self.directory = directory
        self.bindir = bindir
        self.data_dir = directory / "data"
        self.socket_dir = directory / "socket"
        self.log_path = directory / "server.log"
        self.settings = dict(settings)
        self.port = int(self.settings["port"])
        self._runner = _Runner(bindir)
        self._remove_directory = remove_directory
        self._admin: psycopg.Connection[tuple[object, ...]] | None = None
        self._lock = threading.Lock()
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._running = False
        self.primary: Cluster | None = None  # the cluster this one streams from (a replica)
        self.start_seconds = 0.0
        self.stop_seconds = 0.0

    def __repr__(self) -> str:
        return f"<Cluster {self.directory} port={self.port} {'running' if self._running else 'stopped'}>"

    # -- lifecycle --

    def _start(self, primary: Cluster | None = None) -> None:
        """initdb and start; or, given a running ``primary``, copy it with pg_basebackup -R and
        start the copy as its hot standby."""
        began = time.perf_counter()
        runner = self._runner
        socket_name = self.socket_dir / f".s.PGSQL.{self.port}"
        if len(os.fsencode(socket_name)) > SOCKET_NAME_LIMIT:
            raise ClusterError(f"the socket path {socket_name} is longer than a Unix socket allows "
                               f"({SOCKET_NAME_LIMIT} bytes): use a shorter directory")
        self.directory.mkdir(parents=True, exist_ok=True)
        if (self.data_dir / "PG_VERSION").exists():
            raise ClusterError(f"{self.data_dir} already holds a cluster: give an empty directory")
        self.socket_dir.mkdir(exist_ok=True)
        for path in (self.directory, self.socket_dir):
            path.chmod(0o755)
            runner.give(path)
        if runner.as_root:
            probe = runner.run(["test", "-w", str(self.directory), "-a", "-x", str(self.directory)],
                               cwd=Path("/"), timeout=10)
            if probe.returncode != 0:
                raise ClusterError(
                    f"the {SERVER_USER!r} user can't reach {self.directory}: a directory above it "
                    f"isn't searchable by that user (pytest's /tmp/pytest-of-root is mode 0700); "
                    f"use temporary_cluster() or a directory under /tmp")

        if primary is None:
            # --no-sync: initdb's files aren't flushed (a throwaway cluster needn't survive a power
            # cut); it saves a few hundred ms and changes nothing about later commits, which fsync.
            create = runner.command(
                "initdb", "-D", str(self.data_dir), "-U", SUPERUSER, "--auth=trust", "--encoding=UTF8",
                "--locale=C", "--no-sync", "--no-instructions")
        else:
            # -R: standby.signal and primary_conninfo (the primary's socket); -X stream: the WAL
            # written during the copy comes along (initdb's pg_hba trusts local replication).
            # --checkpoint=fast: don't wait for the primary's next spread checkpoint.
            create = runner.command(
                "pg_basebackup", "-D", str(self.data_dir), "-R", "-X", "stream", "--checkpoint=fast",
                "--no-sync", "-h", str(primary.socket_dir), "-p", str(primary.port), "-U", SUPERUSER)
            self.primary = primary
        done = runner.run(create, cwd=self.directory, timeout=120)
        if done.returncode != 0:
            raise ClusterError(f"{Path(create[0]).name} failed", command=create, returncode=done.returncode,
                               log_tail=_tail(done.stdout + done.stderr))
        # Settings go in postgresql.conf (later lines win) rather than on pg_ctl's -o, which pg_ctl
        # hands to a shell: no quoting trouble with paths or values.
        with (self.data_dir / "postgresql.conf").open("a", encoding="utf-8") as conf:
            conf.write("\n# ctxrt.pgcluster: a throwaway cluster\n")
            for key, value in self.settings.items():
                conf.write(f"{key} = {_quote_setting(value)}\n")
        self._launch()
        self.start_seconds = time.perf_counter() - began

    def _launch(self) -> None:
        """Start the server on its data directory and wait until it is ready."""
        runner = self._runner
        try:  # a restart's log already holds the last run's lines (its FATALs too)
            logged = self.log_path.stat().st_size
        except OSError:
            logged = 0
        self._start_watchdog()
        with _LIVE_LOCK:
            _LIVE.add(self)
        self._running = True
        # -W: don't let pg_ctl wait: it polls every 100 ms; _wait_ready polls postmaster.pid often.
        start = runner.command("pg_ctl", "start", "-D", str(self.data_dir), "-l", str(self.log_path), "-W")
        done = runner.run(start, cwd=self.directory, timeout=START_TIMEOUT)
        if done.returncode != 0:
            self._fail_start("pg_ctl start failed", start, done.returncode, done.stdout + done.stderr)
        self._wait_ready(start, logged)

    def _fail_start(self, message: str, command: Sequence[str], returncode: int | None, output: str) -> None:
        log = self._log_tail()
        with contextlib.suppress(Exception):
            self.stop()
        raise ClusterError(message, command=command, returncode=returncode,
                           log_tail="\n".join(filter(None, [_tail(output), log])))

    def _log_tail(self, since: int = 0) -> str:
        """The log's last lines, of what it got after byte ``since``."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(since)
                return _tail(log.read().decode(errors="replace"))
        except OSError:
            return ""

    def _postmaster_status(self) -> tuple[int | None, str]:
        """The postmaster's pid and status from postmaster.pid ("" when absent or not yet written)."""
        try:
            lines = (self.data_dir / "postmaster.pid").read_text().splitlines()
        except OSError:
            return None, ""
        pid = int(lines[0]) if lines and lines[0].strip().isdigit() else None
        return pid, lines[7].strip() if len(lines) > 7 else ""

    def _wait_ready(self, command: Sequence[str], logged: int) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        polls = 0
        while time.monotonic() < deadline:
            pid, status = self._postmaster_status()
            if status in ("ready", "standby"):  # "standby": a hot standby accepting reads
                return
            if pid is not None and not _alive(pid):
                break
            # Before postmaster.pid exists only the log tells of a failed start (a bad setting).
            polls += 1
            if pid is None and polls % 25 == 0 and "FATAL" in self._log_tail(logged):
                break
            time.sleep(0.002)
        else:
            self._fail_start(f"the server was not ready within {START_TIMEOUT:g} s", command, None, "")
        self._fail_start("the server exited during startup", command, None, "")

    def _start_watchdog(self) -> None:
        # A child that waits for EOF on its stdin: the write end is only ours (subprocess pipes are
        # close-on-exec), so EOF without a "stopped" line means this process died without stopping
        # the cluster; the watchdog then stops it. Its own session: a terminal's Ctrl-C doesn't reach it.
        spec = json.dumps({
            "stop": self._stop_command("immediate"), "data_dir": str(self.data_dir),
            "uid": self._runner.uid, "gid": self._runner.gid, "env": self._runner.env,
            "remove": str(self.directory) if self._remove_directory else None,
        })
        self._watchdog = subprocess.Popen(
            [sys.executable, "-I", os.path.abspath(__file__), "--watchdog"], stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            cwd="/",
        )
        assert self._watchdog.stdin is not None
        self._watchdog.stdin.write(spec.encode() + b"\n")
        self._watchdog.stdin.flush()

    def _stop_command(self, mode: str) -> list[str]:
        return self._runner.command("pg_ctl", "stop", "-D", str(self.data_dir), "-m", mode, "-W")

    def stop(self) -> None:
        """Stop the server (fast shutdown; SIGQUIT, then SIGKILL if it hangs). Idempotent. A
        cluster whose directory goes with it stops at once, skipping the shutdown checkpoint: its
        data is about to be deleted (a session's hundreds of test databases took 10-30 s to flush)."""
        with self._lock:
            if not self._running:
                return
            began = time.perf_counter()
            try:
                self._halt("immediate" if self._remove_directory else "fast")
            finally:
                if self._remove_directory:
                    shutil.rmtree(self.directory, ignore_errors=True)
            self.stop_seconds = time.perf_counter() - began

    @contextlib.contextmanager
    def down(self) -> Iterator[None]:
        """An outage: the server stops (fast shutdown: every client's connection is dropped, and a
        new one is refused) with its data kept, and starts again when the block exits, on the same
        socket and port. For tests of clients that must survive a restart."""
        with self._lock:
            if not self._running:
                raise ClusterError("the cluster is not running")
            self._halt("fast")
        try:
            yield
        finally:
            self._launch()  # unlocked: a failed start stops the cluster (``stop`` takes the lock)

    def _halt(self, mode: str) -> None:
        """Stop the server (pg_ctl's shutdown ``mode``) and its watchdog, keeping the data
        directory. Call with ``_lock`` held."""
        if self._admin is not None:
            with contextlib.suppress(Exception):
                self._admin.close()
            self._admin = None
        try:
            _stop_server(self.data_dir, self._stop_command(mode), self._runner.run, cwd=self.directory)
        finally:
            self._running = False
            with _LIVE_LOCK:
                _LIVE.discard(self)
            if self._watchdog is not None:
                with contextlib.suppress(OSError):
                    assert self._watchdog.stdin is not None
                    self._watchdog.stdin.write(b"stopped\n")
                    self._watchdog.stdin.close()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._watchdog.wait(timeout=10)
                self._watchdog = None

    @property
    def running(self) -> bool:
        return self._running

    @property
    def pid(self) -> int | None:
        """The postmaster's process id while it runs."""
        return self._postmaster_status()[0] if self._running else None

    # -- clients --

    def url(self, dbname: str = "postgres") -> str:
        """A libpq URL for ``dbname`` over this cluster's socket, as the ``ctxrt`` superuser."""
        return (f"postgresql://{SUPERUSER}@/{quote(dbname, safe='')}"
                f"?host={quote(str(self.socket_dir), safe='/')}&port={self.port}")

    def create_database(self, name: str) -> str:
        """Create the empty database ``name`` (at most 63 bytes) and return its URL."""
        from psycopg import sql

        if not 0 < len(name.encode()) <= 63:  # PostgreSQL would silently truncate a longer name
            raise ValueError(f"a database name is 1 to 63 bytes, not {len(name.encode())}: {name!r}")

        with self._lock:
            if not self._running:
                raise ClusterError("the cluster is not running")
            admin = self._admin_connection()
            # STRATEGY wal_log (PostgreSQL 15's default) copies the template through WAL; measured
            # here it took ~20 ms against file_copy's ~45 ms (file_copy forces two checkpoints,
            # which fsync, and their cost grows with whatever else the cluster has dirtied).
            # template0: nothing a test did to template1 leaks into its database.
            admin.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0 STRATEGY wal_log")
                          .format(sql.Identifier(name)))
        return self.url(name)

    @contextlib.contextmanager
    def replica(self, *, settings: Mapping[str, str] | None = None) -> Iterator[Cluster]:
        """A hot standby of this running cluster (``pg_basebackup -R``, streaming replication) in a
        fresh ``/tmp/ctxrt-pg-*`` directory, stopped and removed on exit. ``settings`` go over
        ``REPLICA_SETTINGS``. Raises ClusterError when the copy or the start fails."""
        if not self._running:
            raise ClusterError("the cluster is not running")
        merged = {**REPLICA_SETTINGS, **(settings or {})}
        with _temporary(merged, self.bindir, self) as replica:
            yield replica

    def replayed(self, timeout: float = START_TIMEOUT) -> None:
        """Wait until this replica has replayed everything its primary (or upstream standby) had
        before the call (by polling ``pg_last_wal_replay_lsn``). Raises ClusterError if it hasn't within ``timeout``."""
        import psycopg

        if self.primary is None:
            raise ClusterError(f"{self!r} is not a replica")
        with psycopg.connect(self.primary.url(), autocommit=True) as primary, \
                psycopg.connect(self.url(), autocommit=True) as standby:
            # A cascading replica's upstream is a standby: what it has replayed is what it has.
            row = primary.execute("SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() END").fetchone()
            target = str(row[0]) if row and row[0] is not None else replay_target(primary)
            deadline = time.monotonic() + timeout
            while not (standby.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,))
                       .fetchone() or (False,))[0]:
                if time.monotonic() > deadline:
                    raise ClusterError(f"the replica did not replay its primary's WAL within {timeout:g} s",
                                       log_tail=self._log_tail())
                time.sleep(0.002)

    def promote(self) -> None:
        """Make this replica a primary (``pg_ctl promote``, waiting until it takes writes): it stops
        streaming from its primary, for good. Raises ClusterError if it isn't a replica or fails."""
        if self.primary is None:
            raise ClusterError(f"{self!r} is not a replica")
        command = self._runner.command("pg_ctl", "promote", "-D", str(self.data_dir), "-w")
        done = self._runner.run(command, cwd=self.directory, timeout=START_TIMEOUT)
        if done.returncode != 0:
            raise ClusterError("pg_ctl promote failed", command=command, returncode=done.returncode,
                               log_tail="\n".join(filter(None, [_tail(done.stdout + done.stderr), self._log_tail()])))
        self.primary = None

    def _admin_connection(self) -> psycopg.Connection[tuple[object, ...]]:
        import psycopg

        if self._admin is None or self._admin.closed:
            self._admin = psycopg.connect(self.url("postgres"), autocommit=True)
        return self._admin


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (our own unreaped child) counts as gone.
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _read_pid(data_dir: Path) -> int | None:
    try:
        first = (data_dir / "postmaster.pid").read_text().split("\n", 1)[0].strip()
    except OSError:
        return None
    return int(first) if first.isdigit() else None


def _stop_server(data_dir: Path, command: list[str], run: _RunFn, *, cwd: Path) -> None:
    """pg_ctl stop without its 100 ms polling, then SIGQUIT and SIGKILL if the server hangs."""
    pid = _read_pid(data_dir)
    if pid is None or not _alive(pid):
        return
    with contextlib.suppress(ClusterError, subprocess.SubprocessError, OSError):
        run(command, cwd=cwd, timeout=STOP_TIMEOUT)
    for sig, wait in ((None, STOP_TIMEOUT), (signal.SIGQUIT, 5.0), (signal.SIGKILL, 5.0)):
        if sig is not None:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not _alive(pid):
                return
            time.sleep(0.002)


def _settings(settings: Mapping[str, str] | None, socket_dir: Path) -> dict[str, str]:
    merged = dict(DEFAULT_SETTINGS)
    merged["unix_socket_directories"] = str(socket_dir)
    merged.update(settings or {})
    merged.setdefault("port", str(_free_port()))
    return merged


@contextlib.contextmanager
def start_cluster(directory: Path, *, settings: Mapping[str, str] | None = None,
                  bindir: Path | None = None) -> Iterator[Cluster]:
    """Create and start a cluster in ``directory`` (made if missing; must not hold one already);
    stop it on exit. The files stay: the caller owns ``directory``.

    ``settings`` are postgresql.conf settings over ``DEFAULT_SETTINGS`` (e.g. ``{"fsync": "off"}``).
    When root, every directory above ``directory`` must be searchable by the ``postgres`` user.
    Raises ClusterError when the binaries are missing or the server won't start.
    """
    with _started(Path(directory).absolute(), settings, bindir, remove=False) as cluster:
        yield cluster


@contextlib.contextmanager
def temporary_cluster(*, settings: Mapping[str, str] | None = None,
                      bindir: Path | None = None) -> Iterator[Cluster]:
    """``start_cluster`` in a fresh ``/tmp/ctxrt-pg-*`` directory (mode 0755, reachable by the
    ``postgres`` user when root), removed when the cluster stops."""
    with _temporary(settings, bindir, None) as cluster:
        yield cluster


@contextlib.contextmanager
def _temporary(settings: Mapping[str, str] | None, bindir: Path | None,
               primary: Cluster | None) -> Iterator[Cluster]:
    base = Path("/tmp") if Path("/tmp").is_dir() else Path(tempfile.gettempdir())
    directory = Path(tempfile.mkdtemp(prefix="ctxrt-pg-", dir=base))
    try:
        with _started(directory, settings, bindir, remove=True, primary=primary) as cluster:
            yield cluster
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def _started(directory: Path, settings: Mapping[str, str] | None, bindir: Path | None, *,
             remove: bool, primary: Cluster | None = None) -> Iterator[Cluster]:
    if bindir is None:
        bindir = find_binaries()
    if bindir is None:
        where = (f"$PG_BINDIR={os.environ['PG_BINDIR']} lacks one of {', '.join(REQUIRED)}"
                 if os.environ.get("PG_BINDIR") else
                 "not in $PG_BINDIR, pg_config --bindir, PATH or /usr/lib/postgresql/*/bin")
        raise ClusterError(f"PostgreSQL's server binaries ({', '.join(REQUIRED)}) were not found: {where}. "
                           f"Install them (Debian: apt-get install postgresql; `make` does it) "
                           f"or set PG_BINDIR")
    cluster = Cluster(directory, bindir=bindir, settings=_settings(settings, directory / "socket"),
                      remove_directory=remove)
    try:
        cluster._start(primary)
        yield cluster
    finally:
        cluster.stop()


# --- the watchdog (run as a script: python -I pgcluster.py --watchdog) -----------------------------


def _watchdog_main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    spec = json.loads(sys.stdin.readline())
    rest = sys.stdin.read()  # until the parent writes "stopped" and closes, or dies
    if "stopped" in rest:
        return
    uid, gid = spec["uid"], spec["gid"]
    env: dict[str, str] = spec["env"]

    def run(argv: list[str], *, cwd: Path, timeout: float) -> object:
        return subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=timeout, check=False, user=uid, group=gid,
                              extra_groups=[] if uid is not None else None)

    try:
        _stop_server(Path(spec["data_dir"]), spec["stop"], run, cwd=Path("/"))
    finally:
        if spec["remove"]:
            shutil.rmtree(spec["remove"], ignore_errors=True)


# --- a pooler in front (PgBouncer) ---------------------------------------------------------------

PGBOUNCER = "/usr/sbin/pgbouncer"  # Debian's package (`make test` installs it)


class Pooler:
    """A PgBouncer in front of a cluster: ``url(dbname)`` reaches the cluster's ``dbname`` through
    it. In transaction mode (the default) each transaction gets whichever server connection is
    free: what a session set up (a ``SET``, a session advisory lock) stays on that server
    connection, not with the client."""

    def __init__(self, cluster: Cluster, directory: Path, port: int, process: subprocess.Popen[bytes]) -> None:
        self.cluster = cluster
        self.directory = directory
        self.port = port
        self.process = process
        self.log_path = directory / "pgbouncer.log"

    def url(self, dbname: str = "postgres") -> str:
        return (f"postgresql://{SUPERUSER}@/{quote(dbname, safe='')}"
                f"?host={quote(str(self.directory), safe='/')}&port={self.port}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()  # SIGTERM: PgBouncer closes its connections and exits at once
            try:
                self.process.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@contextlib.contextmanager
def start_pooler(cluster: Cluster, *, pool_mode: str = "transaction", pool_size: int = 20) -> Iterator[Pooler]:
    """Start PgBouncer in front of ``cluster`` (its socket only, no TCP; ``auth_type = trust``), its
    configuration, socket and log in a directory of the cluster's; stop it on exit. Debian's 1.18
    knows no protocol-level prepared statements (the engine's writer uses none). Runs as the
    server's user when root (PgBouncer refuses root too). Raises ClusterError if it isn't
    installed or doesn't start."""
    if not os.access(PGBOUNCER, os.X_OK):
        raise ClusterError(f"{PGBOUNCER} isn't installed (Debian: apt-get install pgbouncer; `make test` does it)")
    directory = Path(tempfile.mkdtemp(prefix="pooler-", dir=cluster.directory))
    directory.chmod(0o755)
    runner = cluster._runner
    runner.give(directory)
    port = _free_port()
    (directory / "users.txt").write_text(f'"{SUPERUSER}" ""\n')
    (directory / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={cluster.socket_dir} port={cluster.port}\n"
        "[pgbouncer]\n"
        "listen_addr =\n"
        f"listen_port = {port}\n"
        f"unix_socket_dir = {directory}\n"
        "auth_type = trust\n"
        f"auth_file = {directory / 'users.txt'}\n"
        f"pool_mode = {pool_mode}\n"
        f"default_pool_size = {pool_size}\n"
        "max_client_conn = 500\n"
        f"logfile = {directory / 'pgbouncer.log'}\n"
        "log_connections = 0\nlog_disconnections = 0\n"
    )
    for name in ("users.txt", "pgbouncer.ini"):
        runner.give(directory / name)
    command = [PGBOUNCER, str(directory / "pgbouncer.ini")]
    # In the child before its exec: SIGTERM it when this process dies (PR_SET_PDEATHSIG), so a
    # SIGKILLed run leaves no pooler (the cluster's watchdog stops the server). Looked up here: the
    # child between fork and exec imports nothing.
    prctl = ctypes.CDLL(None).prctl
    process = subprocess.Popen(command, cwd=directory, env=runner.env, preexec_fn=lambda: prctl(1, signal.SIGTERM),
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               user=runner.uid, group=runner.gid, extra_groups=[] if runner.as_root else None)
    pooler = Pooler(cluster, directory, port, process)
    try:
        socket_path = directory / f".s.PGSQL.{port}"
        deadline = time.monotonic() + START_TIMEOUT
        while not socket_path.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                log = (directory / "pgbouncer.log")
                raise ClusterError("pgbouncer didn't start", command=command, returncode=process.poll(), log_tail=_tail(log.read_text()) if log.exists() else "")
            time.sleep(0.01)
        yield pooler
    finally:
        pooler.stop()


if __name__ == "__main__" and sys.argv[1:] == ["--watchdog"]:
    _watchdog_main()


_INSERT_POSITION = ("SELECT pg_current_wal_insert_lsn(), current_setting('wal_block_size'),"
                    " (SELECT setting FROM pg_settings WHERE name = 'wal_segment_size')")
# A WAL page's header (SizeOfXLogShortPHD), and the longer one a segment's first page has.
_PAGE_HEADER, _LONG_PAGE_HEADER = 24, 40


def replay_target(primary: psycopg.Connection[Any]) -> str:
    """The WAL position a standby of ``primary`` has replayed up to once it has every record the
    primary had inserted now. That is the insert position, except just past a page's header: the
    last record then ended at the page's end, which is where a standby's replay stops (no record
    ends past that header until the primary writes again, which an idle one may not for 15 s)."""
    row = primary.execute(_INSERT_POSITION).fetchone()
    assert row is not None
    high, low = str(row[0]).split("/")
    position, block, segment = (int(high, 16) << 32) | int(low, 16), int(row[1]), int(row[2])
    if position % segment == _LONG_PAGE_HEADER:  # a segment's first page has the long header
        position -= _LONG_PAGE_HEADER
    elif position % block == _PAGE_HEADER and position % segment > block:
        position -= _PAGE_HEADER
    return f"{position >> 32:X}/{position & 0xFFFFFFFF:X}"
