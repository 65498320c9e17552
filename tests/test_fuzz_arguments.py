"""Argument fuzz of the public API (M7).

Every public method checks its arguments before anything is written: a wrong type raises
``TypeError`` naming the parameter, a wrong value a ``ValueError`` subclass
(``MalformedContentError`` with ``.path`` for content, names and readers). Nothing else escapes,
and a refused call changes nothing: no namespace registered, no branch created, no floor raised.

Each example is one call of one public method with one argument drawn from a pool of hostile
values (None, bools, huge and negative ints, NaN and infinities, empty, NUL, lone-surrogate and
long strings, bytes, lists, dicts with non-string keys, sets, objects, classes...) or from that
parameter's edge and valid values; every other argument is valid, so the bad one is isolated.
Each example runs in ``trio.run`` against a fresh store (opening one costs a few milliseconds),
so examples are independent and Hypothesis can replay and shrink them. The checks:

* only documented errors escape: ``TypeError``, ``ValueError`` (never a ``UnicodeError``), the
  ``CtxrtError`` subclasses the method documents, ``re.error`` for a bad ``regex``; a
  ``TypeError``/``ValueError`` names a parameter of the call (the fuzzed one when its value is
  outside the documented domain);
* a value outside the parameter's documented domain is refused (never silently accepted);
* after a refusal the store is unchanged (every LMDB table, the branches, each branch's
  namespaces with their readers and floors, the registered states, the last sequence), no
  namespace actor or slot cache was left running, and the manager stays usable where it was.

``open_runtime`` is fuzzed too (each example in a fresh directory, which a refusal must leave as
it was), and ``Budget``, ``Injection`` and ``MessageInjection`` as plain constructors.

``make test`` runs a few hundred derandomised examples per test; ``make soak`` (``CTXRT_SOAK=1``)
runs thousands with fresh random examples.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

import ctxrt
from ctxrt import (
    Autobiographical,
    BranchExistsError,
    BranchNotFoundError,
    Budget,
    ConfigConflictError,
    CtxrtError,
    Derivation,
    Injection,
    MalformedContentError,
    ManagerClosedError,
    MessageInjection,
    MessageNotFoundError,
    ModelError,
    NarrowingRefusedError,
    OfflineModel,
    OverBudgetError,
    Passthrough,
    ReaderConflictError,
    StrategyRefusedError,
    Text,
    ToolUse,
    WindowedPassthrough,
)
from support import dump

# --------------------------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------------------------

NAN = float("nan")
INF = float("inf")


@attrs.frozen(repr=False)
class Big:
    """A large value drawn as a short label (Hypothesis prints the label); resolved before the call."""

    label: str
    value: Any = attrs.field(eq=False)

    def __repr__(self) -> str:
        return self.label


def static(value: Any) -> Any:
    """``value`` with every ``Big`` in it (inside plain lists, tuples and dicts too) resolved."""
    if isinstance(value, Big):
        return value.value
    if type(value) in (list, tuple):
        return type(value)(static(v) for v in value)
    if type(value) is dict:
        return {k: static(v) for k, v in value.items()}
    return value


LONG_DIGITS = Big("'9' * 5000", "9" * 5000)  # past int()'s 4300-digit limit
LONG_TEXT = Big("'x' * 5000", "x" * 5000)


class Opaque:
    def __repr__(self) -> str:
        return "Opaque()"


class StrSub(str):
    pass


class IntSub(int):
    pass


class SeqLike(Sequence[Any]):
    """A Sequence that is neither a list nor a tuple."""

    def __init__(self, *items: Any) -> None:
        self._items = items

    def __getitem__(self, index: Any) -> Any:
        return self._items[index]

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"SeqLike{self._items!r}"


class MapLike(Mapping[str, Any]):
    """A Mapping that is not a dict."""

    def __init__(self, **items: Any) -> None:
        self._items = items

    def __getitem__(self, key: Any) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"MapLike({self._items!r})"


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


DEEP = Big("[[...]] * 300", _nested(300))  # deeper than the codec's 200 levels
DEEP_REGEX = Big("'(' * 1000 + ')' * 1000", "(" * 1000 + ")" * 1000)  # deeper than re's parser recurses


HOSTILE: list[Any] = [
    None, True, False, 0, 1, -1, 2**53 + 1, 2**63, 2**64, 10**400, -(10**400), IntSub(3),
    0.0, -0.0, 0.5, 1.0, -1.5, 1e308, NAN, INF, -INF,
    "", " ", "\x00", "a\x00b", "\ud800", "x\udfff", "é", "main", "default", "0", "1", "01", " 1", "١", "+1",
    StrSub("main"), LONG_TEXT, LONG_DIGITS,
    b"", b"main", bytearray(b"x"), memoryview(b"x"),
    [], [None], ["a"], [1], [""], ["\ud800"], [[]], (), ("a",), (None,), range(2), SeqLike("a"),
    {}, {1: 2}, {"": 1}, {None: 1}, {"a": NAN}, {"a": Opaque()}, {"a": {"b": [1, 2]}}, {("t",): 1}, MapLike(a=1),
    set(), {"a"}, frozenset({"a"}),
    Opaque(), object, Budget, Passthrough, int, len, (lambda *a: None), Budget(), Passthrough(), Text("x"),
    Injection("ns", "system", "x"), MessageInjection("user", "x"), math.pi, complex(1, 1), Ellipsis,
    DEEP,
]

surrogate_text = st.text(st.characters(codec=None, exclude_categories=()), max_size=12)
hostile_scalars = st.one_of(
    st.sampled_from(HOSTILE),
    st.integers(), st.floats(), surrogate_text, st.binary(max_size=6),
)
hostile = st.one_of(
    hostile_scalars,
    st.lists(hostile_scalars, max_size=3),
    st.lists(hostile_scalars, max_size=3).map(tuple),
    st.dictionaries(st.one_of(surrogate_text, st.integers(), st.none()), hostile_scalars, max_size=3),
)


@attrs.frozen
class Ref:
    """A value that depends on the example's store, resolved just before the call."""

    what: str


FIRST, LAST, AUDIENCE, FRESH, SEQ, DERIVATION = (
    Ref(what) for what in ("first", "last", "audience", "fresh", "seq", "derivation"))


@attrs.frozen
class DerivationWith:
    """The Derivation that derive made in the example's store, with one field replaced."""

    field: str
    value: Any


class _Omit:
    def __repr__(self) -> str:
        return "OMIT"


OMIT = _Omit()  # the parameter is not passed

