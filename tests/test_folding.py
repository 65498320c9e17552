"""Adaptive resolution and refusing instead of dropping (T10, T11, T15's per-level budgets).

The fold solver (``ctxrt.strategies.folding``) is tested as the pure function it is, with
hypothesis over random chunk trees, allowances and previous folds; the strategy as synchronous
code over ``ctxrt.testing.PlainContext``; persistence, forks, production on demand and reader
views through the public API over a real LMDB store under ``tmp_path`` (durability "os"), a
``ScriptedModel`` and a ``trio.fail_after`` hang guard.

Token arithmetic: ``say(i)`` is a 29-character text costing 10 tokens with the marker
``<m{i:05d}>``; the scripted model's memories are about 10 tokens, so a chunk of four messages
(40 tokens raw) costs about 30 shown as its level-1 summary (with the recall header's 20).
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
import trio
from hypothesis import HealthCheck, given, settings

import ctxrt
from ctxrt import Budget, ModelRequest, ModelResponse, SelectOptions, Text, Usage
from ctxrt.errors import OverBudgetDiagnostics, OverBudgetError
from ctxrt.strategies.folding import Fold, FoldProblem, Node, solve
from ctxrt.testing import PlainContext, ScriptedModel, estimate_text

GUARD_S = 30
MODEL = "model-x"
NS = "diary"
MARK = re.compile(r"<m(\d{5})>")


def say(i: int) -> str:
    return f"<m{i:05d}> we talked it over".ljust(29, ".")


assert estimate_text(say(0)) == 10


def remember(request: ModelRequest) -> str:
    """A short memory naming the lowest marker the request's last message holds."""
    last = "\n".join(b.text for b in request.messages[-1].content if isinstance(b, Text))
    found = [int(n) for n in MARK.findall(last)] or [0]
    return f"memory from <m{min(found):05d}> on"


def autobio(**overrides: Any) -> ctxrt.Autobiographical:
    """Chunks of four ``say`` messages, no head, a 20-token recent window, adaptive resolution."""
    config: dict[str, Any] = {
        "target_chunk_tokens": 40, "recent_window_tokens": 20, "l1_holdback_chunks": 0,
        "summary_target_tokens": 50, "merge_threshold": 3, "adaptive_resolution": True,
    }
    config.update(overrides)
    return ctxrt.Autobiographical(MODEL, **config)


def budget(tokens: int) -> Budget:
    return Budget(max_tokens=tokens, reserve_for_response=0)


# -- the solver, pure ------------------------------------------------------------------------------


@st.composite
def problems(draw: st.DrawFn) -> FoldProblem:
    """A middle of 0-12 chunks, a level-1 summary for some, merges over runs of those (and of
    the level-2 ones), each summary cheaper or dearer than what it covers."""
    count = draw(st.integers(0, 12))
    raw = tuple(draw(st.integers(1, 120)) for _ in range(count))
    nodes: list[Node] = []
    below: list[Node] = []
    for index in range(count):
        if draw(st.booleans()) or draw(st.booleans()):
            node = Node(f"L1-{index}", 1, index, index + 1, draw(st.integers(1, 60)))
            nodes.append(node)
            below.append(node)
    for level in (2, 3):
        above: list[Node] = []
        at = 0
        while at < len(below):
            size = draw(st.integers(1, 4))
            run = below[at : at + size]
            at += size
            contiguous = all(a.stop == b.start for a, b in zip(run, run[1:]))
            if len(run) >= 2 and contiguous and draw(st.booleans()):
                node = Node(f"L{level}-{len(nodes)}", level, run[0].start, run[-1].stop, draw(st.integers(1, 60)))
                nodes.append(node)
                above.append(node)
        below = above
    return FoldProblem(raw, tuple(nodes), draw(st.integers(0, 50)))


