"""The sync PostgreSQL engine: the LMDB engine's model (global sequence, lineage branches,
versioned items and heads, blobs by SHA-256) in tables, for a store many processes write.

Design (docs/architecture.md, Beyond one machine):

- One global sequence, a database sequence (``ctxrt_sequence``), and no global write lock:
  writers of every process commit in parallel (their WAL flushes shared by the server's group
  commit). What keeps the LMDB engine's orders true (docs/guarantees.md, Ordering):

  * a slot (a state on a branch) is written under a transaction advisory lock of its own, taken
    before its head is read, and the sequences a batch writes there are drawn from the database
    sequence only after that lock was granted: along a slot, sequence order is commit order, so
    "as of the slot's revision T" is a consistent snapshot and reads need no transaction;
  * every write transaction holds the store's catalog lock shared; one that makes or deletes a
    branch or registers a state takes it exclusive, so it runs with no other write in flight:
    a fork's point (the sequence's last value then) has every write at or below it committed,
    and the branch and state tables change only there;
  * ``last_sequence`` is a visibility horizon: the sequence's last value, once every write
    transaction in flight when it was read has ended (nothing at or below it appears later). Each
    write transaction holds a lock of its own connection (its backend's key) from before the
    catalog lock: the horizon waits on those locks of the catalog lock's holders, woken when each
    ends (no polling).
- A batch is one transaction (each process's store actor still group-commits); each command
  that isn't an append runs under a savepoint, so a refused one leaves the others intact (what
  LMDB's nested transactions give). Rows are buffered and sent with ``executemany`` (pipelined)
  before the next read and at the commit.
- Whatever other processes did is found at the start of each batch: a catalog counter other
  than the last this process saw means the branch and state tables are read again; heads are
  never cached between batches (another process may move any slot's). Conditional writes (a
  namespace's claim) and rising floors are decided inside the transaction, under the value's
  slot lock (``Batch.set_value``), so the audience rules hold across processes.
- A remembering namespace's lease is a row (``ctxrt_leases``, K12): a holder, an expiry renewed on
  a thread of the engine's own, and a fencing token each take raises; a batch writing under a
  lease checks it among its first statements (``_Fence``: no round trip of its own). Nothing lives
  in a session (the writer's settings are per transaction; server-side prepared statements only
  on a direct connection), so a transaction-mode pooler in front works (K13).
- Reads run on the caller's thread, one statement each on a connection of their own; batches
  run on a commit thread of their own (``committer``: a ``ThreadCommitter``) on the writing connection.
- A hot standby (a server in recovery: ``pg_is_in_recovery()``) is opened read-only or refused.
  Its ``last_sequence`` can't be found on it (its ``pg_locks`` doesn't show the primary's writes
  in flight, and its sequence reads ahead): the primary's horizon is asked of the primary, with
  the primary's WAL insert position after it, and given once the standby has replayed up to
  that position (docs/guarantees.md, Reads from a standby).

Driver: psycopg 3 (its C implementation, ``psycopg[binary]``): the maintained libpq binding,
with pipelined ``executemany``, binary ``bytea`` and server-side prepared statements (for reads, and
a batch of appends).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import secrets
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import psycopg
import psycopg.conninfo
import psycopg.errors
import trio
from psycopg.pq import TransactionStatus

from ..errors import (
    BranchNotFoundError,
    ConfigConflictError,
    CtxrtError,
    MalformedContentError,
    ReadOnlyStoreError,
    StoreCorruptError,
    StoreFormatError,
    StoreFullError,
    StoreUnavailableError,
    StoreUnsupportedError,
)
from ..pgcluster import replay_target
from .apply import MISTAKES, UNDECODABLE, Unsafe, damaged_record, run_commands
from .batch import Batch, Counter
from .catalog import Catalog, log_state, value_state
from .committer import Committer, ThreadCommitter
from .protocol import AppendItem, Atomically, CreateBranch, DeleteBranch, EditItem, RegisterState, RemoveItems, SetValue
from .records import (
    MAIN_BRANCH,
    BranchRow,
    Item,
    LogHead,
    Operation,
    StateInfo,
    index_marker,
    index_state,
)
from .urls import redact

logger = logging.getLogger("ctxrt.store")
_R = TypeVar("_R")

# 3: leases are rows (ctxrt_leases); 2: the sequence is a database sequence (1: a ctxrt_meta row
# under a lock). A schema-1 or -2 store is read as it is; a writer's open moves it to 3.
SCHEMA_VERSION = 3
READABLE_SCHEMAS = (1, 2, 3)
DEADLOCK_RETRIES = 5  # a batch the server broke a lock cycle in is run again (nothing was written)
CONNECT_TIMEOUT_S = 10
STATEMENT_TIMEOUT_MS = 30_000  # per statement, and per wait for a lock (another process's write)
REPLAY_POLL_S = 0.001  # how often a standby's ``last_sequence`` looks whether it replayed far enough
# A writer's transaction left idle this long (its process stopped or stalled mid-batch) is ended by
# the server: it holds the catalog lock, so until then ``last_sequence`` waits, and a fork waits
# with every other write queued behind it. Well under STATEMENT_TIMEOUT_MS, so those wait, not fail.
IDLE_IN_TRANSACTION_MS = 10_000
# A lease lasts this long unrenewed (its holder renews it every third of it): a holder killed or
# cut off may be taken over this long after its last renewal, and its writes are refused from the
# take on (the fencing token). One that lapsed with nobody taking it is still its holder's.
LEASE_MS = 10_000
# At the close, a lease statement the server hasn't answered in this long is cut (a stalled pooler,
# or a server down behind one, where PgBouncer queues it for 120 s): the leases lapse instead.
LEASE_CLOSE_S = 1.0
# A take or give-back unanswered this long is cut (StoreUnavailableError), as is a renewal unanswered
# for a lease's length: a pooler gone silent (a host vanished, no RST) never answers, and the
# renewer, stuck, kept the lease lock every later take and give-back of the loop waited for.
LEASE_STATEMENT_S = STATEMENT_TIMEOUT_MS / 1000
# At the runtime's close, a batch the server hasn't answered in this long (a stalled server or
# pooler, a server down behind one) is cut, and any later one refused: the close returns, and the
# batch's fate is the server's (a COMMIT it never read rolls back). As long as a healthy server may
# take for a statement or a lock wait, so a batch it would answer is never cut.
CLOSE_BATCH_S = STATEMENT_TIMEOUT_MS / 1000  # closed for a Ctrl-C: LEASE_CLOSE_S (its host wants out)
# A read the server hasn't answered in this long is cut (StoreUnavailableError): reads run on the
# trio thread, so a stalled server (or one down behind a pooler, which queues the read for its
# query_wait_timeout, 120 s) held every task of the loop for as long. Past the reader session's own
# statement and lock bounds, so a healthy server always answers first (with its error).
READ_CUT_S = STATEMENT_TIMEOUT_MS / 1000 + 5
# Likewise a write batch the server hasn't answered in this long while the runtime runs: its
# caller gets StoreUnavailableError (whether it committed is unknown once its rows may have gone
# out), the next batch reconnects. A caller the runtime shields (a fork, an append carrying request
# records) waited for ever on a stalled server, and so did the host's block around it, and the close
# and the Ctrl-C after it (the close's bound is armed only once the block ends).
BATCH_CUT_S = READ_CUT_S
WATCH_S = 1.0  # how often the watchdog looks at the read out
PREPARE_THRESHOLD = 2  # a writer's statement is prepared at its second use in a batch of appends
CURRENT = (1 << 63) - 1  # the version of a log's current head row (past every sequence)
_DAMAGE = (*UNDECODABLE, ValueError, KeyError, TypeError, IndexError)
# A server session out of step with the driver's cache of prepared statement names (K16).
_FORGOTTEN = (psycopg.errors.InvalidSqlStatementName, psycopg.errors.DuplicatePreparedStatement)

# A namespace's lease (K12): who holds it (an engine's random id) until when (the server's clock),
# and the fencing token, raised by every take, that each write under the lease checks.
_LEASES_TABLE = ("CREATE TABLE ctxrt_leases (branch integer NOT NULL, name text NOT NULL, holder text NOT NULL,"
                 " token bigint NOT NULL, expires timestamptz NOT NULL, PRIMARY KEY (branch, name))")

_SCHEMA = """
CREATE TABLE ctxrt_meta (key text PRIMARY KEY, value bigint NOT NULL);
CREATE TABLE ctxrt_branches (id integer PRIMARY KEY, name text NOT NULL, deleted boolean NOT NULL, row bytea NOT NULL);
CREATE UNIQUE INDEX ctxrt_branch_names ON ctxrt_branches (name) WHERE NOT deleted;
CREATE TABLE ctxrt_states (name text PRIMARY KEY, number integer NOT NULL UNIQUE, kind text NOT NULL);
CREATE TABLE ctxrt_items (
    state integer NOT NULL, branch integer NOT NULL, ordinal bigint NOT NULL, version bigint NOT NULL,
    sequence bigint NOT NULL, data bytea NOT NULL, PRIMARY KEY (state, branch, ordinal, version));
CREATE UNIQUE INDEX ctxrt_items_appended ON ctxrt_items (state, sequence) WHERE version = sequence;
CREATE TABLE ctxrt_heads (
    state integer NOT NULL, branch integer NOT NULL, version bigint NOT NULL, revision bigint NOT NULL,
    head bytea NOT NULL, PRIMARY KEY (state, branch, version));
CREATE TABLE ctxrt_values (
    state integer NOT NULL, branch integer NOT NULL, version bigint NOT NULL, data bytea NOT NULL,
    PRIMARY KEY (state, branch, version));
