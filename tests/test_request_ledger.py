"""The request ledger (Q1-Q8): what each namespace's reader was sent, kept as namespace state.

Each test runs on both engines where it says so (a fresh LMDB directory, or a fresh database of the
session's PostgreSQL cluster), through the public API; the compression calls are made by
``OfflineModel`` (deterministic, no network).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest
import trio

import ctxrt
import ctxrt.aio
from ctxrt import (
    Autobiographical,
    Budget,
    HeldItem,
    LedgerOffError,
    OfflineModel,
    RequestRecord,
    RequestUsage,
    Text,
    Usage,
    open_runtime,
)
from ctxrt.errors import StoreCorruptError
from ctxrt.testing import AppendItem, ScriptedModel, verify


@pytest.fixture(params=["lmdb", "postgres"])
def store(request: pytest.FixtureRequest, store_path: Path) -> Path | str:
    """An LMDB store's directory, or a PostgreSQL store's URL (a database of the test cluster)."""
    return store_path if request.param == "lmdb" else request.getfixturevalue("pg_url")


@pytest.fixture
async def rt(store: Path | str) -> AsyncIterator[ctxrt.Runtime]:
    async with open_runtime(store, durability="os") as runtime:
        yield runtime


BUDGET = Budget(max_tokens=10_000)


async def _turn(m: ctxrt.ContextManager, text: str, **kwargs: object) -> RequestRecord:
    await m.add_message("user", text)
    result = await m.compile(BUDGET)
    return await m.record_request(result, form="anthropic", options={"assistant": "Claude"}, **kwargs)  # type: ignore[arg-type]


async def test_a_record_keeps_what_the_request_held_and_reads_back(rt: ctxrt.Runtime) -> None:
    """Q1: a record names its reader, the messages it held with their versions, tokens per zone,
    the stable prefix, the body's digest, the model, usage and latency, and a digest of the reply
    (never its text); requests() reads it back equal."""
    m = await rt.open("agents/ann", view_reader="ann", ledger=True)
    first = await m.add_message("user", "hello there")
    reply = await m.add_message("Claude", "hi, ann")
    result = await m.compile(BUDGET)
    body = result.to_anthropic(assistant="Claude")
    record = await m.record_request(
        result, form="anthropic", options={"assistant": "Claude"}, model="claude-x",
        usage=Usage(120, 30, cache_read_input_tokens=100), latency_ms=812.5, response="the reply text")
    assert (record.namespace, record.branch, record.reader, record.form, record.model) == (
        "agents/ann", "main", "ann", "anthropic", "claude-x")
    assert [(h.id, h.kind) for h in record.held] == [(first, "message"), (reply, "message")]
    assert all(h.version == record.sequence for h in record.held)
    assert record.usage == RequestUsage(120, 30, 100, 0)
    assert record.latency_ms == 812.5
    assert record.total_tokens > 0 and record.total_tokens == sum(record.zone_tokens.values())
    assert record.budget == BUDGET.max_tokens
    rebuilt = await m.rebuild_request(record)
    assert rebuilt.body == body and rebuilt.matches  # the digest is the body's
    assert record.response_chars == len("the reply text") and "reply" not in (record.response or "")
    assert await m.requests() == [record]
    await m.aclose()


async def test_requests_pages_newest_first_window_and_since(rt: ctxrt.Runtime) -> None:
    """Q3: requests(limit=n) is the newest n, oldest first; since=s the first n recorded after s."""
    m = await rt.open("agents/ann", view_reader="ann", ledger=True)
    records = [await _turn(m, f"message {i}") for i in range(7)]
    assert await m.requests(limit=3) == records[-3:]
    assert await m.requests() == records
    assert await m.requests(since=records[1].sequence, limit=2) == records[2:4]
    assert await m.requests(since=records[-1].sequence) == []
    with pytest.raises(ValueError):
        await m.requests(limit=0)
    await m.aclose()


async def test_records_kept_as_what_each_turn_adds_read_back_whole(rt: ctxrt.Runtime) -> None:
    """Q1, Q3, Q5: over many turns (records kept against earlier ones, and whole now and then), with
    an edit and a second namespace's records between, every record reads back as it was made and
    rebuilds to its digest; a record waits for the next message's batch to commit."""
    m = await rt.open("agents/ann", view_reader="ann", ledger=True)
    other = await rt.open("agents/bob", view_reader="bob", ledger=True)
    made = []
    for i in range(40):
        made.append(await _turn(m, f"turn {i} of a long talk"))
        if i % 7 == 3:
            await _turn(other, f"bob's turn {i}")
        if i == 20:
            await m.edit_message(made[5].held[0].id, "the first line, edited")
    before = rt.engine.last_sequence
    last = await m.record_request(await m.compile(BUDGET), form="anthropic", options={"assistant": "Claude"})
    assert rt.engine.last_sequence == before  # no commit of its own: it waits for the next write
    made.append(last)
    assert await m.requests(limit=100) == made
    assert await m.requests(since=made[29].sequence, limit=5) == made[30:35]
    for audited in (made[3].held[0].id, made[20].held[-1].id, made[35].held[-1].id):
        assert await m.requests(holding=audited, limit=100) == [r for r in made if r.holds(audited)]
    for record in made[::9]:
        assert (await m.rebuild_request(record)).matches
    await m.aclose()
    await other.aclose()