def valid(problem: FoldProblem, fold: Fold) -> bool:
    """Every chunk raw or covered by a shown node at its level, the shown nodes' chunks all at that level."""
    for node in fold.shown:
        if node not in problem.nodes or any(fold.levels[i] != node.level for i in range(node.start, node.stop)):
            return False
    covered = {i for node in fold.shown for i in range(node.start, node.stop)}
    return all(level == 0 or i in covered for i, level in enumerate(fold.levels)) and len(fold.levels) == len(problem.raw)


def tokens_of(problem: FoldProblem, fold: Fold) -> int:
    return problem.fixed + sum(node.tokens for node in fold.shown) + sum(
        cost for cost, level in zip(problem.raw, fold.levels) if level == 0)


def least(problem: FoldProblem) -> int:
    """The fewest tokens any fold shows (a summary or its parts, whichever costs less, bottom up)."""
    best = list(problem.raw)
    for level in (1, 2, 3):
        for node in problem.nodes:
            if node.level == level:
                parts = sum(best[node.start : node.stop])
                if node.tokens < parts:
                    best[node.start : node.stop] = [node.tokens] + [0] * (node.stop - node.start - 1)
    return problem.fixed + sum(best)


def common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


folds = st.sampled_from(["kv-stable", "flat"])


@settings(max_examples=300, deadline=None)
@given(problems(), st.integers(0, 800), st.lists(st.integers(0, 3), max_size=14) | st.none(), folds,
       st.sampled_from([0.0, 0.1, 0.3]), st.integers(2, 4))
def test_a_fold_fits_with_every_chunk_raw_or_covered_or_nothing_fits(
        problem: FoldProblem, allowance: int, previous: list[int] | None, folding: str, slack: float,
        span: int) -> None:
    """T10: the solver's fold is valid (each chunk raw or under a shown summary of its level), its tokens are
    what it shows, it fits when any fold could, and it names merges it lacks only when none does: each of
    ``merge_span`` summaries (never fewer: level 3 never merges further), and only when they would make it fit."""
    fold = solve(problem, allowance, previous=previous, folding=folding, slack_ratio=slack, merge_span=span)
    assert valid(problem, fold)
    assert fold.tokens == tokens_of(problem, fold)
    assert fold.fits == (fold.tokens <= allowance)
    assert fold.fits == (least(problem) <= allowance)
    merges = [lack for lack in fold.lacking if lack.level > 1]
    assert not merges or (not fold.fits and fold.least <= allowance)
    for lack in merges:
        parts = [node for node in problem.nodes
                 if node.level == lack.level - 1 and lack.start <= node.start and node.stop <= lack.stop]
        assert len(parts) == span and (parts[0].start, parts[-1].stop) == (lack.start, lack.stop)


@settings(max_examples=300, deadline=None)
@given(problems(), st.integers(0, 800), folds, st.sampled_from([0.1, 0.3]), st.floats(0, 1))
def test_a_fold_does_not_change_while_the_budget_moves_within_the_slack(
        problem: FoldProblem, allowance: int, folding: str, slack: float, where: float) -> None:
    """T10 (hysteresis): a fold that still fits and leaves at most ``slack_ratio`` of the allowance is kept."""
    first = solve(problem, allowance, folding=folding, slack_ratio=slack)
    # an allowance the fold fills to within the slack: from its tokens up to tokens / (1 - slack)
    moved = int(first.tokens + where * (first.tokens / (1 - slack) - first.tokens))
    again = solve(problem, moved, previous=first.levels, folding=folding, slack_ratio=slack)
    if first.tokens <= moved and first.tokens >= moved * (1 - slack):
        assert again.levels == first.levels


@settings(max_examples=300, deadline=None)
@given(problems(), st.integers(0, 800), st.lists(st.integers(0, 3), max_size=14))
def test_kv_stable_keeps_at_least_the_prefix_flat_keeps(problem: FoldProblem, allowance: int, previous: list[int]) -> None:
    """T10: kv-stable keeps the previous fold's oldest chunks as far as flat does or further, and the whole
    previous fold when it still fits within the slack."""
    kept = solve(problem, 10**9, previous=previous, folding="kv-stable", slack_ratio=1.0 - 1e-9).levels  # previous, made valid
    stable = solve(problem, allowance, previous=kept, folding="kv-stable")
    flat = solve(problem, allowance, previous=kept, folding="flat")
    assert stable.fits == flat.fits
    if stable.fits:
        assert common_prefix(stable.levels, kept) >= common_prefix(flat.levels, kept)


