"""The sync engine against a simple in-memory model (K1, K2), with hypothesis' stateful testing.

Determinism: real LMDB in a temp dir, no event loop (the engine is sync); hypothesis shrinks a
failing run to its shortest program.
"""

import json
import shutil
import tempfile

import attrs
import hypothesis
import hypothesis.strategies as st
import lmdb
import pytest
from hypothesis import settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from support import PostgresSchema

from ctxrt.errors import (
    BranchExistsError,
    BranchNotFoundError,
    MalformedContentError,
    MessageNotFoundError,
    NarrowingRefusedError,
    StateKindError,
    UnknownStateError,
    ValueConflictError,
)
from ctxrt.testing import (
    AppendItem,
    BranchRow,
    CreateBranch,
    DeleteBranch,
    EditItem,
    RegisterState,
    RemoveItems,
    SetValue,
    StateInfo,
    execute,
    seals,
)
from ctxrt.store.engine import Engine
from ctxrt.store.postgres import PostgresEngine

LOGS = ("messages", "ns/context")
VALUES = ("ns/reader",)


def open_engine(path):
    env = lmdb.open(path, map_size=1 << 28, max_dbs=10, sync=False)
    return env, Engine(env, readonly=False)


def run(engine, *commands):
    """Apply ``commands`` in one batch; return the first result, raising its error."""
    results, _ = engine.apply(list(commands), execute)
    ok, value = results[0]
    if not ok:
        raise value
    return value


class Model:
    """Every write with its sequence and branch; a view replays what its lineage sees."""

    def __init__(self):
        self.sequence = 0
        self.branches = {"main": []}  # name -> lineage [(ancestor, limit)]
        self.writes = []  # (seq, branch, state, op, args)

    def levels(self, branch, at=None):
        limit = float("inf") if at is None else at
        return [(branch, limit)] + [(name, min(limit, bound)) for name, bound in self.branches[branch]]

    def visible(self, branch, at=None):
        levels = dict(self.levels(branch, at))
        return [w for w in self.writes if w[1] in levels and w[0] <= levels[w[1]]]

    def log(self, state, branch, at=None):
        items = []  # [seq, data]
        for seq, _, name, op, args in self.visible(branch, at):
            if name != state:
                continue
            if op == "append":
                items.append([seq, args])
            elif op == "edit":
                for item in items:
                    if item[0] == args[0]:
                        item[1] = args[1]
            elif op == "remove":
                items = [item for item in items if not args[0] <= item[0] <= args[1]]
        return [tuple(item) for item in items]

    def value(self, state, branch, at=None):
        values = [args for _, _, name, op, args in self.visible(branch, at) if name == state and op == "set"]
        return values[-1] if values else None

    def write(self, branch, state, op, args):
        self.sequence += 1
        self.writes.append((self.sequence, branch, state, op, args))
        return self.sequence


payloads = st.binary(min_size=0, max_size=40)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=10),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=8,
)