async def test_record_request_refuses_a_namespace_without_the_ledger(rt: ctxrt.Runtime) -> None:
    """Q2: record_request on a namespace that keeps no ledger raises LedgerOffError naming
    ledger=True, and stores nothing."""
    m = await rt.open("agents/ann", view_reader="ann")
    await m.add_message("user", "hello")
    result = await m.compile(BUDGET)
    with pytest.raises(LedgerOffError, match="ledger=True"):
        await m.record_request(result, form="anthropic")
    assert await m.requests() == []
    await m.aclose()


async def test_the_ledger_switch_is_stored_and_a_reopen_without_it_keeps_it(rt: ctxrt.Runtime) -> None:
    """Q2: ledger=True is stored on the branch: a later open without it keeps recording; an open
    with ledger=False turns it off (what was recorded stays readable)."""
    m = await rt.open("agents/ann", view_reader="ann", ledger=True)
    await _turn(m, "one")
    await m.aclose()
    m = await rt.open("agents/ann")
    await _turn(m, "two")
    await m.aclose()
    m = await rt.open("agents/ann", ledger=False)
    await m.add_message("user", "three")
    with pytest.raises(LedgerOffError):
        await m.record_request(await m.compile(BUDGET), form="anthropic")
    assert len(await m.requests()) == 2
    await m.aclose()


async def test_a_manager_that_recorded_is_refused_once_another_open_turns_the_ledger_off(rt: ctxrt.Runtime) -> None:
    """Q2: a manager that recorded a request, its namespace's ledger then turned off by another
    open (the manager still open), is refused with LedgerOffError and stores nothing; turned on
    again, it records again."""
    m = await rt.open("agents/ann", view_reader="ann", ledger=True)
    await _turn(m, "one")
    off = await rt.open("agents/ann", ledger=False)
    with pytest.raises(LedgerOffError):
        await _turn(m, "two")
    on = await rt.open("agents/ann", ledger=True)
    await _turn(m, "three")
    assert len(await m.requests()) == 2
    for each in (m, off, on):
        await each.aclose()


async def test_a_result_of_another_reader_is_refused(rt: ctxrt.Runtime) -> None:
    """Q4: a record holds only what its namespace's reader could see: a result compiled for
    another namespace (another reader) is refused, naming both."""
    ann = await rt.open("agents/ann", view_reader="ann", ledger=True)
    bob = await rt.open("agents/bob", view_reader="bob", ledger=True)
    await ann.add_message("user", [Text("for ann only", audience=("ann",)), Text("for all")])
    with pytest.raises(ValueError, match="agents/ann"):
        await bob.record_request(await ann.compile(BUDGET), form="anthropic")
    assert await bob.requests() == []
    record = await bob.record_request(await bob.compile(BUDGET), form="anthropic")
    rebuilt = await bob.rebuild_request(record)
    assert "for ann only" not in str(rebuilt.body) and "for all" in str(rebuilt.body)
    await ann.aclose()
    await bob.aclose()