@settings(max_examples=300, deadline=None)
@given(problems(), st.lists(st.integers(0, 3), max_size=14), st.floats(0, 1))
def test_kv_stable_keeps_a_previous_fold_that_still_fits(problem: FoldProblem, previous: list[int], where: float) -> None:
    """T10: kv-stable keeps the previous fold whole while it fits and leaves at most half the allowance unused
    (a finer re-layout would cost the prompt cache its prefix)."""
    kept = solve(problem, 10**9, previous=previous, folding="kv-stable", slack_ratio=1.0 - 1e-9)
    allowance = int(kept.tokens * (1 + where))  # the fold fills from half of it to all of it
    assert solve(problem, allowance, previous=kept.levels, folding="kv-stable").levels == kept.levels


def test_the_flat_fold_folds_the_oldest_first_and_kv_stable_changes_late() -> None:
    """T10: flat is the finest fit, oldest chunks folded first; kv-stable after an all-raw fold folds the newest
    chunk it can; when only a merge fits, both show it; what can't fit names the lacking summaries."""
    problem = FoldProblem((100, 100, 100, 100), (Node("a", 1, 0, 1, 10), Node("b", 1, 1, 2, 10),
                                                 Node("c", 1, 2, 3, 10), Node("ab", 2, 0, 2, 5)), 0)
    assert solve(problem, 400, folding="flat").levels == (0, 0, 0, 0)
    assert solve(problem, 320, folding="flat").levels == (1, 0, 0, 0)
    assert solve(problem, 320, previous=(0, 0, 0, 0)).levels == (0, 0, 1, 0)
    assert solve(problem, 120, folding="flat").levels == (2, 2, 1, 0)
    nothing = solve(problem, 100, folding="flat")
    assert not nothing.fits and nothing.deepest == 2
    assert [(lack.level, lack.start, lack.stop) for lack in nothing.lacking] == [(1, 3, 4)]
    with pytest.raises(ValueError, match="folding"):
        solve(problem, 100, folding="best")


# -- the strategy, as plain code ---------------------------------------------------------------------


def msg(sequence: int) -> ctxrt.Message:
    return ctxrt.Message(id=str(sequence), sequence=sequence, participant="user", content=(Text(say(sequence)),),
                         metadata=None, timestamp_ms=1_000 * sequence, caused_by=())


def reply(request: ModelRequest) -> ModelResponse:
    return ModelResponse((Text(remember(request)),), "end_turn", Usage(1, 1))


def drain(strategy: Any, ctx: PlainContext, limit: int = 10**6) -> int:
    """Run up to ``limit`` units as the actor would (the floor marked first); how many ran."""
    done = 0
    while done < limit:
        unit = strategy.next_unit(ctx)
        if unit is None:
            break
        ctx.mark_compression_read(unit.reaches)
        strategy.apply_unit(unit, reply(strategy.request_for(unit, ctx)), ctx)
        done += 1
    return done


def shown_ids(entries: list[ctxrt.Entry]) -> set[str]:
    """Every message id the entries show raw or cover by a shown summary (its leaves)."""
    found: set[str] = set()
    for entry in entries:
        found.update(entry.source_ids)
    return found


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(4, 90), st.integers(30, 700), st.lists(st.integers(0, 6), min_size=1, max_size=6),
       folds, st.booleans(), st.sampled_from([0, 1]), st.integers(2, 4))
