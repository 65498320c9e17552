"""OpenAI's request rules, Chat Completions and Responses, as one checker (docs/behaviours.md P11).

``violations(body, api="chat")`` lists every rule a ``POST /v1/chat/completions`` body breaks
(``api="responses"``: a ``POST /v1/responses`` body), each as a sentence naming the place
(``messages[3].tool_calls[0].id``); an empty list means the body passes as far as these rules
go. It is used by ``CompileResult.to_openai_chat(strict=True)`` and ``to_openai_responses``, by
the local OpenAI server in ``ctxrt.testing`` (which answers 400 with the list) and by the tests.
It judges the request's shape only, never the model, credentials or tool schemas.

The rules (P11), the first ones OpenAI's own, the last two stricter, for the OpenAI-compatible
servers (vLLM, llama.cpp, Ollama) that are:

- Chat Completions: ``messages`` is a non-empty list; roles are system, developer, user,
  assistant or tool, each with its own fields and content parts (text in every role; image_url,
  input_audio and file in user messages; refusal in assistant ones); an assistant message has
  content or ``tool_calls``; every tool call is answered by a ``tool`` message among those right
  after its message, once, and every ``tool`` message answers a call of that run;
- Responses: ``input`` is a string or a non-empty list of ``message``, ``function_call`` and
  ``function_call_output`` items; a user, system or developer message holds input_text,
  input_image and input_file parts, an assistant message output_text and refusal parts; every
  function_call has one function_call_output after it and every output a call before it, and no
  two calls share a call_id;
- tool call ids are 1 to 40 characters (Chat Completions) or 1 to 64 (a Responses call_id);
  function names and a message's ``name`` match ``^[a-zA-Z0-9_-]{1,64}$``;
- an image is an http(s) URL or a base64 ``data:image/...`` URL; an input_audio part holds
  base64 ``data`` in ``format`` wav or mp3;
- no field either API doesn't know (``audience``, ``cache_control``, ``raw``, ...);
- stricter: no message and no text part is empty or whitespace-only;
- stricter: a call's ``arguments`` is a string holding a JSON object.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Literal

CHAT_CALL_ID_MAX = 40
RESPONSES_CALL_ID_MAX = 64
NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}\Z")
IMAGE_URL = re.compile(r"(https?://\S+|data:image/(png|jpeg|gif|webp);base64,[A-Za-z0-9+/]+=*)\Z")

CHAT_BODY_FIELDS = frozenset({
    "messages", "model", "audio", "frequency_penalty", "function_call", "functions", "logit_bias", "logprobs",
    "max_completion_tokens", "max_tokens", "metadata", "modalities", "moderation", "n", "parallel_tool_calls",
    "prediction", "presence_penalty", "prompt_cache_key", "prompt_cache_options", "prompt_cache_retention",
    "reasoning_effort", "response_format", "safety_identifier", "seed", "service_tier", "stop", "store", "stream",
    "stream_options", "temperature", "tool_choice", "tools", "top_logprobs", "top_p", "user", "verbosity",
    "web_search_options",
})
RESPONSES_BODY_FIELDS = frozenset({
    "input", "model", "access_programs", "background", "background_options", "context_management", "conversation",
    "image", "include", "instructions", "max_output_tokens", "max_tool_calls", "metadata", "moderation",
    "parallel_tool_calls", "previous_response_id", "prompt", "prompt_cache_key", "prompt_cache_options",
    "prompt_cache_retention", "reasoning", "safety_identifier", "service_tier", "store", "stream", "stream_options",
    "temperature", "text", "tool_choice", "tools", "top_logprobs", "top_p", "truncation", "user",
})
CHAT_MESSAGE_FIELDS: dict[str, frozenset[str]] = {
    "system": frozenset({"role", "content", "name"}),
    "developer": frozenset({"role", "content", "name"}),
    "user": frozenset({"role", "content", "name"}),
    "assistant": frozenset({"role", "content", "name", "tool_calls", "refusal", "audio"}),
    "tool": frozenset({"role", "content", "tool_call_id"}),
}
CHAT_PART_TYPES: dict[str, frozenset[str]] = {
    "system": frozenset({"text"}),
    "developer": frozenset({"text"}),
    "user": frozenset({"text", "image_url", "input_audio", "file"}),
    "assistant": frozenset({"text", "refusal"}),
    "tool": frozenset({"text"}),
}
_BREAKPOINT = "prompt_cache_breakpoint"
CHAT_PART_FIELDS: dict[str, frozenset[str]] = {
    "text": frozenset({"type", "text", _BREAKPOINT}),
    "image_url": frozenset({"type", "image_url", _BREAKPOINT}),
    "input_audio": frozenset({"type", "input_audio"}),
    "file": frozenset({"type", "file", _BREAKPOINT}),
    "refusal": frozenset({"type", "refusal"}),
}
RESPONSES_ITEM_FIELDS: dict[str, frozenset[str]] = {
    "message": frozenset({"type", "role", "content", "id", "status", "phase"}),
    "function_call": frozenset({"type", "call_id", "name", "arguments", "id", "status", "namespace", "caller"}),
    "function_call_output": frozenset({"type", "call_id", "output", "id", "status", "caller", "name", "namespace"}),
}
RESPONSES_PART_FIELDS: dict[str, frozenset[str]] = {
    "input_text": frozenset({"type", "text", _BREAKPOINT}),
    "input_image": frozenset({"type", "image_url", "file_id", "detail", _BREAKPOINT}),
    "input_file": frozenset({"type", "file_data", "file_id", "file_url", "filename", "detail", _BREAKPOINT}),
    "output_text": frozenset({"type", "text", "annotations", "logprobs"}),
    "refusal": frozenset({"type", "refusal"}),
}
RESPONSES_INPUT_PARTS = frozenset({"input_text", "input_image", "input_file"})
RESPONSES_OUTPUT_PARTS = frozenset({"output_text", "refusal"})
IMAGE_DETAILS = frozenset({"auto", "low", "high", "original"})
AUDIO_FORMATS = frozenset({"wav", "mp3"})


def _blank(text: object) -> bool:
    return not isinstance(text, str) or not text.strip()


class _Checker:
    def __init__(self) -> None:
        self.found: list[str] = []

    def add(self, where: str, what: str) -> None:
        self.found.append(f"{where}: {what}")

    def fields(self, value: Mapping[str, Any], allowed: frozenset[str], where: str, what: str) -> None:
        for key in value:
            if key not in allowed:
                self.add(f"{where}.{key}", f"unknown field for {what}")

    def call_id(self, value: Any, where: str, limit: int) -> None:
        if not isinstance(value, str) or not 1 <= len(value) <= limit:
            self.add(where, f"a tool call id is a string of 1 to {limit} characters, not {value!r:.80}")

    def name(self, value: Any, where: str, what: str) -> None:
        if not isinstance(value, str) or not NAME.match(value):
            self.add(where, f"{what} {value!r:.80} does not match ^[a-zA-Z0-9_-]{{1,64}}$")

    def arguments(self, value: Any, where: str) -> None:
        try:
            parsed = json.loads(value) if isinstance(value, str) else None
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            self.add(where, "a call's arguments must be a string holding a JSON object")

    def image_url(self, url: Any, where: str) -> None:
        if not isinstance(url, str) or not IMAGE_URL.match(url):
            self.add(where, "an image is an http(s) URL or a base64 data:image/(png|jpeg|gif|webp) URL")

    def object(self, value: Any, where: str, what: str) -> bool:
        if not isinstance(value, Mapping):
            self.add(where, f"{what} must be an object, not {type(value).__name__}")
            return False
        return True

    # -- Chat Completions ----------------------------------------------------------------------

    def chat(self, body: Mapping[str, Any]) -> None:
        self.fields(body, CHAT_BODY_FIELDS, "body", "a Chat Completions request")
        self.chat_tools(body.get("tools"))
        messages = body.get("messages")
        if not isinstance(messages, list):
            self.add("messages", "must be a list")
            return
        if not messages:
            self.add("messages", "at least one message is required")
            return
        for i, message in enumerate(messages):
            self.chat_message(message, f"messages[{i}]")
        self.chat_pairs(messages)

    def chat_tools(self, tools: Any) -> None:
        if tools is None:
            return
        if not isinstance(tools, list):
            self.add("tools", "must be a list")
            return
        for i, tool in enumerate(tools):
            if self.object(tool, f"tools[{i}]", "a tool") and tool.get("type") == "function":
                function = tool.get("function")
                if self.object(function, f"tools[{i}].function", "a function tool's function"):
                    self.name(function.get("name"), f"tools[{i}].function.name", "function name")

    def chat_message(self, message: Any, where: str) -> None:
        if not self.object(message, where, "a message"):
            return
        role = message.get("role")
        allowed = CHAT_MESSAGE_FIELDS.get(role) if isinstance(role, str) else None
        if allowed is None:
            self.add(f"{where}.role", f"must be system, developer, user, assistant or tool, not {role!r}")
            return
        self.fields(message, allowed, where, f"a {role} message")
        if "name" in message:
            self.name(message["name"], f"{where}.name", "a participant name")
        content = message.get("content")
        if role == "assistant":
            calls = message.get("tool_calls")
            if content is None and not calls:
                self.add(where, "an assistant message needs content or tool_calls")
            if calls is not None:
                self.chat_calls(calls, f"{where}.tool_calls")
            if content is None:
                return
        if role == "tool":
            self.call_id(message.get("tool_call_id"), f"{where}.tool_call_id", CHAT_CALL_ID_MAX)
        self.chat_content(content, f"{where}.content", role)

    def chat_content(self, content: Any, where: str, role: str) -> None:
        if isinstance(content, str):
            if _blank(content):
                self.add(where, "a message's content must hold non-whitespace text")
            return
        if not isinstance(content, list):
            self.add(where, "must be a string or a list of content parts")
            return
        if not content:
            self.add(where, "a message needs at least one content part")
        for j, part in enumerate(content):
            self.chat_part(part, f"{where}[{j}]", role)

    def chat_part(self, part: Any, where: str, role: str) -> None:
        if not self.object(part, where, "a content part"):
            return
        kind = part.get("type")
        allowed = CHAT_PART_FIELDS.get(kind) if isinstance(kind, str) else None
        if allowed is None:
            self.add(f"{where}.type", f"unknown content part type {kind!r}")
            return
        if kind not in CHAT_PART_TYPES[role]:
            self.add(f"{where}.type", f"a {role} message may not hold a {kind} part")
        self.fields(part, allowed, where, f"a {kind} part")
        if kind == "text" and _blank(part.get("text")):
            self.add(where, "text parts must contain non-whitespace text")
        elif kind == "image_url":
            image = part.get("image_url")
            if self.object(image, f"{where}.image_url", "image_url"):
                self.fields(image, frozenset({"url", "detail"}), f"{where}.image_url", "image_url")
                self.image_url(image.get("url"), f"{where}.image_url.url")
                if "detail" in image and image["detail"] not in IMAGE_DETAILS:
                    self.add(f"{where}.image_url.detail", f"must be one of {sorted(IMAGE_DETAILS)}")
        elif kind == "file":
            file = part.get("file")
            if self.object(file, f"{where}.file", "file"):
                self.fields(file, frozenset({"file_data", "file_id", "filename"}), f"{where}.file", "file")
                if not file.get("file_data") and not file.get("file_id"):
                    self.add(f"{where}.file", "a file part needs file_data or file_id")
        elif kind == "input_audio":
            audio = part.get("input_audio")
            if self.object(audio, f"{where}.input_audio", "input_audio"):
                self.fields(audio, frozenset({"data", "format"}), f"{where}.input_audio", "input_audio")
                if _blank(audio.get("data")):
                    self.add(f"{where}.input_audio.data", "input_audio needs its base64 data")
                if audio.get("format") not in AUDIO_FORMATS:
                    self.add(f"{where}.input_audio.format", f"must be one of {sorted(AUDIO_FORMATS)}")

    def chat_calls(self, calls: Any, where: str) -> None:
        if not isinstance(calls, list) or not calls:
            self.add(where, "tool_calls must be a non-empty list")
            return
        for k, call in enumerate(calls):
            place = f"{where}[{k}]"
            if not self.object(call, place, "a tool call"):
                continue
            self.fields(call, frozenset({"id", "type", "function", "custom"}), place, "a tool call")
            self.call_id(call.get("id"), f"{place}.id", CHAT_CALL_ID_MAX)
            if call.get("type") != "function":
                self.add(f"{place}.type", f"these rules cover function calls, not {call.get('type')!r}")
                continue
            function = call.get("function")
            if self.object(function, f"{place}.function", "a call's function"):
                self.fields(function, frozenset({"name", "arguments"}), f"{place}.function", "a call's function")
                self.name(function.get("name"), f"{place}.function.name", "function name")
                self.arguments(function.get("arguments"), f"{place}.function.arguments")

    def chat_pairs(self, messages: list[Any]) -> None:
        """Each assistant message's calls are answered by the run of tool messages right after it."""
        open_calls: set[Any] = set()
        answered: set[Any] = set()
        asker = -1
        for i, message in enumerate(messages):
            if not isinstance(message, Mapping):
                continue
            role = message.get("role")
            if role == "tool":
                call_id = message.get("tool_call_id")
                if call_id in answered:
                    self.add(f"messages[{i}]", f"tool call {call_id!r} is answered twice")
                elif call_id not in open_calls:
                    self.add(f"messages[{i}]", f"a tool message must answer a tool call of the assistant "
                                               f"message before its run; {call_id!r} is none")
                open_calls.discard(call_id)
                answered.add(call_id)
                continue
            self.unanswered(open_calls, asker)
            calls = message.get("tool_calls") if role == "assistant" else None
            ids = [c.get("id") for c in calls if isinstance(c, Mapping)] if isinstance(calls, list) else []
            open_calls, answered, asker = set(ids), set(), i
        self.unanswered(open_calls, asker)

    def unanswered(self, open_calls: set[Any], asker: int) -> None:
        for call_id in sorted(open_calls, key=repr):
            self.add(f"messages[{asker}]", f"tool call {call_id!r} has no tool message answering it right after "
                                           "its message")

    # -- Responses -----------------------------------------------------------------------------

    def responses(self, body: Mapping[str, Any]) -> None:
        self.fields(body, RESPONSES_BODY_FIELDS, "body", "a Responses request")
        instructions = body.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            self.add("instructions", "must be a string")
        tools = body.get("tools")
        if isinstance(tools, list):
            for i, tool in enumerate(tools):
                if isinstance(tool, Mapping) and tool.get("type") == "function":
                    self.name(tool.get("name"), f"tools[{i}].name", "function name")
        items = body.get("input")
        if isinstance(items, str):
            if _blank(items):
                self.add("input", "a string input must hold non-whitespace text")
            return
        if not isinstance(items, list):
            self.add("input", "must be a string or a list of items")
            return
        if not items:
            self.add("input", "at least one item is required")
            return
        for i, item in enumerate(items):
            self.responses_item(item, f"input[{i}]")
        self.responses_pairs(items)

    def responses_item(self, item: Any, where: str) -> None:
        if not self.object(item, where, "an input item"):
            return
        kind = item.get("type", "message" if "role" in item else None)
        allowed = RESPONSES_ITEM_FIELDS.get(kind) if isinstance(kind, str) else None
        if allowed is None:
            self.add(f"{where}.type", f"these rules cover message, function_call and function_call_output "
                                      f"items, not {kind!r}")
            return
        self.fields(item, allowed, where, f"a {kind} item")
        if kind == "message":
            self.responses_message(item, where)
        elif kind == "function_call":
            self.call_id(item.get("call_id"), f"{where}.call_id", RESPONSES_CALL_ID_MAX)
            self.name(item.get("name"), f"{where}.name", "function name")
            self.arguments(item.get("arguments"), f"{where}.arguments")
        else:
            self.call_id(item.get("call_id"), f"{where}.call_id", RESPONSES_CALL_ID_MAX)
            output = item.get("output")
            if isinstance(output, list):
                self.responses_parts(output, f"{where}.output", RESPONSES_INPUT_PARTS)
            elif not isinstance(output, str):
                self.add(f"{where}.output", "must be a string or a list of input parts")
            elif _blank(output):
                self.add(f"{where}.output", "an output must hold non-whitespace text")

    def responses_message(self, item: Mapping[str, Any], where: str) -> None:
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            self.add(f"{where}.role", f"must be user, assistant, system or developer, not {role!r}")
            return
        content = item.get("content")
        if isinstance(content, str):
            if _blank(content):
                self.add(f"{where}.content", "a message's content must hold non-whitespace text")
        elif isinstance(content, list):
            kinds = RESPONSES_OUTPUT_PARTS if role == "assistant" else RESPONSES_INPUT_PARTS
            self.responses_parts(content, f"{where}.content", kinds)
        else:
            self.add(f"{where}.content", "must be a string or a list of content parts")

    def responses_parts(self, parts: list[Any], where: str, kinds: frozenset[str]) -> None:
        if not parts:
            self.add(where, "needs at least one content part")
        for j, part in enumerate(parts):
            place = f"{where}[{j}]"
            if not self.object(part, place, "a content part"):
                continue
            kind = part.get("type")
            if kind not in kinds:
                self.add(f"{place}.type", f"must be one of {', '.join(sorted(kinds))}, not {kind!r}")
                continue
            self.fields(part, RESPONSES_PART_FIELDS[kind], place, f"an {kind} part")
            if kind in ("input_text", "output_text") and _blank(part.get("text")):
                self.add(place, "text parts must contain non-whitespace text")
            elif kind == "input_image":
                if part.get("file_id") is None:
                    self.image_url(part.get("image_url"), f"{place}.image_url")
                if "detail" in part and part["detail"] not in IMAGE_DETAILS:
                    self.add(f"{place}.detail", f"must be one of {sorted(IMAGE_DETAILS)}")
            elif kind == "input_file" and not any(part.get(k) for k in ("file_data", "file_id", "file_url")):
                self.add(place, "an input_file part needs file_data, file_id or file_url")

    def responses_pairs(self, items: list[Any]) -> None:
        calls: dict[Any, int] = {}
        answered: set[Any] = set()
        for i, item in enumerate(items):
            if not isinstance(item, Mapping):
                continue
            call_id = item.get("call_id")
            if item.get("type") == "function_call":
                if call_id in calls:
                    self.add(f"input[{i}].call_id", f"call_id {call_id!r} is used by input[{calls[call_id]}] too")
                else:
                    calls[call_id] = i
            elif item.get("type") == "function_call_output":
                if call_id not in calls:
                    self.add(f"input[{i}]", f"function_call_output {call_id!r} answers no function_call before it")
                elif call_id in answered:
                    self.add(f"input[{i}]", f"function_call {call_id!r} is answered twice")
                answered.add(call_id)
        for call_id, i in calls.items():
            if call_id not in answered:
                self.add(f"input[{i}]", f"function_call {call_id!r} has no function_call_output after it")


def violations(body: Any, *, api: Literal["chat", "responses"] = "chat") -> list[str]:
    """Every rule ``body`` breaks as a Chat Completions request (``api="responses"``: a Responses
    request) (P11), each naming its place; [] if none."""
    if not isinstance(body, Mapping):
        return ["body: must be a JSON object"]
    checker = _Checker()
    if api == "chat":
        checker.chat(body)
    elif api == "responses":
        checker.responses(body)
    else:
        raise ValueError(f"api must be 'chat' or 'responses', not {api!r}")
    return checker.found