async def test_a_request_is_rebuilt_exactly_and_names_the_messages_edited_since(rt: ctxrt.Runtime) -> None:
    """Q5: rebuild_request makes the body again from the store, digest equal to the recorded one;
    after an edit it is still what was sent (the version as of the record), and names the edited
    message; the openai forms too."""
    m = await rt.open("agents/ann", view_reader="ann", ledger=True)
    first = await m.add_message("user", "what is the plan?")
    await m.add_message("Claude", [Text("the plan is "), Text("secret", audience=("ann",))])
    result = await m.compile(BUDGET, injections=[ctxrt.Injection("agents/ann", "system", "be brief")])
    sent = result.to_anthropic(assistant="Claude", system="you help")
    record = await m.record_request(result, form="anthropic", options={"assistant": "Claude", "system": "you help"})
    rebuilt = await m.rebuild_request(record)
    assert rebuilt.body == sent and rebuilt.matches and rebuilt.edited == ()
    chat = await m.record_request(result, form="openai_chat", options={"assistant": ["Claude"]})
    assert (await m.rebuild_request(chat)).body == result.to_openai_chat(assistant=["Claude"]).copy()
    await m.edit_message(first, "what is the new plan?")
    again = await m.rebuild_request(record)
    assert again.body == sent and again.matches and again.edited == (first,)
    await m.aclose()


async def test_a_fork_inherits_the_ledger_and_its_records_then_keeps_its_own(rt: ctxrt.Runtime) -> None:
    """Q3, R1: a fork reads its parent's records up to the fork point and only its own after;
    the ledger switch is inherited; the parent never sees the fork's."""
    m = await rt.open("agents/ann", view_reader="ann", ledger=True)
    before = await _turn(m, "one")
    await m.fork("what-if")  # m moves to the fork
    main = await rt.open("agents/ann")
    on_fork = await _turn(m, "two on the fork")
    on_main = await _turn(main, "two on main")
    assert on_fork.branch == "what-if"
    assert await m.requests() == [before, on_fork]
    assert await main.requests() == [before, on_main]
    await main.aclose()
    await m.aclose()


async def test_requests_holding_finds_every_request_that_held_a_message(rt: ctxrt.Runtime) -> None:
    """Q3: requests(holding=id) is every request that held that message, and no other."""
    m = await rt.open("agents/ann", view_reader="ann", ledger=True)
    await _turn(m, "first")
    target = await m.add_message("user", "the one to audit")
    held = [await m.record_request(await m.compile(BUDGET), form="anthropic") for _ in range(2)]
    await m.remove_message(target)
    await _turn(m, "after its removal")
    assert await m.requests(holding=target) == held
    assert await m.requests(holding=target, limit=1) == held[-1:]
    assert all(HeldItem(target, "message", r.sequence) in r.held for r in held)
    await m.aclose()


async def test_compression_calls_are_recorded_when_the_ledger_is_on(rt: ctxrt.Runtime) -> None:
    """Q6: the namespace's compression calls are kept in its ledger: form "compression", the
    messages the unit read, the model, its usage and latency; none while the ledger is off."""
    strategy = Autobiographical("model-x", target_chunk_tokens=40, recent_window_tokens=20, l1_holdback_chunks=0,
                                summary_target_tokens=50, head_window_tokens=20)
    off = await rt.open("agents/bob", view_reader="bob", model=OfflineModel(), strategy=strategy)
    on = await rt.open("agents/ann", view_reader="ann", model=OfflineModel(), strategy=strategy, ledger=True)
    for i in range(30):
        await on.add_message("user" if i % 2 else "Claude", f"message number {i} about the plan and its parts.")
        await off.add_message("user" if i % 2 else "Claude", f"message number {i} about the plan and its parts.")
    await on.wait_ready()
    await off.wait_ready()
    records = await on.requests(limit=1000)
    assert records and all(r.form == "compression" and r.reader == "ann" for r in records)
    assert all(r.usage is not None and r.usage.input_tokens and r.latency_ms is not None for r in records)
    assert any(h.kind == "message" for r in records for h in r.held)
    rebuilt = await on.rebuild_request(records[0])
    assert rebuilt.matches
    assert await off.requests() == []
    await on.aclose()
    await off.aclose()


async def test_verify_reads_every_record_and_reports_a_damaged_one(store: Path | str) -> None:
    """Q3, K7: verify decodes each ledger item as requests() reads it: sound after records; an
    item that isn't a record is reported, naming the ledger, and requests() raises
    StoreCorruptError for it."""
    async with open_runtime(store) as rt:
        m = await rt.open("agents/ann", view_reader="ann", ledger=True)
        await _turn(m, "one")
        await _turn(m, "two")
        await m.aclose()
    report = verify(str(store))
    assert report.status == "sound", report
    async with open_runtime(store) as rt:
        await rt.store.ask(AppendItem(state="agents/ann/requests", branch="main", data=b'{"id":"x"}'))
        m = await rt.open("agents/ann")
        with pytest.raises(StoreCorruptError, match="agents/ann/requests"):
            await m.requests()
        await m.aclose()
    report = verify(str(store))
    assert report.status == "damaged"
    assert any("agents/ann/requests" in f"{item.place} {item.what}" for item in report.damage), report.damage


