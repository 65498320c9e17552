"""The refusal ladder of a compression unit (docs/behaviours.md T12).

A reply the model refused ("refusal", or no text) or answered with a tool call is not a memory,
but often the same request shaped differently is answered: the unit's next request climbs down a
rung, each one asking less of the model than the one before (they add up): a plain-text
instruction; no tools; the source alone, without the head or recall pairs; the source split in
halves, each summarised and the two stitched into one summary. At most ``refusal_fallbacks``
rungs are tried (a rung that would change nothing is skipped, uncounted) before the reply counts
as one failure and the next attempt starts again from the full request.

Pure values and decisions: where a unit stands (``Step``), its stored form, what a reply's refusal
was and which rung comes next. The strategy builds each rung's request and takes its reply; the
drain makes one model call per rung (per half, for a split), so the ladder is walked one unit at a
time, by the drain, never in a loop inside the strategy.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from ..content.blocks import ToolUse
from ..models.model_types import ModelResponse

logger = logging.getLogger("ctxrt.autobiographical")

FULL = "full"  # the unit's request as planned: not a fallback
PLAIN_TEXT = "plain_text"
NO_TOOLS = "no_tools"
SOURCE_ONLY = "source_only"
SPLIT = "split"
RUNGS = (PLAIN_TEXT, NO_TOOLS, SOURCE_ONLY, SPLIT)  # in the order they are tried
_RANK = {FULL: 0, **{name: rank for rank, name in enumerate(RUNGS, 1)}}

# What the ladder answers: a refusal. Any other failure (cut off, an error) counts at once.
REFUSED, NO_TEXT, TOOL_USE = "refusal", "no text", "tool_use"


@attrs.frozen
class Step:
    """Where a unit stands on its ladder: the rung its next request is made at, how many rungs it
    took (``taken``), the first half's summary once a split made it, and why the reply that sent
    it down was refused (``failure``)."""

    rung: str = FULL
    taken: int = 0
    first_half: str | None = None
    failure: str | None = None

    def at_least(self, rung: str) -> bool:
        """Whether this rung includes what ``rung`` changes (rungs add up)."""
        return _RANK[self.rung] >= _RANK[rung]

    @property
    def half(self) -> int | None:
        """The half a split's next request summarises (1 or 2), else None."""
        if self.rung != SPLIT:
            return None
        return 1 if self.first_half is None else 2


def refusal(outcome: ModelResponse) -> str | None:
    """Why ``outcome`` is a refusal the ladder answers (``REFUSED``, ``TOOL_USE``, ``NO_TEXT``), or None."""
    if outcome.stop_reason == "tool_use" or any(isinstance(block, ToolUse) for block in outcome.content):
        return TOOL_USE
    if outcome.stop_reason == "refusal":
        return REFUSED
    if outcome.stop_reason == "end_turn" and not outcome.text.strip():
        return NO_TEXT
    return None


def next_rung(step: Step, fallbacks: int, applies: Callable[[str], bool]) -> str | None:
    """The rung after ``step`` that changes the request (``applies``), if ``fallbacks`` allow
    another; None: the ladder is spent."""
    if step.taken >= fallbacks:
        return None
    below = RUNGS[_RANK[step.rung]:]
    return next((rung for rung in below if applies(rung)), None)


def stitch(first: str, second: str) -> str:
    """One summary of a split source from its halves' summaries, oldest first."""
    return f"{first}\n\n{second}"


def ladder_record(steps: Mapping[str, Step]) -> dict[str, Any]:
    """The units' steps as the ``ladder`` value stores them (beside ``attempts``)."""
    return {key: attrs.asdict(step) for key, step in steps.items()}


def ladder_from(stored: Any, where: str = "the namespace") -> dict[str, Step]:
    """The ``ladder`` value read back, checked field by field: a step this version can't read
    (another version's, a host's bug) is logged at ERROR, naming ``where`` (the namespace and
    branch), and ignored: its unit starts again from the full request, which is harmless. No
    stored value reaches a request or a summary unchecked."""
    if stored is None:
        return {}
    if not isinstance(stored, dict):
        logger.error("the stored ladder %r of %s can't be read; its units start again", stored, where)
        return {}
    steps: dict[str, Step] = {}
    for key, record in stored.items():
        problem = _unreadable(key, record)
        if problem is not None:
            logger.error("the stored ladder step %r of unit %r in %s can't be read (%s); it starts again", record,
                         key, where, problem)
            continue
        steps[key] = Step(**record)
    return steps


def _unreadable(key: Any, record: Any) -> str | None:
    """What is wrong with a stored ladder step, or None: it reads back as a ``Step``."""
    if not isinstance(key, str):
        return "its unit isn't named by a string"
    if not isinstance(record, dict) or not set(record) <= set(attrs.fields_dict(Step)):
        return "not a step"
    rung, taken = record.get("rung", FULL), record.get("taken", 0)
    first_half, failure = record.get("first_half"), record.get("failure")
    if not isinstance(rung, str) or rung not in _RANK:
        return "an unknown rung"
    if type(taken) is not int or taken < 0:
        return "a count of rungs taken that isn't a whole number of at least 0"
    if first_half is not None and (rung != SPLIT or not isinstance(first_half, str)):
        return "a first half that isn't a split's summary text"
    if failure is not None and not isinstance(failure, str):
        return "a failure that isn't text"
    return None
