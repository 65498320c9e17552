"""docs/api.md says what the code does: every documented signature and the error table are
compared with the objects ``ctxrt`` exports, so the two can't drift (issue 22, item 5).

Pure: the page is read as text and the package introspected; nothing runs. A signature is
compared by its parameters' names, order, kinds (positional, keyword-only) and defaults, and by
whether it is a coroutine; annotations are prose for readers here (mypy checks the code's own).
"""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

import ctxrt
import ctxrt.testing

API = Path(__file__).resolve().parent.parent / "docs" / "api.md"
FENCE = re.compile(r"^```(\w*)\s*$")
HEADING = re.compile(r"^(#{2,3}) (.*)$")
# Headings whose blocks document a class's methods (the class named by the heading).
CLASS_HEADING = re.compile(r"^(Runtime|ContextManager)(\.\w+)?$")


@attrs.frozen
class Documented:
    line: int  # in docs/api.md
    owner: str | None  # the class a ``def name(self, ...)`` belongs to; None for a module-level name
    name: str
    is_async: bool
    signature: ast.arguments | None  # None: documented as a bare name (``Passthrough()`` has no parameters)
    partial: bool  # ends in ``...``: only the parameters shown are compared


def python_blocks() -> Iterator[tuple[int, str, list[str]]]:
    """(first line, the heading it is under, its lines) of each ```python block."""
    heading, block, start = "", None, 0
    for number, line in enumerate(API.read_text().splitlines(), 1):
        fence = FENCE.match(line)
        if fence is not None:
            if block is None:
                block, start = ([] if fence.group(1) == "python" else None), number + 1
                if block is None:
                    block = ["<not python>"]
            else:
                if block and block[0] != "<not python>":
                    yield start, heading, block
                block = None
            continue
        if block is not None:
            block.append(line)
            continue
        found = HEADING.match(line)
        if found is not None:
            level, title = found.groups()
            if level == "##" or CLASS_HEADING.match(title):
                heading = title


def statements(lines: list[str]) -> Iterator[tuple[int, str]]:
    """Each statement of a block (continuation lines joined while brackets are open), comments off."""
    text, first, depth = "", 0, 0
    for index, line in enumerate(lines):
        code = re.sub(r"\s+#.*$", "", line) if not line.lstrip().startswith("#") else ""
        if not text:
            first = index
        text = f"{text} {code.strip()}" if text else code.rstrip()
        depth += sum(code.count(c) for c in "([{") - sum(code.count(c) for c in ")]}")
        if depth <= 0:
            if text.strip():
                yield first, text
            text, depth = "", 0


def documented() -> list[Documented]:
    found: list[Documented] = []
    for start, heading, lines in python_blocks():
        owner_heading = CLASS_HEADING.match(heading)
        owner = owner_heading.group(1) if owner_heading else None
        in_class: str | None = None
        if any(line.startswith(("import ", "from ")) or re.match(r"^\w+ = ", line) for line in lines):
            continue  # an example program, not a reference
        for offset, text in statements(lines):
            line = start + offset
            stripped = text.strip()
            if stripped.startswith(("import ", "from ", "@")) or "=" in stripped.split("(")[0]:
                continue  # an example, or a decorator (the def follows)
            if stripped.startswith("class "):
                in_class = stripped[len("class "):].split("(")[0].rstrip(":").strip()
                continue
            is_async = stripped.startswith("async def ")
            if stripped.startswith(("def ", "async def ")):
                source = stripped.removeprefix("async ").rstrip(":") + ": ..."
                where = in_class if text.startswith((" ", "\t")) and in_class else owner
            else:
                match = re.match(r"^(?:ctxrt\.)?([A-Za-z_]\w*)\s*(\(.*\))?\s*(?:->.*)?$", stripped)
                if match is None or match.group(1)[0].islower() and match.group(2) is None:
                    continue  # a field listing (``name: str = ...`` inside a class block)
                name, params = match.group(1), match.group(2)
                if params is None:
                    continue
                in_class = name  # an indented ``def`` after a constructor line is its method
                source = f"def {name}{params}: ..."
                where = None
            partial = re.search(r",\s*\.\.\.\s*\)", source) is not None
            tree = ast.parse(re.sub(r",\s*\.\.\.\s*\)", ")", source).replace("->", "-> ").strip())
            function = tree.body[0]
            assert isinstance(function, ast.FunctionDef)
            found.append(Documented(line, where, function.name, is_async, function.args, partial))
    return found