async def test_the_asyncio_front_offers_the_ledger(store_path: Path) -> None:
    """Q8, H1: under asyncio the same methods answer the same records."""

    async def host() -> tuple[list[RequestRecord], RequestRecord]:
        async with ctxrt.aio.open_runtime(store_path, durability="os") as rt:
            m = await rt.open("agents/ann", view_reader="ann", ledger=True)
            await m.add_message("user", "hello")
            record = await m.record_request(await m.compile(BUDGET), form="openai_responses",
                                            options={"assistant": "Claude"})
            found = await m.requests()
            await m.aclose()
            return found, record

    found, record = await trio.to_thread.run_sync(asyncio.run, host())
    assert found == [record]


async def test_a_record_waiting_on_a_branch_deleted_since_is_dropped_not_refusing_the_next_write(
    rt: ctxrt.Runtime,
) -> None:
    """Q1, L5: a record still waiting when its branch is deleted is dropped; the next message, on
    another branch, is written as ever."""
    main = await rt.open("agents/ann", view_reader="ann", ledger=True)
    await _turn(main, "one")
    doomed = await rt.open("agents/ann")
    await doomed.fork("doomed")
    await doomed.add_message("user", "on the doomed branch")
    await doomed.record_request(await doomed.compile(BUDGET), form="anthropic", options={"assistant": "Claude"})
    await rt.delete_branch("doomed")
    assert await main.add_message("user", "still written")
    assert [r.branch for r in await main.requests()] == ["main"]
    await main.aclose()


async def test_a_record_given_another_reader_is_not_rebuilt_in_that_readers_view(rt: ctxrt.Runtime) -> None:
    """Q4, Q5: bob's manager refuses to rebuild a record that names reader ann (one changed with
    attrs.evolve, say), naming both readers, rather than reading ann's private blocks."""
    import attrs

    ann = await rt.open("agents/ann", view_reader="ann", ledger=True)
    bob = await rt.open("agents/bob", view_reader="bob", ledger=True)
    await ann.add_message("user", [Text("for ann only", audience=("ann",)), Text("for all")])
    record = await bob.record_request(await bob.compile(BUDGET), form="anthropic")
    with pytest.raises(ValueError, match="'ann'.*'bob'"):
        await bob.rebuild_request(attrs.evolve(record, reader="ann"))
    assert "for ann only" not in str((await bob.rebuild_request(record)).body)
    await ann.aclose()
    await bob.aclose()


async def test_a_record_made_while_its_base_rides_a_held_append_reads_back(rt: ctxrt.Runtime) -> None:
    """Q1, Q3: a record made while the one before it rides an add_message(hold_compression=True)
    through the namespace actor (a batch another may overtake) is not kept against it: both read
    back, neither named damaged."""
    m = await rt.open("agents/ann", view_reader="ann", ledger=True)
    await m.add_message("user", "hi")
    first = await m.record_request(await m.compile(BUDGET), form="anthropic")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: m.add_message("user", "held", hold_compression=True))
        await trio.lowlevel.checkpoint()  # the held append took the waiting record
        second = await m.record_request(await m.compile(BUDGET), form="anthropic")
        assert {r.id for r in await m.requests()} == {first.id, second.id}
    assert {r.id for r in await m.requests()} == {first.id, second.id}
    assert (await m.rebuild_request(second)).matches
    await m.aclose()


async def test_paging_forward_by_the_last_records_sequence_misses_none_that_share_it(rt: ctxrt.Runtime) -> None:
    """Q3: records made between two commits share a sequence (a request retried, say); a page
    forward ends after all of those sharing its last one's, so paging with
    since=records[-1].sequence reads every record once, the audit (holding=) too."""
    m = await rt.open("agents/ann", view_reader="ann", ledger=True)
    first = await m.add_message("user", "hi")
    result = await m.compile(BUDGET)
    made = [(await m.record_request(result, form="anthropic")).id for _ in range(7)]
    made.append((await _turn(m, "again")).id)
    for holding in (None, first):
        paged: list[str] = []
        since = 0
        while page := await m.requests(since=since, limit=3, holding=holding):
            paged += [r.id for r in page]
            since = page[-1].sequence
        assert paged == made
    await m.aclose()


