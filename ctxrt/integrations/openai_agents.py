"""A Session for the OpenAI Agents SDK: the agent's history is its reader's compiled view of a
shared ctxrt slot (docs/integrations.md#openai-agents-sdk).

    pip install 'ctxrt[openai-agents]'

``CtxrtSession(manager)`` implements the SDK's ``Session`` protocol over a ``ctxrt.aio`` manager
opened with the agent's reader:

- ``add_items(items)`` writes the items the runner saves to the shared slot, each block carrying
  the item it came from (its ``raw`` form): a user's message as ``"user"``, a system or developer
  message as that role for the agent's reader alone, and each run of the agent's own items (its
  messages, reasoning, calls and the outputs answering them) as one message of the agent's, in
  order (compile splits the calls from their outputs, P4). An output whose call came in an
  earlier batch is added to the message holding the call, or else written as ``"tool"``. An item
  with no ctxrt block (reasoning, a hosted tool's call) is kept as a text block of its JSON for
  the agent's reader alone. Every item is checked before anything is written.
- ``get_items()`` compiles the manager's view under its budget as Responses input items: what
  this session wrote and the compile left as written comes back as the items it was written
  from (ids, status, parts, reasoning and all); the rest (others' words, summaries, a shaped
  message) in ctxrt's Responses form, another resident's words led by ``[name] ``.
- ``run_config()`` hands out a ``RunConfig`` whose ``call_model_input_filter`` compiles every
  model call's input of a run under the budget.
- ``pop_item()`` removes the newest item this session wrote through its manager and returns it;
  ``clear_session()`` removes every message it wrote. Other residents' messages stay, and so
  does any message holding a block this session's reader can't see.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
from agents import RunConfig
from agents.items import TResponseInputItem
from agents.run_config import CallModelData, ModelInputData

from .. import Budget, Image, MalformedContentError, Message, Text, Thinking, ToolResult, ToolUse, checks
from ..aio import ContextManager
from ..content.blocks import Block as StoredBlock
from ..content.blocks import CompiledMessage
from ..forms.openai_wire import call_ids, message_items, replay_ids
from ..content.tokens import estimate_text
from ..content.validation import blocks_from_content
from ..forms.wire import ForeignCalls, holds_tools
from . import arguments, blocks
from .ledger import record_compiled

if TYPE_CHECKING:
    from agents.memory import SessionSettings  # newer SDKs only: typed here, never imported

METADATA_KEY = "agents_sdk_session"  # metadata naming the session that wrote a message
ITEM_KEY = "agents_sdk_item"  # in a block's raw form: the item the block was written from
AS_JSON = "as_json"  # in a block's raw form: the block is the item's JSON (no ctxrt block holds it)
_ROLES = ("user", "assistant", *blocks.INSTRUCTIONS)
_TEXT_PARTS = ("input_text", "output_text", "text")
_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def _plain(item: Any, place: str) -> dict[str, Any]:
    """``item`` as the JSON object ``SQLiteSession`` would store and give back."""
    if hasattr(item, "model_dump") and not isinstance(item, Mapping):
        item = item.model_dump(exclude_none=True)
    if not isinstance(item, Mapping):
        raise TypeError(f"{place} must be a Responses input item (a dict), not {type(item).__name__}")
    try:
        return dict(json.loads(json.dumps(item)))
    except (TypeError, ValueError) as error:
        raise MalformedContentError(place, f"an item must be JSON: {error}") from None


def _field(item: Mapping[str, Any], key: str, place: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise MalformedContentError(f"{place}.{key}", f"a {item.get('type')} needs {key} as a string, got {value!r}")
    return value


def _parts(content: Any, place: str) -> list[blocks.Block]:
    """A message's or an output's content (a string, or input/output parts) as blocks."""
    if isinstance(content, str):
        return [blocks.text(content, place)] if content.strip() else []
    if not isinstance(content, list):
        raise MalformedContentError(place, f"content must be a string or a list of parts, not {type(content).__name__}")
    out: list[blocks.Block] = []
    for j, part in enumerate(content):
        if not isinstance(part, Mapping):
            raise MalformedContentError(f"{place}[{j}]", f"a part must be an object, not {type(part).__name__}")
        kind = part.get("type")
        if kind in _TEXT_PARTS:
            if str(part.get("text", "")).strip():
                out.append(blocks.text(str(part["text"]), f"{place}[{j}].text"))
        elif kind == "refusal":
            out.append(blocks.text(str(part.get("refusal", "")), f"{place}[{j}].refusal"))
        elif kind == "input_image" and part.get("image_url"):
            out.append(blocks.image(str(part["image_url"]), f"{place}[{j}].image_url"))
        else:
            raise MalformedContentError(f"{place}[{j}]", f"a {kind!r} part has no place in a ctxrt message here")
    return out


def _kind(item: Mapping[str, Any]) -> Any:
    """An item's type (``"message"`` for the short form with a role alone); None if it has none
    (an ``EncryptedSession`` envelope, say)."""
    return item.get("type", "message" if "role" in item else None)



def _item_blocks(item: Mapping[str, Any], place: str, reader: str) -> tuple[list[blocks.Block], bool]:
    """The blocks ``item`` is kept as (without its raw form), and whether they are its JSON (no
    ctxrt block holds it); ``MalformedContentError`` at ``place`` for an item ctxrt can't keep."""
    kind = _kind(item)
    if kind == "message":
        role = item.get("role")
        if role not in _ROLES:
            raise MalformedContentError(f"{place}.role", f"a message's role must be one of {', '.join(_ROLES)}, not {role!r}")
        if "content" not in item:
            raise MalformedContentError(f"{place}.content", "a message needs content")
        said = _parts(item["content"], f"{place}.content")
        if role in blocks.INSTRUCTIONS:
            # Instructions are the agent's own: kept for its reader alone, which only text can be (B1).
            for j, block in enumerate(said):
                if block["type"] != "text":
                    raise MalformedContentError(f"{place}.content[{j}]", f"a {role} message can hold only text "
                                                "here, since it is kept for this agent alone")
            said = blocks.instructions(role, said, reader)[1]
        return (said, False) if said else ([_as_json(item, place, reader)], True)
    if kind == "function_call":
        arguments = item.get("arguments")
        if arguments is not None and not isinstance(arguments, str):
            raise MalformedContentError(f"{place}.arguments",
                                        f"a function_call's arguments must be a JSON string, got {arguments!r}")
        return [blocks.tool_use(_field(item, "call_id", place), _field(item, "name", place), arguments, place)], False
    if kind == "function_call_output":
        call_id = _field(item, "call_id", place)
        if "output" not in item:
            raise MalformedContentError(f"{place}.output", "a function_call_output needs an output")
        output = item["output"]
        content = output if isinstance(output, str) else _parts(output, f"{place}.output")
        return [blocks.tool_result(call_id, content, f"{place}.output")], False
    return [_as_json(item, place, reader)], True