def real(item: Documented) -> Any:
    if item.owner is not None:
        owner = getattr(ctxrt, item.owner, None) or getattr(ctxrt.testing, item.owner)
        return inspect.getattr_static(owner, item.name)
    for module in (ctxrt, ctxrt.testing):
        if hasattr(module, item.name):
            return getattr(module, item.name)
    raise AssertionError(f"docs/api.md:{item.line}: {item.name} is documented but ctxrt doesn't export it")


def parameters(args: ast.arguments) -> list[tuple[str, str, object]]:
    """(name, kind, default text or the marker EMPTY) of a documented signature, self left out."""
    shown: list[tuple[str, str, object]] = []
    positional = [*args.posonlyargs, *args.args]
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    for arg, default in zip(positional, defaults):
        shown.append((arg.arg, "positional", EMPTY if default is None else ast.literal_eval(_constant(default))))
    if args.vararg is not None:
        shown.append((args.vararg.arg, "*args", EMPTY))
    for arg, default in zip(args.kwonlyargs, args.kw_defaults):
        shown.append((arg.arg, "keyword", EMPTY if default is None else ast.literal_eval(_constant(default))))
    if args.kwarg is not None:
        shown.append((args.kwarg.arg, "**kwargs", EMPTY))
    return [p for p in shown if p[0] != "self"]


EMPTY = object()


def _constant(node: ast.expr) -> ast.expr:
    """A default written as arithmetic (``1 << 36``, ``20 * 2**20``) folded to its value."""
    try:
        ast.literal_eval(node)
        return node
    except ValueError:
        return ast.Constant(eval(compile(ast.Expression(node), "<doc>", "eval"), {}))  # noqa: S307 - literals only


def actual(obj: Any) -> tuple[list[tuple[str, str, object]], bool]:
    function = obj.__func__ if isinstance(obj, (staticmethod, classmethod)) else obj
    if inspect.isclass(function):
        signature = inspect.signature(function)
        is_async = False
    else:
        wrapped = inspect.unwrap(function)
        signature = inspect.signature(wrapped)
        is_async = inspect.iscoroutinefunction(wrapped) or inspect.isasyncgenfunction(wrapped)
    kinds = {inspect.Parameter.POSITIONAL_ONLY: "positional", inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional",
             inspect.Parameter.KEYWORD_ONLY: "keyword", inspect.Parameter.VAR_POSITIONAL: "*args",
             inspect.Parameter.VAR_KEYWORD: "**kwargs"}
    shown = [(p.name, kinds[p.kind], EMPTY if p.default is inspect.Parameter.empty else p.default)
             for p in signature.parameters.values() if p.name != "self"]
    return shown, is_async


ITEMS = documented()


def test_no_signature_is_documented_twice() -> None:
    """One place per name: two sections documenting one method drift apart (health() once did)."""
    seen = [(item.owner, item.name) for item in ITEMS]
    assert sorted({key for key in seen if seen.count(key) > 1}, key=str) == []


def test_the_page_documents_the_public_classes_methods() -> None:
    """The parse found what the page holds: Runtime's and ContextManager's methods among them."""
    owners = {(item.owner, item.name) for item in ITEMS}
    assert {("Runtime", "open"), ("ContextManager", "compile"), ("ContextManager", "aclose"),
            (None, "open_runtime"), (None, "Autobiographical")} <= owners, sorted(map(str, owners))
    assert len(ITEMS) > 80


@pytest.mark.parametrize("item", ITEMS, ids=lambda item: f"{item.owner or 'ctxrt'}.{item.name}@{item.line}")
def test_each_documented_signature_is_the_codes(item: Documented) -> None:
    """Names, order, kinds and defaults of every documented signature equal the code's, and a
    method documented ``async`` is a coroutine (or async context manager) in the code."""
    obj = real(item)
    shown, is_async = actual(obj)
    documented_parameters = parameters(item.signature) if item.signature is not None else []
    if item.partial:
        shown = shown[: len(documented_parameters)]
    assert documented_parameters == shown, f"docs/api.md:{item.line}: {item.name}"
    if item.owner is not None:
        assert item.is_async == is_async, f"docs/api.md:{item.line}: {item.name} async documented {item.is_async}"