class EngineMachine(RuleBasedStateMachine):
    """The LMDB engine against the model (``PostgresEngineMachine`` runs the same rules on PostgreSQL)."""

    def make_engine(self):
        self.directory = tempfile.mkdtemp(prefix="ctxrt-engine-")
        self.env, self.engine = open_engine(self.directory)

    def close_engine(self):
        self.env.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    @initialize()
    def open(self):
        self.make_engine()
        for name in LOGS:
            run(self.engine, RegisterState(name=name, kind="log"))
        for name in VALUES:
            run(self.engine, RegisterState(name=name, kind="value"))
        self.model = Model()

    def teardown(self):
        if hasattr(self, "engine"):
            self.close_engine()

    def branch_names(self):
        return sorted(self.model.branches)

    @rule(data=st.data(), payload=payloads)
    def append(self, data, payload):
        branch = data.draw(st.sampled_from(self.branch_names()))
        state = data.draw(st.sampled_from(LOGS))
        result = run(self.engine, AppendItem(state=state, branch=branch, data=payload))
        assert result.sequence == self.model.write(branch, state, "append", payload)

    @rule(data=st.data(), payload=payloads)
    def edit(self, data, payload):
        branch = data.draw(st.sampled_from(self.branch_names()))
        state = data.draw(st.sampled_from(LOGS))
        items = self.model.log(state, branch)
        if not items:
            with pytest.raises(MessageNotFoundError):
                run(self.engine, EditItem(state=state, branch=branch, item_sequence=self.model.sequence + 1, data=b""))
            return
        target = data.draw(st.sampled_from(items))[0]
        run(self.engine, EditItem(state=state, branch=branch, item_sequence=target, data=payload))
        self.model.write(branch, state, "edit", (target, payload))

    @rule(data=st.data())
    def remove(self, data):
        branch = data.draw(st.sampled_from(self.branch_names()))
        state = data.draw(st.sampled_from(LOGS))
        items = self.model.log(state, branch)
        if not items:
            return
        first = data.draw(st.integers(0, len(items) - 1))
        last = data.draw(st.integers(first, min(len(items) - 1, first + 4)))
        result = run(
            self.engine,
            RemoveItems(state=state, branch=branch, from_sequence=items[first][0], to_sequence=items[last][0]),
        )
        assert result.count == last - first + 1
        self.model.write(branch, state, "remove", (items[first][0], items[last][0]))

    @rule(data=st.data(), value=json_values)
    def set_value(self, data, value):
        branch = data.draw(st.sampled_from(self.branch_names()))
        run(self.engine, SetValue(state=VALUES[0], branch=branch, value=value))
        self.model.write(branch, VALUES[0], "set", value)

    @precondition(lambda self: len(self.model.branches) < 6)
    @rule(data=st.data())
    def create_branch(self, data):
        parent = data.draw(st.sampled_from(self.branch_names()))
        at = data.draw(st.none() | st.integers(0, self.model.sequence))
        name = f"b{len(self.model.branches)}"
        row = run(self.engine, CreateBranch(name=name, from_branch=parent, at_sequence=at))
        fork = self.model.sequence if at is None else at
        assert row.fork_sequence == fork
        self.model.branches[name] = [(parent, fork)] + [(a, min(fork, b)) for a, b in self.model.branches[parent]]

    @rule(data=st.data())
    def read_the_past(self, data):
        """K1, K2: a read at any past sequence sees exactly what the model held then."""
        branch = data.draw(st.sampled_from(self.branch_names()))
        at = data.draw(st.integers(0, self.model.sequence))
        row = self.engine.branch(branch)
        for state in LOGS:
            expected = self.model.log(state, branch, at)
            got = [(i.sequence, bytes(i.data)) for i in self.engine.read_items(state, row.id, at=at)]
            assert got == expected
            if expected:
                index = data.draw(st.integers(0, len(expected) - 1))
                [item] = self.engine.read_items(state, row.id, at=at, start=index, stop=index + 1)
                assert (item.sequence, item.data) == expected[index]
                found = self.engine.read_item(state, row.id, expected[index][0], at=at)
                assert (found.sequence, found.data) == expected[index]
        assert self.engine.read_value(VALUES[0], row.id, at=at) == self.model.value(VALUES[0], branch, at)

    @rule(data=st.data())
    def refuse_bad_writes_and_change_nothing(self, data):
        """Bad input: each a clear error, the store unchanged."""
        before = self.engine.last_sequence
        branch = data.draw(st.sampled_from(self.branch_names()))
        bad = data.draw(
            st.sampled_from(
                [
                    (AppendItem(state="unregistered", branch=branch, data=b""), UnknownStateError, "unregistered"),
                    (AppendItem(state=LOGS[0], branch="no-such-branch", data=b""), BranchNotFoundError, "no-such"),
                    (AppendItem(state=VALUES[0], branch=branch, data=b""), StateKindError, VALUES[0]),
                    (SetValue(state=VALUES[0], branch=branch, value={1, 2}), MalformedContentError, "JSON"),
                    (SetValue(state=VALUES[0], branch=branch, value="\ud800"), MalformedContentError, "UTF-8"),
                    (CreateBranch(name=branch, from_branch="main"), BranchExistsError, branch),
                ]
            )
        )
        command, error, text = bad
        with pytest.raises(error, match=text):
            run(self.engine, command)
        assert self.engine.last_sequence == before

    @invariant()
    def heads_agree_with_the_model(self):
        if not hasattr(self, "model"):
            return
        for branch in self.model.branches:
            row = self.engine.branch(branch)
            for state in LOGS:
                expected = self.model.log(state, branch)
                assert self.engine.read_head(state, row.id).length == len(expected)
                for sequence, payload in expected[:3]:
                    found = self.engine.read_item(state, row.id, sequence)
                    assert (found.sequence, found.data) == (sequence, payload)


EngineMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
test_engine_matches_the_model = EngineMachine.TestCase


def test_a_bad_command_fails_alone_in_its_batch(tmp_path):
    """K6: one caller's bad command never fails the others committed in the same transaction."""
    env, engine = open_engine(str(tmp_path))
    run(engine, RegisterState(name="messages", kind="log"))
    results, operations = engine.apply(
        [
            AppendItem(state="messages", branch="main", data=b"a"),
            AppendItem(state="missing", branch="main", data=b"b"),
            AppendItem(state="messages", branch="main", data=b"c"),
        ],
        execute,
    )
    assert [ok for ok, _ in results] == [True, False, True]
    assert isinstance(results[1][1], UnknownStateError)
    with engine.reader() as txn:
        assert [i.data for i in engine.log_items(txn, "messages", engine.branch("main"))] == [b"a", b"c"]
    assert [op.sequence for op in operations] == [1, 2]  # the refused command took no sequence
    env.close()


def test_branch_creation_costs_one_row_whatever_the_slot_size(tmp_path):
    """K2: creating a branch writes only the branch row and its name, never a copy of items."""
    env, engine = open_engine(str(tmp_path))
    run(engine, RegisterState(name="messages", kind="log"))
    engine.apply([AppendItem(state="messages", branch="main", data=b"x" * 50) for _ in range(500)], execute)
    def entries():
        with env.begin() as txn:
            return {name: txn.stat(db)["entries"] for name, db in engine.dbs.items()}

    entries_before = entries()
    run(engine, CreateBranch(name="child", from_branch="main"))
    entries_after = entries()
    grew = {name.decode(): entries_after[name] - entries_before[name] for name in entries_before}
    assert grew == {"meta": 0, "branches": 1, "branch_names": 1, "states": 0, "items": 0, "blobs": 0}
    env.close()


def test_a_deleted_branchs_log_heads_are_forgotten_by_the_writer(tmp_path):
    """K2, L5: the writer's cached log heads keep none of a deleted branch's: a host forking,
    writing and deleting branches for a long run holds heads of its live branches only."""
    env, engine = open_engine(str(tmp_path))
    run(engine, RegisterState(name="messages", kind="log"))
    run(engine, AppendItem(state="messages", branch="main", data=b"x"))
    for n in range(20):
        run(engine, CreateBranch(name=f"fork-{n}", from_branch="main"))
        run(engine, AppendItem(state="messages", branch=f"fork-{n}", data=b"y"))
        run(engine, DeleteBranch(name=f"fork-{n}"))
    live = {row.id for row in engine.known_branches.values() if not row.deleted}
    assert {branch for _, branch in engine.known_heads} == live == {engine.branch("main").id}
    env.close()


def test_a_reopened_engine_reads_what_was_committed(tmp_path):
    """K1: states, branches, items and the sequence survive closing and reopening the environment."""
    env, engine = open_engine(str(tmp_path))
    run(engine, RegisterState(name="messages", kind="log"))
    run(engine, AppendItem(state="messages", branch="main", data=json.dumps({"n": 1}).encode()))
    run(engine, CreateBranch(name="side", from_branch="main"))
    env.close()
    env, engine = open_engine(str(tmp_path))
    assert engine.last_sequence == 1
    assert [row.name for row in engine.list_branches()] == ["main", "side"]
    with engine.reader() as txn:
        assert [json.loads(i.data) for i in engine.log_items(txn, "messages", engine.branch("side"))] == [{"n": 1}]
    env.close()


# -- unnested appends (Engine.apply's ``unnested``): the same outcome as nesting every command ----


