"""Autobiographical memory's prompts: a transcript of messages, and the text of each compression
request (a chunk's, a merge's, a head-window transition's) (docs/behaviours.md T4, T6).

Pure functions from messages and summaries to request messages: what the model is asked, in
one place, apart from when the strategy asks it. A policy may add to a chunk's instruction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ..content.blocks import (
    Audio,
    CompiledMessage,
    Document,
    GeneratedImage,
    Image,
    Message,
    Text,
    ToolAttempt,
    ToolNotice,
    ToolResult,
    ToolUse,
    Video,
)
from ..content.notes import note
from .records import Summary

MANAGER = "Context Manager"
TRANSITION_PREFIX = "[Topic Transition]"
SYSTEM = "You are forming autobiographical memories of a conversation."
WITNESSED_INSTRUCTION = (
    "These events happened before you joined this conversation: you did not take part in them. Remember "
    "them as a record you have read, in the first person as the reader (\"I read that ...\"), never as your "
    "own actions or words."
)
PLAIN_TEXT_INSTRUCTION = "Write the memory as plain text directly in your response — do not call any tools for this."
RECALL_BUDGET_TOKENS = 100_000  # recall pairs in a compression request, newest first, unless the config says
RECALL_PAIR_OVERHEAD_TOKENS = 50


class VoiceOptions(Protocol):
    """The config fields the instructions read (Autobiographical's)."""

    @property
    def summary_target_tokens(self) -> int: ...
    @property
    def witnessed_instruction(self) -> str | None: ...
    @property
    def identity_reminder(self) -> str | None: ...
    @property
    def summary_user_prompt(self) -> str | None: ...


def render_transcript(messages: Sequence[Message]) -> str:
    """Messages as plain transcript text for a compression request."""
    parts: list[str] = []
    previous = None
    for message in messages:
        lines = []
        for block in message.content:
            if type(block) is Text:
                lines.append(block.text)
            elif type(block) is ToolUse:
                lines.append(f"[Tool: {block.name}]")
            elif type(block) is ToolResult:
                body = block.content if isinstance(block.content, str) else " ".join(
                    b.text for b in block.content if type(b) is Text
                )
                lines.append(f"[Tool Result] {body}")
            elif type(block) in (Image, Document):
                lines.append("[Image]" if type(block) is Image else "[Document]")
            elif isinstance(block, (Audio, Video, GeneratedImage, ToolAttempt, ToolNotice)):
                lines.append(note(block))  # the words a request form sends for it
        text = "\n".join(lines)
        if not text:
            continue
        if message.participant == previous:
            parts.append(f"---\n\n{text}")
        else:
            parts.append(f"# {message.participant.upper()}\n{text}")
        previous = message.participant
    return "<earlier_in_conversation>\n" + "\n\n".join(parts) + "\n</earlier_in_conversation>"


def recall_header(summary_id: str) -> str:
    """The text before a summary shown to the model: it names the summary only (P6)."""
    return f"[Recall {summary_id}]"


def recall_pairs(
    frontier: Sequence[Summary], before: int, participant: str, budget: int | None = None
) -> list[CompiledMessage]:
    """The ``frontier`` summaries wholly before ``before``, in store order, capped newest first by
    ``budget`` tokens (None: ``RECALL_BUDGET_TOKENS``; a backlog of unmerged L1s must not grow
    every request)."""
    earlier = sorted((s for s in frontier if s.last_sequence < before), key=lambda s: s.first_sequence)
    left, start = RECALL_BUDGET_TOKENS if budget is None else budget, len(earlier)
    while start > 0 and earlier[start - 1].tokens + RECALL_PAIR_OVERHEAD_TOKENS <= left:
        start -= 1
        left -= earlier[start].tokens + RECALL_PAIR_OVERHEAD_TOKENS
    pairs = []
    for summary in earlier[start:]:
        pairs.append(CompiledMessage(MANAGER, (Text(recall_header(summary.id)),)))
        pairs.append(CompiledMessage(participant, (Text(summary.content),)))
    return pairs


def remind(options: VoiceOptions, instruction: str) -> str:
    """``instruction`` with the identity reminder, if any, after it."""
    reminder = options.identity_reminder
    if not instruction:
        return reminder or ""
    return f"{instruction}\n\n{reminder}" if reminder else instruction


def chunk_instruction(options: VoiceOptions, *, witnessed: bool) -> str:
    """What a chunk's request asks: to remember it in the first person, or in the witnessed
    voice for events before the resident joined. With a ``summary_user_prompt`` the first-person
    ask is the host's (``chunk_ask``), so only the witnessed voice is said here."""
    if witnessed:
        voice = options.witnessed_instruction or WITNESSED_INSTRUCTION
        return remind(options, f"{voice} Aim for about {options.summary_target_tokens} tokens.")
    if options.summary_user_prompt is not None:
        return remind(options, "")  # the reminder alone
    return remind(
        options,
        f"Starting from my last message, please describe everything that has happened. Aim for about "
        f"{options.summary_target_tokens} tokens. Describe it as you would to yourself, as if you are "
        f"remembering what has happened.",
    )


def chunk_ask(options: VoiceOptions, chunk: Sequence[Message], instruction: str) -> str:
    """The last message of a chunk's request: the chunk's transcript and the instruction. A host's
    ``summary_user_prompt`` replaces the framing around the transcript: its ``{content}`` is
    the transcript, and a prompt without one follows it."""
    transcript = render_transcript(chunk)
    prompt = options.summary_user_prompt
    if prompt is None:
        return (f"[{MANAGER}] We are ready to form a long-term memory. Here is the conversation to remember:\n\n"
                f"{transcript}\n\n{instruction}")
    asked = prompt.replace("{content}", transcript) if "{content}" in prompt else f"{transcript}\n\n{prompt}"
    instruction = instruction.strip()
    return f"{asked}\n\n{instruction}" if instruction else asked


def chunk_request(
    head: Sequence[Message], recalled: Sequence[CompiledMessage], ask: str, participant: str,
) -> list[CompiledMessage]:
    """"As of" a chunk: the head before it, prior recall pairs, then the chunk and what to make of
    it (``ask``) (T4)."""
    request: list[CompiledMessage] = []
    if head:
        request.append(CompiledMessage(MANAGER, (Text(render_transcript(head)),)))
        request.append(CompiledMessage(participant, (Text("I remember."),)))
    request += recalled
    request.append(CompiledMessage(MANAGER, (Text(ask),)))
    return request


def merge_request(
    options: VoiceOptions, group: Sequence[Summary], participant: str, *, plain_text: bool = False
) -> list[CompiledMessage]:
    """A merge's request: the group's summaries, then the ask to consolidate them (``plain_text``:
    and not to call a tool, the refusal ladder's first rung)."""
    request = [CompiledMessage(participant, (Text(s.content),)) for s in group]
    ask = remind(
        options,
        f"[{MANAGER}] Please consolidate the memories since my last message into a single cohesive memory. "
        f"Aim for about {options.summary_target_tokens} tokens. Write as you would to yourself — this is "
        f"your autobiography, capturing the arc of what happened.")
    request.append(CompiledMessage(MANAGER, (Text(f"{ask}\n\n{PLAIN_TEXT_INSTRUCTION}" if plain_text else ask),)))
    return request


def transition_request(head: Sequence[Message]) -> list[CompiledMessage]:
    """A head-window reset's request: a summary of the head window (T6)."""
    prompt = render_transcript(head)[:8000]
    return [CompiledMessage(MANAGER, (Text(f"{prompt}\n\nSummarize the prior conversation context in 2-3 paragraphs."),))]