# --------------------------------------------------------------------------------------------
# Oracles: is a value inside the parameter's documented domain?
# --------------------------------------------------------------------------------------------

VALID, INVALID, UNKNOWN = "valid", "invalid", "unknown"


def _encodable(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_seq(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _worst(verdicts: Any) -> str:
    verdicts = list(verdicts)
    if INVALID in verdicts:
        return INVALID
    return UNKNOWN if UNKNOWN in verdicts else VALID


def o_any(value: Any) -> str:
    return VALID if isinstance(value, Ref) else UNKNOWN


def o_name(value: Any) -> str:
    """A branch, reader, namespace or message-id name: non-empty valid text without NUL."""
    if isinstance(value, Ref):
        return VALID
    if not isinstance(value, str) or not value or "\x00" in value or not _encodable(value):
        return INVALID
    return VALID


def o_text(value: Any) -> str:
    if isinstance(value, Ref):
        return VALID
    return VALID if isinstance(value, str) and _encodable(value) else INVALID


def optional(oracle: Callable[[Any], str]) -> Callable[[Any], str]:
    return lambda value: VALID if value is None else oracle(value)


def o_namespace(value: Any) -> str:
    return VALID if value is None or (isinstance(value, str) and value == "") else o_name(value)


def o_participant(value: Any) -> str:
    if isinstance(value, str) and value and _encodable(value):
        return VALID
    return INVALID


def o_flag(value: Any) -> str:
    return VALID if isinstance(value, bool) else INVALID


def o_int(minimum: int | None = None, maximum: int | None = None) -> Callable[[Any], str]:
    def oracle(value: Any) -> str:
        if isinstance(value, Ref):
            return VALID
        if not _is_int(value):
            return INVALID
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            return INVALID
        return VALID

    return oracle


def o_at_sequence(value: Any) -> str:
    verdict = optional(o_int(minimum=0))(value)
    return UNKNOWN if verdict == VALID and _is_int(value) and value > 0 else verdict  # above now: refused


def o_timeout(value: Any) -> str:
    if not _is_number(value):
        return INVALID
    try:
        seconds = float(value)
    except OverflowError:
        return INVALID
    return VALID if 0 < seconds <= 1e9 else INVALID


def o_hold(value: Any) -> str:
    return VALID if isinstance(value, bool) else o_timeout(value)


def o_sequence_of(item: Callable[[Any], str]) -> Callable[[Any], str]:
    def oracle(value: Any) -> str:
        if not _is_seq(value):
            return INVALID
        return _worst(item(v) for v in value)

    return oracle


def o_instance(kind: type) -> Callable[[Any], str]:
    return lambda value: VALID if isinstance(value, kind) else INVALID


def o_injections(kind: type) -> Callable[[Any], str]:
    """A sequence of ``kind``; an injection's own fields are judged by compile (MalformedContentError
    naming the place), so one with anything but plain text fields is of unknown verdict."""

    def oracle(value: Any) -> str:
        if not _is_seq(value):
            return INVALID
        return _worst(INVALID if not isinstance(v, kind) else UNKNOWN if _odd_injection(v) else VALID for v in value)

    return oracle


def _odd_injection(value: Any) -> bool:
    return any(type(getattr(value, f.name)) not in (str, int) or getattr(value, f.name) == ""
               for f in attrs.fields(type(value)))


def o_json(value: Any, depth: int = 0) -> bool:
    if depth > 190:
        return False
    if value is None or isinstance(value, bool) or _is_int(value):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, str):
        return _encodable(value)
    if isinstance(value, (list, tuple)):
        return all(o_json(v, depth + 1) for v in value)
    if isinstance(value, Mapping):
        return all(isinstance(k, str) and _encodable(k) and o_json(v, depth + 1) for k, v in value.items())
    return False


def o_metadata(value: Any) -> str:
    if value is None:
        return VALID
    return VALID if isinstance(value, Mapping) and o_json(value) else INVALID


def o_query_metadata(value: Any) -> str:
    if value is None:
        return VALID
    if not isinstance(value, Mapping):
        return INVALID
    return _worst(o_name(k) for k in value)


def o_caused_by(value: Any) -> str:
    return o_sequence_of(lambda v: VALID if isinstance(v, Ref) else
                         (VALID if isinstance(v, str) and v and _encodable(v) else INVALID))(value)


def o_content(value: Any) -> str:
    """ContentLike: non-empty text, or a non-empty sequence of blocks (dicts or block objects)."""
    if isinstance(value, str):
        return VALID if value and _encodable(value) else INVALID
    if not isinstance(value, (list, tuple)) or not value:
        return INVALID if not _is_seq(value) or not value else UNKNOWN
    if any(not isinstance(v, (Mapping, *ctxrt.content.blocks.BLOCK_TYPES)) for v in value):
        return INVALID
    return UNKNOWN


class _UnmarkedStrategy(ctxrt.Strategy):
    name = "unmarked"  # marks_compression_reads stays False: refused under a reader (D6)

    def select(self, view: Any, budget: Budget, options: Any) -> list[Any]:
        return []


@attrs.frozen
class Unmarked:
    """A host's strategy config that doesn't declare marks_compression_reads."""

    def create(self) -> _UnmarkedStrategy:
        return _UnmarkedStrategy()


STRATEGIES = (Passthrough, WindowedPassthrough, Autobiographical, ctxrt.Knowledge, Unmarked)


def o_strategy(value: Any) -> str:
    return VALID if value is None or isinstance(value, STRATEGIES) else INVALID


def o_required_strategy(value: Any) -> str:
    return INVALID if value is None else o_strategy(value)


def o_model(value: Any) -> str:
    return VALID if value is None or isinstance(value, OfflineModel) else INVALID


def o_callable(value: Any) -> str:
    if value is None:
        return VALID
    return UNKNOWN if callable(value) else INVALID  # a filter that fails is the host's own error


def o_tools(value: Any) -> str:
    return o_sequence_of(lambda v: VALID if isinstance(v, Mapping) else INVALID)(value)


def o_derivation(value: Any) -> str:
    if value is DERIVATION:
        return VALID
    if not isinstance(value, Derivation):
        return INVALID
    return _worst((o_namespace(value.namespace), o_name(value.branch), o_flag(value.isolate),
                   o_sequence_of(optional(o_name))(value.auxiliary_views)))


# --------------------------------------------------------------------------------------------
# Valid and edge values per parameter
# --------------------------------------------------------------------------------------------

PNG = "iVBORw0KGgo="
VALID_CONTENT = [
    "hello", "é ✓", [{"type": "text", "text": "a"}], [Text("x")], (Text("x"),),
    [Text("for alice", audience=("alice",))], [{"type": "text", "text": "both", "audience": ["alice", "bob"]}],
    [ToolUse("t1", "tool", {"q": 1})],
    [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}],
    [{"type": "thinking", "thinking": "hm", "signature": "s"}],
]
EDGE_CONTENT = [
    "", [], (), "\ud800", [{"type": "text"}], [{"type": "text", "text": 5}], [{"type": "nope"}], [{}], [5], [None],
    {"type": "text", "text": "x"}, [{"type": "text", "text": "x", "audience": []}],
    [{"type": "text", "text": "x", "audience": [""]}], [{"type": "text", "text": "x", "audience": "alice"}],
    [{"type": "text", "text": "x", "audience": ["\ud800"]}],
    [{"type": "tool_result", "tool_use_id": "t",
      "content": [{"type": "tool_use", "id": "x", "name": "n", "input": {}}]}],
    [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": "x", "audience": ["alice"]}]}],
    [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "!!"}}],
    [{"type": "image", "source": {"type": "base64", "media_type": "image/bmp", "data": PNG}}],
    [{"type": "image", "source": "x"}], [{"type": "text", "text": "x", "cache_control": {"type": 5}}],
    [{"type": "text", "text": "x", 1: 2}], [{"type": "tool_use", "id": "t", "name": "n", "input": {"a": NAN}}],
    [{"type": "tool_use", "id": "t", "name": "n", "input": {1: 2}}],
    [{"type": "tool_use", "id": "", "name": "n", "input": {}}],
    [{"type": "tool_use", "id": "t", "name": "n", "input": DEEP}], [Text(5)], [Text("x", audience=())],  # type: ignore[arg-type]
    [Text("x", audience=("",))], [Text("x", raw=Opaque())], [{"type": "text", "text": "x", "raw": {"a": INF}}],
    [{"type": "tool_result", "tool_use_id": "t", "is_error": 1}], b"hello", Text("x"), SeqLike(Text("x")),
]
content = st.one_of(st.sampled_from(VALID_CONTENT), st.sampled_from(EDGE_CONTENT), surrogate_text,
                    st.lists(st.one_of(hostile, st.dictionaries(st.sampled_from(["type", "text", "audience", "id"]),
                                                                hostile, max_size=3)), max_size=3))

