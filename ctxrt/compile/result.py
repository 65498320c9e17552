"""A compile's result, ``CompileResult``, and the request bodies it turns into (P7-P11).

What the pipeline (``ctxrt.compile``) returns and hosts hold: the compiled messages, system
injections and provenance, with the Anthropic and OpenAI request forms made from them. It stands
apart from the pipeline because it is read by everything above the namespace (managers, the
inspector, the CLI) while only the namespace runs a compile, and its request forms call into
the wire modules, which the pipeline itself has no use for.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Literal

import attrs

from ..forms.anthropic_body import anthropic_messages
from ..anthropic_rules import violations
from ..forms.body_runs import BodyCache
from ..content.blocks import Block, CompiledMessage, Text
from ..errors import EmptyRequestError, InvalidRequestError
from ..openai_rules import violations as openai_violations
from ..forms.openai_body import chat_messages, responses_input
from ..forms.openai_wire import OpenAIBody, SystemRole, to_chat_messages, to_responses_input
from .provenance import Provenance
from ..forms.wire import to_anthropic_messages

@attrs.frozen(eq=False)
class Follows:
    """What a compile knows of how its messages (``messages``, the result's list) follow the last
    compile of the same memo (P14): ``runs`` of them, (start here, start there, length), are that
    compile's messages and sources, the same objects, copied. ``prior`` is that compile's
    ``token`` and ``prior_length`` its count of messages, or None when the runs are unknown (a
    compile whose repair, marker strip or injections moved messages, now or then). The request
    ledger's encoder reads its shared run off these instead of comparing the lists (O(changed));
    ``length``: the count compiled, so a list the host has grown or cut since is seen as such, as
    is a result made with another list or provenance (``attrs.evolve``): then the lists are
    compared. The list is the host's to change in place too: the encoder checks the run it reads
    off these by one compare in C (the scan's walk and its sources' compare spared)."""

    messages: list[Any]
    sources: tuple[Any, ...]  # the result's provenance's sources per message
    token: object = attrs.field(factory=object)
    prior: object | None = None
    prior_length: int = 0
    runs: tuple[tuple[int, int, int], ...] = ()
    length: int = attrs.field(init=False, default=attrs.Factory(lambda self: len(self.messages), takes_self=True))

    def describes(self, result: CompileResult) -> bool:
        """Whether ``result`` holds the lists this was made for (as long as compiled)."""
        return (result.messages is self.messages and len(self.messages) == self.length
                and result.provenance.messages is self.sources)


@attrs.frozen
class CompileResult:
    """A compile's messages, system injections and provenance.

    ``stable_prefix_tokens`` (P9): the estimated tokens of the longest prefix of this compile's
    messages that is byte-identical (participants and blocks; the breakpoints themselves aside) to
    a prefix of the previous compile of the same namespace actor and reader view ending at one of
    that compile's cache breakpoints: what the prompt cache the previous request wrote can serve.
    0 for a first compile or when nothing up to a previous breakpoint stayed the same.
    """

    messages: list[CompiledMessage]
    system_injections: list[Block]
    provenance: Provenance
    stable_prefix_tokens: int = 0
    # The parts of the last bodies made, shared by the results of one compile memo.
    _bodies: BodyCache = attrs.field(factory=BodyCache, eq=False, repr=False, kw_only=True, alias="body_cache")
    # How its messages follow the memo's last compile's (None: not known), for the request ledger.
    _follows: Follows | None = attrs.field(default=None, eq=False, repr=False, kw_only=True, alias="follows")

    def to_anthropic(
        self, *, assistant: str | Collection[str], system: str | None = None, strict: bool = False
    ) -> dict[str, Any]:
        """``{"system"?, "messages"}`` for ``anthropic.AsyncAnthropic().messages.create(**body, model=..., max_tokens=...)`` (P7, P8).

        Participants in ``assistant`` speak as the assistant, everyone else as the user.

        Raises:
            EmptyRequestError: no message is left to send (P8): the slot is empty in the
                reader's view, the strategy selected nothing (the newest message alone exceeds
                the budget), or nothing selected is sendable (blank text, another's thinking).
            InvalidRequestError: with ``strict=True``, the body breaks a rule of
                ``ctxrt.anthropic_rules`` (a bug in ctxrt: every body should satisfy P8), or a
                turn an earlier body shared with this one was edited by the host (P15).

        Made from the last body's parts (P14): the dict, its ``messages`` list and its last turn
        are the host's to edit; earlier turns are shared with later bodies, read-only (P15).
        """
        body: dict[str, Any] = {}
        text = self._system_text(system)
        if text:
            body["system"] = text
        if strict:
            body["messages"] = to_anthropic_messages(self.messages, assistant)
            self._check_shared(body["messages"], anthropic_messages(self.messages, assistant, self._bodies))
        else:
            body["messages"] = anthropic_messages(self.messages, assistant, self._bodies)
        if not body["messages"]:
            self._refuse_empty("the Messages API", "blank text, or thinking outside the assistant's turns")
        if strict:
            found = violations(body)
            if found:
                raise InvalidRequestError(found)
        return body

    def to_openai_chat(
        self, *, assistant: str | Collection[str], system: str | None = None,
        system_role: SystemRole = "system", alternate_roles: bool = False, strict: bool = False,
    ) -> OpenAIBody:
        """``{"messages"}`` for ``openai.AsyncOpenAI().chat.completions.create(**body, model=...)`` (P10, P11).

        Participants in ``assistant`` speak as the assistant (their tool calls as ``tool_calls``),
        everyone else as the user (with ``name``, but for "user"). ``system`` and system
        injections lead as one ``system_role`` message ("system" or "developer"). With
        ``alternate_roles``, runs of one role merge and the first turn is the user's, for servers
        whose chat templates demand it. What the form can't carry is counted in the body's
        ``left_out`` and ``as_text`` (docs/api.md).

        Raises:
            EmptyRequestError: no message is left to send but the system one (P10), as for
                ``to_anthropic``.
            InvalidRequestError: with ``strict=True``, the body breaks a rule of
                ``ctxrt.openai_rules`` (a bug in ctxrt: every body should satisfy P11), or a
                message an earlier body shared with this one was edited by the host (P15).

        Made from the last body's parts (P14): the dict, its ``messages`` list and its last
        message are the host's to edit; earlier messages are shared with later bodies, read-only (P15).
        """
        text = self._system_text(system)
        messages, left_out, as_text = chat_messages(self.messages, assistant, self._bodies, system=text,
                                                    system_role=system_role, alternate_roles=alternate_roles)
        if strict:
            fresh, _, _ = to_chat_messages(self.messages, assistant, system=text, system_role=system_role,
                                           alternate_roles=alternate_roles)
            self._check_shared(fresh, messages, what="a message", api="Chat Completions")
        if len(messages) == (1 if text else 0):
            self._refuse_empty("Chat Completions", "blank text or thinking only")
        return self._checked(OpenAIBody({"messages": messages}, left_out, as_text), strict, "chat")

    def to_openai_responses(
        self, *, assistant: str | Collection[str], system: str | None = None, strict: bool = False
    ) -> OpenAIBody:
        """``{"instructions"?, "input"}`` for ``openai.AsyncOpenAI().responses.create(**body, model=...)`` (P10, P11).

        Participants in ``assistant`` speak as the assistant (their tool calls as
        ``function_call`` items), everyone else as the user; ``system`` and system injections
        are the ``instructions``. What the form can't carry is counted in the body's
        ``left_out`` and ``as_text`` (docs/api.md).

        Raises:
            EmptyRequestError: no input item is left to send (P10), as for ``to_anthropic``.
            InvalidRequestError: with ``strict=True``, the body breaks a rule of
                ``ctxrt.openai_rules`` (a bug in ctxrt: every body should satisfy P11), or an
                item an earlier body shared with this one was edited by the host (P15).

        Made from the last body's parts (P14): the dict, its ``input`` list and its last item
        are the host's to edit; earlier items are shared with later bodies, read-only (P15).
        """
        items, left_out, as_text = responses_input(self.messages, assistant, self._bodies)
        if strict:
            self._check_shared(to_responses_input(self.messages, assistant)[0], items, "input", "an item", "Responses API")
        if not items:
            self._refuse_empty("the Responses API", "blank text or thinking only")
        text = self._system_text(system)
        body = {"instructions": text, "input": items} if text else {"input": items}
        return self._checked(OpenAIBody(body, left_out, as_text), strict, "responses")

    def _check_shared(self, fresh: list[Any], cached: list[Any], field: str = "messages", what: str = "a turn",
                      api: str = "Messages API") -> None:
        """``strict``: a body's ``field`` made from scratch against one made from cached parts (P15)."""
        if fresh != cached:
            self._bodies.clear()  # the parts were edited: make the next bodies afresh
            place = next((k for k, (a, b) in enumerate(zip(fresh, cached)) if a != b), min(len(fresh), len(cached)))
            raise InvalidRequestError(
                [f"{field}[{place}]: differs from a body made afresh: {what} shared with an earlier body "
                 f"was edited after that body was returned (earlier ones are read-only, docs/api.md)"], api=api)

    def _system_text(self, system: str | None) -> str:
        """The host's system prompt and the system injections' text, blank ones left out (the APIs refuse them)."""
        texts = [system] if system and system.strip() else []
        texts += [b.text for b in self.system_injections if isinstance(b, Text) and b.text.strip()]
        return "\n\n".join(texts)

    def _refuse_empty(self, api: str, unsendable: str) -> None:
        if not self.messages:
            why = ("the compile selected no message: the slot is empty in this reader's view, or the "
                   "newest message alone exceeds the budget (raise Budget.max_tokens, or set the "
                   "strategy's max_message_tokens)")
        else:
            why = f"none of the {len(self.messages)} compiled message(s) holds a block the API accepts ({unsendable})"
        raise EmptyRequestError(
            f"no request to send for {self.provenance.namespace!r} on {self.provenance.branch!r}: {why}; "
            f"{api} refuses an empty message list"
        )

    @staticmethod
    def _checked(body: OpenAIBody, strict: bool, api: Literal["chat", "responses"]) -> OpenAIBody:
        if strict:
            found = openai_violations(body, api=api)
            if found:
                raise InvalidRequestError(found, api="Chat Completions" if api == "chat" else "Responses API")
        return body
