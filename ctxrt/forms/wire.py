"""The Anthropic Messages API form: blocks, compiled messages as a request, a response's blocks (P7).

``block_to_api`` gives one block as the API takes it (no audience, no raw); ``blocks_from_api``
reads a model response's content back into blocks, leniently (block types ctxrt doesn't keep are
skipped); ``to_anthropic_messages`` turns compiled messages into a request's ``messages``. Below
both ``compile`` (``CompileResult.to_anthropic``) and ``model`` (compression requests, their
replies), so neither imports the other; the storage form (``codec``) never needs it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from ..anthropic_rules import MAX_IMAGE_DATA_BYTES
from ..content.blocks import (
    Audio,
    Block,
    CompiledMessage,
    Document,
    GeneratedImage,
    Image,
    RedactedThinking,
    Text,
    Thinking,
    ToolAttempt,
    ToolNotice,
    ToolResult,
    ToolUse,
    Video,
)
from ..content.notes import note
from ..content.validation import TOOL_ID

MAX_REQUEST_CACHE_CONTROLS = 4  # the provider's limit per request
CONTINUED_TEXT = "(continued)"
_TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}\Z")
_NOT_NAME_CHAR = re.compile(r"[^a-zA-Z0-9_-]")


def _api_source(block: Image | Document | GeneratedImage) -> dict[str, Any] | None:
    source = block.source
    return None if source.get("type") == "blob_ref" else dict(source)


def block_to_api(block: Block) -> dict[str, Any]:
    """The Anthropic Messages API dict for ``block``: no audience, no raw; cache_control kept.

    Audio, video, a tool attempt and a tool notice, which the API has no block for, are their
    note (``notes``); a generated image is an image (``message_content`` makes it a note where
    the API takes no image). What the API has no field for (a tool use's ``raw_xml`` and
    ``unparseable_input``, a result's ``tool_name``, an image's ``token_estimate`` and
    ``source_url``, a document's ``filename``) stays in the store, for the host.
    """
    if type(block) is Text:
        d: dict[str, Any] = {"type": "text", "text": block.text}
        if block.cache_control is not None:
            d["cache_control"] = dict(block.cache_control)
        return d
    if type(block) is ToolUse:
        return {"type": "tool_use", "id": block.id, "name": block.name, "input": dict(block.input)}
    if type(block) is ToolResult:
        content = block.content
        d = {
            "type": "tool_result",
            "tool_use_id": block.tool_use_id,
            "content": content if isinstance(content, str) else [block_to_api(b) for b in content],
        }
        if block.is_error:
            d["is_error"] = True
        return d
    if type(block) is Thinking:
        d = {"type": "thinking", "thinking": block.thinking}
        if block.signature is not None:
            d["signature"] = block.signature
        return d
    if type(block) is RedactedThinking:
        return {"type": "redacted_thinking", "data": block.data}
    if type(block) is Image or type(block) is Document:
        source = _api_source(block)
        if source is None:
            digest = block.source.get("sha256", "?")
            return {"type": "text", "text": f"[{block.type} unavailable: stored media {digest} is missing]"}
        d = {"type": block.type, "source": source}
        if type(block) is Document and block.title is not None:
            d["title"] = block.title
        return d
    if type(block) is GeneratedImage:
        source = _api_source(block)
        return {"type": "text", "text": note(block)} if source is None else {"type": "image", "source": source}
    if (type(block) is Audio or type(block) is Video or type(block) is ToolAttempt
            or type(block) is ToolNotice):
        return {"type": "text", "text": note(block)}
    raise TypeError(f"not a content block: {block!r}")


def image_fits(block: GeneratedImage) -> bool:
    """Whether a generated image can be sent as an image where the form takes one: its base64
    data within what the Messages API takes (5 MB), or a URL. (``Image`` blocks are held to it by
    the live policy; a generated image past it is its note, never a request the API refuses.)"""
    data = block.source.get("data") if block.source.get("type") == "base64" else None
    return not isinstance(data, str) or len(data) <= MAX_IMAGE_DATA_BYTES


def _api_item(item: Any) -> Mapping[str, Any] | None:
    if isinstance(item, Mapping):
        return item
    dump = getattr(item, "model_dump", None)  # an SDK response object
    return dump() if callable(dump) else None


def blocks_from_api(items: Sequence[Any]) -> tuple[Block, ...]:
    """Blocks from a model response's content: lenient; block types ctxrt doesn't keep are skipped."""
    out: list[Block] = []
    for item in items:
        d = _api_item(item)
        if d is None:
            continue
        tag = d.get("type")
        if tag == "text":
            cache_control = d.get("cache_control")
            out.append(Text(str(d.get("text") or ""), cache_control=dict(cache_control) if cache_control else None))
        elif tag == "thinking":
            out.append(Thinking(str(d.get("thinking") or ""), d.get("signature")))
        elif tag == "redacted_thinking":
            out.append(RedactedThinking(str(d.get("data") or "")))
        elif tag == "tool_use":
            tool_input = d.get("input")
            out.append(
                ToolUse(str(d.get("id") or ""), str(d.get("name") or ""), dict(tool_input) if isinstance(tool_input, Mapping) else {})
            )
        elif tag == "tool_result":
            content = d.get("content")
            nested: str | tuple[Block, ...] = (
                content if isinstance(content, str) else blocks_from_api(content) if isinstance(content, list) else ""
            )
            out.append(ToolResult(str(d.get("tool_use_id") or ""), nested, is_error=bool(d.get("is_error"))))
        elif tag in ("image", "document") and isinstance(d.get("source"), Mapping):
            source = dict(d["source"])
            out.append(Image(source) if tag == "image" else Document(source, title=d.get("title")))
    return tuple(out)



def api_tool_name(name: str) -> str:
    """``name`` as the API accepts it (P8: ``^[a-zA-Z0-9_-]{1,64}$``): other characters become ``_``.

    Deterministic, so a tool_use keeps the same bytes on every turn (P9). Names such as
    ``mcpl:search`` are stored as written (Knowledge reads their phase from them, T7); only the
    request form changes. A name over 64 characters keeps 55 and a hash of the whole.
    """
    if _TOOL_NAME.match(name):
        return name
    fixed = _NOT_NAME_CHAR.sub("_", name) or "tool"
    if len(fixed) > 64:
        fixed = f"{fixed[:55]}_{hashlib.sha256(name.encode()).hexdigest()[:8]}"
    return fixed


def api_tool_id(tool_id: str) -> str:
    """A tool id as the API accepts it (``^[a-zA-Z0-9_-]+$``). Ingress refuses other ids (validation);
    this only covers ids stored before it did: both halves of a pair map alike, and the hash
    keeps two ids that differ only in a refused character apart."""
    if TOOL_ID.match(tool_id):
        return tool_id
    return f"{_NOT_NAME_CHAR.sub('_', tool_id)}_{hashlib.sha256(tool_id.encode()).hexdigest()[:8]}"


def _sendable(block: Block, role: str) -> bool:
    if type(block) is Text:
        return bool(block.text.strip())  # the API refuses blank text blocks
    if type(block) is Thinking:
        # Only the assistant's own signed thinking can be replayed; the API verifies the signature.
        return role == "assistant" and bool(block.signature)
    if type(block) is RedactedThinking:
        return role == "assistant"
    return True


def mark_cache(content: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Mark a breakpoint on the last block that can carry one; the block marked, or None."""
    for block in reversed(content):
        if block["type"] not in ("thinking", "redacted_thinking"):  # thinking can't carry cache_control
            block["cache_control"] = {"type": "ephemeral"}
            marked: dict[str, Any] = block
            return marked
    return None


def marked_blocks(content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The blocks of ``content`` carrying cache_control, nested ones after their tool_result."""
    found = []
    for block in content:
        if "cache_control" in block:
            found.append(block)
        nested = block.get("content") if block["type"] == "tool_result" else None
        if isinstance(nested, list):
            found += [b for b in nested if "cache_control" in b]
    return found


def cap_cache_controls(turns: list[dict[str, Any]], ours: list[dict[str, Any]]) -> None:
    """Remove cache_control markers past the provider's 4 from ``turns`` (in place); ``ours`` are the compile's."""
    # The provider refuses more than 4 cache_control blocks in a request, nested ones in a
    # tool_result's content counted (P8): a host's own markers on stored text give way, earliest
    # first, to the compile's breakpoints; then the compile's own, earliest after the first.
    marked = [b for turn in turns for b in marked_blocks(turn["content"])]
    excess = len(marked) - MAX_REQUEST_CACHE_CONTROLS
    if excess <= 0:
        return
    mine = {id(o) for o in ours}
    host = [b for b in marked if id(b) not in mine]
    compiled = [b for b in marked if id(b) in mine]
    for block in host + compiled[1:] + compiled[:1]:
        if excess <= 0:
            return
        del block["cache_control"]
        excess -= 1


def strip_final_assistant(turns: list[dict[str, Any]]) -> None:
    """Trim a final assistant turn's trailing whitespace: in place in ``turns`` and the last turn's
    content list, a trimmed block replaced by a new one (never edited: it may be shared)."""
    # The API refuses a final assistant turn ending in whitespace (P8): trim its last text, and
    # drop a block (or the turn) that trimming leaves empty.
    while turns and turns[-1]["role"] == "assistant":
        content = turns[-1]["content"]
        last = content[-1]
        if last["type"] != "text" or last["text"] == last["text"].rstrip():
            return
        if last["text"].rstrip():
            content[-1] = {**last, "text": last["text"].rstrip()}
            return
        content.pop()
        if not content:
            turns.pop()


class ForeignCalls:
    """Tool calls made by participants who don't speak as the assistant, and their results, as text.

    A request form lets only the assistant call tools, so a call another resident made is shown
    as what happened rather than as a call this assistant made. One instance walks one request's
    messages in order (every request form uses it, so the wording is the same in each).
    """

    def __init__(self) -> None:
        self._calls: dict[str, str] = {}  # tool_use id -> "who called what"

    def call_text(self, participant: str, block: ToolUse) -> str:
        return f"[{self.called(participant, block)} with {compact_json(block.input)}]"

    def called(self, participant: str, block: ToolUse) -> str:
        """Note another participant's call; "who called what"."""
        call = self._calls[block.id] = f"{participant} called {block.name}"
        return call

    def lookup(self, tool_use_id: str) -> str | None:
        """"who called what" for a result of another participant's call; None for the assistant's own."""
        return self._calls.get(tool_use_id)

    def own(self, block: ToolUse) -> None:
        """The assistant's own call: a result with this id answers it from now on, even if another
        resident used the same id before (agents number their calls alike: call_1, call_2...)."""
        self._calls.pop(block.id, None)

    def result_text(self, block: ToolResult) -> str | None:
        """The text a result of another participant's call becomes; None for the assistant's own."""
        call = self.lookup(block.tool_use_id)
        if call is None:
            return None
        body = block.content if isinstance(block.content, str) else " ".join(
            getattr(b, "text", f"[{b.type}]") for b in block.content
        )
        failed = " (an error)" if block.is_error else ""
        return f"[result of {call}{failed}: {body}]"


def _api_block(block: Block, participant: str, role: str, foreign: ForeignCalls) -> dict[str, Any]:
    """One block in API form; another participant's tool call (and its result) becomes text."""
    if type(block) is ToolUse and role == "user":
        return {"type": "text", "text": foreign.call_text(participant, block)}
    if type(block) is ToolUse:
        foreign.own(block)
    if type(block) is ToolResult:
        shown = foreign.result_text(block)
        if shown is not None:
            return {"type": "text", "text": shown}
    if type(block) is GeneratedImage and (role == "assistant" or not image_fits(block)):
        # In the assistant's own turn, its note, as in the OpenAI forms (whose assistant messages hold text only).
        return {"type": "text", "text": note(block)}
    api = block_to_api(block)
    if type(block) is ToolUse:
        api["id"], api["name"] = api_tool_id(block.id), api_tool_name(block.name)
    elif type(block) is ToolResult:
        api["tool_use_id"] = api_tool_id(block.tool_use_id)
        nested = api["content"]
        if isinstance(nested, list):
            # Blank text nested in a result is refused by the API as at the top level (P8).
            kept = [b for b in nested if b["type"] != "text" or b["text"].strip()]
            if kept:
                api["content"] = kept
            else:
                del api["content"]  # a tool_result may carry no content
    return api


class ReplayedCalls(ForeignCalls):
    """A ``ForeignCalls`` answering one message's lookups as a walk over the request answered them
    (``replay_calls``), so the message's form can be made apart from that walk."""

    def __init__(self, seen: Sequence[str | None]) -> None:
        super().__init__()
        self._seen = iter(seen)

    def lookup(self, tool_use_id: str) -> str | None:
        return next(self._seen)


def replay_calls(foreign: ForeignCalls, message: CompiledMessage, role: str) -> tuple[str | None, ...]:
    """What ``message_content`` asks ``foreign`` of ``message``, in order, with its effects on it,
    without making the blocks: the walk's context of a message, to tell whether its cached form holds."""
    seen = []
    for block in message.content:
        if type(block) is ToolUse:
            if role == "user":
                foreign.called(message.participant, block)
            else:
                foreign.own(block)
        elif type(block) is ToolResult:
            seen.append(foreign.lookup(block.tool_use_id))
    return tuple(seen)


def holds_tools(message: CompiledMessage) -> bool:
    """Whether ``message``'s form depends on the walk (``ForeignCalls``): it holds a tool block."""
    return any(type(b) is ToolUse or type(b) is ToolResult for b in message.content)


def message_content(message: CompiledMessage, role: str, foreign: ForeignCalls) -> list[dict[str, Any]]:
    """The API blocks of one compiled message spoken as ``role``: what the API refuses left out."""
    return [_api_block(b, message.participant, role, foreign) for b in message.content if _sendable(b, role)]


def compact_json(value: Any) -> str:
    """``value`` as compact JSON text, the same bytes every time (P9)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def to_anthropic_messages(messages: Sequence[CompiledMessage], assistant: str | Collection[str]) -> list[dict[str, Any]]:
    """Messages API ``messages``: roles by membership in ``assistant``, same-role runs merged (P7).

    A breakpoint becomes ``cache_control: {"type": "ephemeral"}`` on its message's last block (a
    host's own cache_control on stored text gives way past the provider's 4); blocks the API refuses (blank text, thinking outside the assistant's turns) are left out;
    tool_results lead their user turn; a leading assistant turn follows a "(continued)" user turn;
    another participant's tool calls and their results are shown as text. Blank text nested in a
    tool_result is left out too, at most 4 cache_control markers are kept counting nested ones,
    a final assistant turn's trailing whitespace is trimmed, and tool names and ids outside the
    API's alphabet are rewritten deterministically (P8).
    """
    speakers = {assistant} if isinstance(assistant, str) else assistant
    out: list[dict[str, Any]] = []
    ours: list[dict[str, Any]] = []
    foreign = ForeignCalls()
    for message in messages:
        role = "assistant" if message.participant in speakers else "user"
        content = message_content(message, role, foreign)
        if not content:
            continue
        if message.cache_breakpoint:
            marked = mark_cache(content)
            if marked is not None:
                ours.append(marked)
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(content)
        else:
            out.append({"role": role, "content": content})
    for turn in out:
        # The API wants a user turn's tool_results first (an injection may sit before them).
        if turn["role"] == "user" and any(b["type"] == "tool_result" for b in turn["content"]):
            turn["content"].sort(key=lambda b: b["type"] != "tool_result")
    cap_cache_controls(out, ours)
    strip_final_assistant(out)
    if out and out[0]["role"] == "assistant":
        out.insert(0, continued_turn())
    return out


def continued_turn() -> dict[str, Any]:
    """The user turn put before a leading assistant turn (the API wants a user turn first)."""
    return {"role": "user", "content": [{"type": "text", "text": CONTINUED_TEXT}]}