STRATEGY_VALUES = [Passthrough(), WindowedPassthrough(), WindowedPassthrough(re_anchor_fraction=0.2),
                   Autobiographical("offline", target_chunk_tokens=40, recent_window_tokens=40, head_window_tokens=20)]

budgets = st.one_of(
    st.sampled_from([Budget(), Budget(1000, 10), Budget(5, 4), Budget(10**400, 0), Budget(10**401, 10**400)]),
    st.builds(Budget, st.integers(1, 10**6), st.just(0)),
)


def injection_values(kind: type) -> tuple[st.SearchStrategy[Any], st.SearchStrategy[Any]]:
    """(valid, edge) values of ``injections`` or ``message_injections``."""
    if kind is Injection:
        positions = st.sampled_from(["system", "before_user", "after_user"])
        good = st.builds(Injection, st.sampled_from(["ns", "other"]), positions, st.sampled_from(["hi", [Text("x")]]))
        odd = st.builds(Injection, st.one_of(hostile, st.sampled_from(["", "ns"])), positions, content)
    else:
        good = st.builds(MessageInjection, st.sampled_from(["user", "Claude"]),  # type: ignore[arg-type]
                         st.sampled_from(["hi", [Text("x")]]), st.sampled_from([0, 1, 5, 10**400]))
        odd = st.builds(MessageInjection, st.one_of(hostile, st.just("")),  # type: ignore[arg-type]
                        content, st.sampled_from([0, 2]))
    return (st.lists(good, max_size=3),
            st.one_of(st.lists(st.one_of(good, odd), min_size=1, max_size=2),
                      st.lists(st.one_of(good, hostile), min_size=1, max_size=2)))


def injection_param(kind: type) -> Param:
    valid, edge = injection_values(kind)
    return Param(valid, o_injections(kind), edge)


@attrs.frozen
class Param:
    valid: st.SearchStrategy[Any]
    oracle: Callable[[Any], str]
    edge: st.SearchStrategy[Any] = attrs.field(factory=st.nothing)
    lookup: bool = False  # a name looked up in the store: a documented "not found" is a fair refusal


def values(*items: Any) -> st.SearchStrategy[Any]:
    return st.sampled_from(items)


NAME_EDGE_VALUES = ("", "\x00", "a\x00b", "\ud800", "x\udfff", LONG_TEXT, "b" * 201, "é" * 101, StrSub("side"))
NAME_EDGES = values(*NAME_EDGE_VALUES)
P_BRANCH = Param(values("main", "side", "nope"), o_name, NAME_EDGES, lookup=True)
P_MESSAGE_ID = Param(values(FIRST, LAST, AUDIENCE, "999999"), o_name,
                     values("0", "01", "+1", " 1", "١", "-1", LONG_DIGITS, "1" * 30, "\ud800", ""), lookup=True)
P_TEXT_ID = Param(values(FIRST, LAST, "999999", "", "abc"), o_text, P_MESSAGE_ID.edge, lookup=True)
P_NEW_BRANCH = Param(values(FRESH, "side", "main"), o_name, NAME_EDGES)
P_OPT_NEW_BRANCH = Param(values(None, FRESH, "side"), optional(o_name), NAME_EDGES)
P_STRATEGY = Param(st.sampled_from([None, *STRATEGY_VALUES, Unmarked()]), o_strategy,
                   values(0, "", [], False, Passthrough))
P_MODEL = Param(values(None, OfflineModel()), o_model)
P_MESSAGE_IDS = Param(st.lists(values(FIRST, LAST, AUDIENCE, "999999"), max_size=3), o_sequence_of(o_name),
                      st.lists(P_MESSAGE_ID.edge, min_size=1, max_size=2))


@attrs.frozen
class Target:
    """One public method: how to call it, its parameters and the errors it documents."""

    name: str
    call: Callable[..., Any]
    params: dict[str, Param]
    raises: tuple[type[BaseException], ...] = ()
    manager: bool = True  # a ContextManager method (else Runtime)
    setup: str = ""  # extra store setup it needs ("derivation")
    required: tuple[str, ...] = ()  # parameters always passed (the others are sometimes left out)