def test_a_compile_with_adaptive_resolution_fits_covering_the_middle_or_refuses(
        count: int, tokens: int, work: list[int], folding: str, enforce: bool, holdback: int, threshold: int) -> None:
    """T10, T11: over random histories, budgets and fold states (compiles between units), a compile shows every
    message raw or under a shown summary, or (with enforce_budget) refuses with diagnostics; a message left out
    without enforce_budget is reported in render_stats().dropped_ids, never silent."""
    config = autobio(folding=folding, enforce_budget=enforce, l1_holdback_chunks=holdback, merge_threshold=threshold)
    ctx = PlainContext([msg(i) for i in range(1, count + 1)])
    strategy = config.create()
    strategy.initialize(ctx)
    for step, units in enumerate(work):
        ctx.messages += [msg(len(ctx.messages) + 1) for _ in range(step % 3)]
        drain(strategy, ctx, units)
        try:
            entries = strategy.select(ctx.view, budget(tokens), SelectOptions(context=ctx))
        except OverBudgetError as refused:
            assert enforce and isinstance(refused.diagnostics, OverBudgetDiagnostics)
            assert refused.actual > refused.budget
            continue
        stats = strategy.render_stats()
        assert stats is not None and stats.total_tokens <= tokens
        shown = shown_ids(entries)
        dropped = set(stats.dropped_ids)
        assert {m.id for m in ctx.messages} == shown | dropped and not shown & dropped
        if dropped:
            assert not enforce and stats.dropped_reason


def test_the_fold_is_stored_and_what_it_lacks_is_made_on_demand() -> None:
    """T10: a fold that can't fit queues the held-back chunk's level-1 summary, and no merge of fewer than
    merge_threshold summaries; once it is made, the next compile fits; the fold is the ``resolutions`` value,
    read back at initialize."""
    ctx = PlainContext([msg(i) for i in range(1, 19)])  # 4 chunks of 4, 2 messages in the recent window
    strategy = autobio(l1_holdback_chunks=1, merge_threshold=6).create()
    strategy.initialize(ctx)
    drain(strategy, ctx)
    assert len(strategy.summaries) == 3  # the newest chunk is held back, no merge yet (6 needed)
    selected = strategy.select(ctx.view, budget(140), SelectOptions(context=ctx))
    stats = strategy.render_stats()
    assert stats is not None and stats.dropped_ids  # 20 recent + 3 L1s + 40 raw: it can't fit yet
    assert not strategy.is_ready()  # what the fold lacks is queued
    backlog = strategy.backlog(ctx)  # and counted as work and debt: the held-back chunk
    assert backlog.units == 1 and backlog.tokens == sum(ctx.view.estimate_tokens(m) for m in ctx.messages[12:16])
    assert drain(strategy, ctx) == 1
    assert [s.level for s in strategy.summaries] == [1, 1, 1, 1]  # no early merge of 4 when 6 make one
    selected = strategy.select(ctx.view, budget(140), SelectOptions(context=ctx))
    stats = strategy.render_stats()
    assert stats is not None and not stats.dropped_ids
    assert shown_ids(selected) == {m.id for m in ctx.messages}
    stored = ctx.values["resolutions"]
    assert stored and all(level > 0 for level in stored.values())
    again = autobio(l1_holdback_chunks=1, merge_threshold=6).create()
    again.initialize(ctx)
    assert again.select(ctx.view, budget(140), SelectOptions(context=ctx)) == selected


