"""The PostgreSQL engine through the public API: runtimes sharing one store, errors, verify (issue 15)."""

from __future__ import annotations

import itertools
import subprocess
import sys

import psycopg
import pytest
import trio

import ctxrt
from ctxrt import Text
from ctxrt.store.postgres import advisory_locks_exclude
from ctxrt.testing import reset_writer_session


async def test_two_runtimes_on_one_store_see_each_others_writes_in_order(pg_url: str) -> None:
    """Two runtimes (as two processes would) append in turns; each compile holds every message in
    id order, including the other's latest (a cache that missed a write reloads, S3)."""
    async with ctxrt.open_runtime(pg_url) as first, ctxrt.open_runtime(pg_url) as second:
        a, b = await first.open("a"), await second.open("b")
        ids = []
        for turn in range(6):
            writer = a if turn % 2 == 0 else b
            ids.append(await writer.add_message("user", f"turn {turn}"))
            for reader in (a, b):
                assert await reader.message_count() == turn + 1
                compiled = await reader.compile()
                assert [m.content[0].text for m in compiled.messages] == [f"turn {t}" for t in range(turn + 1)]
        assert ids == sorted(ids, key=int)


async def test_a_claim_made_by_another_runtime_refuses_another_reader(pg_url: str) -> None:
    """C1 across processes: the claim is a conditional write; the loser gets ReaderConflictError,
    an open for the same reader goes on, and the store records one reader."""
    async with ctxrt.open_runtime(pg_url) as first, ctxrt.open_runtime(pg_url) as second:
        await second.open("agents/x")  # the second runtime's actor starts unclaimed
        await first.open("agents/x", view_reader="ann")
        with pytest.raises(ctxrt.ReaderConflictError):
            await second.open("agents/x", view_reader="bob")
        same = await second.open("agents/x", view_reader="ann")
        assert same.view_reader == "ann"
        [info] = [n for n in await first.list_namespaces() if n.namespace == "agents/x"]
        assert info.reader == "ann"


async def test_an_audience_line_never_reaches_another_runtimes_reader(pg_url: str) -> None:
    """A1 across processes: bob's compile in another runtime never holds ann's line."""
    async with ctxrt.open_runtime(pg_url) as first, ctxrt.open_runtime(pg_url) as second:
        ann = await first.open("ann", view_reader="ann")
        bob = await second.open("bob", view_reader="bob")
        await ann.add_message("user", [Text("for everyone"), Text("ANN-ONLY", audience=("ann",))])
        bob_texts = [b.text for m in (await bob.compile()).messages for b in m.content]
        ann_texts = [b.text for m in (await ann.compile()).messages for b in m.content]
        assert bob_texts == ["for everyone"] and ann_texts == ["for everyone", "ANN-ONLY"]


async def test_errors_name_the_database_without_its_password(pg_url: str) -> None:
    """A missing database is StoreUnavailableError naming the URL; the password never appears."""
    missing = pg_url.replace("ctxrt@", "ctxrt:s3cret-pw@").replace("/t", "/no_such_db_t", 1)
    with pytest.raises(ctxrt.StoreUnavailableError) as refused:
        async with ctxrt.open_runtime(missing):
            pass
    assert "no_such_db" in str(refused.value) and "s3cret-pw" not in str(refused.value)
    assert "s3cret-pw" not in refused.value.url


async def test_a_store_of_an_unknown_schema_version_is_refused(pg_url: str) -> None:
    """K5: a schema version this ctxrt doesn't read is refused with StoreFormatError; nothing written."""
    async with ctxrt.open_runtime(pg_url):
        pass
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE ctxrt_meta SET value = 99 WHERE key = 'format'")
    with pytest.raises(ctxrt.StoreFormatError, match="schema 99"):
        async with ctxrt.open_runtime(pg_url):
            pass


async def test_a_read_only_runtime_on_an_empty_database_creates_nothing(pg_url: str) -> None:
    """A read-only open of a database without a store refuses it and leaves no table behind."""
    with pytest.raises(ctxrt.StoreFormatError, match="no ctxrt store"):
        async with ctxrt.open_runtime(pg_url, readonly=True):
            pass
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT to_regclass('ctxrt_meta')").fetchone() == (None,)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ctxrt", *args], capture_output=True, text=True, timeout=120,
                          check=False)