def _dump(env):
    """Every row, a branch row without its creation time."""
    with env.begin() as txn:
        rows = {name: list(txn.cursor(db=env.open_db(name, txn=txn, create=False)))
                for name in (b"meta", b"branches", b"branch_names", b"states", b"items", b"blobs")}
    assert all(seals.intact(key, value) for table in rows.values() for key, value in table)
    rows[b"branches"] = [(key, {**json.loads(value[: -seals.SIZE]), "created_ms": 0}) for key, value in rows[b"branches"]]
    return rows


def _outcome(results):
    def same(value):
        return attrs.evolve(value, created_ms=0) if isinstance(value, BranchRow) else value
    return [(ok, same(value) if ok else (type(value), str(value))) for ok, value in results]


_batch_commands = st.lists(
    st.one_of(
        st.builds(AppendItem, state=st.sampled_from(("messages", "ns/context", "ghost", "ns/reader")),
                  branch=st.sampled_from(("main", "side", "nowhere")), data=st.binary(max_size=40),
                  flagged=st.booleans()),
        st.builds(EditItem, state=st.sampled_from(LOGS), branch=st.sampled_from(("main", "side")),
                  item_sequence=st.integers(1, 5), data=st.binary(max_size=20)),
        st.builds(RemoveItems, state=st.sampled_from(LOGS), branch=st.sampled_from(("main", "side")),
                  from_sequence=st.integers(1, 5), to_sequence=st.integers(1, 6)),
        st.builds(SetValue, state=st.sampled_from(VALUES), branch=st.just("main"), value=st.integers()),
        st.builds(CreateBranch, name=st.sampled_from(("side", "twig")), from_branch=st.just("main")),
    ),
    min_size=2, max_size=8,
)


@settings(max_examples=60, deadline=None)
@hypothesis.given(first=_batch_commands, second=_batch_commands)
def test_unnested_appends_commit_what_nested_ones_do(first, second):
    """A batch whose appends run unnested, their heads written once, answers every command and stores
    every row exactly as the same batch with every command nested (K6)."""
    from ctxrt.store.actor import runs_unnested

    outcomes = []
    for unnested in (None, runs_unnested):
        with tempfile.TemporaryDirectory() as path:
            env, engine = open_engine(path)
            run(engine, *[RegisterState(name=name, kind="log") for name in LOGS])
            run(engine, RegisterState(name=VALUES[0], kind="value"))
            run(engine, AppendItem(state="messages", branch="main", data=b"seed"))
            run(engine, CreateBranch(name="side", from_branch="main"))
            batches = [_outcome(engine.apply(batch, execute, unnested)[0]) for batch in (first, second)]
            with engine.reader() as txn:
                logs = {(state, name): [(i.sequence, i.data) for i in engine.log_items(txn, state, engine.branch(name))]
                        for state in LOGS for name in ("main", "side") if name in engine.known_branch_ids}
            outcomes.append((batches, logs, _dump(env), engine.last_sequence))
            env.close()
    assert outcomes[0] == outcomes[1]


def test_an_unnested_command_that_fails_after_writing_fails_alone(tmp_path):
    """Should an unnested command raise after it began writing, the batch is run again nested: that
    command alone is refused and leaves nothing, the others commit (K6)."""
    from ctxrt.store.actor import runs_unnested

    env, engine = open_engine(str(tmp_path))
    run(engine, RegisterState(name="messages", kind="log"))
    calls = []

    def breaking(batch, command):
        calls.append(command.data)
        value = execute(batch, command)
        if command.data == b"breaks":
            raise ValueError("broke after writing")
        return value

    commands = [AppendItem(state="messages", branch="main", data=data) for data in (b"a", b"breaks", b"c")]
    results, operations = engine.apply(commands, breaking, runs_unnested)
    assert calls == [b"a", b"breaks", b"a", b"breaks", b"c"]  # begun again, nested, from the start
    assert [ok for ok, _ in results] == [True, False, True]
    assert str(results[1][1]) == "broke after writing"
    with engine.reader() as txn:
        assert [i.data for i in engine.log_items(txn, "messages", engine.branch("main"))] == [b"a", b"c"]
        assert engine.log_head(txn, "messages", engine.branch("main")).length == 2
    assert [op.sequence for op in operations] == [1, 2]
    env.close()