def test_a_fold_nothing_can_fit_shows_its_newest_summaries_and_says_nothing_can() -> None:
    """T10, T11: when nothing queued can make the fold fit (every level-1 summary made, too few for a merge),
    it asks for no merge, shows the summaries that fit before any raw message (the oldest history is what is
    left out, as without folding) and, with enforce_budget, the refusal names nothing lacking and says so."""
    ctx = PlainContext([msg(i) for i in range(1, 19)])
    strategy = autobio(l1_holdback_chunks=0, merge_threshold=6).create()
    strategy.initialize(ctx)
    drain(strategy, ctx)
    entries = strategy.select(ctx.view, budget(120), SelectOptions(context=ctx))
    stats = strategy.render_stats()
    assert stats is not None and stats.summaries == ((1, 3),)  # the newest three of four, then raw in what is left
    left_out = len(stats.dropped_ids)
    assert 0 < left_out < 4 and list(stats.dropped_ids) == [m.id for m in ctx.messages[:left_out]]  # the oldest
    assert shown_ids(entries) == {m.id for m in ctx.messages[left_out:]}
    assert strategy.next_unit(ctx) is None and strategy.is_ready()  # nothing to ask for
    refusing = autobio(l1_holdback_chunks=0, merge_threshold=6, enforce_budget=True).create()
    refusing.initialize(ctx)
    with pytest.raises(OverBudgetError, match="nothing can make it fit") as refused:
        refusing.select(ctx.view, budget(120), SelectOptions(context=ctx))
    diagnostics = refused.value.diagnostics
    assert diagnostics is not None and diagnostics.lacking == () and diagnostics.deepest_level == 1


def test_a_refused_merge_the_fold_asks_for_is_quarantined_and_not_asked_for_again() -> None:
    """T10 with T4's quarantine: a merge the fold asked for that fails MAX_ATTEMPTS times is quarantined
    (health's keys); its first summary is sealed as merge_group seals it, so the next merge starts after it;
    what the fold can't fit meanwhile is reported."""
    ctx = PlainContext([msg(i) for i in range(1, 19)])
    strategy = autobio(l1_holdback_chunks=0, merge_threshold=3, refusal_fallbacks=0).create()
    strategy.initialize(ctx)
    while (unit := strategy.next_unit(ctx)) is not None and not isinstance(unit.work, tuple):
        ctx.mark_compression_read(unit.reaches)
        strategy.apply_unit(unit, reply(strategy.request_for(unit, ctx)), ctx)
    strategy.select(ctx.view, budget(60), SelectOptions(context=ctx))
    refused = ModelResponse((Text("I won't."),), "refusal", Usage(1, 1))
    while (unit := strategy.next_unit(ctx)) is not None and unit.key == "L1-0,L1-1,L1-2":
        ctx.mark_compression_read(unit.reaches)
        strategy.apply_unit(unit, refused, ctx)
        strategy.select(ctx.view, budget(60), SelectOptions(context=ctx))
    assert strategy.quarantined() == ["L1-0,L1-1,L1-2"]
    assert {s.level for s in strategy.summaries} == {1}
    assert unit is not None and unit.key == "L1-1,L1-2,L1-3"  # the next group starts after the sealed summary
    stats = strategy.render_stats()
    assert stats is not None and stats.dropped_ids


def left_out_over_a_run(adaptive: bool, tokens: int, turns: int, **overrides: Any) -> int:
    """The messages each compile left out, summed over ``turns`` turns of a message, a drain and a compile."""
    ctx = PlainContext([])
    strategy = autobio(adaptive_resolution=adaptive, **overrides).create()
    strategy.initialize(ctx)
    left_out = 0
    for turn in range(1, turns + 1):
        ctx.messages.append(msg(turn))
        strategy.on_new_message(ctx.messages[-1], ctx)
        drain(strategy, ctx)
        strategy.select(ctx.view, budget(tokens), SelectOptions(context=ctx))
        stats = strategy.render_stats()
        assert stats is not None
        left_out += len(stats.dropped_ids)
    return left_out


@pytest.mark.parametrize("tokens", [300, 200, 120])
def test_folding_leaves_out_no_more_than_the_selection_without_it(tokens: int) -> None:
    """T10 (folding replaces dropping): over a long run at a tight budget, adaptive resolution leaves out no more
    history than the selection without it (it once merged early into many small level-3 summaries, which never
    merge further, and then showed no summary at all)."""
    adaptive, off = left_out_over_a_run(True, tokens, 220), left_out_over_a_run(False, tokens, 220)
    assert off > 0 and adaptive <= off


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(10, 120), st.integers(40, 500), st.integers(2, 5), st.sampled_from([0, 1, 2]),
       st.sampled_from([30, 40, 60, 100]), folds, st.sampled_from([0.0, 0.1, 0.3]),
       st.lists(st.integers(0, 3), min_size=1, max_size=5))