async def test_verify_and_the_read_only_commands_work_on_a_url(pg_url: str) -> None:
    """ctxrt verify reports a sound store sound and a damaged head damaged, naming it; inspect and
    messages read a URL."""
    async with ctxrt.open_runtime(pg_url) as rt:
        manager = await rt.open("ann")
        for n in range(3):
            await manager.add_message("user", f"line {n}")
    sound = await trio.to_thread.run_sync(cli, "verify", pg_url)
    assert sound.returncode == 0 and ": sound" in sound.stdout, sound.stdout + sound.stderr
    listed = await trio.to_thread.run_sync(cli, "messages", pg_url)
    assert listed.returncode == 0 and "line 2" in listed.stdout, listed.stderr
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE ctxrt_heads SET head = '\\x00'::bytea")
    damaged = await trio.to_thread.run_sync(cli, "verify", pg_url)
    assert damaged.returncode == 1 and "head" in damaged.stdout, damaged.stdout + damaged.stderr


async def test_a_compile_on_a_shared_store_asks_for_each_head_once(pg_url: str) -> None:
    """S3 on a shared store: a cold compile of a long slot, and a second namespace's, read the slot's
    head once each (reads without an await between them are one snapshot), not once per message."""
    async with ctxrt.open_runtime(pg_url, durability="os") as rt:
        writer = await rt.open("writer")
        async with trio.open_nursery() as nursery:
            for n in range(300):
                nursery.start_soon(writer.add_message, "user", f"line {n}")
    async with ctxrt.open_runtime(pg_url) as rt:
        for namespace in ("first", "second"):
            manager = await rt.open(namespace)
            before = (await manager.inspect()).caches[0].looks
            compiled = await manager.compile()
            assert len(compiled.messages) == 300
            looks = (await manager.inspect()).caches[0].looks - before
            assert looks == 1, looks


