"""The Messages API ``messages`` of a compile, made from the last body's parts (P7, P14, P15).

``wire.to_anthropic_messages`` makes a body from scratch, block by block. Here the same body is
assembled from what the last one of the same assistant set was made of: each compiled message's
API blocks (a ``_Part``, reused while the message is the same object and, for a message with
tool blocks, while the walk over the request's tool calls shows it the same calls), and each
turn (a merged same-role run of parts, reused whole, by list slices, where the same parts make
it and its neighbours' roles still differ). So a body costs a list of references plus what
changed. The cache's parts and turns are never edited once made: the provider's 4-marker cap and
the final assistant trim are made on copies, and the last turn is always a fresh copy (the
host's to edit, docs/api.md).
"""

from __future__ import annotations

import copy
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Collection, Sequence
from functools import partial
from typing import Any, cast

from .body_runs import BodyCache, MadeFrom, SharedParts, carried, runs
from ..content.blocks import CompiledMessage
from .wire import (
    MAX_REQUEST_CACHE_CONTROLS,
    ForeignCalls,
    ReplayedCalls,
    cap_cache_controls,
    continued_turn,
    mark_cache,
    marked_blocks,
    message_content,
    replay_calls,
    strip_final_assistant,
)


class _Part:
    """One compiled message's API blocks as ``role`` (None when nothing in it is sendable), with
    the calls the walk showed it (``seen``), the block its breakpoint marked and its marker count."""

    __slots__ = ("content", "marks", "message", "ours", "results", "role", "seen")

    def __init__(self, message: CompiledMessage, role: str, seen: tuple[str | None, ...]) -> None:
        content = message_content(message, role, ReplayedCalls(seen))
        self.message, self.role, self.seen = message, role, seen
        self.ours = mark_cache(content) if content and message.cache_breakpoint else None
        self.marks = len(marked_blocks(content))
        self.results = role == "user" and any(b["type"] == "tool_result" for b in content)
        self.content = content or None


class _Body:
    """What one body was made of: its messages, their parts, where the tool-bearing ones are,
    and its turns (as made, before the cap and trim) with each one's span of messages."""

    __slots__ = ("base", "ends", "marked", "marks", "messages", "parts", "prior", "runs", "starts", "token", "tools",
                 "turns")

    def __init__(self) -> None:
        self.token = object()  # names this body for the next one's ``prior``
        self.prior: object | None = None  # the body its turns were taken from, if any
        self.runs: list[tuple[int, int, int]] = []  # (turn here, turn there, count) taken whole from it
        self.messages: list[CompiledMessage] = []
        self.parts: list[_Part] = []
        self.tools: list[int] = []
        self.turns: list[dict[str, Any]] = []
        # Each turn's first message and past its last, less ``base``: a body taking the last one's
        # turns at one shift copies these as they are, where adding the shift would cost O(turns).
        self.base = 0
        self.starts = array("q")  # arrays: copying a slice copies memory, not a reference per turn
        self.ends = array("q")
        # The turns holding cache markers (few: sorted positions), with each one's marker count and
        # the blocks whose markers its breakpoints made.
        self.marked: list[int] = []
        self.marks: list[tuple[int, tuple[dict[str, Any], ...]]] = []