def test_on_random_histories_a_fold_leaves_out_no_more_than_the_selection_without_it(
        turns: int, tokens: int, threshold: int, holdback: int, target: int, folding: str, slack: float,
        work: list[int]) -> None:
    """T10: at every turn of a random run (chunk size, merge threshold, holdback, budget, objective, and some of
    the due units made between turns), a compile with adaptive resolution leaves out no more messages than one
    without it over the same history and summaries. (Across two separate runs the figures can differ by the
    timing of what each makes: folding asks for the held-back chunk's summary sooner.)"""
    config = {"merge_threshold": threshold, "l1_holdback_chunks": holdback, "target_chunk_tokens": target}
    ctx = PlainContext([])
    adaptive = autobio(folding=folding, slack_ratio=slack, **config).create()
    adaptive.initialize(ctx)
    for turn in range(1, turns + 1):
        ctx.messages.append(msg(turn))
        adaptive.on_new_message(ctx.messages[-1], ctx)
        drain(adaptive, ctx, work[turn % len(work)])
        adaptive.select(ctx.view, budget(tokens), SelectOptions(context=ctx))
        off = autobio(adaptive_resolution=False, **config).create()
        off.initialize(ctx)  # the same chunks and summaries
        off.select(ctx.view, budget(tokens), SelectOptions(context=ctx))
        folded, selected = adaptive.render_stats(), off.render_stats()
        assert folded is not None and selected is not None
        assert len(folded.dropped_ids) <= len(selected.dropped_ids)


def test_without_adaptive_resolution_enforce_budget_refuses_a_compile_that_drops() -> None:
    """T11: enforce_budget without folding refuses a compile that would leave uncompressed history out, naming the
    units that would make it fit; a compile that fits is not refused."""
    ctx = PlainContext([msg(i) for i in range(1, 19)])
    strategy = autobio(adaptive_resolution=False, enforce_budget=True).create()
    strategy.initialize(ctx)
    with pytest.raises(OverBudgetError, match="enforce_budget") as refused:
        strategy.select(ctx.view, budget(90), SelectOptions(context=ctx))
    diagnostics = refused.value.diagnostics
    assert diagnostics is not None and diagnostics.tail_tokens == 20 and diagnostics.lacking
    assert diagnostics.levels == ()
    strategy.select(ctx.view, budget(1_000), SelectOptions(context=ctx))


def test_the_grace_lets_a_refusing_compile_run_over_by_its_ratio() -> None:
    """T11: with over_budget_grace_ratio, a fold that overruns the budget by less than the grace is shown whole
    rather than refused; beyond it, refused with the fold it reached."""
    ctx = PlainContext([msg(i) for i in range(1, 11)])  # 2 chunks raw (80) + 20 recent
    strategy = autobio(enforce_budget=True, over_budget_grace_ratio=0.1).create()
    strategy.initialize(ctx)
    strategy.next_unit(ctx)  # the chunks close; nothing is compressed
    entries = strategy.select(ctx.view, budget(95), SelectOptions(context=ctx))
    assert shown_ids(entries) == {m.id for m in ctx.messages}
    with pytest.raises(OverBudgetError) as refused:
        strategy.select(ctx.view, budget(80), SelectOptions(context=ctx))
    diagnostics = refused.value.diagnostics
    assert diagnostics is not None
    assert [chunk for chunk, _ in diagnostics.levels] == ["c-0", "c-1"] and diagnostics.deepest_level == 0
    assert diagnostics.lacking == ("c-0", "c-1") and diagnostics.middle_needed_tokens == 80
    assert refused.value.actual == 100 and refused.value.budget == 80