async def test_a_record_refused_for_its_options_leaves_the_next_one_readable(rt: ctxrt.Runtime) -> None:
    """Q1, Q3: options the form takes but a record can't keep (an assistant name that isn't a str)
    are refused naming options['assistant']; the next record, kept against the last one kept,
    reads back and rebuilds to its digest."""
    m = await rt.open("agents/ann", view_reader="ann", ledger=True)
    first = await _turn(m, "one")
    await m.add_message("user", "two")
    with pytest.raises(TypeError, match=r"options\['assistant'\]"):
        await m.record_request(await m.compile(BUDGET), form="anthropic", options={"assistant": {"Claude", 3}})
    third = await _turn(m, "three")
    assert await m.requests() == [first, third]
    assert (await m.rebuild_request(third)).matches
    await m.aclose()


async def test_a_models_usage_is_checked_as_a_mapping_is(rt: ctxrt.Runtime) -> None:
    """Q1: a ctxrt.Usage with a negative or NaN count (a host's own model reports it) is refused as
    the same mapping would be, naming the field; nothing is stored."""
    m = await rt.open("agents/ann", view_reader="ann", ledger=True)
    await m.add_message("user", "one")
    result = await m.compile(BUDGET)
    for bad in (Usage(input_tokens=-5, output_tokens=1), Usage(input_tokens=1, output_tokens=float("nan"))):  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="usage"):
            await m.record_request(result, form="anthropic", usage=bad)
    assert await m.requests() == []
    await m.aclose()


async def test_a_closed_namespace_keeps_nothing_of_its_last_request_and_records_again(rt: ctxrt.Runtime) -> None:
    """Q1, Q7: once a namespace's last manager closes, the runtime holds nothing of its last
    request once other compiles displace the store's own caches (a runtime that serves many
    agents in turn doesn't grow with them: 400 closed namespaces of 300 messages held 234 MB,
    now 48); opened again, it records and reads back as before."""
    import gc
    import weakref

    m = await rt.open("agents/ann", view_reader="ann", ledger=True)
    first = await _turn(m, "one")
    await m.add_message("user", "two")
    result = await m.compile(BUDGET)
    second = await m.record_request(result, form="anthropic", options={"assistant": "Claude"})
    held = weakref.ref(result.messages[-1])
    del result
    await m.aclose()
    other = await rt.open("agents/bob", view_reader="bob", ledger=True)  # the store's caches of the last compile move on
    await _turn(other, "for bob")
    await other.aclose()
    gc.collect()
    assert held() is None
    m = await rt.open("agents/ann")
    third = await _turn(m, "three")
    assert await m.requests() == [first, second, third]
    assert (await m.rebuild_request(third)).matches
    await m.aclose()


async def test_a_cancelled_record_request_keeps_nothing(rt: ctxrt.Runtime) -> None:
    """Q1: record_request cancelled (before it returns a record) keeps no record; the next one,
    and the ledger, read back as before."""
    m = await rt.open("agents/ann", view_reader="ann", ledger=True)
    first = await _turn(m, "one")
    result = await m.compile(BUDGET)
    with trio.CancelScope() as scope:
        scope.cancel()
        await m.record_request(result, form="anthropic")
    assert scope.cancelled_caught
    second = await _turn(m, "two")
    assert await m.requests() == [first, second]
    await m.aclose()


async def test_a_result_compiled_by_another_runtime_is_refused_and_nothing_kept(rt: ctxrt.Runtime,
                                                                                 tmp_path: Path) -> None:
    """Q9: a result another runtime's manager compiled (the same namespace, branch and reader, over
    another store) is refused with ValueError naming this runtime; the ledger is as it was, and the
    next record is kept against the last as before."""
    m = await rt.open("agents/ann", view_reader="ann", ledger=True)
    first = await _turn(m, "one")
    async with open_runtime(tmp_path / "elsewhere", durability="os") as other:
        twin = await other.open("agents/ann", view_reader="ann", ledger=True)
        await twin.add_message("user", "a line of another store")
        with pytest.raises(ValueError, match="not compiled by a manager of this runtime"):
            await m.record_request(await twin.compile(BUDGET), form="anthropic")
        await twin.aclose()
    second = await _turn(m, "two")
    assert await m.requests() == [first, second]
    assert (await m.rebuild_request(second)).matches
    await m.aclose()