class _Assembly:
    """Turns in the making: whole turns taken from the last body, and the turn being merged: a
    taken turn reopened (its first message, past its last, the turn, its marker count and our
    markers), then a group of parts joining it."""

    def __init__(self, body: _Body, parts: list[_Part]) -> None:
        self.body, self.parts = body, parts
        self.reopened: tuple[int, int, dict[str, Any], int, tuple[dict[str, Any], ...]] | None = None
        self.group: list[int] = []  # positions of the sendable parts of the open turn (after a reopened one)

    def role(self) -> str | None:
        if self.reopened is not None:
            return cast(str, self.reopened[2]["role"])
        if self.group:
            return self.parts[self.group[0]].role
        return self.body.turns[-1]["role"] if self.body.turns else None

    def part(self, i: int) -> None:
        part = self.parts[i]
        if part.content is None:
            return
        opened = self.group or self.reopened is not None
        if not opened and self.body.turns and self.body.turns[-1]["role"] == part.role:
            self._reopen()  # a taken turn the next part of its role must join
        elif opened and self.role() != part.role:
            self.close()
        self.group.append(i)

    def _reopen(self) -> None:
        body = self.body
        start, end = body.starts.pop() + body.base, body.ends.pop() + body.base
        turn = body.turns.pop()
        runs = body.runs
        if runs and runs[-1][0] + runs[-1][2] > len(body.turns):  # a taken turn made again: the run ends before it
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] - 1)
        count, ours = 0, cast(tuple[dict[str, Any], ...], ())
        if body.marked and body.marked[-1] == len(body.turns):
            body.marked.pop()
            count, ours = body.marks.pop()
        self.reopened = (start, end, turn, count, ours)

    def close(self) -> None:
        reopened, self.reopened = self.reopened, None
        group, self.group = self.group, []
        parts = [self.parts[k] for k in group]
        if reopened is not None:
            start, end, turn, count, ours = reopened
            if any(part.results for part in parts):  # tool_results go first: the whole turn made again
                group = [k for k in range(start, end) if self.parts[k].content is not None] + group
                parts = [self.parts[k] for k in group]
            else:  # the turn as it was, and what joins it
                content = turn["content"] + [block for part in parts for block in part.content or ()]
                count += sum(part.marks for part in parts)
                ours += tuple(part.ours for part in parts if part.ours is not None)
                self._add(turn["role"], content, start, group[-1] + 1 if group else end, count, ours)
                return
        if not group:
            return
        content = [block for part in parts for block in part.content or ()]
        if any(part.results for part in parts):
            content.sort(key=lambda b: b["type"] != "tool_result")  # the API wants tool_results first
        self._add(parts[0].role, content, group[0], group[-1] + 1, sum(part.marks for part in parts),
                  tuple(part.ours for part in parts if part.ours is not None))

    def _add(self, role: str, content: list[dict[str, Any]], first: int, end: int, count: int,
             ours: tuple[dict[str, Any], ...]) -> None:
        body = self.body
        body.turns.append({"role": role, "content": content})
        body.starts.append(first - body.base)
        body.ends.append(end - body.base)
        if count:
            body.marked.append(len(body.turns) - 1)
            body.marks.append((count, ours))

    def take_span(self, old: _Body, start: int, stop: int, shift: int) -> int:
        """Messages from ``start`` (the last body's ``shift`` before) as a slice of the last body's
        turn holding it, to that turn's end or ``stop``, whichever comes first: if that is more
        than a few messages and the turn can be cut (no turn open here, another role before it,
        no tool_result in it, so its content is its parts' in order), the cut parts' blocks and
        markers left out. Where the messages left to add one by one start."""
        at = start - shift  # the last body's message
        t = bisect_right(old.starts, at - old.base) - 1
        if t < 0:
            return start
        turn, body = old.turns[t], self.body
        first, end = old.starts[t] + old.base, old.ends[t] + old.base  # the turn's messages, there
        stop = min(stop - shift, end)
        if (stop - at <= _SPAN or self.group or self.reopened is not None or not turn["content"]
                or turn["content"][0]["type"] == "tool_result" or (body.turns and body.turns[-1]["role"] == turn["role"])):
            return start
        before = [part for part in old.parts[first:at] if part.content is not None]
        after = [part for part in old.parts[stop:end] if part.content is not None]
        count, ours = 0, cast(tuple[dict[str, Any], ...], ())
        marked = bisect_left(old.marked, t)
        if marked < len(old.marked) and old.marked[marked] == t:
            count, ours = old.marks[marked]
            cut = {id(part.ours) for part in before + after if part.ours is not None}
            count -= sum(part.marks for part in before + after)
            ours = tuple(o for o in ours if id(o) not in cut)
        content = turn["content"]
        content = content[sum(len(part.content or ()) for part in before):
                          len(content) - sum(len(part.content or ()) for part in after)]
        self._add(turn["role"], content, start, stop + shift, count, ours)
        return stop + shift

    def take(self, old: _Body, first: int, last: int, shift: int) -> None:
        """The last body's turns ``first``..``last - 1`` whole, their messages ``shift`` further on."""
        if first < last and old.turns[first]["role"] == self.role():
            for k in range(old.starts[first] + old.base, old.ends[first] + old.base):  # it merges with what precedes it
                self.part(k + shift)
            first += 1
        if first >= last:
            return
        self.close()
        body = self.body
        delta = old.base + shift - body.base
        if delta:
            body.starts.extend(map(delta.__add__, old.starts[first:last]))
            body.ends.extend(map(delta.__add__, old.ends[first:last]))
        else:
            body.starts += old.starts[first:last]
            body.ends += old.ends[first:last]
        lo, hi = bisect_left(old.marked, first), bisect_left(old.marked, last)
        if lo < hi:
            offset = len(body.turns) - first
            body.marked += [t + offset for t in old.marked[lo:hi]]
            body.marks += old.marks[lo:hi]
        to = len(body.turns)
        if body.runs and body.runs[-1][0] + body.runs[-1][2] == to and body.runs[-1][1] + body.runs[-1][2] == first:
            body.runs[-1] = (body.runs[-1][0], body.runs[-1][1], body.runs[-1][2] + last - first)
        else:
            body.runs.append((to, first, last - first))
        if body.turns:
            body.turns += old.turns[first:last]
        else:  # the first turns: one copy, not a copy appended
            body.turns = old.turns[first:last]