async def _call_method(env: Env, name: str, kwargs: dict[str, Any], positional: tuple[str, ...] = ()) -> Any:
    owner = env.m if name not in RUNTIME_METHODS else env.rt
    args = [kwargs.pop(p) for p in positional if p in kwargs]
    result = getattr(owner, name)(*args, **kwargs)
    if hasattr(result, "__await__"):
        result = await result
    return result


RUNTIME_METHODS = {"open", "create_branch", "delete_branch", "list_namespaces", "reopen_derived"}
READER = (ReaderConflictError,)
OPENS = (ReaderConflictError, StrategyRefusedError, ConfigConflictError, BranchNotFoundError)
COMPILES = (ReaderConflictError, StrategyRefusedError, OverBudgetError)


def method(name: str, params: dict[str, Param], raises: tuple[type[BaseException], ...] = (), *,
           positional: tuple[str, ...] = (), setup: str = "", required: tuple[str, ...] | None = None) -> Target:
    """``required`` defaults to the positional parameters."""

    async def call(env: Env, kwargs: dict[str, Any]) -> Any:
        return await _call_method(env, name, kwargs, positional)

    return Target(name, call, params, raises, manager=name not in RUNTIME_METHODS, setup=setup,
                  required=positional if required is None else required)


TARGETS = [
    # -- Runtime ---------------------------------------------------------------------------
    method("open", {
        "namespace": Param(values(None, "", "default", "fz", "fzr", "fzn", "a/b", "fz/reader"), o_namespace,
                           values(*NAME_EDGE_VALUES, Big("'x' * 400", "x" * 400), Big("'é' * 150", "é" * 150))),
        "strategy": P_STRATEGY,
        "view_reader": Param(values(None, "alice", "bob"), optional(o_name), NAME_EDGES),
        "branch": P_BRANCH,
        "isolate": Param(values(False, True), o_flag),
        "view_filter": Param(values(None, lambda message: True), o_callable),
        "auxiliary_views": Param(values((), (None,), ("fzi",), ["fz", None], ("fzi", "fzi")),
                                 o_sequence_of(optional(o_name)),
                                 values(("",), ("\ud800",), ("a\x00",), [1], "fz", b"fz")),
        "model": P_MODEL,
    }, OPENS, positional=("namespace",), required=()),
    method("create_branch", {
        "name": P_NEW_BRANCH,
        "from_branch": P_BRANCH,
        "at_sequence": Param(values(None, 0, 1, SEQ), o_at_sequence, values(-1, 10**400, True, 1.0)),
    }, (BranchExistsError, BranchNotFoundError), positional=("name",)),
    method("delete_branch", {"name": Param(values("side", "nope", "main"), o_name, NAME_EDGES, lookup=True)},
           (BranchNotFoundError,), positional=("name",)),
    method("list_namespaces", {"branch": P_BRANCH}, (BranchNotFoundError,), positional=("branch",)),
    method("reopen_derived", {
        "derivation": Param(values(DERIVATION), o_derivation),
        "view_filter": Param(values(None, lambda message: True), o_callable),
        "strategy": P_STRATEGY,
        "model": P_MODEL,
    }, OPENS, positional=("derivation",), setup="derivation"),
    # -- ContextManager: messages ----------------------------------------------------------
    method("add_message", {
        "participant": Param(values("user", "Claude", "a\x00b"), o_participant, values("", "\ud800", StrSub("user"))),
        "content": Param(st.sampled_from(VALID_CONTENT), o_content, content),
        "metadata": Param(values(None, {"a": 1}, {"task": {"id": "x"}}, {"": None}, MapLike(a=[1.5, True])),
                          o_metadata, values({"a": NAN}, {"a": INF}, {1: 2}, {"a": {None: 1}}, {"\ud800": 1},
                                             {"a": "\ud800"}, {"a": b"x"}, {"a": {"b"}}, {"a": DEEP}, {"a": SeqLike(1)},
                                             [("a", 1)])),
        "caused_by": Param(st.lists(values(FIRST, "999", "abc"), max_size=2), o_caused_by,
                           values([""], ["\ud800"], ["a\x00"], [1], "1", b"1", [None], SeqLike("1"))),
        "hold_compression": Param(values(False, True, 5.0, 1, 1e9), o_hold,
                                  values(0, 0.0, -1, NAN, INF, 1e9 + 1, 10**400)),
        "timestamp_ms": Param(values(None, 0, 1_700_000_000_000, 2**53), optional(o_int(0, 2**53)),
                              values(-1, 2**53 + 1, 10**400, 1.5, True, IntSub(5))),
    }, (), positional=("participant", "content")),
    method("edit_message", {
        "message_id": P_MESSAGE_ID,
        "content": Param(st.sampled_from([*VALID_CONTENT, [Text("for bob", audience=("bob",))], "plain now"]),
                         o_content, content),
    }, (MessageNotFoundError, NarrowingRefusedError, ReaderConflictError), positional=("message_id", "content")),
    method("remove_message", {"message_id": P_MESSAGE_ID}, (MessageNotFoundError,), positional=("message_id",)),
    method("remove_messages", {"from_id": P_MESSAGE_ID, "to_id": P_MESSAGE_ID}, (MessageNotFoundError,),
           positional=("from_id", "to_id")),
    method("get_message", {"message_id": P_TEXT_ID}, (), positional=("message_id",)),
    method("get_message_window", {
        "offset": Param(values(0, 1, -1, 10**400, -(10**400)), o_int()),
        "limit": Param(values(0, 1, 10, 10**400), o_int(0)),
    }, (), positional=("offset", "limit")),
    method("query_messages", {
        "participant": Param(values(None, "user", "", "nobody"), optional(o_text), values("\ud800", StrSub("user"))),
        "metadata": Param(values(None, {}, {"a": 1}, {"task.id": "x"}, {"a": [1]}, {"a": NAN}), o_query_metadata,
                          values({"": 1}, {"\ud800": 1}, {"a\x00": 1}, {1: 2}, {None: 1})),
        "since_ms": Param(values(None, 0, 1_700_000_000_000, 10**400), optional(o_int(0))),
        "until_ms": Param(values(None, 0, 1_700_000_000_000, 10**400), optional(o_int(0))),
        "external_id": Param(values(None, "x", ""), optional(o_text), values("\ud800", StrSub("x"))),
        "limit": Param(values(None, 0, 1, 10**400), optional(o_int(0))),
        "reverse": Param(values(False, True), o_flag),
        "channel": Param(values(None, "general", ""), optional(o_text), values("\ud800", StrSub("general"))),
    }),
    method("channel_token_stats", {
        "since_ms": Param(values(None, 0, 1_700_000_000_000, 10**400), optional(o_int(0))),
        "until_ms": Param(values(None, 0, 1_700_000_000_000, 10**400), optional(o_int(0))),
    }, ()),
    # -- compiling ---------------------------------------------------------------------------
    method("compile", {
        "budget": Param(st.one_of(st.none(), budgets), optional(o_instance(Budget))),
        "injections": injection_param(Injection),
        "message_injections": injection_param(MessageInjection),
        "dry_run": Param(values(False, True), o_flag),
        "strict": Param(values(False, True), o_flag),
    }, COMPILES, positional=("budget",), required=()),
    method("preview_context", {
        "budget": Param(budgets, o_instance(Budget)),
        "message_injections": injection_param(MessageInjection),
    }, COMPILES, positional=("budget",)),
    # -- holds -------------------------------------------------------------------------------
    method("hold_compression", {
        "message_ids": P_MESSAGE_IDS,
        "timeout_s": Param(values(None, 0.5, 1, 1e9), optional(o_timeout), values(0, -1, NAN, INF, 10**400, True)),
    }, (), positional=("message_ids",)),
    method("release_compression", {"message_ids": P_MESSAGE_IDS}, (), positional=("message_ids",)),
    # -- branches ----------------------------------------------------------------------------
    method("switch_branch", {"name": P_BRANCH}, (BranchNotFoundError, ReaderConflictError, StrategyRefusedError),
           positional=("name",)),
    method("fork", {"name": P_OPT_NEW_BRANCH},
           (BranchExistsError, BranchNotFoundError, ReaderConflictError, StrategyRefusedError), positional=("name",),
           required=()),
    method("branch_at", {"message_id": P_TEXT_ID, "name": P_OPT_NEW_BRANCH}, (MessageNotFoundError, BranchExistsError),
           positional=("message_id", "name"), required=("message_id",)),
    method("derive", {
        "branch": P_NEW_BRANCH,
        "strategy": P_STRATEGY,
        "at_sequence": Param(values(None, 0, 1, SEQ), o_at_sequence, values(-1, 10**400, True, 1.0)),
        "model": P_MODEL,
    }, (StrategyRefusedError, ReaderConflictError, BranchExistsError, BranchNotFoundError), required=("branch",)),
    method("set_strategy", {"strategy": Param(st.sampled_from([*STRATEGY_VALUES, Unmarked()]), o_required_strategy,
                                              values(None, 0, ""))},
           (StrategyRefusedError, ReaderConflictError), positional=("strategy",)),
    # -- summaries ---------------------------------------------------------------------------
    method("search_summaries", {
        "text": Param(values(None, "", "hello"), optional(o_text), values("\ud800",)),
        "regex": Param(values(None, "h.*o", "(?i)HELLO"), optional(o_text),
                       values("\ud800", "(", "[", "a{99999999999}", DEEP_REGEX)),
        "levels": Param(values(None, [], [1, 2], (3,)), optional(o_sequence_of(o_int(1))),
                        values([0], [True], [1.0], 1)),
        "limit": Param(values(0, 1, 50, 10**400), o_int(0)),
        "include_merged": Param(values(False, True), o_flag),
    }, (ReaderConflictError, re.error)),
    method("get_summaries_in_range", {
        "from_ms": Param(values(None, 0, -1, 10**400), optional(o_int())),
        "to_ms": Param(values(None, 0, 2**53, -(10**400)), optional(o_int())),
        "level": Param(values(None, 1, 3, 10**400), optional(o_int(1)), values(0, -1)),
    }, READER),
    method("get_summary", {"summary_id": Param(values("", "999", "L1-0", "L1-1", "L2-0"), o_text, values("\ud800",))},
           READER,
           positional=("summary_id",)),
    method("pin_range", {
        "first_id": P_TEXT_ID, "last_id": P_TEXT_ID,
        "name": Param(values(None, "", "the plan"), optional(o_text), values("\ud800",)),
        "level": Param(values(None, 1, 3, 10**400), optional(o_int(1))),
    }, (StrategyRefusedError, MessageNotFoundError, ReaderConflictError), positional=("first_id", "last_id")),
    method("unpin", {"pin_id": Param(values("pin-0", "", "x"), o_text, values("\ud800",))},
           (StrategyRefusedError, ReaderConflictError), positional=("pin_id",)),
    method("reset_head_window", {"transition_text": Param(values(None, "", "new topic"), optional(o_text),
                                                          values("\ud800",))},
           (StrategyRefusedError, ModelError, ReaderConflictError), positional=("transition_text",), required=()),
    # -- live settings -----------------------------------------------------------------------
    method("set_tool_definitions", {"tools": Param(values((), [{"name": "t"}], [MapLike(name="t")]), o_tools,
                                                   values({"name": "t"}, [1], "t", b"t"))}, (), positional=("tools",)),
    method("set_system_prompt", {"text": Param(values(None, "", "be brief"), optional(o_text), values("\ud800",))}, (),
           positional=("text",)),
]
TARGET_BY_NAME = {t.name: t for t in TARGETS}