class PostgresEngineMachine(EngineMachine):
    """The same rules on the PostgreSQL engine: each example in a schema of its own."""

    def __init__(self, url):
        super().__init__()
        self.url = url

    def make_engine(self):
        self.schema = PostgresSchema(self.url)
        self.engine = PostgresEngine(self.schema.url)

    def close_engine(self):
        self.engine.close()
        self.schema.drop()


@pytest.mark.soak  # the first 10 examples run every rule; make soak runs 100
def test_the_postgres_engine_matches_the_model(pg_url, soak_scale):
    """K1, K2 on PostgreSQL: the engine model test, run against the second engine."""
    run_state_machine_as_test(lambda: PostgresEngineMachine(pg_url),
                              settings=settings(max_examples=soak_scale(10, 100), stateful_step_count=30, deadline=None))


def _logs(engine):
    names = [row.name for row in engine.list_branches()]
    return {(state, name): [(i.sequence, bytes(i.data)) for i in engine.read_log(state, engine.branch(name).id)]
            for state in LOGS for name in names}


@pytest.mark.soak  # make soak: 200 pairs of batches
def test_the_postgres_engine_answers_batches_as_lmdb_does(pg_url, soak_scale):
    """The same random batches (refusals among them, appends unnested) give the same answers, the
    same operations and the same logs on both engines (K1, K6: a refused command fails alone)."""
    from ctxrt.store.actor import runs_unnested

    @settings(max_examples=soak_scale(12, 200), deadline=None)
    @hypothesis.given(first=_batch_commands, second=_batch_commands)
    def same_on_both(first, second):
        machine = PostgresEngineMachine(pg_url)
        machine.make_engine()
        postgres = machine.engine
        outcomes = []
        with tempfile.TemporaryDirectory() as path:
            env, lmdb_engine = open_engine(path)
            for engine in (lmdb_engine, postgres):
                run(engine, *[RegisterState(name=name, kind="log") for name in LOGS])
                run(engine, RegisterState(name=VALUES[0], kind="value"))
                run(engine, AppendItem(state="messages", branch="main", data=b"seed"))
                run(engine, CreateBranch(name="side", from_branch="main"))
                answers, operations = [], []
                for batch in (first, second):
                    results, ops = engine.apply(batch, execute, runs_unnested)
                    answers.append(_outcome(results))
                    operations.append([attrs.evolve(op, row=attrs.evolve(op.row, created_ms=0)) if hasattr(op, "row")
                                       else op for op in ops])
                outcomes.append((answers, operations, _logs(engine), engine.last_sequence,
                                 engine.read_value(VALUES[0], 1)))
            env.close()
        machine.close_engine()
        assert outcomes[0] == outcomes[1]

    same_on_both()


@pytest.fixture(params=["lmdb", "postgres"])
def any_engine(request, tmp_path):
    """An empty engine of either kind."""
    if request.param == "lmdb":
        env, engine = open_engine(str(tmp_path))
        yield engine
        env.close()
        return
    machine = PostgresEngineMachine(request.getfixturevalue("pg_url"))
    machine.make_engine()
    yield machine.engine
    machine.close_engine()


def test_a_narrowing_edit_is_refused_in_its_transaction_once_the_floor_reaches_the_item(any_engine):
    """D2 decided in the write: an edit naming the floor state is refused if that floor has reached
    the item (another process's actor may have raised it after the edit was checked), and changes
    nothing; below the floor, or with no floor yet, it goes through."""
    engine = any_engine
    run(engine, RegisterState(name="messages", kind="log"), RegisterState(name="ns/floor", kind="value"))
    first = run(engine, AppendItem(state="messages", branch="main", data=b"one")).sequence
    second = run(engine, AppendItem(state="messages", branch="main", data=b"two")).sequence
    guarded = dict(state="messages", branch="main", floor_state="ns/floor")
    run(engine, EditItem(item_sequence=first, data=b"one, narrowed", **guarded))  # no floor yet
    run(engine, SetValue(state="ns/floor", branch="main", value=first))
    before = engine.last_sequence
    with pytest.raises(NarrowingRefusedError, match="narrowing floor"):
        run(engine, EditItem(item_sequence=first, data=b"again", **guarded))
    assert engine.last_sequence == before
    run(engine, EditItem(item_sequence=second, data=b"two, narrowed", **guarded))  # past the floor
    assert [i.data for i in engine.read_log("messages", 1)] == [b"one, narrowed", b"two, narrowed"]