def test_level_budgets_fill_level_three_first_and_carry_down() -> None:
    """T15: with per-level budgets, level 3 takes its budget first and what it leaves carries to level 2, then to
    level 1 (the reference's waterfall): a level-1 budget of 0 still shows an L1 on level 3's carry; with every
    level's budget 0 no summary is shown and what doesn't fit raw is reported."""
    ctx = PlainContext([msg(i) for i in range(1, 43)])  # 10 chunks of 4: an L3 over 9, an unmerged L1
    strategy = autobio(adaptive_resolution=False, merge_threshold=3, l1_budget_tokens=0, l2_budget_tokens=0,
                       l3_budget_tokens=1_000).create()
    strategy.initialize(ctx)
    drain(strategy, ctx)
    strategy.select(ctx.view, budget(200), SelectOptions(context=ctx))
    stats = strategy.render_stats()
    assert stats is not None and stats.summaries == ((1, 1), (3, 1)) and not stats.dropped_ids
    starved = autobio(adaptive_resolution=False, merge_threshold=3, l3_budget_tokens=0, l2_budget_tokens=0,
                      l1_budget_tokens=0).create()
    starved.initialize(ctx)
    starved.select(ctx.view, budget(200), SelectOptions(context=ctx))
    stats = starved.render_stats()
    assert stats is not None and stats.summaries == () and stats.dropped_ids


# -- through the runtime -----------------------------------------------------------------------------


async def covered(m: ctxrt.ContextManager, result: ctxrt.CompileResult) -> set[str]:
    """The message ids ``result`` shows raw or under a summary it shows (provenance, then ``get_summary``
    down to the leaves; every shown summary found by ``search_summaries(include_merged=True)``)."""
    every = {match.summary.id for match in await m.search_summaries(include_merged=True, limit=10_000)}
    found: set[str] = set()
    for sources in result.provenance.messages:
        for source in sources:
            if source.kind == "message":
                found.add(source.id)
            else:
                assert source.id in every
                found.update(await leaves(m, source.id))
    return found


async def leaves(m: ctxrt.ContextManager, summary_id: str) -> list[str]:
    summary = await m.get_summary(summary_id)
    assert summary is not None
    if summary.level == 1:
        return list(summary.source_ids)
    return [leaf for child in summary.source_ids for leaf in await leaves(m, child)]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(8, 40), st.integers(40, 300), st.lists(st.integers(0, 4), min_size=1, max_size=4), folds,
       st.booleans())
async def test_through_the_runtime_every_message_is_shown_covered_or_reported(
        count: int, tokens: int, ticks: list[int], folding: str, enforce: bool) -> None:
    """T10, T11 through compile: at every step (messages added, some units made, a compile), each message of the
    view is in the compile's provenance raw or under a summary ``search_summaries`` knows, or reported in
    render_stats().dropped_ids (never with enforce_budget: that compile raises OverBudgetError instead)."""
    with tempfile.TemporaryDirectory() as directory, trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(Path(directory) / "store", model=ScriptedModel(remember), durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(folding=folding, enforce_budget=enforce, l1_holdback_chunks=1))
            ids = [await m.add_message("user", say(i)) for i in range(count)]
            for step, units in enumerate(ticks):
                ids += [await m.add_message("user", say(len(ids))) for _ in range(step * 3)]
                for _ in range(units):
                    await m.tick()
                try:
                    result = await m.compile(budget(tokens))
                except OverBudgetError as refused:
                    assert enforce and refused.diagnostics is not None
                    continue
                stats = m.render_stats()
                assert stats is not None and stats.total_tokens <= tokens
                shown, dropped = await covered(m, result), set(stats.dropped_ids)
                assert shown | dropped == set(ids) and not shown & dropped
                assert not (dropped and enforce)


