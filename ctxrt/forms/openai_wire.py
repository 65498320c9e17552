"""Compiled messages in OpenAI's request forms (docs/behaviours.md P10): Chat Completions
``messages`` and Responses ``input`` items. Pure and synchronous.

Below both ``compile`` (``CompileResult.to_openai_chat`` / ``to_openai_responses``) and
``openai_model`` (compression requests), so neither imports the other; ``ctxrt.openai_rules``
checks what comes out. What the two forms share with the Messages API form (who speaks as the
assistant, another participant's tool calls shown as text, tool names rewritten into the
API alphabet) comes from ``wire``.

What a form can't carry (docs/api.md, OpenAI request forms): thinking and redacted thinking are
left out; an image, document, generated image or audio where the form has no place for it becomes
a text note naming it (its URL or title where it has one), as do video, tool attempts and tool
notices everywhere (``content.notes``); a text/plain document becomes text. ``OpenAIBody.left_out``
and ``.as_text`` count them, by block type.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, Literal, Union

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
from ..openai_rules import CHAT_CALL_ID_MAX, RESPONSES_CALL_ID_MAX
from .wire import (
    CONTINUED_TEXT,
    ForeignCalls,
    ReplayedCalls,
    api_tool_name,
    block_to_api,
    compact_json,
    image_fits,
    replay_calls,
)

NO_OUTPUT = "(no output)"  # a tool result with nothing to show, so no tool message is empty
ERROR_PREFIX = "Error: "  # neither form has an is_error flag: an error result says so in its text
DEFAULT_FILENAME = "document.pdf"
JOIN = "\n\n"  # between the text blocks of one message sent as one string
# The audio Chat Completions takes as input_audio, by media type (its two formats).
AUDIO_FORMATS = {"audio/wav": "wav", "audio/x-wav": "wav", "audio/wave": "wav", "audio/mpeg": "mp3", "audio/mp3": "mp3"}
SystemRole = Literal["system", "developer"]
Api = Literal["chat", "responses"]


class OpenAIBody(dict[str, Any]):
    """A request body (a dict: pass it as keyword arguments to the SDK's ``create``), with what the
    form couldn't carry as itself, by block type: ``left_out`` (thinking, redacted_thinking) and
    ``as_text`` (image, document, audio, video, generated_image, tool_attempt, tool_notice,
    tool_use, tool_result shown as a text note)."""

    def __init__(self, body: Mapping[str, Any], left_out: Mapping[str, int], as_text: Mapping[str, int]) -> None:
        super().__init__(body)
        self.left_out: dict[str, int] = dict(left_out)
        self.as_text: dict[str, int] = dict(as_text)


def fit_call_id(tool_id: str, limit: int) -> str:
    """``tool_id`` within ``limit`` characters: a longer one keeps its start and a hash of the whole,
    the same bytes on every turn (P9), so both halves of a pair map alike."""
    if len(tool_id) <= limit:
        return tool_id
    return f"{tool_id[: limit - 9]}_{hashlib.sha256(tool_id.encode()).hexdigest()[:8]}"


class CallIds:
    """Call ids as a form sends them: fitted to its length limit and unique in the request (the
    Responses API pairs calls and outputs by id across the whole input; agents reuse call_1...)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used: set[str] = set()
        self.current: dict[str, str] = {}  # a stored id -> what its latest call was sent as

    def call(self, tool_id: str) -> str:
        sent = fit_call_id(tool_id, self.limit)
        n = 1
        while sent in self.used:
            n += 1
            sent = fit_call_id(f"{tool_id}_{n}", self.limit)
        self.used.add(sent)
        self.current[tool_id] = sent
        return sent

    def output(self, tool_use_id: str) -> str:
        # A compile pairs every result with the call before it (P4); a hand-built result might not.
        return self.current.get(tool_use_id) or fit_call_id(tool_use_id, self.limit)


class _ReplayedIds(CallIds):
    """A ``CallIds`` answering one message's asks as a walk over the request answered them
    (``replay_ids``), so the message's items can be made apart from that walk."""

    def __init__(self, limit: int, sent: Sequence[str]) -> None:
        super().__init__(limit)
        self._sent = iter(sent)

    def call(self, tool_id: str) -> str:
        return next(self._sent)

    def output(self, tool_use_id: str) -> str:
        return next(self._sent)


def _data_url(source: Mapping[str, Any]) -> str | None:
    """The URL a form sends media by: a data URL for base64; an http(s) URL as is. None for what
    the forms don't fetch (another scheme), missing stored media and text documents."""
    if source.get("type") == "base64":
        return f"data:{source.get('media_type')};base64,{source.get('data')}"
    url = str(source.get("url")) if source.get("type") == "url" else ""
    return url if url.startswith(("http://", "https://")) else None


def _note(block: Image | Document | GeneratedImage) -> str:
    """The text an image or document becomes where the form has no place for it (an image by
    its URL, or where the host says it came from; a document by its title or filename and URL)."""
    if type(block) is GeneratedImage:
        return note(block)
    if block.source.get("type") == "blob_ref":
        return str(block_to_api(block)["text"])  # the Messages API form's words for missing media
    url = block.source.get("url") if block.source.get("type") == "url" else None
    if type(block) is Image:
        url = url or block.source_url
        return f"[image: {url}]" if url else "[image not shown]"
    assert type(block) is Document
    named = [str(part) for part in (block.title or block.filename, url) if part]
    return f"[document: {', '.join(named)}]" if named else "[document not shown]"


def _document_text(block: Document) -> str:
    name = block.title or block.filename
    title = f"[document: {name}]\n" if name else ""
    return title + str(block.source.get("data", ""))


def _filename(block: Document) -> str:
    return block.filename or block.title or DEFAULT_FILENAME


class _ChatForm:
    """Chat Completions: media in user messages only, text parts typed "text", call ids up to 40."""

    call_id_limit = CHAT_CALL_ID_MAX
    text_type = "text"

    def media_part(self, block: Image | Document | GeneratedImage, *, output: bool) -> dict[str, Any] | None:
        url = _data_url(block.source)
        if output or url is None:
            return None  # a tool message carries text only
        if type(block) is not Document:
            return {"type": "image_url", "image_url": {"url": url}}
        if block.source.get("type") == "base64":
            return {"type": "file", "file": {"filename": _filename(block), "file_data": url}}
        return None  # Chat Completions takes no file by URL

    def audio_part(self, block: Audio) -> dict[str, Any] | None:
        """Base64 wav or mp3 as ``input_audio``; other audio, or audio by URL, has no part here."""
        source = block.source
        audio_format = AUDIO_FORMATS.get(str(source.get("media_type")))
        if source.get("type") != "base64" or audio_format is None:
            return None
        return {"type": "input_audio", "input_audio": {"data": source.get("data"), "format": audio_format}}


class _ResponsesForm:
    """Responses: media in user messages and tool outputs, text parts "input_text", call ids up to 64."""

    call_id_limit = RESPONSES_CALL_ID_MAX
    text_type = "input_text"

    def media_part(self, block: Image | Document | GeneratedImage, *, output: bool) -> dict[str, Any] | None:
        url = _data_url(block.source)
        if url is None:
            return None
        if type(block) is not Document:
            return {"type": "input_image", "image_url": url, "detail": "auto"}
        if block.source.get("type") == "base64":
            return {"type": "input_file", "filename": _filename(block), "file_data": url}
        return {"type": "input_file", "file_url": url}

    def audio_part(self, block: Audio) -> dict[str, Any] | None:
        return None  # the Responses input has no audio part


_Form = Union[_ChatForm, _ResponsesForm]
_CHAT = _ChatForm()
_RESPONSES = _ResponsesForm()
_FORMS: dict[Api, _Form] = {"chat": _CHAT, "responses": _RESPONSES}


class _Turn:
    """One compiled message in a form's terms: tool outputs answering the call before it, its
    content parts, and the assistant's own calls."""

    __slots__ = ("calls", "outputs", "parts")

    def __init__(self) -> None:
        self.outputs: list[tuple[str, list[dict[str, Any]]]] = []  # (call id, parts)
        self.parts: list[dict[str, Any]] = []
        self.calls: list[tuple[str, str, str]] = []  # (call id, name, arguments)


class _Walk:
    """Walks a request's compiled messages once, turning each into a ``_Turn``, and counts what
    the form couldn't carry."""

    def __init__(self, form: _Form, foreign: ForeignCalls | None = None, ids: CallIds | None = None) -> None:
        self.form = form
        self.foreign = foreign or ForeignCalls()
        self.ids = ids or CallIds(form.call_id_limit)
        self.left_out: dict[str, int] = {}
        self.as_text: dict[str, int] = {}

    def text(self, text: str) -> dict[str, Any]:
        return {"type": self.form.text_type, "text": text}

    def shown_as_text(self, block: Block, text: str) -> dict[str, Any]:
        self.as_text[block.type] = self.as_text.get(block.type, 0) + 1
        return self.text(text)

    def media(self, block: Image | Document | GeneratedImage, *, output: bool, assistant: bool) -> dict[str, Any] | None:
        if type(block) is Document and block.source.get("type") == "text":
            text = _document_text(block)
            return self.shown_as_text(block, text) if text.strip() else None
        sendable = not assistant and (type(block) is not GeneratedImage or image_fits(block))
        part = self.form.media_part(block, output=output) if sendable else None
        return part if part is not None else self.shown_as_text(block, _note(block))

    def turn(self, message: CompiledMessage, assistant: bool) -> _Turn:
        turn = _Turn()
        for block in message.content:
            if type(block) is Text:
                if block.text.strip():
                    turn.parts.append(self.text(block.text))
            elif type(block) is Thinking or type(block) is RedactedThinking:
                self.left_out[block.type] = self.left_out.get(block.type, 0) + 1
            elif type(block) is ToolUse:
                if assistant:
                    self.foreign.own(block)
                    turn.calls.append((self.ids.call(block.id), api_tool_name(block.name), compact_json(block.input)))
                else:
                    turn.parts.append(self.shown_as_text(block, self.foreign.call_text(message.participant, block)))
            elif type(block) is ToolResult:
                shown = self.foreign.result_text(block)
                if shown is not None:
                    turn.parts.append(self.shown_as_text(block, shown))
                else:
                    turn.outputs.append((self.ids.output(block.tool_use_id), self.output_parts(block)))
            elif type(block) is Image or type(block) is Document or type(block) is GeneratedImage:
                part = self.media(block, output=False, assistant=assistant)
                if part is not None:
                    turn.parts.append(part)
            elif type(block) is Audio:
                part = None if assistant else self.form.audio_part(block)
                turn.parts.append(part if part is not None else self.shown_as_text(block, note(block)))
            elif type(block) is Video or type(block) is ToolAttempt or type(block) is ToolNotice:
                turn.parts.append(self.shown_as_text(block, note(block)))
        return turn

    def output_parts(self, block: ToolResult) -> list[dict[str, Any]]:
        """A result's content as parts: never empty, and an error says so in its first text."""
        parts: list[dict[str, Any]] = []
        if isinstance(block.content, str):
            if block.content.strip():
                parts.append(self.text(block.content))
        else:
            for inner in block.content:
                if type(inner) is Text:
                    if inner.text.strip():
                        parts.append(self.text(inner.text))
                elif type(inner) is Image or type(inner) is Document:
                    part = self.media(inner, output=True, assistant=False)
                    if part is not None:
                        parts.append(part)
        if not parts:
            parts.append(self.text(NO_OUTPUT))
        if block.is_error:
            if parts[0]["type"] == self.form.text_type:
                parts[0] = self.text(ERROR_PREFIX + parts[0]["text"])
            else:
                parts.insert(0, self.text(ERROR_PREFIX.strip()))
        return parts

    def turns(
        self, messages: Sequence[CompiledMessage], assistant: str | Collection[str]
    ) -> Iterable[tuple[CompiledMessage, bool, _Turn]]:
        speakers = {assistant} if isinstance(assistant, str) else assistant
        for message in messages:
            speaks_as_assistant = message.participant in speakers
            yield message, speaks_as_assistant, self.turn(message, speaks_as_assistant)


def _all_text(parts: list[dict[str, Any]], text_type: str) -> bool:
    return all(part["type"] == text_type for part in parts)


def _joined(parts: list[dict[str, Any]]) -> str:
    return JOIN.join(part["text"] for part in parts)


def _content(parts: list[dict[str, Any]], text_type: str) -> str | list[dict[str, Any]]:
    """One string when every part is text (what every OpenAI-compatible server takes), else the parts."""
    return _joined(parts) if _all_text(parts, text_type) else parts


def _speaker_name(participant: str) -> str | None:
    # Chat Completions' "name" tells participants of one role apart; the generic "user" needs none.
    return None if participant.lower() == "user" else api_tool_name(participant)


def check_system_role(system_role: object) -> None:
    """Raise ``ValueError`` unless ``system_role`` is one the form has for a system prompt."""
    if system_role not in ("system", "developer"):
        raise ValueError(f"system_role must be 'system' or 'developer', not {system_role!r}")


def to_chat_messages(
    messages: Sequence[CompiledMessage],
    assistant: str | Collection[str],
    *,
    system: str | None = None,
    system_role: SystemRole = "system",
    alternate_roles: bool = False,
) -> tuple[list[dict[str, Any]], dict[str, int], dict[str, int]]:
    """Chat Completions ``messages`` for compiled messages, with ``left_out`` and ``as_text`` (P10).

    ``system`` (if not blank) leads as a ``system_role`` message. Participants in ``assistant``
    speak as the assistant (their tool calls as ``tool_calls``), everyone else as the user, with
    ``name`` unless the participant is "user". A result of the assistant's own call is a ``tool``
    message right after the call, before the rest of its message; one message per compiled
    message, never an empty one. ``alternate_roles``: see ``_alternated``.
    """
    check_system_role(system_role)
    walk = _Walk(_CHAT)
    out: list[dict[str, Any]] = []
    for message, speaks_as_assistant, turn in walk.turns(messages, assistant):
        out += _chat_items(message, speaks_as_assistant, turn)
    return chat_finish(out, system, system_role, alternate_roles), walk.left_out, walk.as_text


def chat_finish(
    out: list[dict[str, Any]], system: str | None, system_role: SystemRole, alternate_roles: bool
) -> list[dict[str, Any]]:
    """The messages' items, alternated if asked, behind the system message."""
    if alternate_roles and out:
        out = _alternated(out)
    if system and system.strip():
        out.insert(0, {"role": system_role, "content": system})
    return out


def _chat_items(message: CompiledMessage, speaks_as_assistant: bool, turn: _Turn) -> list[dict[str, Any]]:
    """One compiled message's Chat Completions messages: tool outputs, then its own, if any."""
    out: list[dict[str, Any]] = [
        {"role": "tool", "tool_call_id": call_id, "content": _joined(parts)} for call_id, parts in turn.outputs
    ]
    if speaks_as_assistant:
        reply: dict[str, Any] = {"role": "assistant"}
        if turn.parts:
            reply["content"] = _joined(turn.parts)  # every part is text: media became notes
        if turn.calls:
            reply["tool_calls"] = [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
                for call_id, name, arguments in turn.calls
            ]
        if len(reply) > 1:
            out.append(reply)
    elif turn.parts:
        said: dict[str, Any] = {"role": "user", "content": _content(turn.parts, "text")}
        name = _speaker_name(message.participant)
        if name is not None:
            said["name"] = name
        out.append(said)
    return out


def _parts(content: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def _merged(run: list[dict[str, Any]]) -> dict[str, Any]:
    """One message for a run of one role: the first one's fields; the contents joined (strings by
    JOIN until a list of parts comes, then part lists, strings as text parts); the tool calls in
    order; the name only if every message of the run has it."""
    merged = dict(run[0])
    if len(run) == 1:
        return merged
    contents = [message["content"] for message in run if "content" in message]
    if contents:
        lists = next((k for k, content in enumerate(contents) if not isinstance(content, str)), len(contents))
        if lists == len(contents):
            merged["content"] = JOIN.join(contents)
        else:
            parts = _parts(JOIN.join(contents[:lists])) if lists else []
            merged["content"] = parts + [part for content in contents[lists:] for part in _parts(content)]
    if any("tool_calls" in message for message in run):
        merged["tool_calls"] = [call for message in run for call in message.get("tool_calls", ())]
    if len({message.get("name") for message in run}) > 1:
        merged.pop("name", None)
    return merged


def _alternated(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For servers whose chat templates want user and assistant turns to alternate (Mistral's and
    Gemma's, for one): a run of user messages, or of assistant ones, becomes one message (a
    ``name`` kept only if the whole run shares it), and an opening assistant message follows a
    "(continued)" user one, as in the Messages API form."""
    runs: list[list[dict[str, Any]]] = []
    for message in messages:
        if runs and runs[-1][0]["role"] == message["role"] != "tool":
            runs[-1].append(message)
        else:
            runs.append([message])
    out = [_merged(run) for run in runs]  # each run merged once: a long run costs its length, not its square
    if out[0]["role"] != "user":
        out.insert(0, {"role": "user", "content": CONTINUED_TEXT})
    return out


def to_responses_input(
    messages: Sequence[CompiledMessage], assistant: str | Collection[str]
) -> tuple[list[dict[str, Any]], dict[str, int], dict[str, int]]:
    """Responses API ``input`` items for compiled messages, with ``left_out`` and ``as_text`` (P10).

    A message is a ``message`` item (the assistant's content one string; a user's one string, or
    ``input_text``/``input_image``/``input_file`` parts when it holds media); the assistant's own
    calls are ``function_call`` items after its message, each answered by a
    ``function_call_output`` right after them. The form has no participant name: everyone not in
    ``assistant`` speaks as the user.
    """
    walk = _Walk(_RESPONSES)
    out: list[dict[str, Any]] = []
    for message, speaks_as_assistant, turn in walk.turns(messages, assistant):
        out += _responses_items(message, speaks_as_assistant, turn)
    return out, walk.left_out, walk.as_text


def _responses_items(_message: CompiledMessage, speaks_as_assistant: bool, turn: _Turn) -> list[dict[str, Any]]:
    """One compiled message's Responses items: outputs, its message item if any, then its calls."""
    out: list[dict[str, Any]] = [
        {"type": "function_call_output", "call_id": call_id, "output": _content(parts, "input_text")}
        for call_id, parts in turn.outputs
    ]
    if turn.parts:
        if speaks_as_assistant:
            out.append({"type": "message", "role": "assistant", "content": _joined(turn.parts)})
        else:
            out.append({"type": "message", "role": "user", "content": _content(turn.parts, "input_text")})
    out += ({"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments}
            for call_id, name, arguments in turn.calls)
    return out


_ITEMS = {"chat": _chat_items, "responses": _responses_items}


def call_ids(api: Api) -> CallIds:
    """A request's call ids in form ``api``, for ``replay_ids`` to walk it with."""
    return CallIds(_FORMS[api].call_id_limit)


def replay_ids(
    foreign: ForeignCalls, ids: CallIds, message: CompiledMessage, speaks_as_assistant: bool
) -> tuple[tuple[str | None, ...], tuple[str, ...]]:
    """What making ``message``'s items asks of a request's walk (``foreign``, then ``ids``), in
    order, with its effects on both, without making them: the message's context in the request,
    to tell whether its cached items hold. ``ids`` keep apart from ``foreign``'s answers but for
    a result the walk shows as text, which asks no id."""
    looked = replay_calls(foreign, message, "assistant" if speaks_as_assistant else "user")
    answers = iter(looked)
    sent: list[str] = []
    for block in message.content:
        if type(block) is ToolUse and speaks_as_assistant:
            sent.append(ids.call(block.id))
        elif type(block) is ToolResult and next(answers) is None:
            sent.append(ids.output(block.tool_use_id))
    return looked, tuple(sent)


def message_items(
    api: Api, message: CompiledMessage, speaks_as_assistant: bool,
    looked: Sequence[str | None] = (), sent: Sequence[str] = (),
) -> tuple[list[dict[str, Any]], dict[str, int], dict[str, int]]:
    """One compiled message's items in form ``api`` with its ``left_out`` and ``as_text``, the
    walk's answers to it being ``replay_ids``'s (none for a message without tool blocks)."""
    form = _FORMS[api]
    walk = _Walk(form, ReplayedCalls(looked), _ReplayedIds(form.call_id_limit, sent))
    items = _ITEMS[api](message, speaks_as_assistant, walk.turn(message, speaks_as_assistant))
    return items, walk.left_out, walk.as_text


def chat_tools(tools: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages API tool definitions (``name``, ``description``, ``input_schema``) as Chat
    Completions function tools, names rewritten as calls are; a provider's own tools (those with
    a ``type``, such as a web search) have no Chat Completions form and are left out."""
    out = []
    for tool in tools:
        if "type" in tool and tool["type"] != "custom":
            continue
        function: dict[str, Any] = {"name": api_tool_name(str(tool.get("name", "")))}
        if tool.get("description"):
            function["description"] = tool["description"]
        if "input_schema" in tool:
            function["parameters"] = dict(tool["input_schema"])
        out.append({"type": "function", "function": function})
    return out