def _as_json(item: Mapping[str, Any], place: str, reader: str) -> blocks.Block:
    """An item no ctxrt block holds, as a text block of its JSON for ``reader`` alone: counted
    against the budget at its size, never shown to another agent."""
    return blocks.checked({"type": "text", "text": _COMPACT(item), "audience": [reader]}, place)


def _planned(items: Sequence[dict[str, Any]], agent: str, reader: str, writer: str) -> list[tuple[str, list[blocks.Block]]]:
    """The messages a batch writes, every item checked first, each block carrying its item: each
    run of the agent's own items (all but a user's, system or developer message) as one message
    of the agent's, an output in it only after its call; another's message as its role; an
    output whose call isn't in the run as ``TOOL``."""
    out: list[tuple[str, list[blocks.Block]]] = []
    run: list[blocks.Block] = []
    calls: set[str] = set()
    for i, item in enumerate(items):
        made, as_json = _item_blocks(item, f"items[{i}]", reader)
        raw: dict[str, Any] = {ITEM_KEY: item, blocks.WRITER: writer}
        if as_json:
            raw[AS_JSON] = True
        made = [{**block, "raw": raw} for block in made]
        kind, role = _kind(item), item.get("role")
        lone_output = kind == "function_call_output" and item["call_id"] not in calls
        if (kind != "message" or role == "assistant") and not lone_output:
            if kind == "function_call":
                calls.add(item["call_id"])
            run += made
            continue
        if run:
            out.append((agent, run))
            run, calls = [], set()
        out.append((blocks.TOOL if lone_output else blocks.USER if role == "user" else str(role), made))
    if run:
        out.append((agent, run))
    return out


def _bare(block: StoredBlock) -> StoredBlock:
    """A block as compared with the one its item makes: no raw form, no audience (a compile's
    blocks carry none)."""
    if type(block) is Text or type(block) is Thinking:
        return attrs.evolve(block, raw=None, audience=None)
    return attrs.evolve(block, raw=None)


