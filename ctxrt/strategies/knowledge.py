"""Knowledge: Autobiographical with phase-aware chunking, instructions and L1 budgets (docs/behaviours.md T7).

Each message gets a phase from the tools it calls: ``lesson`` (exact lesson tool names) over
``subagent`` (prefix ``subagent:``) over ``research`` (prefixes ``mcpl:``, ``zulip:``) over
``synthesis`` (plain dialogue); a message of tool results only inherits the last tool phase.
A chunk closes at a phase change (with at least 2 messages) or at its phase's token ceiling.
Knowledge is the autobiographical strategy with the ``KNOWLEDGE`` compression policy, whose
decisions are the plain functions here.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from ..content.blocks import Message, ToolResult, ToolUse
from .autobiographical import Autobiographical, AutobiographicalStrategy
from .chunking import ChunkRule
from .policy import CompressionPolicy
from .records import Summary
from .selection import Price

LESSON_TOOLS = frozenset({"lessons:create", "lessons:update"})
SUBAGENT_PREFIXES = ("subagent:",)
RESEARCH_PREFIXES = ("mcpl:", "zulip:")
CEILING = {"research": 2.0, "subagent": 2.0, "synthesis": 1.5, "lesson": 1.0}
INSTRUCTIONS = {
    "research": "Record what was looked up and what was found: sources, facts, figures, dead ends.",
    "subagent": "Record what was delegated, to whom, and what came back.",
    "lesson": "Record the lesson exactly as it was written or changed, and why.",
    "synthesis": "Record the reasoning, the decisions made and the user's active asks.",
}
LEAD_NOTE = "Mark every open lead or unresolved question with [LEAD] so it survives later consolidation."


def phase_of(message: Message, previous: str = "synthesis") -> str:
    names = [block.name for block in message.content if type(block) is ToolUse]
    if not names:
        only_results = message.content and all(type(block) is ToolResult for block in message.content)
        return previous if only_results else "synthesis"
    if any(name in LESSON_TOOLS for name in names):
        return "lesson"
    if any(name.startswith(SUBAGENT_PREFIXES) for name in names):
        return "subagent"
    if any(name.startswith(RESEARCH_PREFIXES) for name in names):
        return "research"
    return "synthesis"


def phases(messages: Sequence[Message]) -> list[str]:
    found, previous = [], "synthesis"
    for message in messages:
        previous = phase_of(message, previous)
        found.append(previous)
    return found


def phase_rule(target_chunk_tokens: int) -> ChunkRule:
    """A chunk closes at a phase change (with at least 2 messages) or at its phase's ceiling."""
    walked = "synthesis"  # the phase of the last message the walk handed in

    def closes(pending: Sequence[Message], tokens: int, following: Message | None) -> bool:
        nonlocal walked
        # The walk hands messages in order: carry the phase along rather than re-derive it (O(n), not O(n^2)).
        previous = "synthesis" if len(pending) == 1 else walked
        current = walked = phase_of(pending[-1], previous)
        if len(pending) < 2:
            return False
        if tokens >= CEILING[current] * target_chunk_tokens:
            return True
        return following is not None and phase_of(following, current) != current

    return closes


def phase_detail(chunk: Sequence[Message]) -> str:
    """What a chunk's instruction adds: the phases it went through, what to record of each, and the lead note."""
    mix = sorted(set(phases(chunk)))
    details = " ".join(INSTRUCTIONS[phase] for phase in mix)
    return f"This stretch was {', '.join(mix)}. {details} {LEAD_NOTE}"


def dominant_phase(chunk: Sequence[Message]) -> str | None:
    found = phases(chunk)
    return max(set(found), key=found.count) if found else None


def choose_by_phase(candidates: list[Summary], allowance: int, price: Price) -> list[Summary]:
    """Asymmetric L1 budget: synthesis first (floor 0.4, cap 0.7), then lessons, then
    subagent and the rest, research capped at 0.3 of the allowance."""
    by_phase: dict[str, list[Summary]] = {}
    for summary in candidates:
        by_phase.setdefault(summary.phase or "synthesis", []).append(summary)
    caps = {"synthesis": 0.7, "lesson": 1.0, "subagent": 1.0, "research": 0.3}
    chosen: list[Summary] = []
    left = allowance
    for phase in ("synthesis", "lesson", "subagent", "research"):
        budget = min(left, int(allowance * caps[phase]))
        for summary in reversed(by_phase.get(phase, [])):  # the newest of a phase first
            cost = price(summary)
            if cost <= budget:
                chosen.append(summary)
                budget -= cost
                left -= cost
    return sorted(chosen, key=lambda s: s.first_sequence)


KNOWLEDGE = CompressionPolicy("knowledge", phase_rule, phase_detail, dominant_phase, choose_by_phase)


@attrs.frozen
class Knowledge(Autobiographical):
    """Config of ``KnowledgeStrategy``: Autobiographical's options, hierarchical always."""

    hierarchical: bool = attrs.field(default=True, init=False)

    def create(self) -> AutobiographicalStrategy:
        return AutobiographicalStrategy(self, KNOWLEDGE)