# --------------------------------------------------------------------------------------------
# The environment of one example
# --------------------------------------------------------------------------------------------


@attrs.define
class Env:
    rt: Any
    m: Any  # the manager the call goes to
    managers: list[Any]
    ids: dict[str, str]
    derivation: Derivation | None = None
    fresh: int = 0

    def resolve(self, value: Any) -> Any:
        if isinstance(value, Big):
            return value.value
        if type(value) is dict:
            return {k: self.resolve(v) for k, v in value.items()}
        if isinstance(value, Ref):
            if value.what == "fresh":
                self.fresh += 1
                return f"fresh-{self.fresh}"
            if value.what == "seq":
                return self.rt.engine.last_sequence
            if value.what == "derivation":
                return self.derivation
            return self.ids[value.what]
        if isinstance(value, DerivationWith):
            assert self.derivation is not None
            return attrs.evolve(self.derivation, **{value.field: static(value.value)})
        if type(value) in (list, tuple):
            return type(value)(self.resolve(v) for v in value)
        return value


async def snapshot(rt: Any) -> dict[str, Any]:
    branches = await rt.list_branches()
    stats = rt.statistics()
    return {
        "last_sequence": rt.engine.last_sequence,
        "branches": branches,
        "namespaces": {b.name: await rt.list_namespaces(b.name) for b in branches},
        "states": [s.name for s in rt.engine.list_states()],
        "namespace_actors": stats.namespace_actors,
        "slot_caches": stats.slot_caches,
        "dump": dump(rt),  # every LMDB table, raw
    }