def _legacy_items(message: Message, agent: str) -> list[TResponseInputItem]:
    """A message written before blocks carried their items (no raw form), as items: one per call
    and output, or the message."""
    tools: list[Any] = []
    for block in message.content:
        if isinstance(block, ToolUse):
            tools.append({"type": "function_call", "call_id": block.id, "name": block.name,
                          "arguments": json.dumps(block.input)})
        elif isinstance(block, ToolResult):
            output = block.content if isinstance(block.content, str) else "\n\n".join(
                b.text for b in block.content if isinstance(b, Text))
            tools.append({"type": "function_call_output", "call_id": block.tool_use_id, "output": output})
    if tools:
        return tools
    if message.participant == agent:
        text = "\n\n".join(b.text for b in message.content if isinstance(b, Text))
        return [{"type": "message", "role": "assistant", "content": text}]
    parts: list[Any] = [
        {"type": "input_text", "text": b.text} if isinstance(b, Text)
        else {"type": "input_image", "image_url": _image_url(b), "detail": "auto"}
        for b in message.content if isinstance(b, (Text, Image))
    ]
    role = message.participant if message.participant in blocks.INSTRUCTIONS else "user"
    return [{"type": "message", "role": role, "content": parts}]  # type: ignore[list-item, misc]


def _image_url(block: Image) -> str:
    source = block.source
    if source.get("type") == "base64":
        return f"data:{source.get('media_type')};base64,{source.get('data')}"
    return str(source.get("url", ""))


def _named(items: list[dict[str, Any]], participant: str) -> None:
    """Another resident's words led by ``[name] `` in their first text, the Responses form
    having no name field; a system or developer message keeps its role."""
    for item in items:
        if item.get("type") != "message":
            continue
        if participant in blocks.INSTRUCTIONS:
            item["role"] = participant
            return
        content = item["content"]
        if isinstance(content, str):
            item["content"] = blocks.speaker_prefix(participant) + content
            return
        for part in content:
            if part.get("type") == "input_text":
                part["text"] = blocks.speaker_prefix(participant) + part["text"]
                return


def _loaded(made: Sequence[str]) -> list[TResponseInputItem]:
    """Items from their JSON texts: fresh objects on every call, as ``SQLiteSession`` gives, so
    what the SDK does to them never reaches a stored block."""
    loaded: list[TResponseInputItem] = json.loads(f"[{','.join(made)}]")
    return loaded