async def test_the_fold_survives_a_restart_and_forks_with_the_branch(tmp_path: Path) -> None:
    """T10: the fold is namespace state: a reopened runtime compiles the same context, and a fork starts from
    the fold of the branch it left, then keeps its own."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "store", model=ScriptedModel(remember), durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(merge_threshold=3))
            ids = [await m.add_message("user", say(i)) for i in range(30)]
            await m.wait_ready()
            first = await m.compile(budget(120))
            assert await covered(m, first) == set(ids)
            assert (await m.inspect()).strategy.resolutions  # folded: raw wouldn't fit
        async with ctxrt.open_runtime(tmp_path / "store", model=ScriptedModel(remember), durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(merge_threshold=3))
            again = await m.compile(budget(120))
            assert again.messages == first.messages
            folded = (await m.inspect()).strategy.resolutions
            await m.fork("side")
            assert (await m.inspect()).strategy.resolutions == folded
            more = [await m.add_message("user", say(i)) for i in range(30, 42)]
            await m.wait_ready()
            side = await m.compile(budget(120))
            assert await covered(m, side) == set(ids + more)
            assert (await m.inspect()).strategy.resolutions != folded  # the side branch's own
            child = await m.derive(branch="kid")
            assert (await child.inspect()).strategy.resolutions == (await m.inspect()).strategy.resolutions
            await m.switch_branch("main")
            assert (await m.inspect()).strategy.resolutions == folded


async def test_lacking_summaries_are_made_and_the_fold_improves_after_wait_ready(tmp_path: Path) -> None:
    """T10: a compile whose fold can't fit reports what it left out; its lacking summary (the held-back chunk's)
    is queued as a unit, and after wait_ready the same budget fits everything."""
    with trio.fail_after(GUARD_S):
        model = ScriptedModel(remember)
        async with ctxrt.open_runtime(tmp_path / "store", model=model, durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(l1_holdback_chunks=1, merge_threshold=6))
            ids = [await m.add_message("user", say(i)) for i in range(18)]
            await m.wait_ready()
            before = len(model.requests)
            await m.compile(budget(140))
            stats = m.render_stats()
            assert stats is not None and stats.dropped_ids
            health = await m.health()
            assert health.pending_units >= 1 and health.compression_debt_tokens > 0  # what the fold lacks is work
            await m.wait_ready()
            assert len(model.requests) > before
            result = await m.compile(budget(140))
            stats = m.render_stats()
            assert stats is not None and not stats.dropped_ids
            assert await covered(m, result) == set(ids)


async def test_enforce_budget_refuses_a_compile_through_the_manager(tmp_path: Path) -> None:
    """T11: compile raises OverBudgetError with diagnostics when even full folding can't fit, and compiles
    without it once the budget allows."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "store", durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(enforce_budget=True))
            ids = [await m.add_message("user", say(i)) for i in range(12)]
            with pytest.raises(OverBudgetError) as refused:
                await m.compile(budget(90))
            assert refused.value.diagnostics is not None and refused.value.diagnostics.lacking
            result = await m.compile(budget(500))
            assert await covered(m, result) == set(ids)


async def test_a_reader_s_fold_shows_no_other_reader_s_block(tmp_path: Path) -> None:
    """T10 with audiences: folding alice's view, no shown summary or raw message carries a block only bob may
    see; every message of her view is shown or covered."""
    def private(request: ModelRequest) -> str:
        text = " ".join(b.text for m_ in request.messages for b in m_.content if isinstance(b, Text))
        assert "for bob only" not in text
        return remember(request)

    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "store", model=ScriptedModel(private), durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(merge_threshold=3), view_reader="alice")
            for i in range(40):
                content: Any = say(i)
                if i % 5 == 0:
                    content = [{"type": "text", "text": say(i)},
                               {"type": "text", "text": "for bob only", "audience": ["bob"]}]
                await m.add_message("user", content)
            await m.wait_ready()
            result = await m.compile(budget(90))
            for message in result.messages:
                for block in message.content:
                    assert "for bob only" not in getattr(block, "text", "")
            for match in await m.search_summaries(include_merged=True, limit=1000):
                assert "for bob only" not in match.summary.content
            view = {message.id for message in await m.get_all_messages()}
            stats = m.render_stats()
            assert stats is not None and not stats.dropped_ids
            assert await covered(m, result) == view