def test_every_public_coroutine_method_is_documented() -> None:
    """Every public coroutine method of Runtime and ContextManager has a signature on the page."""
    documented_names = {(item.owner, item.name) for item in ITEMS}
    for owner in (ctxrt.Runtime, ctxrt.ContextManager):
        for name, member in vars(owner).items():
            if name.startswith("_"):
                continue
            function = inspect.unwrap(member) if callable(member) else None
            if function is not None and (inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function)):
                assert (owner.__name__, name) in documented_names, f"{owner.__name__}.{name} is not in docs/api.md"


def test_every_type_a_documented_signature_names_is_one_a_host_can_import() -> None:
    """A type named in a documented signature is exported by ``ctxrt`` (or ``ctxrt.testing``), or
    is Python's or trio's: a host annotating its code with it finds it."""
    import builtins
    import collections.abc
    import typing

    known = {*dir(ctxrt), *dir(ctxrt.testing), *dir(typing), *dir(collections.abc), *dir(builtins), "trio", "os", "anthropic", "openai"}
    named = {node.id for item in ITEMS if item.signature is not None
             for arg in (*item.signature.posonlyargs, *item.signature.args, *item.signature.kwonlyargs)
             if arg.annotation is not None for node in ast.walk(arg.annotation) if isinstance(node, ast.Name)}
    named |= {name for found in re.findall(r"->\s*([^\n]+)", API.read_text())
              for name in re.findall(r"(?<![.\w])([A-Z]\w+)", found)}
    assert sorted(named - known) == []


INLINE_CONSTRUCTOR = re.compile(r"`([A-Z]\w+)\(((?:\w+, )*\w+)?\)`")


def test_each_class_spelled_out_in_prose_lists_its_fields_in_order() -> None:
    """Prose like `NamespaceInfo(namespace, reader, narrowing_floor)` names the class's fields, in order."""
    checked = 0
    for number, line in enumerate(API.read_text().splitlines(), 1):
        for name, fields in INLINE_CONSTRUCTOR.findall(line):
            cls = getattr(ctxrt, name, None) or getattr(ctxrt.testing, name, None)
            if cls is None or not attrs.has(cls):
                continue
            listed = fields.split(", ") if fields else []
            actual_fields = [f.name for f in attrs.fields(cls) if f.init][: len(listed)] if listed else []
            assert listed == actual_fields, f"docs/api.md:{number}: {name}"
            checked += 1
    assert checked >= 5


ERROR_ROW = re.compile(r"^\| `(\w+)` \| ([^|]+) \| (.+) \|$")


def error_table() -> dict[str, list[str]]:
    rows = {}
    in_errors = False
    for line in API.read_text().splitlines():
        if line.startswith("## "):
            in_errors = line == "## Errors"
        found = ERROR_ROW.match(line) if in_errors else None
        if found is not None:
            rows[found.group(1)] = re.findall(r"`(\w+)`", found.group(2))
    return rows


def test_the_error_table_is_every_error_ctxrt_exports_with_its_bases() -> None:
    """Each row names an exported error and its direct bases as the code has them, and every
    error class ``ctxrt`` exports has a row."""
    table = error_table()
    exported = {name for name, value in vars(ctxrt).items()
                if inspect.isclass(value) and issubclass(value, BaseException)}
    assert set(table) == exported, (sorted(exported - set(table)), sorted(set(table) - exported))
    for name, bases in table.items():
        assert [base.__name__ for base in getattr(ctxrt, name).__bases__] == bases, name


def test_every_public_coroutine_method_says_what_it_raises() -> None:
    """Every public async method documents what it raises (its docstring has a Raises: section)."""
    for owner in (ctxrt.Runtime, ctxrt.ContextManager):
        for name, member in vars(owner).items():
            function = inspect.unwrap(member) if callable(member) and not name.startswith("_") else None
            if function is not None and (inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function)):
                doc = " ".join((function.__doc__ or "").split())
                assert any(words in doc for words in ("Raises:", "Raises as", "Never raises")), \
                    f"{owner.__name__}.{name}"