class CtxrtSession:
    """The OpenAI Agents SDK's ``Session`` over a ctxrt manager opened with the agent's reader.

    ``manager`` is a ``ctxrt.aio`` manager with a ``view_reader`` (its namespace claimed for that
    reader); ``agent`` is the participant the agent speaks as in the slot (default: the reader);
    ``budget`` bounds every view ``get_items`` compiles; ``session_id`` (default: the manager's
    namespace) names this session in the metadata of the messages it writes. Raises
    ``TypeError`` naming the parameter for an argument of the wrong type, ``ValueError`` for a
    manager without a reader.
    """

    def __init__(
        self,
        manager: ContextManager,
        *,
        budget: Budget | None = None,
        agent: str | None = None,
        session_id: str | None = None,
        session_settings: SessionSettings | None = None,
    ) -> None:
        self.manager, self.budget, self.agent = arguments.adapter_arguments("CtxrtSession", manager, budget, agent)
        if session_id is not None and not isinstance(session_id, str):
            raise TypeError(f"CtxrtSession session_id must be a str, not {type(session_id).__name__}")
        self.session_id = session_id if session_id is not None else manager.namespace
        self.session_settings = session_settings
        self._reader = str(manager.view_reader)
        # Each compiled message's items as JSON texts and whether it holds tool blocks, while the
        # compile hands back that object.
        self._made: dict[int, tuple[CompiledMessage, list[str], bool]] = {}
        # The JSON (keys sorted) of every item written or handed out: what a model call's input
        # holds that the slot doesn't is what isn't here (``run_config``).
        self._known: set[str] = set()

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The reader's compiled view as Responses input items (the newest ``limit`` of them, or
        of ``session_settings.limit``, less any output whose call was cut off; all of them for a
        negative limit, as ``SQLiteSession``); ``TypeError`` naming ``limit`` for anything but an
        integer or None (I10)."""
        limit = checks.optional_integer(limit, "get_items limit")
        if limit is None:
            limit = getattr(self.session_settings, "limit", None)
        made = await self._view(self.budget)
        if limit is None or limit < 0:
            return _loaded(made)
        items: list[Any] = _loaded(made[-limit:] if limit > 0 else [])
        calls = {item["call_id"] for item in items if item.get("type") == "function_call"}
        return [item for item in items if item.get("type") != "function_call_output" or item["call_id"] in calls]

    def run_config(self, **run_config_kwargs: Any) -> RunConfig:
        """A ``RunConfig`` (``run_config_kwargs`` passed on) whose ``call_model_input_filter``
        hands every model call of a run this session's view compiled under its budget, less the
        instructions' tokens, followed by what the call's input holds that the slot doesn't yet
        (an item the runner hasn't saved)."""
        if "call_model_input_filter" in run_config_kwargs:
            raise TypeError("CtxrtSession.run_config sets call_model_input_filter itself; "
                            "filter in a session_input_callback or wrap this one instead")
        return RunConfig(call_model_input_filter=self._bounded, **run_config_kwargs)

    async def _bounded(self, data: CallModelData[Any]) -> ModelInputData:
        given = data.model_data
        unsaved = self._unsaved(given.input)
        spent = estimate_text(given.instructions or "") + (estimate_text(json.dumps(unsaved, default=repr)) if unsaved else 0)
        room = self.budget.max_tokens - spent
        made = await self._view(Budget(room, self.budget.reserve_for_response)) \
            if room > self.budget.reserve_for_response else []
        return ModelInputData(input=_loaded(made) + unsaved, instructions=given.instructions)

    def _unsaved(self, given: Sequence[Any]) -> list[Any]:
        """The items at the end of a call's input that this session hasn't written or handed out."""
        at = len(given)
        while at > 0:
            try:
                key = json.dumps(_plain(given[at - 1], "input"), sort_keys=True)
            except (TypeError, ValueError):
                key = None
            if key in self._known:
                break
            at -= 1
        return list(given[at:])

    async def _view(self, budget: Budget) -> list[str]:
        """The view compiled under ``budget``, as its items' JSON texts."""
        result = await self.manager.compile(budget)
        await record_compiled(self.manager, result, "openai_responses", self.agent)
        foreign, ids = ForeignCalls(), call_ids("responses")
        made: dict[int, tuple[CompiledMessage, list[str], bool]] = {}
        out: list[str] = []
        for message in result.messages:
            held = self._made.get(id(message))
            if held is not None and held[0] is message:
                _, texts, tools = held
                if tools:  # replayed as given, but the walk still passes its calls
                    replay_ids(foreign, ids, message, message.participant == self.agent)
            else:
                speaks, tools = message.participant == self.agent, holds_tools(message)
                looked, sent = replay_ids(foreign, ids, message, speaks) if tools else ((), ())
                replayed = self._replayed(message)
                texts = replayed if replayed is not None else self._rendered(message, speaks, looked, sent)
                if replayed is None and tools:
                    out += texts  # its items depend on the walk (``ForeignCalls``): made again each time
                    continue
            made[id(message)] = (message, texts, tools)
            out += texts
        self._made = made
        self._known.update(out)
        return out

    def _item(self, block: StoredBlock) -> dict[str, Any] | None:
        """The raw form this session's namespace wrote ``block`` with, if it did."""
        raw = block.raw
        if isinstance(raw, Mapping) and raw.get(blocks.WRITER) == self.manager.namespace and ITEM_KEY in raw:
            return dict(raw)
        return None

    def _replayed(self, message: CompiledMessage) -> list[str] | None:
        """``message``'s items as this session was given them, if every block of it is one this
        session wrote and the compile left it as written; else None."""
        out: list[str] = []
        content = message.content
        at = 0
        while at < len(content):
            raw = self._item(content[at])
            if raw is None:
                return None
            made, _ = _item_blocks(raw[ITEM_KEY], "item", self._reader)
            written = blocks_from_content([{k: v for k, v in b.items() if k != "audience"} for b in made])
            end = at + len(written)
            if end > len(content) or any(self._item(b) != raw for b in content[at:end]) \
                    or tuple(_bare(b) for b in content[at:end]) != written:
                return None
            out.append(json.dumps(raw[ITEM_KEY], sort_keys=True))
            at = end
        return out

    def _rendered(self, message: CompiledMessage, speaks: bool, looked: Sequence[str | None],
                  sent: Sequence[str]) -> list[str]:
        """``message`` in ctxrt's Responses form, without the blocks that are an item's JSON,
        another's words named, and the call ids this session was given kept."""
        content = tuple(b for b in message.content if not (self._item(b) or {}).get(AS_JSON))
        if not content:
            return []
        items, _, _ = message_items("responses", attrs.evolve(message, content=content), speaks,
                                    tuple(looked), tuple(sent))
        # A call or result shown as text names its caller already: only words get the name.
        if not speaks and message.participant not in (blocks.USER, blocks.TOOL) and \
                any(type(b) is Text for b in content):
            _named(items, message.participant)
        given = self._given_ids(message, looked, sent)
        for item in items:
            if item.get("call_id") in given:
                item["call_id"] = given[item["call_id"]]
        return [json.dumps(item, sort_keys=True) for item in items]

    def _given_ids(self, message: CompiledMessage, looked: Sequence[str | None], sent: Sequence[str]) -> dict[str, str]:
        """The ids the request sends for this session's calls and outputs in ``message``, each to
        the call id the SDK gave it (which a call id ctxrt maps, P8, would otherwise lose)."""
        out: dict[str, str] = {}
        answers, ids = iter(looked), iter(sent)
        for block in message.content:
            if type(block) is ToolUse and message.participant == self.agent or \
                    type(block) is ToolResult and next(answers) is None:
                sent_id = next(ids)
                raw = self._item(block)
                if raw is not None and raw[ITEM_KEY].get("call_id") not in (None, sent_id):
                    out[sent_id] = raw[ITEM_KEY]["call_id"]
        return out

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Writes the items to the shared slot (see the module's doc). ``TypeError`` for items
        that aren't a list of dicts, ``MalformedContentError`` naming ``items[i]`` for one ctxrt
        can't keep, before anything is written."""
        if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Sequence):
            raise TypeError(f"add_items items must be a list of Responses input items, not {type(items).__name__}")
        plain = [_plain(item, f"items[{i}]") for i, item in enumerate(items)]
        planned = _planned(plain, self.agent, self._reader, self.manager.namespace)
        for participant, content in planned:
            if participant == blocks.TOOL:
                content = [result for result in content if not await self._answer(result)]
            if content:
                await self.manager.add_message(participant, content, metadata=self._metadata)
        self._known.update(json.dumps(item, sort_keys=True) for item in plain)

    async def _answer(self, result: blocks.Block) -> bool:
        """Adds an output to the message of this session's holding its call unanswered (written by
        an earlier batch), so the two stay one message; False if there is none."""
        call_id = result["tool_use_id"]

        def asks(message: Message) -> bool:
            return any(isinstance(b, ToolUse) and b.id == call_id for b in message.content) and not any(
                isinstance(b, ToolResult) and b.tool_use_id == call_id for b in message.content)

        message = await self._newest(asks)
        if message is None:
            return False
        await self.manager.edit_message(message.id, [*message.content, result])
        return True

    async def pop_item(self) -> TResponseInputItem | None:
        """Removes the newest item this session wrote and returns it as it was given (None if
        none): the blocks of a message's last item are taken off it, the message goes with its
        only item."""
        message = await self._newest()
        if message is None:
            return None
        content = message.content
        raw = self._item(content[-1])
        if raw is None:
            items, kept = _legacy_items(message, self.agent), list(content[:-1])
            popped: Any = items[-1]
            last = len(items) == 1
        else:
            at = len(content)
            while at > 0 and self._item(content[at - 1]) == raw:
                at -= 1
            popped, kept, last = raw[ITEM_KEY], list(content[:at]), at == 0
        if last:
            await self.manager.remove_message(message.id)
        else:
            await self.manager.edit_message(message.id, kept)
        return popped  # type: ignore[no-any-return]

    async def clear_session(self) -> None:
        """Removes every message this session wrote; the other residents' stay."""
        for message in await self.manager.query_messages(metadata=self._metadata):
            if blocks.seen_whole(message, self._reader):
                await self.manager.remove_message(message.id)

    @property
    def _metadata(self) -> dict[str, str]:
        """What marks a message as this session's: its id, and the namespace it writes through."""
        return {METADATA_KEY: self.session_id, blocks.WRITER: self.manager.namespace}

    async def _newest(self, wanted: Callable[[Message], bool] = lambda message: True) -> Message | None:
        """The newest ``wanted`` message this session wrote whose blocks its reader sees (read back
        only as far as that, L7)."""
        limit = 1
        while True:
            found = await self.manager.query_messages(metadata=self._metadata, reverse=True, limit=limit)
            for message in found:
                if blocks.seen_whole(message, self._reader) and wanted(message):
                    return message
            if len(found) < limit:
                return None
            limit *= 4