async def test_a_rebuild_lets_other_tasks_run_while_it_reads(rt: ctxrt.Runtime) -> None:
    """Q10: rebuild_request reads the store a few messages at a time and makes the body off the
    event loop: a task that counts its turns keeps getting them during a rebuild of 200 messages
    (read all at once, it got at most the one at the call's start)."""
    m = await rt.open("agents/ann", view_reader="ann", ledger=True)
    for n in range(199):
        await m.add_message("user" if n % 2 else "Claude", f"line {n}")
    record = await _turn(m, "the last")
    ticks, done = 0, trio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not done.is_set():
            await trio.lowlevel.checkpoint()
            ticks += 1

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker)
        await trio.lowlevel.checkpoint()  # the ticker's first turn
        before = ticks
        rebuilt = await m.rebuild_request(record)
        during = ticks - before
        done.set()
    assert rebuilt.matches and rebuilt.edited == ()
    assert during >= 10, during
    await m.aclose()


async def test_racing_writers_keep_records_in_the_ledgers_order(rt: ctxrt.Runtime) -> None:
    """Q11: records made by callers racing, their batches riding appends with and without a
    compression hold (through the namespace actor, or straight to the store) and some of those
    cancelled at a checkpoint, are stored in the ledger's order: requests() reads them by
    sequence, the order they were made in among those sharing one, and paging forward by the last
    one's sequence reads each once."""
    ann = await rt.open("agents/ann", view_reader="ann", ledger=True)
    bob = await rt.open("agents/bob", view_reader="bob")
    await ann.add_message("user", "hi")
    made: list[RequestRecord] = []

    async def turn(k: int) -> None:
        made.append(await ann.record_request(await ann.compile(BUDGET), form="anthropic"))
        with trio.CancelScope() as scope:
            if k % 5 == 4:
                scope.cancel()  # cancelled at its first checkpoint: its append may or may not be stored
            await ann.add_message("user", f"turn {k}", hold_compression=k % 2 == 0)

    async def other(k: int) -> None:
        await bob.add_message("user", f"bob {k}")  # a commit between records: their sequences differ

    for _ in range(3):
        async with trio.open_nursery() as nursery:
            for k in range(12):
                nursery.start_soon(turn, k)
                nursery.start_soon(other, k)
    found = await ann.requests(limit=1_000)
    assert sorted(r.id for r in found) == sorted(r.id for r in made)
    order = {r.id: n for n, r in enumerate(made)}
    assert [(r.sequence, order[r.id]) for r in found] == sorted((r.sequence, order[r.id]) for r in found)
    paged: list[str] = []
    since = 0
    while page := await ann.requests(since=since, limit=5):
        paged += [r.id for r in page]
        since = page[-1].sequence
    assert paged == [r.id for r in found]
    await ann.aclose()
    await bob.aclose()


async def test_a_compression_call_answered_after_turns_keeps_the_ledgers_order(rt: ctxrt.Runtime) -> None:
    """Q6, Q11: a compression call whose reply comes after turns recorded their requests (the last
    one's record still waiting for a write) is kept after them, in line with the records waiting:
    the ledger reads in sequence order, and paging forward reads it once."""
    asked, release = trio.Event(), trio.Event()

    async def answer(request: object) -> str:
        asked.set()
        await release.wait()
        return "the gist of what was said"

    strategy = Autobiographical("model-x", target_chunk_tokens=40, recent_window_tokens=20, l1_holdback_chunks=0,
                                summary_target_tokens=50, head_window_tokens=20)
    m = await rt.open("agents/ann", view_reader="ann", model=ScriptedModel(answer), strategy=strategy, ledger=True)
    for n in range(30):
        await m.add_message("user" if n % 2 else "Claude", f"message number {n} about the plan and its parts.")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(m.wait_ready)  # its first unit's call waits for the release
        await asked.wait()
        turns = [await _turn(m, f"turn {k}") for k in range(3)]
        release.set()
    paged: list[str] = []
    since = 0
    while page := await m.requests(since=since, limit=2):
        paged += [r.id for r in page]
        since = page[-1].sequence
    found = await m.requests(limit=1_000)  # a later unit may have been kept since
    compressions = [r for r in found if r.form == "compression"]
    assert compressions and {r.id for r in turns} <= {r.id for r in found}
    assert [r.sequence for r in found] == sorted(r.sequence for r in found)
    assert compressions[0].sequence >= turns[-1].sequence
    assert paged == [r.id for r in found][:len(paged)] and set(r.id for r in turns) <= set(paged)
    await m.aclose()