@attrs.frozen
class Case:
    target: str
    fuzzed: str
    kwargs: dict[str, Any]
    manager: str  # which manager the call goes to: "plain" (no reader) or "reader" (compiles for alice)
    strategy: Any  # the strategy the example's namespaces start with
    rich: bool = False  # a longer conversation, compressed (Autobiographical keeps summaries of it)


@attrs.frozen
class Outcome:
    result: Any
    error: BaseException | None
    before: dict[str, Any]
    after: dict[str, Any]
    branch_before: str
    branch_after: str | None
    usable_after: BaseException | None  # what a read through the manager raised after the call
    kwargs: dict[str, Any]


async def run_case(path: Path, case: Case) -> Outcome:
    async with ctxrt.open_runtime(path, durability="os", model=OfflineModel()) as rt:
        plain = await rt.open("fz", strategy=case.strategy)
        reader = await rt.open("fzr", view_reader="alice", strategy=case.strategy)
        first = await plain.add_message("user", "hello there", metadata={"task": {"id": "x"}})
        audience = await plain.add_message("Claude", [Text("for alice", audience=("alice",)), Text("for all")])
        last = await plain.add_message("user", [ToolUse("t1", "tool", {"q": 1})])
        if case.rich:
            for i in range(9):
                await plain.add_message("user" if i % 2 else "Claude", f"message number {i} with a few words " * 3)
            await plain.wait_ready()
            await reader.wait_ready()
        await rt.create_branch("side")
        env = Env(rt, plain if case.manager == "plain" else reader, [plain, reader],
                  {"first": first, "audience": audience, "last": last})
        target = TARGET_BY_NAME[case.target]
        if target.setup == "derivation":
            child = await plain.derive(branch="derived")
            env.derivation = child.derivation
            await child.aclose()
        kwargs = {name: env.resolve(value) for name, value in case.kwargs.items() if value is not OMIT}
        before = await snapshot(rt)
        branch_before = env.m.branch
        result: Any = None
        error: BaseException | None = None
        try:
            with trio.fail_after(30):
                result = await target.call(env, dict(kwargs))
        except Exception as exc:  # judged by the caller
            error = exc
        if isinstance(result, ctxrt.ContextManager):
            env.managers.append(result)
        await trio.testing.wait_all_tasks_blocked()  # a told command (settings) has been handled
        after = await snapshot(rt)
        usable: BaseException | None = None
        try:
            await env.m.message_count()
        except Exception as exc:
            usable = exc
        branch_after = None if usable else env.m.branch
        for manager in env.managers:
            await manager.aclose()
        return Outcome(result, error, before, after, branch_before, branch_after, usable, kwargs)


class Store:
    """A fresh store directory per example (a few milliseconds), removed after it. In memory
    (/dev/shm) where there is one: every example opens, syncs and closes an environment."""

    def __init__(self) -> None:
        shm = Path("/dev/shm")
        memory = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
        self.root = Path(tempfile.mkdtemp(prefix="ctxrt-fuzz-", dir=memory))
        self.count = 0

    def path(self) -> Path:
        self.count += 1
        return self.root / f"s{self.count}"

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _difference(before: Any, after: Any) -> str:
    """What changed, briefly: rows added and removed per table for a dump, else both values."""
    if isinstance(before, dict) and "tables" in before:
        changes = []
        for table, rows in before["tables"].items():
            old, new = set(rows), set(after["tables"][table])
            if old != new:
                changes.append(f"{table}: +{sorted(new - old)!r:.300} -{sorted(old - new)!r:.300}")
        return "; ".join(changes) or f"{before!r:.300} -> {after!r:.300}"
    return f"{before!r:.500} -> {after!r:.500}"


def _mentions(exc: BaseException, names: Sequence[str]) -> bool:
    text = f"{exc} {getattr(exc, 'path', '')}"
    return any(name in text for name in names)


def judge(case: Case, outcome: Outcome, verdict: str) -> None:
    """Assert M7 of one call."""
    target = TARGET_BY_NAME[case.target]
    error = outcome.error
    param = target.params[case.fuzzed]
    if error is None:
        assert verdict != INVALID, (
            f"{case.target}({case.fuzzed}={outcome.kwargs.get(case.fuzzed)!r}) accepted a value outside "
            f"the documented domain; it returned {outcome.result!r}"
        )
        return
    documented = (*target.raises, ManagerClosedError) if target.manager else target.raises
    if target.manager:
        documented = (*documented, BranchNotFoundError)
    argument_error = isinstance(error, (TypeError, ValueError)) and (
        not isinstance(error, CtxrtError) or isinstance(error, MalformedContentError))
    assert not isinstance(error, (UnicodeError, BaseExceptionGroup)), f"{case.target} leaked {error!r}"
    assert argument_error or isinstance(error, documented), (
        f"{case.target}({case.fuzzed}=...) raised an undocumented {type(error).__name__}: {error!r}"
    )
    if argument_error and not isinstance(error, re.error):
        wanted = [case.fuzzed] if verdict == INVALID else list(target.params)
        if case.target == "reopen_derived" and case.fuzzed == "derivation":
            wanted += [f.name for f in attrs.fields(Derivation)]
        assert _mentions(error, wanted), (
            f"{case.target}: {type(error).__name__} doesn't name the parameter ({' or '.join(wanted)}): {error!r}"
        )
    if isinstance(error, TypeError) and argument_error:
        others = [param.oracle(outcome.kwargs[name]) for name, param in target.params.items()
                  if name in outcome.kwargs and name != case.fuzzed]
        assert _worst([verdict, *others]) != VALID, (
            f"{case.target} raised TypeError though every argument is of a documented type: {error!r}"
        )
    if verdict == INVALID and not argument_error:
        assert param.lookup and isinstance(error, (BranchNotFoundError, MessageNotFoundError)), (
            f"{case.target}({case.fuzzed}={outcome.kwargs.get(case.fuzzed)!r}) was refused with "
            f"{type(error).__name__}, not as a bad argument (TypeError/ValueError): {error!r}"
        )
    # A refused call changes nothing.
    for key in outcome.before:  # the summaries first, the raw tables last
        assert outcome.before[key] == outcome.after[key], (
            f"{case.target} was refused ({error!r}) but changed {key}: "
            f"{_difference(outcome.before[key], outcome.after[key])}"
        )
    if target.manager:
        assert outcome.usable_after is None, (
            f"the manager is unusable after a refused {case.target}: {outcome.usable_after!r}")
        assert outcome.branch_after == outcome.branch_before, f"a refused {case.target} moved the manager"