@pytest.mark.parametrize("foreign", [
    "CREATE TABLE ctxrt_items (id integer)",
    "CREATE TABLE ctxrt_meta (name text)",
    "CREATE TABLE ctxrt_meta (key text, value bigint); INSERT INTO ctxrt_meta VALUES ('format', 1)",
])
async def test_a_database_with_foreign_ctxrt_tables_is_refused_as_not_a_store(pg_url: str, foreign: str) -> None:
    """K7 on PostgreSQL: tables named like ctxrt's that aren't a ctxrt store are StoreFormatError,
    not a connection problem; nothing is added to them."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(foreign)
        before = conn.execute("SELECT count(*) FROM pg_tables WHERE tablename LIKE 'ctxrt_%'").fetchone()
    with pytest.raises(ctxrt.StoreFormatError):
        async with ctxrt.open_runtime(pg_url):
            pass
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE tablename LIKE 'ctxrt_%'").fetchone() == before


async def test_a_write_after_the_server_dropped_idle_connections_succeeds(pg_url: str) -> None:
    """A connection the server dropped while idle (a restart, an administrator) is made again: the
    next write and read succeed, and nothing is lost."""
    async with ctxrt.open_runtime(pg_url) as rt:
        manager = await rt.open("ann")
        first = await manager.add_message("user", "before")
        with psycopg.connect(pg_url, autocommit=True) as conn:
            dropped = conn.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                                   " WHERE datname = current_database() AND pid <> pg_backend_pid()").fetchone()
        assert dropped is not None and dropped[0] >= 2  # the runtime's reading and writing connections
        second = await manager.add_message("user", "after")
        assert await manager.message_count() == 2 and int(second) > int(first)


async def test_a_namespace_whose_strategy_keeps_memory_is_served_by_one_process_at_a_time(pg_url: str) -> None:
    """Autobiographical keeps its summaries in its actor: while one runtime serves the namespace with
    it, another runtime's open with it is ConfigConflictError (nothing changes); once the first one
    closes the namespace, the other may serve it. A strategy that keeps nothing opens anywhere."""
    async with ctxrt.open_runtime(pg_url) as first, ctxrt.open_runtime(pg_url) as second:
        holder = await first.open("agents/a", strategy=ctxrt.Autobiographical("claude-haiku-4-5"))
        with pytest.raises(ctxrt.ConfigConflictError, match="another process"):
            await second.open("agents/a", strategy=ctxrt.Autobiographical("claude-haiku-4-5"))
        await second.open("agents/b", strategy=ctxrt.Autobiographical("claude-haiku-4-5"))  # another namespace: its own lease
        passthrough = await second.open("agents/a")  # keeps no memory: served here too
        await passthrough.aclose()
        await holder.aclose()  # the first runtime's actor stops and gives the lease back
        taken = await second.open("agents/a", strategy=ctxrt.Autobiographical("claude-haiku-4-5"))
        assert (await taken.compile()).messages == []


async def test_reads_on_a_branch_another_runtime_deleted_raise_branch_not_found(pg_url: str) -> None:
    """L5 across processes: once another runtime deletes the branch, this runtime's managers on it
    raise BranchNotFoundError for reads too, not answers from what they last read."""
    async with ctxrt.open_runtime(pg_url) as first, ctxrt.open_runtime(pg_url) as second:
        await first.create_branch("side")
        manager = await second.open("ann", branch="side")
        await manager.add_message("user", "on the side")
        assert await manager.message_count() == 1
        await first.delete_branch("side")
        with pytest.raises(ctxrt.BranchNotFoundError):
            await manager.message_count()
        with pytest.raises(ctxrt.BranchNotFoundError):
            await manager.compile()


async def test_a_claim_by_another_runtime_refuses_this_runtimes_managers_for_no_reader(pg_url: str) -> None:
    """C8 across processes: a manager opened for no reader before another runtime claims the
    namespace is refused at its next call (it would compile what the reader's namespace holds)."""
    async with ctxrt.open_runtime(pg_url) as first, ctxrt.open_runtime(pg_url) as second:
        unclaimed = await second.open("agents/x")
        await unclaimed.add_message("user", "hello")
        assert len((await unclaimed.compile()).messages) == 1
        await first.open("agents/x", view_reader="ann")
        with pytest.raises(ctxrt.ReaderConflictError):
            await unclaimed.compile()


async def test_a_write_to_a_branch_another_runtime_deleted_is_refused_not_lost(pg_url: str) -> None:
    """L5 across processes: after another runtime deletes the branch (which moves no sequence), an
    append to it raises BranchNotFoundError; nothing is acknowledged and then lost."""
    async with ctxrt.open_runtime(pg_url) as first, ctxrt.open_runtime(pg_url) as second:
        await first.create_branch("x")
        manager = await second.open("ann", branch="x")
        await manager.add_message("user", "kept")
        await first.delete_branch("x")
        with pytest.raises(ctxrt.BranchNotFoundError):
            await manager.add_message("user", "must not be acknowledged")


async def test_branches_and_states_another_runtime_made_are_seen_by_the_next_write(pg_url: str) -> None:
    """A branch another runtime created is BranchExistsError here (not a collision in the database
    failing other writes), and two runtimes opening one new namespace at once both succeed."""
    async with ctxrt.open_runtime(pg_url) as first, ctxrt.open_runtime(pg_url) as second:
        await second.open("warm")  # second's engine has read the tables once
        await first.create_branch("x")
        with pytest.raises(ctxrt.BranchExistsError):
            await second.create_branch("x")
        opened = []

        async def open_in(rt: ctxrt.Runtime) -> None:
            opened.append(await rt.open("agents/new"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(open_in, first)
            nursery.start_soon(open_in, second)
        assert len(opened) == 2
        await opened[0].add_message("user", "hi")
        assert await opened[1].message_count() == 1


async def test_a_lease_that_lapsed_and_was_taken_over_stops_the_namespace_here(pg_url: str) -> None:
    """K12: a process's lease lapsed (its holder cut off past its expiry) and another process took the
    namespace: this process's next write for it raises ConfigConflictError instead of compressing
    beside the other (two servers of one remembering namespace)."""
    async with ctxrt.open_runtime(pg_url) as first, ctxrt.open_runtime(pg_url) as second:
        holder = await first.open("agents/a", strategy=ctxrt.Autobiographical("claude-haiku-4-5"))
        ids = [await holder.add_message("user", f"line {n}") for n in range(3)]
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("UPDATE ctxrt_leases SET expires = now() - interval '1 second'")
        taker = await second.open("agents/a", strategy=ctxrt.Autobiographical("claude-haiku-4-5"))
        with pytest.raises(ctxrt.ConfigConflictError, match="lost its lease"):
            await holder.pin_range(ids[0], ids[1])
        await taker.pin_range(ids[0], ids[1])  # the one process serving it now


@pytest.mark.parametrize("damage, finding", [
    ("SELECT setval('ctxrt_sequence', 1)", "ctxrt_sequence"),
    ("DELETE FROM ctxrt_meta WHERE key = 'next_branch'", "next_branch"),
    ("UPDATE ctxrt_states SET kind = 'x' WHERE number = 1", "kind"),
    ("DROP TABLE ctxrt_blobs", "ctxrt's tables"),
])
async def test_verify_reports_damage_that_breaks_writes(pg_url: str, damage: str, finding: str) -> None:
    """ctxrt verify names what would break the next writes (counters behind the rows, a missing
    counter, a state row the engine can't load, a dropped table): damaged, exit 1, nothing written."""
    async with ctxrt.open_runtime(pg_url) as rt:
        manager = await rt.open("ann")
        for n in range(3):
            await manager.add_message("user", f"line {n}")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(damage)
    report = await trio.to_thread.run_sync(cli, "verify", pg_url)
    assert report.returncode == 1 and finding in report.stdout, report.stdout + report.stderr


async def test_the_load_test_runs_on_a_postgres_store_and_refuses_a_used_one(pg_url: str) -> None:
    """ctxrt load-test --store URL: concurrent opens, claims, adds, compiles and ticks on a database
    pass their checks (no lost message, one claim per namespace); a database holding a store is refused."""
    first = await trio.to_thread.run_sync(cli, "load-test", "--store", pg_url, "--duration", "1", "--managers", "40",
                                          "--namespaces", "10")
    assert first.returncode == 0 and "checks passed" in first.stdout, first.stdout + first.stderr
    second = await trio.to_thread.run_sync(cli, "load-test", "--store", pg_url, "--duration", "1")
    assert second.returncode != 0 and "already holds a ctxrt store" in second.stderr


async def test_a_fork_shows_what_another_runtime_edited_before_it(pg_url: str) -> None:
    """K2 on a shared store: a fork made after another runtime's edit holds the edited message (the
    fork's cache is not seeded from this runtime's parent cache, which may be behind)."""
    async with ctxrt.open_runtime(pg_url) as first, ctxrt.open_runtime(pg_url) as second:
        mine = await first.open("ann")
        first_id = await mine.add_message("user", "original")
        assert len((await mine.compile()).messages) == 1  # this runtime's cache holds the message
        theirs = await second.open("bob")
        await theirs.edit_message(first_id, "EDITED")
        await mine.fork()  # the manager moves to the new branch
        texts = [b.text for m in (await mine.compile()).messages for b in m.content]
        assert texts == ["EDITED"]


async def test_a_role_that_is_not_a_superuser_can_make_and_use_a_store(pg_cluster, pg_url: str) -> None:
    """Hosted PostgreSQL users aren't superusers: a role that may create tables in the database
    makes the store on first open, writes and reads it."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE ROLE app LOGIN")
        conn.execute("GRANT CREATE ON SCHEMA public TO app")
    app_url = pg_url.replace("ctxrt@", "app@")
    async with ctxrt.open_runtime(app_url) as rt:
        manager = await rt.open("ann", view_reader="ann")
        await manager.add_message("user", "hello")
        assert await manager.message_count() == 1


async def test_a_password_is_never_quoted_back_in_an_error() -> None:
    """libpq quotes a malformed URL's bad token word for word; the error says neither form of the
    password (as written, percent-decoded)."""
    for url in ("postgresql://app:pa%zzs3cret@/db?host=/nowhere", "postgresql://app:s3cret%20pw@[::1/db",
                "postgresql://app@/db?host=/nowhere&password=s3cret"):
        with pytest.raises(ctxrt.StoreUnavailableError) as refused:
            async with ctxrt.open_runtime(url):
                pass
        assert "s3cret" not in str(refused.value), str(refused.value)


# A server that speaks PostgreSQL's protocol but whose advisory locks are no-ops (CockroachDB's
# answer true and lock nothing): this database's sessions find the shim's functions first.
NO_OP_LOCKS = """
CREATE SCHEMA shim;
CREATE FUNCTION shim.pg_try_advisory_xact_lock(bigint) RETURNS boolean LANGUAGE sql AS 'SELECT true';
CREATE FUNCTION shim.pg_advisory_xact_lock(bigint) RETURNS void LANGUAGE sql AS '';
CREATE FUNCTION shim.pg_advisory_xact_lock_shared(bigint) RETURNS void LANGUAGE sql AS '';
"""


def without_advisory_locks(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in NO_OP_LOCKS.split(";"):
            if statement.strip():
                conn.execute(statement)
        name = conn.execute("SELECT current_database()").fetchone()
        assert name is not None
        conn.execute(psycopg.sql.SQL("ALTER DATABASE {} SET search_path = shim, pg_catalog").format(
            psycopg.sql.Identifier(name[0])))


def test_the_lease_probe_tells_locks_that_exclude_from_locks_that_do_not(pg_url: str) -> None:
    """K8: on PostgreSQL a transaction lock one session holds keeps another out; one session taking its
    own lock again, or two sessions of a server whose locks are no-ops, prove nothing is kept out.
    The probe leaves no lock behind."""
    with psycopg.connect(pg_url, autocommit=True) as first, psycopg.connect(pg_url, autocommit=True) as second:
        assert advisory_locks_exclude(first, second)
        assert not advisory_locks_exclude(first, first)
        assert second.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").fetchone() == (0,)
    without_advisory_locks(pg_url)
    with psycopg.connect(pg_url, autocommit=True) as first, psycopg.connect(pg_url, autocommit=True) as second:
        assert not advisory_locks_exclude(first, second)


async def test_a_server_whose_advisory_locks_exclude_no_one_is_refused_at_open(pg_url: str) -> None:
    """K8: a writer's open of a database whose advisory locks are no-ops (two processes would write one
    slot at once) raises StoreUnsupportedError naming the server, and writes nothing."""
    without_advisory_locks(pg_url)
    with pytest.raises(ctxrt.StoreUnsupportedError, match="advisory locks don't exclude") as refused:
        async with ctxrt.open_runtime(pg_url):
            pass
    assert "PostgreSQL" in refused.value.reason  # the server's version(), as it names itself
    assert refused.value.url == pg_url  # it holds no password to hide
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE tablename LIKE 'ctxrt_%'").fetchone() == (0,)


async def test_an_append_batch_waits_for_the_server_once_before_its_commit(
    pg_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """K16: a durable append's batch is two round trips on the writing connection: its slot's lock,
    head and sequence in one (a single Sync: the sequence drawn with the lock is answered with the
    head's read sent after it), then its rows and the commit."""
    async with ctxrt.open_runtime(pg_url, durability="sync") as rt:
        manager = await rt.open("ann", isolate=True)
        await manager.add_message("user", "warm-up")  # the tables read, the slot's state registered
        syncs = 0
        sync = psycopg.Pipeline.sync

        def counted(pipeline: psycopg.Pipeline) -> None:
            nonlocal syncs
            syncs += 1
            sync(pipeline)

        monkeypatch.setattr(psycopg.Pipeline, "sync", counted)
        before = rt.statistics().batches
        for n in range(5):
            await manager.add_message("user", f"line {n}")
        assert rt.statistics().batches - before == 5
        assert syncs == 5


async def test_runtimes_making_their_first_appends_at_once_meet_no_lock_cycle(
    pg_url: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """K10: a log's first append registers its index marker, a change of the store's tables: runtimes
    making theirs at once take the catalog lock in turn from the start, so none waits for the server
    to break a lock cycle (a second each, and a warning from the driver) and every append lands."""
    runtimes = 6
    async with ctxrt.open_runtime(pg_url) as first:  # the store made before the race
        await (await first.open("made")).add_message("user", "made")
    caplog.set_level("INFO")
    go = trio.Event()
    landed: list[int] = []

    async def writer(number: int) -> None:
        async with ctxrt.open_runtime(pg_url) as rt:
            manager = await rt.open(f"writer-{number}", isolate=True)
            await go.wait()
            await manager.add_message("user", f"first of {number}")
            landed.append(await manager.message_count())

    for round_ in range(3):
        go = trio.Event()
        async with trio.open_nursery() as nursery:
            for number in range(runtimes):
                nursery.start_soon(writer, round_ * runtimes + number)
            await trio.testing.wait_all_tasks_blocked()
            go.set()
    assert landed == [1] * (3 * runtimes)
    cycles = [r.getMessage() for r in caplog.records if "lock cycle" in r.getMessage() or "terminating" in r.getMessage()]
    assert cycles == []


async def test_appends_keep_landing_around_batches_that_roll_a_refused_command_back(pg_url: str) -> None:
    """K16, R1: a runtime's batches of appends (server-side prepared statements on a direct
    connection) keep landing, in order, between its batches that roll a refused command back to its
    savepoint in their pipeline (a branch made under a name taken), alone or several at once."""
    async with ctxrt.open_runtime(pg_url, durability="sync") as rt:
        writer = await rt.open("writer", isolate=True)
        ids = []
        for turn in range(4):
            ids += [await writer.add_message("user", f"line {turn}.{n}") for n in range(3)]
            with pytest.raises(ctxrt.BranchExistsError):
                await rt.create_branch("main")
        async with trio.open_nursery() as nursery:
            for n in range(6):
                nursery.start_soon(writer.add_message, "user", f"together {n}")
        assert ids == sorted(ids, key=int)
        assert await writer.message_count() == 18


async def test_an_append_cancelled_while_its_batch_is_on_the_server_is_stored(pg_url: str) -> None:
    """M1, L4: a lone append hands its batch to the commit thread from its own task; cancelled
    while the batch is out, the message is still stored, and the next append lands after it."""
    async with ctxrt.open_runtime(pg_url, durability="sync") as rt:
        manager = await rt.open("ann", isolate=True)
        first = await manager.add_message("user", "first")
        async with trio.open_nursery() as nursery:
            scope = trio.CancelScope()

            async def append() -> None:
                with scope:
                    await manager.add_message("user", "cancelled while out")

            nursery.start_soon(append)
            await trio.testing.wait_all_tasks_blocked()  # its batch is on the thread
            scope.cancel()
        last = await manager.add_message("user", "last")
        texts = [m.content[0].text for m in await manager.get_all_messages()]
        assert texts == ["first", "cancelled while out", "last"] and int(first) < int(last)


async def test_an_append_batch_whose_session_forgot_its_prepared_statements_runs_again(pg_url: str) -> None:
    """K16: a batch of appends running on server-side prepared statements its session no longer
    holds (reset by ``DISCARD ALL``, as a pooler resetting a server connection does) runs again on
    a new connection: every append lands, and no "prepared statement does not exist" reaches the host."""
    async with ctxrt.open_runtime(pg_url, durability="sync") as rt:
        writer = await rt.open("writer", isolate=True)
        ids = [await writer.add_message("user", f"line {n}") for n in range(4)]  # prepared from the second
        for turn in range(3):
            reset_writer_session(rt.engine)  # between batches, unknown to the driver's statement names
            ids += [await writer.add_message("user", f"after reset {turn}.{n}") for n in range(2)]
        assert ids == sorted(ids, key=int)
        assert await writer.message_count() == 10


async def test_an_append_refused_as_unavailable_mid_batch_says_whether_it_may_have_landed(pg_url: str) -> None:
    """K16, M1: the server dropping the writer's connection while appends are in flight (its
    backend terminated, again and again): each append acknowledged is stored, and each refused
    with ``StoreUnavailableError`` either says its batch may have committed or left nothing. Once
    "cannot exit pipeline mode while busy" (the connection dropped after the COMMIT went out)
    reached the host as if nothing were written, its message stored."""
    acked: list[tuple[str, str]] = []
    refused: list[tuple[str, str]] = []
    async with ctxrt.open_runtime(pg_url) as rt:
        managers = [await rt.open(f"writer-{n}", isolate=True) for n in range(3)]
        stop = trio.Event()
        answered = [trio.Event()]  # set by the next append answered, acknowledged or refused

        async def append(manager: ctxrt.ContextManager, tag: str) -> None:
            for number in itertools.count():
                if stop.is_set():
                    return
                text = f"{tag} {number}"
                try:
                    acked.append((text, await manager.add_message("user", text)))
                except ctxrt.StoreUnavailableError as exc:
                    refused.append((text, str(exc)))
                answered[0].set()

        def terminate() -> None:
            with psycopg.connect(pg_url, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                              " WHERE datname = current_database() AND pid <> pg_backend_pid()")

        async with trio.open_nursery() as nursery:
            for n, manager in enumerate(managers):
                nursery.start_soon(append, manager, f"writer {n}")
            for _ in range(40):
                await trio.to_thread.run_sync(terminate)
                answered[0] = trio.Event()
                await answered[0].wait()  # appends go on between the outages
            stop.set()
        stored = {m.content[0].text: m.id for manager in managers for m in await manager.get_all_messages()}
    assert all(stored.get(text) == message_id for text, message_id in acked)
    assert refused, "no append met an outage"
    silent = [(text, why) for text, why in refused if text in stored and "whether it committed is unknown" not in why]
    assert silent == []