def _assemble(messages: Sequence[CompiledMessage], speakers: Collection[str], old: _Body | None,
              shared: SharedParts) -> _Body:
    def role_of(message: CompiledMessage) -> str:
        return "assistant" if message.participant in speakers else "user"

    body = _Body()
    body.messages = new = list(messages)  # the host may change its list; the record keeps this one
    found = runs(new, old.messages) if old is not None else []
    if found and old is not None:  # the longest run's turns are taken as they were stored
        i, j, _ = max(found, key=lambda run: run[2])
        body.base = old.base + i - j
    parts, fresh, body.tools = carried(found, old.parts if old is not None else [], old.tools if old is not None else [], new)
    # Replay the request's walk over its tool-bearing messages only: a part made under other calls is made again.
    foreign = ForeignCalls()
    remade: list[int] = []
    for t in body.tools:
        message = new[t]
        role = role_of(message)
        seen = replay_calls(foreign, message, role)
        held = parts[t]
        if held is None or held.seen != seen:
            if held is not None:
                remade.append(t)
            parts[t] = _Part(message, role, seen)
    for k in fresh:
        if parts[k] is None:
            message, role = new[k], role_of(new[k])
            parts[k] = shared.part(("anthropic", id(message), role), message, partial(_Part, message, role, ()))
    body.parts = made = cast(list[_Part], parts)  # every position has its part now
    assembly = _Assembly(body, made)
    position = 0
    for i, j, length in found:
        for k in range(position, i):
            assembly.part(k)
        assert old is not None
        _take_run(assembly, old, i, j, length, [t for t in remade if i <= t < i + length])
        position = i + length
    for k in range(position, len(new)):
        assembly.part(k)
    assembly.close()
    if old is not None:
        body.prior = old.token
        body.runs = [run for run in body.runs if run[2]]
    return body


def _take_run(assembly: _Assembly, old: _Body, i: int, j: int, length: int, remade: list[int]) -> None:
    """Messages ``i``..``i + length - 1``, the last body's from ``j``: its turns wholly inside the
    run (and clear of a remade part) taken whole, the rest part by part."""
    shift = i - j
    bounds = [i] + [b for t in remade for b in (t, t + 1)] + [i + length]
    for start, end in zip(bounds[::2], bounds[1::2]):
        first = bisect_left(old.starts, start - shift - old.base)
        last = max(first, bisect_right(old.ends, end - shift - old.base))
        inside = first < last
        head = old.starts[first] + old.base + shift if inside else end  # before the first whole turn
        for k in range(assembly.take_span(old, start, head, shift), head):
            assembly.part(k)
        if inside:
            assembly.take(old, first, last, shift)
            tail = old.ends[last - 1] + old.base + shift
            for k in range(assembly.take_span(old, tail, end, shift) if tail < end else tail, end):
                assembly.part(k)
        if end < i + length:
            assembly.part(end)  # a remade part


_SPAN = 16  # messages of a turn cut at the front or back taken by a slice of its content rather than one by one


def _copy_marked(turn: dict[str, Any]) -> dict[str, Any]:
    """A turn for the cap to edit: a new dict and content list, the blocks that carry a marker
    (theirs or a tool_result's inside them) copied, the others shared."""
    return {"role": turn["role"], "content": [
        copy.deepcopy(block) if "cache_control" in block or block["type"] == "tool_result" else block
        for block in turn["content"]]}


def _copy_last(turn: dict[str, Any]) -> dict[str, Any]:
    """The host's last turn: a new dict, a new content list, and a copy of its last block (the
    others shared: a turn merging a long run of one role is copied in C, not block by block)."""
    content = list(turn["content"])
    if content:
        content[-1] = copy.deepcopy(content[-1])
    return {"role": turn["role"], "content": content}


def anthropic_messages(
    messages: Sequence[CompiledMessage], assistant: str | Collection[str], cache: BodyCache
) -> list[dict[str, Any]]:
    """``wire.to_anthropic_messages(messages, assistant)``, made from the parts of the last body
    ``cache`` holds for the same assistant set; the body's turns but its last are shared with it."""
    speakers = frozenset({assistant} if isinstance(assistant, str) else assistant)
    key = ("anthropic", speakers)
    body = cache.made_of(key, messages)
    if body is None:
        body = _assemble(messages, speakers, cache.get(key), cache.shared)
    cache.put(key, body, body.messages)
    out = list(body.turns)
    copied = []
    if sum(count for count, _ in body.marks) > MAX_REQUEST_CACHE_CONTROLS:
        copied = list(body.marked)
        # The cap edits markers: on copies of the turns holding them, the cached ones kept as made.
        copies, ours = [], []
        for t, (_, made) in zip(body.marked, body.marks):
            out[t] = _copy_marked(out[t])
            copies.append(out[t])
            mine = set(map(id, made))
            ours += [c for b, c in zip(body.turns[t]["content"], out[t]["content"]) if id(b) in mine]
        cap_cache_controls(copies, ours)
    if out:
        out[-1] = _copy_last(out[-1])  # the host's to edit (P15), and the trim's
        copied.append(len(out) - 1)
    strip_final_assistant(out)
    whole = len(out) == len(body.turns)  # the trim dropped no turn
    if out and out[0]["role"] == "assistant":
        out.insert(0, continued_turn())
    cache.made = MadeFrom(out, body.token, body.prior, len(out) - len(body.turns), copied, body.runs) if whole else None
    return out