CREATE INDEX ctxrt_values_by_branch ON ctxrt_values (branch, version);
CREATE TABLE ctxrt_blobs (sha256 bytea PRIMARY KEY, media_type text NOT NULL, data bytea NOT NULL);
CREATE SEQUENCE ctxrt_sequence;
""" + "\n" + _LEASES_TABLE + ";\n"


class PostgresEngine(Catalog):
    """One PostgreSQL database's ctxrt data. Reads from the trio thread; writes only through ``apply``
    (on one thread at a time)."""

    shared = True  # other processes write it too: caches check the head before a read

    def __init__(self, url: str, *, synchronous: bool = True, create: bool = True,
                 idle_in_transaction_ms: int = IDLE_IN_TRANSACTION_MS, lease_ms: int | None = None,
                 connect_timeout_s: int = CONNECT_TIMEOUT_S, lease_statement_s: float = LEASE_STATEMENT_S,
                 statement_timeout_ms: int = STATEMENT_TIMEOUT_MS, close_batch_s: float | None = None) -> None:
        super().__init__()
        self.url = url
        self._statement_ms = statement_timeout_ms  # the bound of a statement and of a lock wait
        self._connect_timeout_s = connect_timeout_s
        self._lease_statement_s = lease_statement_s  # how long a take or give-back waits for its answer
        self._idle_ms = idle_in_transaction_ms  # how long the server lets a stalled batch hold its locks
        self._lease_ms = LEASE_MS if lease_ms is None else lease_ms  # the module's, as it is at the open
        self._close_batch_s = CLOSE_BATCH_S if close_batch_s is None else close_batch_s  # likewise
        self._cut_off = False  # the close cut a batch the server didn't answer: no later one is sent
        self._batch_cut_s = BATCH_CUT_S  # likewise
        self._cut_now = False  # the batch out was cut (``_cut_writer``) while the runtime ran
        self._answered = 0.0  # when the server last answered the batch out (monotonic)
        self.data_path = redact(url)
        self._synchronous = synchronous
        # The read connection, used by one thread at a time, and since when the read out waits.
        self._lock = _ReadWatch()
        self._read_cut_s = READ_CUT_S  # the module's, as it is at the open
        self._install = threading.Lock()  # the cached tables and counters change together
        self._secrets = _passwords(url)
        self._reader = self._connect()
        self.standby = self._in_recovery()  # a hot standby: read-only (its primary takes the writes)
        if self.standby and create:
            self._reader.close()
            raise ReadOnlyStoreError(f"{self.data_path} is a hot standby (a PostgreSQL server in recovery, replaying its "
                                     f"primary's WAL): it takes no writes; open it with readonly=True to read, and "
                                     f"write through its primary")
        self._primary: psycopg.Connection[Any] | None = None  # a standby's link to its primary (the horizon)
        self._asking = threading.Lock()  # the link to the primary is used by one thread at a time
        self._was_promoted = False  # a standby found promoted since its open
        self._closed = False
        self._direct = False  # the writer reaches the server itself, not through a pooler (set by _connect)
        self._writer = self._connect(writer=True)
        self._leases: psycopg.Connection[Any] | None = None  # made at the first hold
        # The lease connection and changes to ``_held`` (the renewer's thread too). Never taken inside
        # a batch: the renewer holds it while it may wait for a lease row a batch locked.
        self._lease_lock = threading.Lock()
        self._holder = secrets.token_hex(16)  # this engine, as the lease rows name their holder
        # The leases this engine took, with their fencing tokens, and those of them another engine
        # took over since (a renewal or a write found their token moved).
        self._held: dict[tuple[int, str], int] = {}
        self._lost: set[tuple[int, str]] = set()
        self._renewer: threading.Thread | None = None  # started at the first hold
        self._closing = threading.Event()
        # (sequence, catalog) as of what this process last read or committed: a batch that finds
        # others reads the branch and state tables again (another process wrote, made or deleted
        # a branch, or registered a state: those move the catalog, not the sequence).
        self._committed = 0
        self._schema = SCHEMA_VERSION
        self._began = False  # the server answered the running batch (a retry would no longer be safe)
        if create:  # a writer: it locks slots (and the schema's creation lock)
            self._require_locks()
        self._ensure_schema(create)
        self._catalog_key = _lock_key(self._reader, "catalog")
        self.reload()
        threading.Thread(target=self._watch_reads, name="ctxrt-store-read-watch", daemon=True).start()

    # -- set-up -----------------------------------------------------------------------------

    def _in_recovery(self) -> bool:
        try:
            row = self._reader.execute("SELECT pg_is_in_recovery()").fetchone()
        except psycopg.Error as exc:
            self._reader.close()
            raise StoreUnavailableError(self.data_path, self._reason(exc)) from None
        return bool(row and row[0])

    def _connect(self, old: psycopg.Connection[Any] | None = None, *, writer: bool = False,
                 conninfo: str | None = None) -> psycopg.Connection[Any]:
        """A connection (replacing ``old``, closed) to this store's server, or to ``conninfo``. A
        reader's statements and lock waits are bounded for its session; the writer's settings are
        its transactions' own (``_begin_locked``)."""
        if old is not None:
            old.close()
        try:
            conn = psycopg.connect(conninfo or self.url, autocommit=True, connect_timeout=self._connect_timeout_s)
            if not writer:
                # Bounds, so a stalled server is an error, not a hang. Behind a transaction-mode pooler
                # this lands on whichever server connection the pooler gave (the same bounds every
                # ctxrt process sets; nothing else a session SET would carry to another client).
                conn.execute(f"SET statement_timeout = {self._statement_ms}; SET lock_timeout = {self._statement_ms}")
            # No server-side prepared statements behind a pooler: a transaction-mode pooler (PgBouncer
            # before 1.21) gives the next statement another server connection, which doesn't know
            # them (or knows another client's of the same name). A direct reader keeps them: they
            # spare each of its reads the planning (about 0.15 ms). The writer's are set per batch
            # (``_apply``).
            pooled = _pooled(conn)
            if writer or pooled:
                conn.prepare_threshold = None
            if writer:
                self._direct = not pooled
            return conn
        except psycopg.Error as exc:
            where = "" if conninfo is None else f"its primary ({_server(conninfo)}): "
            raise StoreUnavailableError(self.data_path, where + self._reason(exc)) from None

    def _begin_locked(self, cursor: psycopg.Cursor[Any], exclusive: bool, slot: tuple[int, int, int] | None = None) -> None:
        """The writer's bounds, set for the transaction just begun, then this backend's own lock,
        then the catalog lock (exclusive or shared): one statement, each step a materialized CTE
        the next reads, so they run in that order (sent with the batch's first statements: no round
        trip of their own). ``SET LOCAL`` holds behind a transaction-mode pooler, where a session's
        SET stays on a server connection other clients get next. Every lock wait bounded (a wait
        reads ``lock_timeout`` when it begins: these two, after it was set, are too), every later
        statement bounded, a transaction left idle ended, and under durability "os"
        ``synchronous_commit=off`` (the server acknowledges before its WAL is flushed). The backend's lock comes first (no one else takes it exclusive):
        the horizon waits on it.

        ``slot`` (state, branch, count): a lone append slot's lock too, after the catalog lock, and
        ``count`` sequences drawn once it is granted, answered on ``cursor`` (``_LONE_SLOT``)."""
        # Durability "sync" leaves synchronous_commit as the server has it (remote_apply for one).
        bounds = ("WITH bounds AS MATERIALIZED (SELECT set_config('statement_timeout', %s, true),"
                  " set_config('lock_timeout', %s, true), set_config('idle_in_transaction_session_timeout', %s, true)"
                  + ("" if self._synchronous else ", set_config('synchronous_commit', 'off', true)")
                  + f"), backend AS MATERIALIZED (SELECT {_BACKEND_LOCK} FROM bounds)")
        params: tuple[Any, ...] = (str(self._statement_ms), str(self._statement_ms), str(int(self._idle_ms)),
                                   str(self._catalog_key), self._catalog_key)
        if slot is None:
            cursor.execute(f"{bounds} SELECT pg_advisory_xact_lock{'' if exclusive else '_shared'}(%s) FROM backend", params)
        else:
            state, branch, count = slot
            cursor.execute(bounds + _LONE_SLOT, (*params, _slot_key(self._catalog_key, state, branch), count))

    def _require_locks(self) -> None:
        """Refuse a server whose transaction advisory locks don't keep a second session out
        (CockroachDB's are no-ops that answer true): two processes would write one slot at once, out
        of sequence order, and ``last_sequence`` would see no write in flight. Proved on this
        engine's two connections, before anything is written."""
        try:
            if advisory_locks_exclude(self._writer, self._reader):
                return
            version = str((self._reader.execute("SELECT version()").fetchone() or ("unknown",))[0])
        except psycopg.Error as exc:
            self.close()
            raise StoreUnavailableError(self.data_path, self._reason(exc)) from None
        self.close()
        raise StoreUnsupportedError(
            self.data_path,
            f"its advisory locks don't exclude another session (a second session took a lock the first held in "
            f"its transaction), so two processes could write one slot at once and readers could skip a write in "
            f"flight; ctxrt needs PostgreSQL's transaction advisory locks (CockroachDB's, for one, are no-ops; "
            f"server: {' '.join(version.split())[:200]})",
        )

    def _cut_reason(self, outcome: str) -> str:
        return f"the runtime closed while the server hadn't answered a batch (a stalled server or pooler): it was cut{outcome}"

    def _reason(self, exc: BaseException) -> str:
        """What the driver said, on one line, without this URL's password (libpq may quote it)."""
        text = _reason(exc)
        for secret in self._secrets:
            text = text.replace(secret, "(hidden)")
        return text

    # A Ctrl-C in a trio host waits for the close's end (trio raises it at the next checkpoint, or
    # out of ``trio.run``): cut short, the close left the renewer renewing the leases for as long as
    # the process lived.
    @trio.lowlevel.enable_ki_protection
    def close(self) -> None:
        """Give back the leases held (another process may take them at once) and close. Returns
        within ``LEASE_CLOSE_S`` (and a connect timeout) when the server doesn't answer (a stalled
        pooler, a server down behind one): the lease statement in flight is cut, and the leases
        lapse at their expiry."""
        self._closed = True  # a standby's horizon wait in a thread its caller left ends, reconnecting nothing
        self._closing.set()
        answering = True
        if self._renewer is not None:
            self._renewer.join(LEASE_CLOSE_S)
            if self._renewer.is_alive():  # its renewal unanswered: the server won't take a release either
                answering = False
                self._cut_leases()
                self._renewer.join()
        with self._lease_lock:
            if self._held and answering:
                try:
                    self._on_leases(_RELEASE, (*self._lease_arrays(self._held), self._holder), within=LEASE_CLOSE_S)
                except StoreUnavailableError as exc:  # they lapse at their expiry instead
                    logger.warning("%s: couldn't give back the leases at the close: %s", self.data_path, exc.reason)
            elif self._held:
                logger.warning("%s: the server didn't answer the lease renewal at the close: the leases lapse at"
                               " their expiry", self.data_path)
            self._held.clear()
            self._lost.clear()
        for conn in (self._reader, self._writer, self._leases, self._primary):
            if conn is not None:
                conn.close()

    def hold(self, branch_id: int, name: str) -> bool:
        """Take the lease on (branch, ``name``) (K12): a row naming this engine its holder until an
        expiry the engine renews in the background, with a fencing token raised by this take that
        every write of the namespace's states checks in its own transaction. Taken over only once
        its holder let it lapse (killed, cut off: ``lease_ms`` after its last renewal) or gave it
        back. False if another holder's is still running. Raises ``StoreUnavailableError``."""
        key = (branch_id, name)
        with self._lease_lock:
            row = self._on_leases(_TAKE_LEASE, {"branch": branch_id, "name": name, "holder": self._holder,
                                                    "ms": self._lease_ms}, within=self._lease_statement_s)
            if row is None:
                return False
            self._held[key] = int(row[0])
            self._lost.discard(key)
            if self._renewer is None:
                # Started before it is recorded: a Ctrl-C between the two leaves a thread the close's
                # ``_closing`` still ends, never one the close would join unstarted.
                renewer = threading.Thread(target=self._renew_leases, name="ctxrt lease renewer", daemon=True)
                renewer.start()
                self._renewer = renewer
            return True

    def holds(self, branch_id: int, name: str) -> bool:
        """Whether this engine still holds the lease, as far as it knows (no round trip): one a
        renewal or a write found taken over is gone. One that lapsed unrenewed (the server away
        longer than a lease, this process stalled) is held while nobody took it over: its token is
        unchanged, so nothing was written under it since, and the renewer renews it once it can.
        The server's word is the fencing check each write makes."""
        # No lock: the renewer may sit waiting for a row a batch of this engine holds, and this runs
        # on the loop's thread (set and dict lookups are atomic).
        key = (branch_id, name)
        return key in self._held and key not in self._lost

    def release(self, branch_id: int, name: str) -> None:
        """Give the lease back: it expires now (its row, and the token, stay for the next take).
        Waits ``LEASE_CLOSE_S`` at most, for the lease connection and for the server's answer, as
        the close's give-back does: it runs on the loop's thread (a namespace's stop, at the
        runtime's close), and a stalled server held the close for the renewer's statement (10 s)
        then this one's (30 s). Raises ``StoreUnavailableError`` (it then lapses at its expiry)."""
        key = (branch_id, name)
        if not self._lease_lock.acquire(timeout=LEASE_CLOSE_S):  # a renewal the server doesn't answer
            self._held.pop(key, None)  # (atomic: ``holds`` reads them unlocked too)
            self._lost.discard(key)
            raise StoreUnavailableError(self.data_path, f"the lease connection was busy for {LEASE_CLOSE_S:g} s with a "
                                                        f"renewal the server hasn't answered")
        try:
            token = self._held.pop(key, None)
            self._lost.discard(key)
            if token is not None:
                self._on_leases(_RELEASE, (*self._lease_arrays({key: token}), self._holder), within=LEASE_CLOSE_S)
        finally:
            self._lease_lock.release()

    def _lease_arrays(self, held: dict[tuple[int, str], int]) -> tuple[list[int], list[str], list[int]]:
        return [b for b, _ in held], [n for _, n in held], list(held.values())

    def _renew_leases(self) -> None:
        """The renewer's thread: every third of ``lease_ms``, push the expiry of every lease held on;
        one found taken over or lapsed is marked lost (``holds`` says so; its writes are refused)."""
        while not self._closing.wait(self._lease_ms / 3000):
            with self._lease_lock:
                held = dict(self._held)
                if not held:
                    continue
                arrays = (*self._lease_arrays(held), self._holder)
                try:
                    answer = {(int(b), str(n)): bool(done) for b, n, done in self._on_leases(
                        _RENEW, (*arrays, self._lease_ms, *arrays), every=True, within=self._lease_ms / 1000)}
                except StoreUnavailableError as exc:  # held until their expiry: tried again next time
                    if not self._closing.is_set():  # (cut by the close otherwise)
                        logger.warning("%s: couldn't renew the leases: %s", self.data_path, exc.reason)
                    continue
                for key, token in held.items():
                    # Not answered: taken over (renewed, or its row locked by a batch in flight, else).
                    if key not in answer and self._held.get(key) == token and key not in self._lost:
                        # Kept in ``_held``: the writes still name its token, and the server refuses them.
                        logger.warning("%s: the lease on %s was taken over", self.data_path, key)
                        self._lost.add(key)

    def _on_leases(self, query: str, params: Sequence[Any] | dict[str, Any], *, every: bool = False, within: float | None = None) -> Any:
        """One statement on the lease connection (made again if it was lost: the leases are rows, they
        stay, unless the engine is closing); its first row, or every row; cut if unanswered
        ``within`` seconds. Call with ``_lease_lock`` held."""
        for attempt in (0, 1):
            if self._leases is None or self._leases.closed or self._leases.broken:
                self._leases = self._connect(self._leases)
            fired: list[bool] = []  # cut for taking too long: not tried again (the server is silent)

            def overdue() -> None:
                fired.append(True)
                self._cut_leases()
            cut = None if within is None else threading.Timer(within, overdue)
            try:
                if cut is not None:
                    cut.start()
                cursor = self._leases.execute(query, params)
                if cursor.description is None:  # a statement returning no rows (a release)
                    return None
                return cursor.fetchall() if every else cursor.fetchone()
            except psycopg.OperationalError as exc:
                if fired:
                    raise StoreUnavailableError(self.data_path, f"the lease statement had no answer in {within:g} s"
                                                                f" (the server or its pooler is silent)") from None
                if attempt or self._closing.is_set() or not (self._leases.closed or self._leases.broken):
                    raise StoreUnavailableError(self.data_path, self._reason(exc)) from None
            except psycopg.Error as exc:
                raise StoreUnavailableError(self.data_path, self._reason(exc)) from None
            finally:
                if cut is not None:
                    cut.cancel()
        raise AssertionError("unreachable")

    def _cut_leases(self) -> None:
        """Fail the lease connection's statement in flight, from another thread (PgBouncer queues a
        statement for a server that is down; a stalled pooler never answers)."""
        _shut(self._leases)

    def _cut_writer(self, closing: bool) -> None:
        """The cut of a batch the server didn't answer (``ThreadCommitter``), from another thread:
        the batch fails, reconnecting nothing; from the close on, every later one is refused."""
        if closing:
            self._cut_off = True
        else:
            self._cut_now = True
        _shut(self._writer)

    def taken_over(self, keys: Sequence[tuple[int, str]]) -> None:
        """Leases a write found taken over: ``holds`` answers False for them from now. No lock: this
        runs in a batch holding the lease rows, which the renewer (holding the lock) may be waiting for."""
        self._lost.update(keys)

    def fenced(self, commands: Sequence[Any]) -> dict[tuple[int, str], int]:
        """The leases taken (and not given back) that ``commands`` write under, with their tokens: a
        write of a namespace's state (not its message slot, which any process writes) on a branch
        whose lease on that namespace this engine took. A lease lost since still counts: the
        server refuses the write."""
        held = dict(self._held)
        if not held:
            return {}
        found: dict[tuple[int, str], int] = {}
        for command in commands:
            if type(command) is Atomically:
                found.update(self.fenced(command.commands))
                continue
            if type(command) not in (AppendItem, EditItem, RemoveItems, SetValue) or command.state.endswith("/messages"):
                continue
            branch = command.branch if isinstance(command.branch, int) else self.known_branch_ids.get(command.branch)
            for (held_branch, name), token in held.items():
                if held_branch == branch and command.state.startswith(name.removesuffix("/context") + "/"):
                    found[(held_branch, name)] = token
        return found

    def sync(self) -> None:
        """Nothing to do: the server flushes its log itself (``synchronous_commit=off`` within 3 × wal_writer_delay)."""

    def _ensure_schema(self, create: bool) -> None:
        """Create the tables and the format row in one transaction on first open (K5) unless
        ``create`` is False (a read-only runtime, ``verify``: then StoreFormatError); refuse a
        database that holds another schema version, or tables of ours without a format row."""
        try:
            with self._writer.transaction():
                found = self._format()
                if found is None and not create:
                    raise StoreFormatError(f"{self.data_path} holds no ctxrt store (no ctxrt_meta table)")
                if found is None:
                    # One creator at a time (any role that may create tables may take this lock).
                    self._writer.execute("SELECT pg_advisory_xact_lock(hashtext('ctxrt schema'))")
                    found = self._format()  # another process may have made it while we waited
                if found is None:
                    self._create()
                    return
        except psycopg.errors.DuplicateTable:  # made by another process at the same moment, or foreign
            found = self._format()
            if found is None:
                raise StoreFormatError(f"{self.data_path} holds tables named ctxrt_* that aren't a ctxrt store "
                                       f"(no ctxrt_meta table)") from None
        except (psycopg.errors.UndefinedColumn, psycopg.errors.UndefinedTable, psycopg.errors.DataError) as exc:
            raise StoreFormatError(f"{self.data_path} holds a ctxrt_meta table that isn't ctxrt's "
                                   f"({self._reason(exc)})") from None
        except psycopg.Error as exc:
            raise StoreUnavailableError(self.data_path, self._reason(exc)) from None
        if found not in READABLE_SCHEMAS:
            raise StoreFormatError(
                f"{self.data_path} records ctxrt schema {found!r}; this ctxrt reads schemas "
                f"{', '.join(map(str, READABLE_SCHEMAS))}"
            )
        self._schema = found
        if found < SCHEMA_VERSION and create:
            self._migrate()

    def _migrate(self) -> None:
        """Schema 1 or 2 to 3, in one transaction. 1 to 2: the sequence row becomes a database
        sequence that goes on from it; deleting the row waits for schema-1 writers' batches (they
        lock it) and stops their next ones (they find no sequence row and write nothing). 2 to 3:
        the lease table (a schema-2 writer still running keeps its session-lock leases, which
        exclude no one of this version: stop the old writers first, docs/api.md)."""
        try:
            with self._writer.transaction():
                self._writer.execute("SELECT pg_advisory_xact_lock(hashtext('ctxrt schema'))")
                # Only a store's tables are moved (a foreign ctxrt_meta is refused by the load that follows).
                tables = self._writer.execute("SELECT to_regclass('ctxrt_branches') IS NOT NULL"
                                              " AND to_regclass('ctxrt_items') IS NOT NULL").fetchone()
                found = self._format()
                if found in (1, 2) and tables and tables[0]:
                    if found == 1:
                        row = self._writer.execute("DELETE FROM ctxrt_meta WHERE key = 'sequence' RETURNING value").fetchone()
                        self._writer.execute("CREATE SEQUENCE ctxrt_sequence")
                        if row is not None and int(row[0]) > 0:
                            self._writer.execute("SELECT setval('ctxrt_sequence', %s)", (int(row[0]),))
                    self._writer.execute(_LEASES_TABLE)
                    self._writer.execute("UPDATE ctxrt_meta SET value = %s WHERE key = 'format'", (SCHEMA_VERSION,))
                    logger.info("%s: moving the store from ctxrt schema %s to %s", self.data_path, found, SCHEMA_VERSION)
        except psycopg.Error as exc:
            raise StoreUnavailableError(self.data_path, f"moving the store to schema {SCHEMA_VERSION} failed: "
                                                        f"{self._reason(exc)}") from None
        self._schema = SCHEMA_VERSION

    def _format(self) -> int | None:
        exists = self._writer.execute("SELECT to_regclass('ctxrt_meta') IS NOT NULL").fetchone()
        if not exists or not exists[0]:
            return None
        row = self._writer.execute("SELECT value FROM ctxrt_meta WHERE key = 'format'").fetchone()
        if row is None:
            raise StoreFormatError(f"{self.data_path} holds ctxrt's tables but records no format")
        return int(row[0])

    def _create(self) -> None:
        conn = self._writer
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                conn.execute(statement)
        conn.cursor().executemany(
            "INSERT INTO ctxrt_meta (key, value) VALUES (%s, %s)",
            [("format", SCHEMA_VERSION), ("next_branch", 2), ("next_state", 1)],
        )
        main = BranchRow(1, MAIN_BRANCH, None, None, (), int(time.time() * 1000))
        conn.execute("INSERT INTO ctxrt_branches (id, name, deleted, row) VALUES (1, %s, false, %s)",
                     (MAIN_BRANCH, main.to_json()))

    def _damaged(self, what: str) -> StoreCorruptError:
        return StoreCorruptError(self.data_path, what)

    def reload(self) -> None:
        """Re-read the branch and state tables and the sequence (after another process wrote)."""
        with self._lock:
            try:
                self._load(self._reader)
            except StoreUnavailableError as exc:
                self._reader = self._reconnect(self._reader, exc)
                self._load(self._reader)

    def _load(self, conn: psycopg.Connection[Any]) -> None:
        try:
            # The counter first: the tables read after it are at least as new as it says, so a
            # batch that finds the same counter needs no reload.
            catalog = _catalog(conn.execute(_CATALOG).fetchall())
            branch_rows = conn.execute("SELECT id, row FROM ctxrt_branches").fetchall()
            state_rows = conn.execute("SELECT name, number, kind FROM ctxrt_states").fetchall()
        except (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn) as exc:
            raise StoreFormatError(f"{self.data_path} records a ctxrt schema but lacks its tables "
                                   f"({self._reason(exc)})") from None
        except psycopg.Error as exc:
            raise StoreUnavailableError(self.data_path, self._reason(exc)) from None
        branches = {}
        for branch_id, raw in branch_rows:
            try:
                row = BranchRow.from_json(bytes(raw))
                if row.id != branch_id:
                    raise ValueError(f"the row says id {row.id}")
            except _DAMAGE as exc:
                raise self._damaged(f"the row of branch {branch_id} doesn't decode ({exc!r})") from None
            branches[row.id] = row
        states = {}
        for name, number, kind in state_rows:
            if kind not in ("log", "value"):
                raise self._damaged(f"state {name!r} has kind {kind!r}")
            states[name] = StateInfo(number, name, kind)
        with self._install:
            # A reload on the loop's thread can race a batch's commit on the worker: never install
            # tables older than what is installed (the counter says which is newer).
            if catalog < self._committed:
                return
            self.install(branches, states)
            self._committed = catalog

    # -- lookups ----------------------------------------------------------------------------

    @property
    def last_sequence(self) -> int:
        """The store's visible horizon: a sequence at or below which every write is committed and
        none will appear later (the database sequence's last value, once every write transaction
        in flight when it was read has ended). Writers commit in parallel, so a higher sequence
        may already be readable in its own slot. On a hot standby, the primary's horizon, given
        once the standby has replayed the primary's WAL up to where it stood after it (within the
        replica's lag). Raises ``StoreUnavailableError`` (on a standby, also when its primary
        can't be reached or named, or the standby doesn't catch up within the statement timeout)."""
        if self._schema == 1:  # read as it is (a schema-1 writer commits one batch at a time)
            row = self._fetchone("SELECT value FROM ctxrt_meta WHERE key = 'sequence'", ())
            if row is not None:
                return int(row[0])
            # No row: a writer of this version moved the store to schema 2 since this engine opened
            # (the row went in the move); the horizon is schema 2's from now on, never 0.
            row = self._fetchone("SELECT value FROM ctxrt_meta WHERE key = 'format'", ())
            if row is None or int(row[0]) not in READABLE_SCHEMAS[1:]:
                raise self._damaged("ctxrt_meta has no 'sequence' row")
            self._schema = int(row[0])
        return self._standby_horizon() if self.standby else self._own_horizon()

    def _standby_horizon(self) -> int:
        """The primary's horizon, once this standby has replayed the primary's WAL up to its insert
        position read after it: the writes at or below the horizon had ended (their commit records
        written) before that position, so this standby's next snapshots see them. The reads on the
        standby take ``_lock`` one look at a time: this process's other reads go on meanwhile. A
        standby promoted since (``pg_ctl promote``) is a primary: its own horizon is given."""
        if self._promoted():
            return self._own_horizon()
        with self._asking:
            try:
                try:
                    horizon, lsn = self._ask_primary()
                except psycopg.OperationalError as exc:
                    if self._closed or self._primary is None or not (self._primary.closed or self._primary.broken):
                        raise
                    # The primary restarted (or dropped this link) since the last horizon: once more.
                    logger.warning("%s: connection to its primary lost (%s); reconnecting", self.data_path,
                                   self._reason(exc))
                    horizon, lsn = self._ask_primary()
            except psycopg.Error as exc:
                raise StoreUnavailableError(self.data_path, f"its primary, asked for the horizon: {self._reason(exc)}") from None
        deadline = time.monotonic() + self._statement_ms / 1000
        while True:  # within the replica's lag
            with self._lock:
                try:
                    recovering, replayed = self._replayed(lsn)
                except psycopg.OperationalError as exc:
                    self._reader = self._reconnect(self._reader, exc)
                    continue
            if replayed:
                return horizon
            if not recovering:  # promoted short of ``lsn``: its writes may draw sequences at or below ``horizon``
                self._was_promoted = True
                return self._own_horizon()
            with self._lock:
                if time.monotonic() > deadline:
                    raise StoreUnavailableError(self.data_path, f"the standby didn't replay its primary's WAL up to "
                                                                f"{lsn} within {self._statement_ms} ms{self._paused()}")
            time.sleep(REPLAY_POLL_S)

    def _ask_primary(self) -> tuple[int, str]:
        """The primary's horizon and the WAL position to replay up to, on the link to the primary
        (made if there is none, or it was lost). Call with ``_asking``."""
        if self._primary is None or self._primary.closed or self._primary.broken:
            self._primary = self._connect(self._primary, conninfo=self._primary_conninfo())
            row = self._primary.execute("SELECT pg_is_in_recovery()").fetchone()
            if row and row[0]:  # its pg_locks would show no writer either: a horizon too high
                self._primary.close()
                raise StoreUnavailableError(self.data_path, "it is a hot standby whose upstream is itself a standby "
                                                            "(cascading replication): its horizon needs the primary")
        return self._horizon(self._primary), replay_target(self._primary)

    def _paused(self) -> str:
        """Why the standby's replay stands still, if it was paused (``pg_wal_replay_pause()``)."""
        try:
            row = self._reader.execute("SELECT pg_is_wal_replay_paused()").fetchone()
        except psycopg.Error:
            return ""
        return ": its replay is paused (pg_wal_replay_pause(); resume it with pg_wal_replay_resume())" \
            if row and row[0] else ""

    def _replayed(self, lsn: str) -> tuple[bool, bool]:
        """Whether this server is still a standby, and has replayed its primary's WAL up to ``lsn``."""
        row = self._reader.execute("SELECT pg_is_in_recovery(), pg_last_wal_replay_lsn() >= %s::pg_lsn",
                                   (lsn,)).fetchone()
        return (bool(row[0]), bool(row[1])) if row else (True, False)

    def _promoted(self) -> bool:
        """Whether this standby was promoted since its open (it is then a primary, for good)."""
        if not self._was_promoted:
            row = self._fetchone("SELECT pg_is_in_recovery()", ())
            self._was_promoted = bool(row) and not row[0]
        return self._was_promoted

    def _own_horizon(self) -> int:
        """The horizon as a primary finds it, on this engine's server."""
        with self._lock:
            try:
                return self._horizon(self._reader)
            except psycopg.OperationalError as exc:
                self._reader = self._reconnect(self._reader, exc)
                return self._horizon(self._reader)

    def _primary_conninfo(self) -> str:
        """How this standby's WAL receiver reaches its primary, for this store's database as this
        engine's user (and password, if its URL has one)."""
        row = self._fetchone("SELECT pid, conninfo FROM pg_stat_wal_receiver", ())
        if row is None:  # its WAL receiver isn't running: it lost its primary and tries again
            raise StoreUnavailableError(
                self.data_path, "it is a hot standby, whose horizon is asked of its primary, and it isn't streaming "
                                "from one now (its primary is down or unreachable; see its log)")
        if not row[1]:
            raise StoreUnavailableError(
                self.data_path, "it is a hot standby, whose horizon is asked of its primary, and this role can't read "
                                "which server that is (pg_stat_wal_receiver's conninfo): grant it pg_read_all_stats")
        params = {k: v for k, v in psycopg.conninfo.conninfo_to_dict(str(row[1])).items()
                  if k not in ("dbname", "replication", "fallback_application_name")}
        own = psycopg.conninfo.conninfo_to_dict(self.url)
        params.update({k: v for k, v in own.items() if k not in ("host", "hostaddr", "port")})
        return psycopg.conninfo.make_conninfo("", **params)

    def _horizon(self, conn: psycopg.Connection[Any]) -> int:
        # The last value first, then who holds the catalog lock: a writer that drew a sequence at or
        # below it took that lock before, and holds it until its rows are visible. Each holder took
        # its backend's lock before the catalog lock: wait for each of those (shared, for this
        # statement only), which ends with its transaction. A holder's backend that begins another
        # batch meanwhile may be waited for too: later than needed, never earlier.
        row = conn.execute(_LAST_VALUE).fetchone()
        last = int(row[0]) if row else 0
        holders = [int(pid) for (pid,) in conn.execute(_WRITERS, {"key": self._catalog_key}).fetchall()]
        if holders:
            try:
                conn.execute(_AWAIT_WRITERS, (str(self._statement_ms), str(self._catalog_key), holders))
            except (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled):
                raise StoreUnavailableError(self.data_path, f"writes in flight didn't end within "
                                                            f"{self._statement_ms} ms") from None
        return last

    def rereads(self) -> bool:
        """Always: other processes write the tables too."""
        return True

    def branch_by_id(self, branch_id: int) -> BranchRow:
        row = self.known_branches.get(branch_id)
        if row is None:
            self.reload()
            row = self.known_branches[branch_id]
        return row

    def head_sequence(self, branch: BranchRow) -> int:
        """The sequence of the branch's newest write (its fork point if it wrote nothing)."""
        row = self._fetchone(
            "SELECT greatest((SELECT max(revision) FROM ctxrt_heads WHERE branch = %s AND version = %s),"
            " (SELECT max(version) FROM ctxrt_values WHERE branch = %s))",
            (branch.id, CURRENT, branch.id),
        )
        own = int(row[0]) if row and row[0] is not None else 0
        return max(own, branch.fork_sequence or 0)

    def branch_deleted(self, branch_id: int) -> bool:
        """Whether branch ``branch_id`` was deleted (read afresh: another process may have)."""
        row = self._fetchone("SELECT deleted FROM ctxrt_branches WHERE id = %s", (branch_id,))
        return row is None or bool(row[0])

    def fresh_branch(self, branch_id: int) -> BranchRow | None:
        """Branch ``branch_id``'s row as stored now (read afresh: another process may have switched
        or deleted it); None if there is none."""
        found = self._fetchone("SELECT row FROM ctxrt_branches WHERE id = %s", (branch_id,))
        if found is None:
            return None
        try:
            return BranchRow.from_json(bytes(found[0]))
        except _DAMAGE as exc:
            raise self._damaged(f"the row of branch {branch_id} doesn't decode ({exc!r})") from None

    # -- reads ------------------------------------------------------------------------------

    def _fetchone(self, query: str, params: Sequence[Any]) -> Any:
        found = self._fetchall(query, params)
        return found[0] if found else None

    def _fetchall(self, query: str, params: Sequence[Any]) -> list[Any]:
        with self._lock:
            try:
                return self._reader.execute(query, params).fetchall()
            except psycopg.OperationalError as exc:
                self._reader = self._reconnect(self._reader, exc)
                return self._reader.execute(query, params).fetchall()

    def rows(self, query: str) -> list[Any]:
        """Every row ``query`` returns (for ``verify``'s walk of the tables)."""
        return self._fetchall(query, ())

    def _reconnect(self, conn: psycopg.Connection[Any], exc: BaseException) -> psycopg.Connection[Any]:
        """A connection the server dropped is made again once; a second failure is the caller's. A
        closed engine makes none (a read in a thread its caller left, on a standby, may still run),
        nor a read the watchdog cut (the next read makes it)."""
        if conn is self._reader and self._lock.cut:
            self._lock.cut = False
            raise StoreUnavailableError(self.data_path, f"the server didn't answer a read in {self._read_cut_s:g} s (a "
                                                        f"stalled server, or one down behind a pooler): it was cut") from None
        if self._closed or (not conn.closed and not conn.broken):
            raise StoreUnavailableError(self.data_path, self._reason(exc)) from None
        logger.warning("%s: connection lost (%s); reconnecting", self.data_path, self._reason(exc))
        self._lock.since = time.monotonic()  # a read again: timed afresh
        return self._connect(conn)

    def _watch_reads(self) -> None:
        """The watchdog's thread, for the engine's life: cut a read out longer than ``READ_CUT_S``."""
        watch = self._lock
        while not self._closing.wait(WATCH_S):
            since = watch.since
            if since and time.monotonic() - since > self._read_cut_s:
                logger.warning("%s: the server hasn't answered a read in %g s; cutting it", self.data_path,
                               self._read_cut_s)
                watch.cut = True
                _shut(self._reader)

    def _head_at(self, fetch: _Fetch, state: int, levels: Sequence[tuple[int, int]],
                 current_row: list[Any] | None = None) -> LogHead:
        """A log state's head as a view (its levels and limits) sees it (as the LMDB engine's).
        ``current_row``: the first level's current head row(s), read already."""
        for i, (branch, limit) in enumerate(levels):
            row = current_row if i == 0 and current_row is not None else fetch(
                "SELECT head FROM ctxrt_heads WHERE state = %s AND branch = %s AND version = %s", (state, branch, CURRENT))
            if not row:
                continue  # nothing written here: inherited
            current = LogHead.decode(bytes(row[0][0]))
            if current.revision <= limit:
                return current
            row = fetch("SELECT head FROM ctxrt_heads WHERE state = %s AND branch = %s AND version <= %s"
                        " ORDER BY version DESC LIMIT 1", (state, branch, limit))
            base = LogHead.decode(bytes(row[0][0])) if row else self._head_at(fetch, state, levels[i + 1 :])
            # Ordinals appended on this level after the base, in sequence order: those within the limit.
            row = fetch("SELECT count(*), max(version) FROM ctxrt_items WHERE state = %s AND branch = %s"
                        " AND ordinal >= %s AND ordinal < %s AND version = sequence AND version <= %s",
                        (state, branch, base.next_ordinal, current.next_ordinal, limit))
            appended, last = int(row[0][0]), row[0][1]
            if not appended:
                return base
            return LogHead(base.length + appended, base.next_ordinal + appended, base.removed,
                           max(base.revision, int(last)), base.rewrite_revision, current.flagged)
        return LogHead()

    def _items(
        self, fetch: _Fetch, info: StateInfo, levels: Sequence[tuple[int, int]], start: int, stop: int | None,
        head: LogHead,
    ) -> list[Item]:
        stop = head.length if stop is None else min(stop, head.length)
        start = max(0, start)
        if start >= stop:
            return []
        first, last = head.index_to_ordinal(start), head.index_to_ordinal(stop - 1)
        rows = fetch(
            "SELECT DISTINCT ON (i.ordinal) i.ordinal, i.version, i.sequence, i.data"
            " FROM unnest(%s::integer[], %s::bigint[], %s::integer[]) AS l(branch, lim, depth)"
            " JOIN ctxrt_items i ON i.state = %s AND i.branch = l.branch AND i.ordinal BETWEEN %s AND %s"
            " AND i.version <= l.lim ORDER BY i.ordinal, l.depth, i.version DESC",
            ([b for b, _ in levels], [_limit(lim) for _, lim in levels], list(range(len(levels))),
             info.number, first, last),
        )
        found = {ordinal: (version, sequence, data) for ordinal, version, sequence, data in rows}
        items = []
        for ordinal in head.visible_ordinals(first, last):
            row = found.get(ordinal)
            if row is None:
                raise self._damaged(f"{info.name!r} has no row for its visible ordinal {ordinal} (levels {levels})")
            version, sequence, data = row
            items.append(Item(int(sequence), ordinal, int(version), bytes(data)))
        return items

    def _locate(
        self, fetch: _Fetch, info: StateInfo, levels: Sequence[tuple[int, int]], sequence: int, head: LogHead,
    ) -> tuple[int, int, LogHead] | None:
        """(index, ordinal, head) of the visible item appended at ``sequence`` under the view's ``head``."""
        limits = dict(levels)
        for branch, ordinal in fetch(
            "SELECT branch, ordinal FROM ctxrt_items WHERE state = %s AND sequence = %s AND version = sequence",
            (info.number, sequence),
        ):
            if branch in limits and sequence <= limits[branch] and ordinal < head.next_ordinal:
                index = head.ordinal_to_index(ordinal)
                return None if index is None else (index, ordinal, head)
        return None

    def _value(self, fetch: _Fetch, info: StateInfo, levels: Sequence[tuple[int, int]]) -> tuple[Any, int]:
        rows = fetch(
            "SELECT v.data, v.version FROM unnest(%s::integer[], %s::bigint[], %s::integer[]) AS l(branch, lim, depth)"
            " CROSS JOIN LATERAL (SELECT data, version FROM ctxrt_values WHERE state = %s AND branch = l.branch"
            " AND version <= l.lim ORDER BY version DESC LIMIT 1) v ORDER BY l.depth LIMIT 1",
            ([b for b, _ in levels], [_limit(lim) for _, lim in levels], list(range(len(levels))), info.number),
        )
        if not rows:
            return None, 0
        return json.loads(bytes(rows[0][0])), int(rows[0][1])

    def _as_of(self, info: StateInfo, row: BranchRow, at: int | None) -> tuple[LogHead, list[tuple[int, int]]]:
        """The log's head as of ``at`` (or now), and the levels that read items as of that head: what
        it describes, whatever commits meanwhile."""
        head = self._head_at(self._fetchall, info.number, row.levels(at))
        return head, row.levels(head.revision if at is None else at)

    def _guarded(self, what: str, branch: BranchRow, read: Callable[[], _R]) -> _R:
        try:
            return read()
        except CtxrtError:
            raise  # said already (a deleted branch; a KeyError too, not damage)
        except _DAMAGE as exc:
            raise self._damaged(f"{what} on branch {branch.name!r} can't be read: {exc!r}") from None
        except psycopg.Error as exc:
            raise StoreUnavailableError(self.data_path, self._reason(exc)) from None

    def read_value(self, state: str, branch_id: int, default: Any = None, *, at: int | None = None) -> Any:
        """The value ``state`` holds on branch ``branch_id`` (as of ``at``, or now), or ``default``
        if it was never set or the state isn't registered."""
        if not self.has_state(state):
            return default
        info, row = value_state(self.state(state)), self.branch_by_id(branch_id)
        value, sequence = self._guarded(f"the value of {state!r}", row,
                                        lambda: self._value(self._fetchall, info, row.levels(at)))
        return default if sequence == 0 else value

    def read_head(self, state: str, branch_id: int, at: int | None = None) -> LogHead:
        info, row = log_state(self.state(state)), self.branch_by_id(branch_id)
        return self._guarded(f"the head of {state!r}", row,
                             lambda: self._head_at(self._fetchall, info.number, row.levels(at)))

    def read_items(
        self, state: str, branch_id: int, *, at: int | None = None, start: int = 0, stop: int | None = None,
    ) -> list[Item]:
        info, row = log_state(self.state(state)), self.branch_by_id(branch_id)

        def read() -> list[Item]:
            head, levels = self._as_of(info, row, at)
            return self._items(self._fetchall, info, levels, start, stop, head)

        return self._guarded(f"the items of {state!r}", row, read)

    def read_log(self, state: str, branch_id: int) -> list[Item]:
        """Every item of log ``state`` on branch ``branch_id`` ([] if the state isn't registered)."""
        if not self.has_state(state):
            return []
        return self.read_items(state, branch_id)

    def read_tail(self, state: str, branch_id: int, start: int) -> tuple[LogHead, list[Item]]:
        """The head now and the items from index ``start`` to it, as of the head's revision (a
        cache's look before a read). ``BranchNotFoundError`` once another process deleted the branch:
        the same statement reads the branch's row and its own head."""
        info, row = log_state(self.state(state)), self.branch_by_id(branch_id)

        def read() -> tuple[LogHead, list[Item]]:
            found = self._fetchall(
                "SELECT b.deleted, h.head FROM ctxrt_branches b LEFT JOIN ctxrt_heads h ON h.state = %s"
                " AND h.branch = b.id AND h.version = %s WHERE b.id = %s", (info.number, CURRENT, branch_id))
            if not found or found[0][0]:
                raise BranchNotFoundError(f"branch {row.name!r} (id {branch_id}) was deleted")
            own = found[0][1]
            head = (LogHead.decode(bytes(own)) if own is not None
                    else self._head_at(self._fetchall, info.number, row.levels()))  # inherited: read the lineage
            if start >= head.length:
                return head, []
            return head, self._items(self._fetchall, info, row.levels(head.revision), start, None, head)

        return self._guarded(f"the items of {state!r}", row, read)

    def read_item(self, state: str, branch_id: int, sequence: int, *, at: int | None = None) -> Item | None:
        info, row = log_state(self.state(state)), self.branch_by_id(branch_id)

        def read() -> Item | None:
            head, levels = self._as_of(info, row, at)
            found = self._locate(self._fetchall, info, levels, sequence, head)
            if found is None:
                return None
            items = self._items(self._fetchall, info, levels, found[0], found[0] + 1, found[2])
            return items[0] if items else None

        return self._guarded(f"item {sequence} of {state!r}", row, read)

    def read_items_appended(
        self, state: str, branch_id: int, first: int, last: int, *, at: int | None = None,
    ) -> list[Item]:
        info, row = log_state(self.state(state)), self.branch_by_id(branch_id)

        def read() -> list[Item]:
            head, levels = self._as_of(info, row, at)
            low = self._locate(self._fetchall, info, levels, first, head)
            high = self._locate(self._fetchall, info, levels, last, head)
            if low is None or high is None:
                return []
            return self._items(self._fetchall, info, levels, low[0], high[0] + 1, low[2])

        return self._guarded(f"the items of {state!r}", row, read)

    def read_blob(self, sha256: str) -> tuple[bytes, str] | None:
        try:
            digest = bytes.fromhex(sha256)
        except ValueError:
            return None
        row = self._fetchone("SELECT data, media_type FROM ctxrt_blobs WHERE sha256 = %s", (digest,))
        return None if row is None else (bytes(row[0]), str(row[1]))

    # -- writes -----------------------------------------------------------------------------

    def committer(self, execute: Callable[[Any, Any], Any], unnested: Callable[[Any], bool]) -> Committer:
        """The store actor's committer: a commit waits on the server, so each batch runs on a thread of its own."""
        return ThreadCommitter(lambda commands: self.apply(commands, execute, unnested), cut=self._cut_writer,
                               cut_after_s=(self._batch_cut_s, self._close_batch_s,
                                            min(self._close_batch_s, LEASE_CLOSE_S)),
                               answered=lambda: self._answered)

    def apply(
        self, commands: Sequence[Any], execute: Callable[[Any, Any], Any],
        unnested: Callable[[Any], bool] | None = None,
    ) -> tuple[list[tuple[bool, Any]], list[Operation]]:
        """Run ``execute(batch, command)`` for each command in ONE transaction and commit (as
        ``Engine.apply``: a refused command is rolled back alone under its savepoint).

        Raises ``StoreUnavailableError`` when the server can't be reached or drops the connection
        (before the batch began: nothing was written; once it began, the rows and the COMMIT went
        out together, so the message says whether it committed is unknown), ``StoreFullError`` when
        the server's disk is full, ``StoreCorruptError`` when a stored row doesn't decode or the
        database sequence is behind the stored rows. A batch the server broke a lock cycle in
        (two batches locking slots in opposite orders) runs again, holding the catalog lock exclusive.
        ``StoreUnsupportedError`` from an engine opened read-only on a schema-1 store;
        ``ReadOnlyStoreError`` from an engine on a hot standby (nothing is sent).
        """
        if self.standby:
            raise ReadOnlyStoreError(f"{self.data_path} is a hot standby: it takes no writes (write through its primary)")
        if self._cut_off:
            raise StoreUnavailableError(self.data_path, self._cut_reason("; nothing of this one was sent"))
        if self._schema != SCHEMA_VERSION:  # a read-only engine on an older store
            raise StoreUnsupportedError(self.data_path, f"it holds ctxrt schema {self._schema}; a writing "
                                                        f"runtime's open moves it to {SCHEMA_VERSION}")
        # A batch that changes the tables holds the catalog lock exclusive from its start (two
        # batches upgrading from shared would each wait for the other).
        exclusive, settled = _changes_catalog(commands, self.known_states), False
        try:
            for attempt in range(DEADLOCK_RETRIES + 1):
                try:
                    try:
                        results, batch = self._apply_reconnecting(commands, execute, unnested, exclusive, settled)
                    except Unsafe:
                        results, batch = self._apply(commands, execute, None, exclusive, settled)
                    break
                except _CatalogMoved:
                    # Another process made or deleted a branch or registered a state since this one
                    # last read the tables: the batch ran on old ones and was rolled back. Run it
                    # again, reading the tables first (under the catalog lock: they can't move again
                    # before it commits).
                    settled = True
                except psycopg.errors.DeadlockDetected:
                    # Two batches took locks in opposite orders and the server rolled this one back
                    # whole: nothing of it was written. It runs again holding the catalog lock
                    # exclusive (no other write in flight: it can't meet a cycle again).
                    if attempt == DEADLOCK_RETRIES:
                        raise
                    logger.info("%s: a batch met a lock cycle; running it again", self.data_path)
                    exclusive = True
            else:
                raise StoreUnavailableError(self.data_path, "the branch and state tables kept changing under a batch")
        except psycopg.errors.DiskFull as exc:
            raise StoreFullError(self.data_path, f"the server's disk is full ({self._reason(exc)})") from None
        except psycopg.errors.UniqueViolation as exc:
            if exc.diag.constraint_name != "ctxrt_items_appended":
                raise StoreUnavailableError(self.data_path, f"a write collided with another process's: "
                                                            f"{self._reason(exc)}; nothing was written") from None
            # A sequence handed out twice: the database sequence went back.
            raise self._damaged(f"a write reused a stored sequence; the sequence ctxrt_sequence is behind the "
                                f"stored rows ({self._reason(exc)})") from None
        except psycopg.Error as exc:
            raise self._batch_failed(exc) from None
        self._committed_batch(batch)
        return results, batch.operations

    def _batch_failed(self, exc: psycopg.Error) -> StoreUnavailableError:
        """What a batch the driver failed raises: whether it may have committed, and why (the
        connection lost, a cut); a lost connection is made again for the next batch."""
        # An error of the client's own (no SQLSTATE: "cannot exit pipeline mode while busy", once
        # the server dropped the connection after the COMMIT went out) leaves the conversation
        # out of step, whatever the connection's flags say: it is made again, as a lost one.
        lost = self._writer.broken or self._writer.closed or exc.sqlstate is None
        outcome = "whether it committed is unknown" if self._began else "nothing of it was written"
        if self._cut_off:
            return StoreUnavailableError(self.data_path, self._cut_reason(f"; {outcome}"))
        if self._cut_now:  # the next batch reconnects (``_apply_reconnecting``)
            return StoreUnavailableError(self.data_path, f"the server didn't answer a batch in {self._batch_cut_s:g} s "
                                                         f"(a stalled server or pooler): it was cut; {outcome}")
        reason = self._reason(exc)
        if lost and self._began:  # the rows and the COMMIT go out together: it may have landed
            reason = f"the connection was lost during the batch; whether it committed is unknown ({reason})"
        if lost:
            try:
                self._writer = self._connect(self._writer, writer=True)
            except StoreUnavailableError as failed:
                # A server restarting refuses the new one: its reason alone read as a batch
                # never sent. The next batch connects again (``_apply_reconnecting``).
                if not self._began:
                    return failed
                reason = f"{reason}; reconnecting failed: {failed.reason}"
        return StoreUnavailableError(self.data_path, reason)

    def _apply_reconnecting(
        self, commands: Sequence[Any], execute: Callable[[Any, Any], Any], unnested: Callable[[Any], bool] | None,
        exclusive: bool, settled: bool,
    ) -> tuple[list[tuple[bool, Any]], PgBatch]:
        """``_apply``, again on a new connection if the server had dropped the old one before the
        batch could begin (an idle connection killed by a restart: nothing was sent, nothing written),
        or if its session no longer held the prepared statements the driver had named (reset under
        it, as a pooler's ``DISCARD ALL`` does: the failed statement came before the COMMIT, so
        nothing was written; a new connection starts both afresh, and is asked again whether a
        pooler stands in front)."""
        self._began = self._cut_now = False
        try:
            return self._apply(commands, execute, unnested, exclusive, settled)
        except _FORGOTTEN as exc:
            logger.warning("%s: the writer's session lost its prepared statements (%s); running the batch "
                           "again on a new connection", self.data_path, self._reason(exc))
            self._writer = self._connect(self._writer, writer=True)
            return self._apply(commands, execute, unnested, exclusive, settled)
        except psycopg.OperationalError:
            if self._began or self._cut_off or self._cut_now or not (self._writer.broken or self._writer.closed):
                raise
            self._writer = self._connect(self._writer, writer=True)
            return self._apply(commands, execute, unnested, exclusive, settled)

    def _apply(
        self, commands: Sequence[Any], execute: Callable[[Any, Any], Any], unnested: Callable[[Any], bool] | None,
        exclusive: bool, settled: bool,
    ) -> tuple[list[tuple[bool, Any]], PgBatch]:
        conn = self._writer
        # Server-side prepared statements in a batch of appends only (planning its dozen statements
        # took a fifth of a lone append's batch): appends run unnested, so its pipeline sends no
        # ROLLBACK TO SAVEPOINT. psycopg forgets its statements at every ROLLBACK, and mid-pipeline
        # that fell out of step with statements already sent ("prepared statement does not
        # exist"); a ROLLBACK after a failed batch is sent alone. The server keeps them through it.
        prepared = self._direct and unnested is not None and all(map(unnested, commands))
        conn.prepare_threshold = PREPARE_THRESHOLD if prepared else None
        # Pipelined: statements are sent without waiting for each answer; a read (a head's) waits.
        # An append batch is two round trips: the catalog lock and counter with the slot's lock,
        # head and sequences; then its rows and the commit.
        # BEGIN and COMMIT are sent as statements, not with ``conn.transaction()``: in a pipeline that
        # syncs after its BEGIN, after the block and after the COMMIT (5 round trips, not 2).
        # A batch appending to one slot the tables know sends five statements: BEGIN, the locks with
        # its sequences, the catalog counter with its head, its rows, COMMIT (psycopg's own work for
        # each statement sent, more than the server's, was most of a lone append's batch: eight took
        # 1.43x a raw 6-round-trip transaction, five take 1.14x, synchronous_commit off,
        # bench/postgres_batch.py).
        appends = _appends(commands)
        settling = settled or exclusive or not self.known_states
        lone = None if settling else self._lone_slot(commands, appends)
        try:
            with conn.pipeline() as pipeline:
                cursor = conn.cursor()
                cursor.execute("BEGIN")
                drawing = None if lone is None else conn.cursor()
                self._begin_locked(cursor if drawing is None else drawing, exclusive, lone)
                fence = _Fence(self, conn, self.fenced(commands))  # answered with the batch's first read
                # Read after the lock is granted (a statement of its own: its snapshot is taken then),
                # answered with the batch's first read: the tables it knows are checked then.
                found = (conn.cursor().execute(_CATALOG) if lone is None
                         else conn.cursor().execute(_CATALOG_AND_HEAD, (lone[0], lone[1], CURRENT)))
                counter: psycopg.Cursor[Any] | None = found
                # Nothing read yet, or they moved: read the tables first. So does a batch that changes
                # them (it holds the lock exclusive): it judges a branch's name against the tables as
                # they are, not as this process last read them (another may have just made that name).
                if settling:
                    self._began = True
                    pipeline.sync()
                    if _catalog(found.fetchall()) != self._committed or not self.known_states:
                        self._load(conn)
                    counter = None
                catalog = self._committed  # what the commands are judged against (a reload may move it meanwhile)
                prelocked = self._lock_appended(cursor, appends)
                batch = PgBatch(self, cursor, pipeline, catalog, appends, counter, prelocked, lone, drawing)
                batch.exclusive = exclusive
                results = run_commands(batch, commands, fence.around(execute), unnested, _Savepoints(self, batch, pipeline))
                batch.check_catalog()
                batch.flush()
                if batch.catalog != catalog:
                    cursor.execute("INSERT INTO ctxrt_meta (key, value) VALUES ('catalog', %s)"
                                   " ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value", (batch.catalog,))
                cursor.execute("COMMIT")  # with the rows: the pipeline's end is their one Sync
        except BaseException:
            # What the server still holds of it (a refused row left it aborted; a Python error left it open).
            if not (conn.closed or conn.broken) and conn.info.transaction_status in (TransactionStatus.INTRANS,
                                                                                     TransactionStatus.INERROR):
                try:
                    conn.execute("ROLLBACK")
                except psycopg.Error as exc:  # the batch's own error is the one to report
                    logger.warning("%s: rolling a failed batch back failed: %s", self.data_path, self._reason(exc))
            raise
        return results, batch

    def _lock_appended(self, cursor: psycopg.Cursor[Any], appends: dict[tuple[str, str | int], int]) -> frozenset[tuple[int, int]]:
        """Lock the slots a batch appends to, if more than one, up front in the order of their keys
        (sent with the catalog lock: no round trip of their own). Taken as commands come, two
        batches appending to the same slots in opposite orders waited for each other until the
        server broke the cycle (``deadlock_timeout``, a second, then run again): measured, 2 processes
        appending to the same 4 slots in opposite orders made 219 appends/s, one alone 4,285 (5,926
        with this). Slots the tables don't know yet are locked when first touched."""
        slots = set()
        for state, branch in appends:
            info = self.known_states.get(state)
            branch_id = branch if isinstance(branch, int) else self.known_branch_ids.get(branch)
            if info is not None and branch_id is not None:
                slots.add((info.number, branch_id))
        if len(slots) < 2:
            return frozenset()
        for key in sorted(_slot_key(self._catalog_key, *slot) for slot in slots):
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", (key,))
        return frozenset(slots)

    def _lone_slot(self, commands: Sequence[Any], appends: dict[tuple[str, str | int], int]) -> tuple[int, int, int] | None:
        """(state, branch, appends) of the one slot a batch of appends writes, if the tables know it:
        its lock, sequences and head are sent with the batch's first statements. Not with another
        command: taken before the commands run, the slot's lock would be held while a command
        before the append took the catalog lock exclusive (a switch's), the lock another process's
        append to the slot holds shared while it waits for the slot: a cycle. Nor with an append
        the tables refuse (``Batch.append``'s checks before its head read): its sequences would be
        drawn, and a refused write moves no sequence (K1)."""
        if len(appends) != 1 or not all(type(command) is AppendItem for command in commands):
            return None
        [((state, branch), count)] = appends.items()
        info = self.known_states.get(state)
        row = self.known_branches.get(branch if isinstance(branch, int) else self.known_branch_ids.get(branch, -1))
        if info is None or info.kind != "log" or row is None or row.deleted:
            return None
        if any(c.followed is not None and row.switches > c.followed and row.switched_to for c in commands):
            return None  # refused: BranchSwitched (R4)
        return info.number, row.id, count

    def _refusal(self, command: Any, exc: BaseException) -> BaseException:
        if isinstance(exc, UNDECODABLE):
            return damaged_record(self.data_path, command, exc)
        if isinstance(exc, psycopg.Error):  # a value the database can't hold (text with NUL, say)
            return MalformedContentError(type(command).__name__, f"the database refused it: {self._reason(exc)}")
        return exc

    def _committed_batch(self, batch: PgBatch) -> None:
        with self._install:
            self._committed = batch.catalog
            self.take_batch(batch)
            self.known_heads.clear()  # another process may move any head before the next batch