def test_a_conditional_value_write_and_a_rising_floor_are_decided_in_the_transaction(any_engine):
    """C1, D4 decided in the write: SetValue(expect=) refuses when another value is stored
    (ValueConflictError, nothing written); SetValue(rising=True) never lowers a stored integer."""
    engine = any_engine
    run(engine, RegisterState(name="ns/reader", kind="value"), RegisterState(name="ns/floor", kind="value"))
    run(engine, SetValue(state="ns/reader", branch="main", value="ann", expect=None))
    before = engine.last_sequence
    with pytest.raises(ValueConflictError):
        run(engine, SetValue(state="ns/reader", branch="main", value="bob", expect=None))
    assert engine.last_sequence == before and engine.read_value("ns/reader", 1) == "ann"
    run(engine, SetValue(state="ns/floor", branch="main", value=40, rising=True))
    run(engine, SetValue(state="ns/floor", branch="main", value=12, rising=True))
    assert engine.read_value("ns/floor", 1) == 40


def test_an_edit_judged_against_an_older_version_is_refused_in_its_transaction(any_engine):
    """D1, D5 decided in the write: EditItem(expect_version=) goes through only onto the version it
    names (the item's append, or its latest edit, in the same batch too, on a child branch too), and a
    stale one is refused (ValueConflictError) with nothing written."""
    engine = any_engine
    run(engine, RegisterState(name="messages", kind="log"))
    first = run(engine, AppendItem(state="messages", branch="main", data=b"one")).sequence
    edited = run(engine, EditItem(state="messages", branch="main", item_sequence=first, data=b"one, edited",
                                  expect_version=first)).sequence
    before = engine.last_sequence
    with pytest.raises(ValueConflictError, match=f"was edited \\(at sequence {edited}\\)"):
        run(engine, EditItem(state="messages", branch="main", item_sequence=first, data=b"stale", expect_version=first))
    assert engine.last_sequence == before
    # Two edits in one batch: the second sees the first's version.
    results, _ = engine.apply([
        EditItem(state="messages", branch="main", item_sequence=first, data=b"again", expect_version=edited),
        EditItem(state="messages", branch="main", item_sequence=first, data=b"stale too", expect_version=edited),
    ], execute)
    assert results[0][0] and not results[1][0] and isinstance(results[1][1], ValueConflictError)
    again = results[0][1].sequence
    run(engine, CreateBranch(name="child", from_branch="main"))
    child = engine.branch("child").id
    run(engine, EditItem(state="messages", branch="child", item_sequence=first, data=b"on the child",
                         expect_version=again))  # the version it inherited
    assert [i.data for i in engine.read_log("messages", 1)] == [b"again"]
    assert [i.data for i in engine.read_log("messages", child)] == [b"on the child"]


def test_a_command_whose_row_fails_before_a_later_read_fails_alone(pg_url):
    """A command whose row the database refuses, seen only at a read later in the same command (a
    pipelined error), is refused alone; the batch's other commands commit (K6)."""
    machine = PostgresEngineMachine(pg_url)
    machine.make_engine()
    engine = machine.engine
    try:
        run(engine, RegisterState(name="messages", kind="log"))

        def breaking(batch, command):
            if command == "duplicate state":
                batch.put_state(StateInfo(99, "messages", "log"))  # a name taken: refused by the table
                batch.next_number("branch")  # a read: the refusal surfaces here, mid-command
                return "unreachable"
            return execute(batch, command)

        results, _ = engine.apply([AppendItem(state="messages", branch="main", data=b"a"), "duplicate state",
                                   AppendItem(state="messages", branch="main", data=b"b")], breaking, None)
        assert [ok for ok, _ in results] == [True, False, True]
        assert [i.data for i in engine.read_log("messages", 1)] == [b"a", b"b"]
    finally:
        machine.close_engine()