# --------------------------------------------------------------------------------------------
# The fuzz
# --------------------------------------------------------------------------------------------


@st.composite
def cases(draw: st.DrawFn, targets: Sequence[Target]) -> Case:
    target = draw(st.sampled_from(targets))
    fuzzed = draw(st.sampled_from(sorted(target.params)))
    kwargs: dict[str, Any] = {}
    for name, param in target.params.items():
        if name == fuzzed:
            # Edge values weigh double: the hostile pool is mostly wrong types.
            kwargs[name] = draw(st.one_of(hostile, param.edge, param.edge, param.valid), label=name)
        elif name in target.required:
            kwargs[name] = draw(param.valid)
        else:
            kwargs[name] = draw(st.one_of(param.valid, st.just(OMIT)))
    if target.name == "open":
        _consistent_open(kwargs, fuzzed)
    if target.name == "reopen_derived" and fuzzed == "derivation" and draw(st.booleans()):
        # A Derivation with one field hostile, the rest as derive made them.
        field = draw(st.sampled_from([f.name for f in attrs.fields(Derivation)]))
        kwargs["derivation"] = DerivationWith(field, draw(hostile))
    return Case(target.name, fuzzed, kwargs, draw(st.sampled_from(["plain", "reader"])),
                draw(st.sampled_from(STRATEGY_VALUES)), rich=draw(st.booleans()))


def _consistent_open(kwargs: dict[str, Any], fuzzed: str) -> None:
    """Valid values of open's parameters that are refused together (isolate without a namespace, an
    auxiliary view naming the own slot) are made consistent, so only the fuzzed one can be wrong."""
    if fuzzed not in ("namespace", "isolate") and kwargs["isolate"] is True and kwargs["namespace"] in (None, "", OMIT):
        kwargs["namespace"] = "fzn"
    views = kwargs["auxiliary_views"]
    if fuzzed not in ("namespace", "isolate", "auxiliary_views") and views is not OMIT and None in views \
            and kwargs["isolate"] is not True:
        kwargs["auxiliary_views"] = ()


