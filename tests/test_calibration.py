"""Token calibration (issue 13 item 7; docs/api.md, Host controls): a ``TokenEstimator`` prices a
namespace's messages; the bundled ``CalibratedEstimator`` learns, per model, from the usage its
compression requests report, and the namespace stores what it learnt. Pure tests of the
estimator, then through the public API on a real store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

import ctxrt
from ctxrt import Autobiographical, Budget, CalibratedEstimator, Message, ModelRequest, Text
from ctxrt.testing import estimate_blocks, estimate_message, estimate_text
from ctxrt.content.tokens import MAX_FACTOR, MIN_FACTOR

GUARD_S = 30


def message(text: str) -> Message:
    return Message("1", 1, "user", (Text(text),))


def test_each_observation_moves_the_models_factor_toward_what_the_model_reported() -> None:
    """Item 7: an exponential average of actual / estimated, per model, clamped."""
    estimator = CalibratedEstimator()
    plain = message("we talked it over " * 20)
    assert estimator.estimate(plain) == estimate_message(plain)  # nothing observed: the plain estimate
    for _ in range(30):
        estimator.observe("model-a", 1_000, 1_500)
    assert estimator.factors["model-a"] == pytest.approx(1.5, rel=1e-3)
    assert estimator.estimate(plain) == round(estimate_message(plain) * estimator.factor)
    estimator.observe("model-b", 100, 10_000)  # an absurd report moves it only as far as the clamp allows
    assert MIN_FACTOR <= estimator.factors["model-b"] <= MAX_FACTOR
    pinned = CalibratedEstimator(model="model-a")
    pinned.restore(estimator.to_json())
    assert pinned.factor == estimator.factors["model-a"]  # its own model's factor, not the last observed
    estimator.observe("model-a", 0, 10)  # nothing to learn from
    assert estimator.factors["model-a"] == pinned.factor


@pytest.mark.parametrize("damaged", [None, 3, {"factors": "x"}, {"factors": {"m": "1.5"}}, {"factors": {"m": 99.0}}])
def test_a_stored_calibration_that_doesnt_read_is_ignored(damaged: Any) -> None:
    """Item 7: damage or another version's record leaves the estimator uncalibrated, never raises."""
    estimator = CalibratedEstimator()
    estimator.restore(damaged)
    assert estimator.factor == 1.0


def test_an_estimator_without_the_protocol_is_refused_naming_it() -> None:
    """Bad input is refused where it is given."""
    with pytest.raises(TypeError, match="model must be"):
        CalibratedEstimator(model=3)  # type: ignore[arg-type]


class Reporting:
    """A model whose usage reports ``ratio`` times the plain estimate of each request."""

    def __init__(self, ratio: float) -> None:
        self.ratio = ratio
        self.requests: list[ModelRequest] = []

    async def complete(self, request: ModelRequest) -> ctxrt.ModelResponse:
        self.requests.append(request)
        estimated = estimate_text(request.system or "") + sum(estimate_blocks(m.content) for m in request.messages)
        return ctxrt.ModelResponse((Text("memory of it"),), "end_turn", ctxrt.Usage(round(estimated * self.ratio), 5))


async def test_a_namespace_calibrates_from_compression_usage_and_keeps_it_across_restarts(tmp_path: Path) -> None:
    """Item 7: through the runtime: the model reports 1.6x the plain estimate; the namespace's
    estimates rise toward it, compiles price with it, and a restart starts from what was stored."""
    model = Reporting(1.6)
    strategy = Autobiographical("m", target_chunk_tokens=40, recent_window_tokens=0, l1_holdback_chunks=0)
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "store", model=model, durability="os") as rt:
            estimator = CalibratedEstimator()
            m = await rt.open("diary", strategy=strategy, token_estimator=estimator)
            for i in range(40):
                await m.add_message("user", f"<m{i:05d}> we talked it over".ljust(29, "."))
            await m.wait_ready()
            assert len(model.requests) >= 5
            learnt = estimator.factors["m"]
            assert 1.3 < learnt <= 1.6
            with pytest.raises(ctxrt.ConfigConflictError, match="token_estimator"):
                await rt.open("diary", token_estimator=CalibratedEstimator())
        async with ctxrt.open_runtime(tmp_path / "store", model=model, durability="os") as rt:
            fresh = CalibratedEstimator()
            m = await rt.open("diary", strategy=strategy, token_estimator=fresh)
            assert fresh.factors["m"] == pytest.approx(learnt)
            await m.set_strategy(ctxrt.Passthrough())  # every message raw, priced by the namespace's estimator
            await m.compile(Budget(max_tokens=100_000, reserve_for_response=0))
            stats = m.render_stats()
            assert stats is not None
            messages = await m.get_all_messages()
            assert stats.total_tokens == sum(round(estimate_message(msg) * learnt) for msg in messages)
            assert stats.total_tokens > sum(estimate_message(msg) for msg in messages)
        with pytest.raises(TypeError, match="token_estimator"):
            async with ctxrt.open_runtime(tmp_path / "store") as rt:
                await rt.open("other", token_estimator=object())  # type: ignore[arg-type]


class Broken:
    """An estimator whose answers aren't token counts."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer

    def estimate(self, message: Message) -> Any:
        return self.answer

    def observe(self, model: str, estimated: int, actual: int) -> None:
        pass


@pytest.mark.parametrize("answer", [-1, 2.5, None, True])
async def test_an_estimate_that_is_not_a_token_count_is_refused_naming_the_estimator(tmp_path: Path, answer: Any) -> None:
    """Bad input gets a clear error (from a host-style attack: a negative estimate let everything 'fit')."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "store", durability="os") as rt:
            m = await rt.open("n", token_estimator=Broken(answer))
            await m.add_message("user", "hello")
            with pytest.raises(TypeError, match="non-negative int"):
                await m.compile()
            assert await m.message_count() == 1  # the namespace goes on