_Fetch = Callable[[str, Sequence[Any]], list[Any]]


class _Fence:
    """A batch's fencing check (K12): the leases its commands write under, looked at (and locked
    until the batch ends) among its first statements, in the same pipeline; a command writing
    under one no longer this engine's is refused (``ConfigConflictError``) and writes nothing."""

    def __init__(self, engine: PostgresEngine, conn: psycopg.Connection[Any], wanted: dict[tuple[int, str], int]) -> None:
        self._engine = engine
        self._wanted = wanted
        self._granted: set[tuple[int, str]] | None = None
        self._answer = conn.cursor()
        if wanted:
            self._answer.execute(_FENCE, (*engine._lease_arrays(wanted), engine._holder))

    def around(self, execute: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        """``execute``, then the check (the command's reads brought the answer: no round trip of its
        own), before its rows are sent: a refused command's rows are discarded with its scope."""
        if not self._wanted:
            return execute

        def fenced(batch: Any, command: Any) -> Any:
            value = execute(batch, command)
            self.check(command)
            return value
        return fenced

    def check(self, command: Any) -> None:
        needed = [key for key in self._engine.fenced([command]) if key in self._wanted]
        if not needed:
            return
        if self._granted is None:
            self._granted = {(int(branch), str(name)) for branch, name in self._answer.fetchall()}
        lost = [key for key in needed if key not in self._granted]
        if lost:
            branch, name = lost[0]
            self._engine.taken_over(lost)
            raise ConfigConflictError(
                f"namespace {name.removesuffix('/context')!r} on branch {branch} lost its lease (another process "
                f"took it over once it lapsed): this write wasn't made; reopen the namespace where it is served")


def advisory_locks_exclude(first: psycopg.Connection[Any], second: psycopg.Connection[Any]) -> bool:
    """Whether a transaction advisory lock ``first`` holds keeps ``second`` from taking it, tried with
    the statement slot and catalog locks use. Sessions are what counts: ``first`` and ``second`` as
    one session (which may take its own lock again) answer False, as a server whose locks are
    no-ops does. (Behind a transaction-mode pooler ``first``'s open transaction keeps its server
    connection: ``second`` gets another.)

    The key holds ``first``'s backend pid, so probes of processes opening at once don't meet; a
    key someone else holds answers True (it excluded ``first``). Raises ``psycopg.Error``.
    """
    key = hashlib.blake2b(f"ctxrt lock probe {first.info.backend_pid}".encode(), digest_size=8).digest()
    probe = "SELECT pg_try_advisory_xact_lock(%s)"
    with first.transaction():
        if not _granted(first, probe, int.from_bytes(key, "big", signed=True)):
            return True
        return not _granted(second, probe, int.from_bytes(key, "big", signed=True))


def _granted(conn: psycopg.Connection[Any], query: str, key: int) -> bool:
    row = conn.execute(query, (key,)).fetchone()
    return bool(row and row[0])


_REFUSALS = (*UNDECODABLE, *MISTAKES)


class _Savepoints:
    """A batch's commands nested under savepoints of its one transaction (apply.Nesting)."""

    refusals: tuple[type[BaseException], ...] = _REFUSALS
    # A nested command's rows are sent and answered before its savepoint is released: a row the
    # database refuses refuses that command alone.
    nested_refusals: tuple[type[BaseException], ...] = (*_REFUSALS, psycopg.errors.IntegrityError, psycopg.errors.DataError,
                       psycopg.errors.PipelineAborted)

    def __init__(self, engine: PostgresEngine, batch: PgBatch, pipeline: psycopg.Pipeline) -> None:
        self._engine = engine
        self._batch = batch
        self._pipeline = pipeline
        self._savepoint = ""

    def refusal(self, command: Any, exc: BaseException) -> BaseException:
        return self._engine._refusal(command, exc)

    def begin(self, number: int) -> None:
        self._batch.flush()
        self._savepoint = f"c{number}"
        self._batch.cursor.execute(f"SAVEPOINT {self._savepoint}")

    def settle(self) -> None:
        self._batch.flush()
        self._pipeline.sync()  # a row this command can't write refuses the command, not the batch

    def keep(self) -> None:
        self._batch.cursor.execute(f"RELEASE SAVEPOINT {self._savepoint}")

    def undo(self, exc: BaseException) -> BaseException:
        self._batch.discard()
        # After an error the server skips what was sent until the next sync: sync first (the
        # failing row's own error may come only then), then roll back to the savepoint.
        try:
            self._pipeline.sync()
        except (psycopg.errors.IntegrityError, psycopg.errors.DataError) as cause:
            exc = cause if isinstance(exc, psycopg.errors.PipelineAborted) else exc
        except psycopg.errors.PipelineAborted:
            pass
        self._batch.cursor.execute(f"ROLLBACK TO SAVEPOINT {self._savepoint}")
        return exc

    def abandon(self) -> None:
        """Nothing: the batch's transaction rolls back whole."""


class _CatalogMoved(Exception):
    """A batch ran on branch and state tables older than its transaction's: it runs again."""


class PgBatch(Batch):
    """A batch's rows in one PostgreSQL transaction, buffered until the next read or the commit."""

    def __init__(self, engine: PostgresEngine, cursor: psycopg.Cursor[Any], pipeline: psycopg.Pipeline, catalog: int,
                 appends: dict[tuple[str, str | int], int], counter: psycopg.Cursor[Any] | None,
                 prelocked: frozenset[tuple[int, int]] = frozenset(), lone: tuple[int, int, int] | None = None,
                 lone_draw: psycopg.Cursor[Any] | None = None) -> None:
        super().__init__(engine, 0)  # ``sequence``: the last this batch drew
        self.catalog = catalog  # moved by every branch or state row this batch writes
        self._counter = counter  # the catalog counter as the transaction found it, not read yet
        self.pg = engine
        self.cursor = cursor
        # Every wait for an answer ends the pipeline's statement with a Sync (not only a flush): the
        # session is then idle in transaction while this process works, so a process stopped
        # mid-batch is ended by the server (IDLE_IN_TRANSACTION_MS); left mid-statement, it held its
        # locks, and the horizon, for as long as it stayed stopped. The same round trips.
        self._pipeline = pipeline
        self._rows: dict[str, list[tuple[Any, ...]]] = {}
        self._current: dict[tuple[int, int], tuple[Any, ...]] = {}  # current heads, one row each
        # Slot locks held, and sequences drawn since the last of them was granted (a slot's writes
        # take only sequences drawn after its lock). A lock taken under a savepoint that is rolled
        # back is released with it: both are part of ``savepoint``.
        self._locked: frozenset[tuple[int, int]] = frozenset()
        self._drawn: tuple[int, ...] = ()
        self._drawing: psycopg.Cursor[Any] | None = None  # a draw sent with the last lock, unread
        self.exclusive = False  # the catalog lock is held exclusive
        # The batch's appends per (state, branch as named): a slot's lock draws as many sequences in
        # its round trip (an append is refused, if at all, before it takes one: no gap). Other
        # commands draw theirs when they take it, so a refused one takes none.
        self._appends = appends
        self._prelocked = prelocked  # slot locks taken at the batch's start (outside any savepoint)
        # A lone append slot (``PostgresEngine._lone_slot``): locked by the batch's first statement,
        # its sequences drawn there (``lone_draw``, unread) and its current head read with the catalog
        # counter (``_counter``): both used at the slot's first touch, once.
        self._lone = None if lone is None else lone[:2]
        self._lone_draw = lone_draw
        self._lone_head: list[Any] | None = None  # the head's row(s), once the counter's answer is read
        if lone is not None:
            self._prelocked = prelocked | {lone[:2]}

    def _fetch(self, query: str, params: Sequence[Any]) -> list[Any]:
        self.flush()
        self.cursor.execute(query, params)
        self._pipeline.sync()
        rows = self.cursor.fetchall()
        self.pg._answered = time.monotonic()  # the cut of a batch unanswered counts from here
        self.pg._began = True  # the server answered: from here a failure may follow writes
        self.check_catalog()
        return rows

    def check_catalog(self) -> None:
        """Raise ``_CatalogMoved`` if the catalog counter the transaction found (answered by now, or
        read here) isn't the one this batch's commands were judged against."""
        if self._counter is not None:
            counter, self._counter = self._counter, None
            rows = counter.fetchall()
            if self._lone is not None:
                self._lone_head = [] if rows[0][1] is None else [(rows[0][1],)]
            if _catalog(rows) != self.catalog:
                raise _CatalogMoved

    def flush(self) -> None:
        """Send the buffered rows (pipelined)."""
        rows, self._rows = self._rows, {}
        current, self._current = self._current, {}
        items = rows.pop(_INSERT_ITEM, [])
        for statement, values in rows.items():
            self.cursor.executemany(statement, values)
        if len(items) == 1 and len(current) == 1:  # a lone append's: one statement
            [head] = current.values()
            self.cursor.execute(_APPEND_ROWS, (*items[0], *head))
            return
        if items:
            self.cursor.executemany(_INSERT_ITEM, items)
        if current:
            self.cursor.executemany(_UPSERT_HEAD, list(current.values()))

    def discard(self) -> None:
        self._rows, self._current = {}, {}

    def _buffer(self, statement: str, row: tuple[Any, ...]) -> None:
        self._rows.setdefault(statement, []).append(row)

    def read_head(self, info: StateInfo, row: BranchRow) -> LogHead:
        self._lock_slot(info, row)  # heads are never cached between batches: this is a slot's first touch
        current = None
        if self._lone == (info.number, row.id):
            if self._counter is not None:
                if self._counter.pgresult is None:  # not answered yet: this is the batch's first wait
                    self.flush()
                    self._pipeline.sync()
                self.pg._began = True
                self.check_catalog()
                self.pg._answered = time.monotonic()
            current, self._lone_head, self._lone = self._lone_head, None, None
        return self.pg._head_at(self._fetch, info.number, row.levels(), current)

    def locate(
        self, info: StateInfo, row: BranchRow, item_sequence: int, head: LogHead,
    ) -> tuple[int, int, LogHead] | None:
        return self.pg._locate(self._fetch, info, row.levels(), item_sequence, head)

    def read_range(self, info: StateInfo, row: BranchRow, head: LogHead, start: int, stop: int) -> list[Item]:
        return self.pg._items(self._fetch, info, row.levels(), start, stop, head)

    def read_value(self, info: StateInfo, row: BranchRow) -> tuple[Any, int]:
        self._lock_slot(info, row)  # a conditional write or a floor: decided against the newest value
        return self.pg._value(self._fetch, info, row.levels())

    def item_version(self, info: StateInfo, row: BranchRow, located: tuple[int, int, LogHead]) -> int:
        index, _, head = located
        return self.pg._items(self._fetch, info, row.levels(), index, index + 1, head)[0].version

    def next_number(self, counter: Counter) -> int:
        self._lock_catalog()
        key = "next_state" if counter == "state" else "next_branch"
        found = self._fetch("UPDATE ctxrt_meta SET value = value + 1 WHERE key = %s RETURNING value - 1", (key,))
        if not found:
            raise self.pg._damaged(f"ctxrt_meta has no {key!r} row")
        return int(found[0][0])

    def savepoint(self) -> tuple[Any, ...]:
        return (*super().savepoint(), self.catalog, self._locked, self.exclusive)

    def restore(self, saved: tuple[Any, ...]) -> None:
        super().restore(saved[:-3])
        self.catalog, self._locked, self.exclusive = saved[-3:]
        self._drawn, self._drawing = (), None  # maybe drawn before a lock now taken again

    def _lock_slot(self, info: StateInfo, row: BranchRow) -> None:
        """Take the slot's lock (waiting for another batch writing it to end) and draw one sequence
        after it, sent ahead of the read that follows (the same round trip)."""
        if (info.number, row.id) in self._locked:
            return
        self.flush()
        lock = (info.number, row.id) not in self._prelocked
        self._locked |= {(info.number, row.id)}
        self._drawn, self._drawing = (), None
        count = self._appends.get((info.name, row.id), 0) + self._appends.get((info.name, row.name), 0)
        key = _slot_key(self.pg._catalog_key, info.number, row.id)
        if self._lone_draw is not None and self._lone == (info.number, row.id):
            self._drawing, self._lone_draw = self._lone_draw, None  # drawn by the batch's first statement
        elif count:
            self._drawing = self.pg._writer.cursor()
            if lock:  # one statement: the sequences are drawn once the lock is granted
                self._drawing.execute(_LOCK_AND_DRAW, (key, count))
            else:
                self._drawing.execute(_DRAW, (count,))
        elif lock:
            self.cursor.execute("SELECT pg_advisory_xact_lock(%s)", (key,))

    def _next_sequence(self) -> int:
        if self._drawing is not None:
            drawing, self._drawing = self._drawing, None
            if drawing.pgresult is None:  # not answered yet (a head's read, sent after it, answers it too)
                self._pipeline.sync()
            [(drawn,)] = drawing.fetchall()
            self._drawn = tuple(map(int, drawn))
        if not self._drawn:
            [(drawn,)] = self._fetch(_DRAW, (1,))
            self._drawn = tuple(map(int, drawn))
        self.sequence, self._drawn = self._drawn[0], self._drawn[1:]
        return self.sequence

    def store_sequence(self) -> int:
        """The sequence's last value with no other write in flight (this batch holds the catalog
        lock exclusive): every write at or below it is committed."""
        self._lock_catalog()
        [(last,)] = self._fetch(_LAST_VALUE, ())
        return max(int(last), self.sequence)

    def _lock_catalog(self) -> None:
        """Hold the catalog lock exclusive (from the shared hold every batch has): wait for every other
        write in flight to end, and keep new ones out until this batch commits."""
        if not self.exclusive:
            self.flush()
            self.cursor.execute("SELECT pg_advisory_xact_lock(%s)", (self.pg._catalog_key,))
            self.exclusive = True

    def put_state(self, info: StateInfo) -> None:
        self._lock_catalog()
        self.catalog += 1
        self._buffer("INSERT INTO ctxrt_states (name, number, kind) VALUES (%s, %s, %s)",
                     (info.name, info.number, info.kind))

    def put_item(self, info: StateInfo, row: BranchRow, ordinal: int, version: int, item_sequence: int,
                 data: bytes) -> None:
        self._buffer(_INSERT_ITEM, (info.number, row.id, ordinal, version, item_sequence, data))

    def put_head(self, info: StateInfo, row: BranchRow, head: LogHead, version: int | None) -> None:
        if version is None:
            self._current[(info.number, row.id)] = (info.number, row.id, CURRENT, head.revision, head.encode())
        else:
            self._buffer("INSERT INTO ctxrt_heads (state, branch, version, revision, head) VALUES (%s, %s, %s, %s, %s)",
                         (info.number, row.id, version, head.revision, head.encode()))

    def put_value(self, info: StateInfo, row: BranchRow, version: int, data: bytes) -> None:
        self._buffer("INSERT INTO ctxrt_values (state, branch, version, data) VALUES (%s, %s, %s, %s)",
                     (info.number, row.id, version, data))

    def put_branch(self, row: BranchRow, *, created: bool) -> None:
        self._lock_catalog()
        self.catalog += 1
        if created:
            self._buffer("INSERT INTO ctxrt_branches (id, name, deleted, row) VALUES (%s, %s, %s, %s)",
                         (row.id, row.name, row.deleted, row.to_json()))
        else:
            self._buffer("UPDATE ctxrt_branches SET deleted = %s, row = %s WHERE id = %s",
                         (row.deleted, row.to_json(), row.id))

    def put_blob_row(self, sha256: str, data: bytes, media_type: str) -> None:
        self._buffer("INSERT INTO ctxrt_blobs (sha256, media_type, data) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
                     (bytes.fromhex(sha256), media_type, data))


# Leases (K12), on the server's clock. A take wins a lease that expired (or was given back), or its
# own; every take raises the token, so whatever the last holder still sends is refused. The expiry
# is counted from when the take won (after waiting for the last holder's batch, which keeps the row
# locked: an expiry from before the wait was already past).
# Nor while a schema-2 writer (ctxrt before row leases, still running when the store was moved)
# holds the namespace as a session advisory lock on (branch, hashtext(schema/name)): pg_locks shows
# its two keys as unsigned oids.
_TAKE_LEASE = ("INSERT INTO ctxrt_leases AS l (branch, name, holder, token, expires)"
               " SELECT %(branch)s::integer, %(name)s::text, %(holder)s::text, 1,"
               " clock_timestamp() + %(ms)s * interval '1 millisecond'"
               " WHERE NOT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 AND granted"
               " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
               " AND classid::bigint = (%(branch)s::integer::bigint & 4294967295)"
               " AND objid::bigint = (hashtext(current_schema() || '/' || %(name)s::text)::bigint & 4294967295))"
               " ON CONFLICT (branch, name) DO UPDATE SET holder = EXCLUDED.holder, token = l.token + 1,"
               " expires = clock_timestamp() + %(ms)s * interval '1 millisecond'"
               " WHERE l.expires <= clock_timestamp() OR l.holder = EXCLUDED.holder"
               " RETURNING l.token")
# The lease rows of (branches, names, tokens) held by a holder.
_HELD = ("unnest(%s::integer[], %s::text[], %s::bigint[]) AS h(branch, name, token) WHERE l.branch = h.branch"
         " AND l.name = h.name AND l.token = h.token AND l.holder = %s")
# A renewal: each lease still held (its token unchanged, expired or not: nobody took it over, so
# nothing was written under it since) pushed on, but one the engine's own batch in flight keeps
# locked (its fencing check, to the batch's end) is passed over, not waited for: a stalled batch
# must not hold up the others' renewals. Answers (branch, name, renewed) for each still held.
_RENEW = ("WITH free AS (SELECT l.branch, l.name FROM ctxrt_leases AS l, " + _HELD +
          " FOR NO KEY UPDATE OF l SKIP LOCKED),"
          " renewed AS (UPDATE ctxrt_leases AS l SET expires = clock_timestamp() + %s * interval '1 millisecond'"
          " FROM free WHERE l.branch = free.branch AND l.name = free.name RETURNING l.branch, l.name)"
          " SELECT branch, name, true FROM renewed UNION ALL SELECT l.branch, l.name, false FROM ctxrt_leases AS l, "
          + _HELD + " AND (l.branch, l.name) NOT IN (SELECT branch, name FROM renewed)")
_RELEASE = f"UPDATE ctxrt_leases AS l SET expires = '-infinity' FROM {_HELD}"
# The fencing check, among a batch's first statements: the leases its writes need, still this
# engine's (same token: never taken over; one that lapsed meanwhile is still its own), locked
# until the batch ends (a take waits for it to commit).
_FENCE = f"SELECT l.branch, l.name FROM ctxrt_leases AS l, {_HELD} FOR SHARE OF l"
_CATALOG = "SELECT value FROM ctxrt_meta WHERE key = 'catalog'"
# A lone append slot's first read: the catalog counter and the slot's current head (none: NULL), in
# one statement sent after the one that took the slot's lock (its snapshot is taken once both locks
# are held).
_CATALOG_AND_HEAD = ("SELECT COALESCE((SELECT value FROM ctxrt_meta WHERE key = 'catalog'), 0),"
                     " (SELECT head FROM ctxrt_heads WHERE state = %s AND branch = %s AND version = %s)")
# Sequences drawn, as one array.
_DRAW = "SELECT array_agg(nextval('ctxrt_sequence')) FROM generate_series(1, %s)"
# Sequences drawn once a slot's lock (the row ``locked``) is granted: a subquery reading the lock's
# row (``locked.first``), so it runs after it. Read from a join of the two, the count a parameter,
# the server planned the statement again at every batch (pg_stat_statements: 200 plans in 200
# calls, a custom plan for each count beating the generic one): 33 us a batch alone, 0.15 ms once in
# the lone slot's first statement with its whole chain of locks (bench/postgres_batch.py's shapes).
_DRAWN_AFTER = (" SELECT drawn FROM locked, LATERAL (SELECT array_agg(nextval('ctxrt_sequence')) AS drawn"
                " FROM generate_series(locked.first, %s)) AS d")
# A slot's lock, then sequences drawn after it is granted.
_LOCK_AND_DRAW = "WITH locked AS MATERIALIZED (SELECT pg_advisory_xact_lock(%s), 1 AS first)" + _DRAWN_AFTER
# The end of a batch's first statement (``_begin_locked``) for a lone append slot: the catalog lock
# shared, then the slot's lock, then its sequences.
_LONE_SLOT = (", catalog AS MATERIALIZED (SELECT pg_advisory_xact_lock_shared(%s) FROM backend),"
              " locked AS MATERIALIZED (SELECT pg_advisory_xact_lock(%s), 1 AS first FROM catalog)" + _DRAWN_AFTER)
# The last sequence drawn (a sequence never drawn from has is_called false: none yet).
_LAST_VALUE = "SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM ctxrt_sequence"
# The write transactions holding the catalog lock (a bigint key's halves, as pg_locks shows them).
_WRITERS = ("SELECT DISTINCT pid FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1"
            " AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " AND classid = ((%(key)s::bigint >> 32) & 4294967295)::oid AND objid = (%(key)s::bigint & 4294967295)::oid")
# The lock a write transaction holds exclusive before the catalog lock, keyed by the store's
# catalog key and its server backend's pid.
# Keyed in SQL by the server's pid: behind a pooler the client's backend_pid is the pooler's.
_BACKEND_KEY = "hashtextextended(%s::text || '/backend/' || {pid}, 0)"
_BACKEND_LOCK = f"pg_advisory_xact_lock({_BACKEND_KEY.format(pid='pg_backend_pid()')})"
# Wait for each holder's backend lock to be released (its transaction ended), shared: holders
# don't wait for one another, nor for this. Its bound is set in the statement, for its own
# transaction (a CTE with a volatile function runs once, before the rows it joins): behind a
# transaction-mode pooler the reader's session ``SET lock_timeout`` is on another server connection,
# and the wait lasted as long as a stalled writer did.
_AWAIT_WRITERS = ("WITH bound AS (SELECT set_config('lock_timeout', %s, true))"
                  f" SELECT count(pg_advisory_xact_lock_shared({_BACKEND_KEY.format(pid='pid')}))"
                  " FROM bound, unnest(%s::int[]) AS pid")
_INSERT_ITEM = ("INSERT INTO ctxrt_items (state, branch, ordinal, version, sequence, data)"
                " VALUES (%s, %s, %s, %s, %s, %s)")
_UPSERT_HEAD = ("INSERT INTO ctxrt_heads (state, branch, version, revision, head) VALUES (%s, %s, %s, %s, %s)"
                " ON CONFLICT (state, branch, version) DO UPDATE SET revision = EXCLUDED.revision, head = EXCLUDED.head")
# A lone append's rows: its item and its log's current head, one statement.
_APPEND_ROWS = ("WITH item AS (" + _INSERT_ITEM + ") " + _UPSERT_HEAD)


def _appends(commands: Sequence[Any]) -> dict[tuple[str, str | int], int]:
    """How many appends ``commands`` make to each (state, branch as the command names it)."""
    counts: dict[tuple[str, str | int], int] = {}
    for command in commands:
        if type(command) is AppendItem:
            counts[(command.state, command.branch)] = counts.get((command.state, command.branch), 0) + 1
        elif type(command) is Atomically:
            for key, count in _appends(command.commands).items():
                counts[key] = counts.get(key, 0) + count
    return counts


def _changes_catalog(commands: Sequence[Any], states: dict[str, StateInfo]) -> bool:
    """Whether ``commands`` may make or delete a branch or register a state (one not known yet)."""
    for command in commands:
        if type(command) in (CreateBranch, DeleteBranch) or (type(command) is RegisterState and command.name not in states):
            return True
        if type(command) is Atomically and _changes_catalog(command.commands, states):
            return True
        if type(command) in (AppendItem, EditItem) and _files_new_index(command, states):
            return True
    return False


def _files_new_index(command: AppendItem | EditItem, states: dict[str, StateInfo]) -> bool:
    """Whether an item's write may register its log's index marker or an index log (K10): a log's first
    append does. Predicted, such a batch holds the catalog lock exclusive from its start: taken up
    from shared, two processes' first appends waited for each other until the server broke the cycle
    (a second each; 8 processes opening at once met 1-5 such cycles)."""
    index = getattr(command.attachment, "index", None)
    if index is None:
        return False
    return index_marker(command.state) not in states or any(index_state(command.state, e.key) not in states for e in index)


def _catalog(rows: list[Any]) -> int:
    return int(rows[0][0]) if rows else 0


def _lock_key(conn: psycopg.Connection[Any], what: str) -> int:
    """A 64-bit advisory lock key for ``what`` of the store in this connection's schema (stores in
    other schemas of the database don't share it; leases use two 32-bit keys, another key space)."""
    row = conn.execute("SELECT current_schema()").fetchone()
    digest = hashlib.blake2b(f"ctxrt {row[0] if row else ''}/{what}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def _pooled(conn: psycopg.Connection[Any]) -> bool:
    """Whether ``conn`` reaches its server through a pooler: a pooler (PgBouncer, Pgpool) hands the
    client a backend pid of its own, not the server backend's that answers."""
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    return not row or int(row[0]) != conn.info.backend_pid


def _slot_key(catalog_key: int, state: int, branch: int) -> int:
    """The lock key of one slot (state, branch) of the store whose catalog lock is ``catalog_key``."""
    digest = hashlib.blake2b(f"{catalog_key}/{state}/{branch}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def _server(conninfo: str) -> str:
    """Where ``conninfo`` leads (host and port), for a message: never its password."""
    params = psycopg.conninfo.conninfo_to_dict(conninfo)
    return f"host {params.get('host') or params.get('hostaddr') or 'default'}, port {params.get('port') or 5432}"


def _limit(limit: int) -> int:
    return min(limit, CURRENT)


class _ReadWatch:
    """The read connection's lock, and since when the read holding it waits (0.0: none held it), for
    the engine's watchdog; ``cut``: the watchdog cut the read out."""

    __slots__ = ("cut", "lock", "since")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.since = 0.0
        self.cut = False

    def __enter__(self) -> None:
        self.lock.acquire()
        self.since = time.monotonic()

    def __exit__(self, *_: object) -> None:
        self.since = 0.0
        self.lock.release()


def _shut(conn: psycopg.Connection[Any] | None) -> None:
    """Fail ``conn``'s statement in flight, from another thread: its socket shut (the thread's wait
    for an answer ends at once; a stalled server or pooler would never answer it)."""
    if conn is None or conn.closed:
        return
    with contextlib.suppress(OSError, psycopg.Error), socket.socket(fileno=os.dup(conn.pgconn.socket)) as sock:
        sock.shutdown(socket.SHUT_RDWR)


def _passwords(url: str) -> set[str]:
    """The password a URL holds, as written and decoded (libpq quotes either in its messages)."""
    found = set(re.findall(r"://[^:/@\s]*:([^@\s]*)@", url))
    found |= {m for m in re.findall(r"(?i)(?:password|%70assword)=([^&#\s]*)", url)}
    return {form for secret in found if secret for form in (secret, urllib.parse.unquote(secret)) if len(form) > 1}


def _reason(exc: BaseException) -> str:
    """What the driver said, on one line, with any password it quoted taken out."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    text = re.sub(r"(\w+://[^:/@\s]*):[^@\s]*@", r"\1@", text)  # user:password@ in a quoted URL
    text = re.sub(r"(?i)(password|%70assword)=[^&\s'\"]*", r"\1=(hidden)", text)
    return text[:500]