def fuzz(targets: Sequence[Target], examples: int) -> None:
    store = Store()
    try:
        @settings(max_examples=examples, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(case=cases(targets))
        def check(case: Case) -> None:
            path = store.path()
            try:
                outcome = trio.run(run_case, path, case)
            finally:
                shutil.rmtree(path, ignore_errors=True)
            verdict = TARGET_BY_NAME[case.target].params[case.fuzzed].oracle(outcome.kwargs[case.fuzzed])
            event(f"{case.target}: {verdict} -> {'ok' if outcome.error is None else type(outcome.error).__name__}")
            note(f"{case.target}({case.fuzzed}={outcome.kwargs.get(case.fuzzed)!r}) verdict {verdict}: "
                 f"{outcome.error!r} / {outcome.result!r}")
            judge(case, outcome, verdict)

        check()
    finally:
        store.close()


RUNTIME_TARGETS = [t for t in TARGETS if not t.manager]
MESSAGE_TARGETS = [TARGET_BY_NAME[n] for n in ("add_message", "edit_message", "remove_message", "remove_messages",
                                                "get_message", "get_message_window", "query_messages",
                                                "channel_token_stats", "hold_compression", "release_compression")]
COMPILE_TARGETS = [TARGET_BY_NAME[n] for n in ("compile", "preview_context", "search_summaries",
                                                "get_summaries_in_range", "get_summary", "reset_head_window",
                                                "pin_range", "unpin",
                                                "set_tool_definitions", "set_system_prompt", "set_strategy")]
BRANCH_TARGETS = [TARGET_BY_NAME[n] for n in ("switch_branch", "fork", "branch_at", "derive")]
assert {t.name for t in (*RUNTIME_TARGETS, *MESSAGE_TARGETS, *COMPILE_TARGETS, *BRANCH_TARGETS)} == set(TARGET_BY_NAME)


@pytest.mark.soak
@pytest.mark.filterwarnings("ignore:the derived manager:RuntimeWarning")  # a filtered derive reopened without one
def test_fuzz_runtime_arguments(soak_scale: Callable[[int, int], int]) -> None:
    fuzz(RUNTIME_TARGETS, soak_scale(350, 4000))


@pytest.mark.soak
def test_fuzz_message_arguments(soak_scale: Callable[[int, int], int]) -> None:
    fuzz(MESSAGE_TARGETS, soak_scale(400, 4000))


@pytest.mark.soak
def test_fuzz_compile_and_summary_arguments(soak_scale: Callable[[int, int], int]) -> None:
    fuzz(COMPILE_TARGETS, soak_scale(350, 4000))


@pytest.mark.soak
def test_fuzz_branch_arguments(soak_scale: Callable[[int, int], int]) -> None:
    fuzz(BRANCH_TARGETS, soak_scale(250, 3000))


# --------------------------------------------------------------------------------------------
# Constructors: Budget, Injection, MessageInjection (no store)
# --------------------------------------------------------------------------------------------

CONSTRUCTORS: dict[type, dict[str, tuple[st.SearchStrategy[Any], Callable[[Any], str]]]] = {
    Budget: {"max_tokens": (values(100_000, 10**400, 5), o_int(0)),
             "reserve_for_response": (values(0, 4_000, 4), o_int(0))},
    # An injection's namespace and content are judged by compile (B4), its position when made.
    Injection: {"namespace": (values("ns", ""), o_any),
                "position": (values("system", "before_user", "after_user"),
                             lambda v: VALID if isinstance(v, str) and v in ("system", "before_user", "after_user")
                             else INVALID),
                "content": (st.sampled_from(VALID_CONTENT), o_any)},
    MessageInjection: {"participant": (values("user",), o_any), "content": (st.sampled_from(VALID_CONTENT), o_any),
                       "depth": (values(0, 3, 10**400), o_int(0))},
}


@st.composite
def constructor_cases(draw: st.DrawFn) -> tuple[type, str, dict[str, Any]]:
    kind = draw(st.sampled_from(list(CONSTRUCTORS)))
    fields = CONSTRUCTORS[kind]
    fuzzed = draw(st.sampled_from(sorted(fields)))
    kwargs = {name: static(draw(st.one_of(hostile, valid) if name == fuzzed else valid))
              for name, (valid, _) in fields.items()}
    return kind, fuzzed, kwargs


@pytest.mark.soak
def test_fuzz_constructor_arguments(soak_scale: Callable[[int, int], int]) -> None:
    @settings(max_examples=soak_scale(600, 10_000))
    @given(data=constructor_cases())
    def check(data: tuple[type, str, dict[str, Any]]) -> None:
        kind, fuzzed, kwargs = data
        verdict = CONSTRUCTORS[kind][fuzzed][1](kwargs[fuzzed])
        try:
            built = kind(**kwargs)
        except (TypeError, ValueError) as exc:
            assert not isinstance(exc, UnicodeError), repr(exc)
            assert _mentions(exc, [fuzzed] if verdict == INVALID else list(kwargs)), f"unnamed: {exc!r}"
            return
        if kind is Budget and kwargs["max_tokens"] <= kwargs["reserve_for_response"]:
            pytest.fail(f"Budget{kwargs} leaves no room, yet was made: {built!r}")
        assert verdict != INVALID, f"{kind.__name__}({fuzzed}={kwargs[fuzzed]!r}) was accepted: {built!r}"

    check()


# --------------------------------------------------------------------------------------------
# open_runtime (a fresh directory per example; nothing is touched when it refuses)
# --------------------------------------------------------------------------------------------


@attrs.frozen
class Place:
    """A path inside the example's directory: "store" (nothing there yet) or "file" (a regular file)."""

    what: str
    as_path: bool = False


def o_path(value: Any) -> str:
    if isinstance(value, Place):
        return VALID if value.what == "store" else UNKNOWN
    if not isinstance(value, (str, os.PathLike)):
        return INVALID
    text = os.fspath(value)
    if not isinstance(text, str) or not text or "\x00" in text or not _encodable(text):
        return INVALID
    if any(len(part.encode("utf-8")) > 255 for part in Path(text).parts):
        return INVALID
    return UNKNOWN  # a file in the way, permissions: the filesystem decides


def o_map_size(value: Any) -> str:
    """From 64 KiB (below about 28 KiB LMDB can't make its tables) to 2**46 bytes (what a process maps)."""
    return VALID if _is_int(value) and 1 << 16 <= value <= 1 << 46 else INVALID


OPEN_RUNTIME_PARAMS: dict[str, Param] = {
    "path": Param(values(Place("store"), Place("store", as_path=True)), o_path,
                  values("", "\x00", "a\x00b", "\ud800", b"store", Place("file"), Big("'x' * 300", "x" * 300))),
    "model": P_MODEL,
    "readonly": Param(values(False, True), o_flag),
    "durability": Param(values("sync", "os"),
                        lambda v: VALID if isinstance(v, str) and v in ("sync", "os") else INVALID,
                        values("SYNC", "", b"sync", ["os"])),
    "map_size": Param(values(1 << 20, 1 << 30, 1 << 36), o_map_size,
                      values(0, -1, 1, 4096, 28672, 1 << 50, 2**62, 2**63 - 1, 2**63, 10**400, 1.5, True)),
    "model_timeout_s": Param(values(300.0, 1, 1e9), o_timeout, values(0, -1, NAN, INF, 1e9 + 1, True, "1")),
}
OPEN_RUNTIME_RAISES = (ctxrt.StoreLockedError, ctxrt.StoreFormatError, ctxrt.StoreCorruptError, ctxrt.StoreFullError,
                       ctxrt.StorePermissionError, FileNotFoundError)


@st.composite
def open_runtime_cases(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    fuzzed = draw(st.sampled_from(sorted(OPEN_RUNTIME_PARAMS)))
    kwargs = {name: draw(st.one_of(hostile, param.edge, param.edge, param.valid) if name == fuzzed
                         else st.one_of(param.valid, st.just(OMIT)) if name != "path" else param.valid)
              for name, param in OPEN_RUNTIME_PARAMS.items()}
    return fuzzed, kwargs


def _inside(directory: Path, value: Any) -> Any:
    """A drawn path made to point inside ``directory``: hostile text becomes one name in it."""
    value = static(value)
    if isinstance(value, Place):
        path = directory / value.what
        return path if value.as_path else str(path)
    if isinstance(value, str) and value:
        return str(directory / "d" / value.replace("/", "_"))
    return value


async def _open_and_close(kwargs: dict[str, Any]) -> None:
    async with ctxrt.open_runtime(**kwargs):
        pass


@pytest.mark.soak
def test_fuzz_open_runtime_arguments(soak_scale: Callable[[int, int], int]) -> None:
    store = Store()
    try:
        @settings(max_examples=soak_scale(150, 1500))
        @given(data=open_runtime_cases())
        def check(data: tuple[str, dict[str, Any]]) -> None:
            fuzzed, drawn = data
            directory = store.path()
            directory.mkdir()
            (directory / "file").write_text("not a store")
            kwargs = {name: _inside(directory, value) if name == "path" else static(value)
                      for name, value in drawn.items() if value is not OMIT}
            verdict = OPEN_RUNTIME_PARAMS[fuzzed].oracle(static(drawn[fuzzed]) if fuzzed == "path" else kwargs[fuzzed])
            error: BaseException | None = None
            try:
                trio.run(_open_and_close, kwargs)
            except Exception as exc:  # judged below
                error = exc
            left = sorted(p.name for p in directory.iterdir())
            shutil.rmtree(directory, ignore_errors=True)
            note(f"open_runtime({fuzzed}={kwargs.get(fuzzed)!r}) verdict {verdict}: {error!r}; left {left}")
            if error is None:
                assert verdict != INVALID, f"open_runtime({fuzzed}={kwargs[fuzzed]!r}) was accepted"
                return
            assert not isinstance(error, (UnicodeError, BaseExceptionGroup)), repr(error)
            argument_error = isinstance(error, (TypeError, ValueError)) and (
                not isinstance(error, CtxrtError) or isinstance(error, MalformedContentError))
            assert argument_error or isinstance(error, OPEN_RUNTIME_RAISES), (
                f"open_runtime({fuzzed}=...) raised an undocumented {type(error).__name__}: {error!r}")
            if argument_error:
                assert _mentions(error, [fuzzed] if verdict == INVALID else list(OPEN_RUNTIME_PARAMS)), (
                    f"open_runtime: {type(error).__name__} doesn't name the parameter: {error!r}")
            if verdict == INVALID:
                assert argument_error, f"open_runtime({fuzzed}=...) refused with {error!r}, not as a bad argument"
            if argument_error or kwargs.get("readonly") is True:
                assert left == ["file"], f"open_runtime refused ({error!r}) but left {left} behind"

        check()
    finally:
        store.close()
