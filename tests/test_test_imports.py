"""Tests import ctxrt as documented: its public modules, or the testing seam ``ctxrt.testing``,
which re-exports from where they live now the internals tests need (store commands, store
layout, slots, ...; see its docstring). A module split or rename then changes ``ctxrt.testing``
and not every test (issue 35, item 7). Only the files in ``INTERNAL_IMPORTS`` import an internal
module directly, each for the reason given; the list grows only by the unit tests of new pure parts
(the fold solver, the queue's merge limits), never by a test of behaviour a public name reaches."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

TESTS = Path(__file__).parent

# Documented public modules (docs/api.md, docs/asyncio.md, docs/integrations.md): the facade, the
# asyncio front, the errors, the testing helpers and seam, the framework adapters, the request
# rules the local API servers apply, and the tracing switch.
PUBLIC = ("ctxrt", "ctxrt.aio", "ctxrt.errors", "ctxrt.testing", "ctxrt.integrations", "ctxrt.openai_rules",
          "ctxrt.anthropic_rules", "ctxrt.tracing")

_CLI = "the command-line tools' own modules (above ctxrt.testing in the layers): tested as the command they implement"
_UNIT = "the unit test of these modules: it calls their functions directly, and moves with them"
_MEMORY = ("the autobiographical strategy's parts (chunking, zones, queue, records, live policy), unit-tested "
           "one by one; issue 35 item 5 reshapes select, and these tests with it")
_MACHINE = ("the namespace machine's sans-I/O parts, driven message by message; issue 35 item 1 reshapes "
            "the machine, and these tests with it")

# test file (relative to tests/) -> (the internal modules it imports, why).
INTERNAL_IMPORTS: dict[str, tuple[frozenset[str], str]] = {
    "test_cli.py": (frozenset({"ctxrt.demo", "ctxrt.loadtest"}), _CLI),
    "test_cli_demo.py": (frozenset({"ctxrt.cli.demo", "ctxrt.demo"}), _CLI),
    "test_cli_errors.py": (frozenset({"ctxrt.cli"}), _CLI),
    "test_inspector.py": (frozenset({"ctxrt.inspector.app", "ctxrt.inspector.pages", "ctxrt.inspector.prices"}), _CLI),
    "test_inspector_browser.py": (frozenset({"ctxrt.demo", "ctxrt.inspector.pages"}), _CLI),
    "test_interrupt.py": (frozenset({"ctxrt.demo"}), _CLI),
    "test_autobiographical.py": (
        frozenset({"ctxrt.namespace.actor", "ctxrt.strategies.autobiographical",
                   "ctxrt.strategies.knowledge", "ctxrt.strategies.prompts", "ctxrt.strategies.queue"}),
        "the strategy's behaviour against its own tuning (timeouts, backoff, attempts, prompts, phases) and "
        "a subclass that fails on purpose"),
    "test_autobiographical_parts.py": (
        frozenset({"ctxrt.strategies.chunking", "ctxrt.strategies.knowledge", "ctxrt.strategies.policy",
                   "ctxrt.strategies.queue", "ctxrt.strategies.records", "ctxrt.strategies.selection"}), _MEMORY),
    "test_autobiographical_zones.py": (
        frozenset({"ctxrt.strategies.chunking", "ctxrt.strategies.coverage", "ctxrt.strategies.live",
                   "ctxrt.strategies.shown_entries", "ctxrt.strategies.zones"}), _MEMORY),
    "test_context_settings.py": (frozenset({"ctxrt.strategies.queue", "ctxrt.strategies.records"}), _MEMORY),
    "test_incremental_strategies.py": (frozenset({"ctxrt.strategies.coverage"}), _MEMORY),
    "test_folding.py": (frozenset({"ctxrt.strategies.folding"}), _UNIT),
    "test_request_ledger_encoding.py": (frozenset({"ctxrt.request_ledger"}), _UNIT),
    "test_live_policy.py": (frozenset({"ctxrt.strategies.live"}), _MEMORY),
    "test_namespace_core.py": (frozenset({"ctxrt.namespace.core"}), _MACHINE),
    "test_namespace_machine.py": (
        frozenset({"ctxrt.namespace.actor", "ctxrt.namespace.core", "ctxrt.namespace.effects",
                   "ctxrt.namespace.lease", "ctxrt.namespace.machine", "ctxrt.namespace.protocol"}), _MACHINE),
    "test_namespace_machine_pure.py": (
        frozenset({"ctxrt.namespace.core", "ctxrt.namespace.effects", "ctxrt.namespace.lease",
                   "ctxrt.namespace.machine", "ctxrt.namespace.protocol", "ctxrt.store.batch",
                   "ctxrt.store.interface", "ctxrt.store.records"}),
        _MACHINE + "; with a store port of its own (the engine protocol, its records and its ANY)"),
    "test_namespace_parts.py": (
        frozenset({"ctxrt.namespace.actor", "ctxrt.namespace.core", "ctxrt.namespace.drain", "ctxrt.namespace.effects",
                   "ctxrt.namespace.lease", "ctxrt.namespace.protocol", "ctxrt.namespace.views",
                   "ctxrt.store.interface"}), _MACHINE),
    "spec/test_audience.py": (frozenset({"ctxrt.namespace.core", "ctxrt.views"}),
                              "E3's run with the reader's view switched off patches these modules "
                              "(KNOWN_REACHES in test_layers.py)"),
    "test_compile.py": (frozenset({"ctxrt.compile.breakpoints", "ctxrt.compile.pipeline", "ctxrt.compile.injections", "ctxrt.compile.provenance",
                                   "ctxrt.compile.tool_pairing"}), _UNIT + " (the compile pipeline's steps)"),
    "test_compile_reference.py": (frozenset({"ctxrt.compile.pipeline", "ctxrt.compile.reference"}),
                                  _UNIT + " (the memo against the reference compile, strict=True)"),
    "test_incremental_compile.py": (frozenset({"ctxrt.content.codec", "ctxrt.compile.pipeline", "ctxrt.compile.reference",
                                               "ctxrt.request_ledger"}),
                                    _UNIT + " (compile's memo against a compile from scratch; the runs it hands the "
                                    "request ledger against the ledger's scan)"),
    "test_incremental_bodies.py": (frozenset({"ctxrt.forms.anthropic_body", "ctxrt.forms.body_runs", "ctxrt.forms.openai_body",
                                              "ctxrt.forms.openai_wire"}),
                                   _UNIT + " (the request bodies' caches against their oracle)"),
    "test_codec.py": (frozenset({"ctxrt.content.codec", "ctxrt.content.validation", "ctxrt.forms.wire"}),
                      _UNIT + " (a message's stored and wire forms)"),
    "test_engine.py": (frozenset({"ctxrt.store.actor", "ctxrt.store.engine", "ctxrt.store.postgres"}),
                       _UNIT + " (both store engines, command by command)"),
    "test_postgres_horizon_attack.py": (frozenset({"ctxrt.store.postgres"}), _UNIT),
    "test_postgres_store.py": (frozenset({"ctxrt.store.postgres"}), _UNIT),
    "test_postgres_lease.py": (frozenset({"ctxrt.store.postgres"}),
                               _UNIT + " (the engine's leases and their fencing check, engine by engine)"),
    "pg_lease_holder.py": (frozenset({"ctxrt.store.postgres"}),
                           "a host process whose lease length its test sets (the engine's default, before the open)"),
    "pg_stalled_closer.py": (frozenset({"ctxrt.store.postgres"}),
                             "a host process whose close bound its test sets (the engine's default, before the open)"),
    "test_postgres_ordering.py": (frozenset({"ctxrt.store.postgres"}),
                                  _UNIT + " (the engine's visible horizon, last_sequence, read as the ordering contract states it)"),
    "typecheck/engines.py": (frozenset({"ctxrt.store.engine", "ctxrt.store.interface", "ctxrt.store.postgres"}),
                             "mypy checks that both engines satisfy the engine protocol"),
    "test_tokens.py": (frozenset({"ctxrt.content.tokens"}), _UNIT),
    "test_calibration.py": (frozenset({"ctxrt.content.tokens"}), _UNIT + " (the calibrated estimator's bounds)"),
    "test_model.py": (frozenset({"ctxrt.models.model"}), _UNIT + " (OfflineModel's extractive summary)"),
    "test_queries.py": (frozenset({"ctxrt.queries"}), _UNIT),
    "test_subscribe.py": (frozenset({"ctxrt.events"}), _UNIT + " (the diff that makes the events)"),
}


def public(module: str) -> bool:
    return module == "ctxrt" or any(module == name or module.startswith(name + ".") for name in PUBLIC[1:])


def submodule(package: str, name: str) -> str | None:
    """``package.name`` if that is a module (``from ctxrt import codec`` imports ``ctxrt.content.codec``)."""
    try:
        return f"{package}.{name}" if importlib.util.find_spec(f"{package}.{name}") is not None else None
    except ModuleNotFoundError:  # ``package`` is a module, not a package
        return None


def internal_imports(source: str) -> set[str]:
    """The ctxrt modules ``source`` imports that are neither public nor the testing seam (code only:
    a child's script in a string is its own program)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and not public(node.module):
            found |= {submodule(node.module, alias.name) or node.module for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "ctxrt":
            found |= {name for alias in node.names if (name := submodule("ctxrt", alias.name)) is not None}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return {name for name in found if name.split(".")[0] == "ctxrt" and not public(name)}


def test_tests_import_public_modules_the_testing_seam_or_a_listed_internal() -> None:
    """Item 7: a test file imports an internal module only if INTERNAL_IMPORTS lists it for that
    file, and every entry there is still needed (the list only shrinks)."""
    found = {str(path.relative_to(TESTS)): internal_imports(path.read_text()) for path in sorted(TESTS.rglob("*.py"))}
    unlisted = sorted(f"{name} imports {module}" for name, modules in found.items() for module in modules
                      if module not in INTERNAL_IMPORTS.get(name, (frozenset(), ""))[0])
    assert unlisted == [], "import it from ctxrt, or re-export it in ctxrt.testing"
    stale = sorted(f"{name}: {module}" for name, (modules, _) in INTERNAL_IMPORTS.items()
                   for module in modules if module not in found.get(name, set()))
    assert stale == [], "remove these from INTERNAL_IMPORTS"


def test_the_checker_sees_each_way_of_importing_an_internal_module() -> None:
    """Item 7: ``from``-imports (of a module's names or of a submodule, the root's included) and
    plain imports count; public modules, the seam and relative imports don't."""
    snippet = (
        "import ctxrt\n"
        "import ctxrt.aio\n"
        "import ctxrt.views\n"
        "from ctxrt import Budget\n"
        "from ctxrt.testing import AppendItem\n"
        "from ctxrt.integrations.langchain import CtxrtMiddleware\n"
        "from ctxrt.store import files\n"
        "from ctxrt import Runtime, memos\n"
        "from ctxrt.slots import prepare_append\n"
        "from . import support\n"
        "def later():\n"
        "    from ctxrt.compile.pipeline import build_compile_result\n"
        "SCRIPT = 'from ctxrt.runtime import open_runtime'\n"
    )
    assert internal_imports(snippet) == {"ctxrt.views", "ctxrt.store.files", "ctxrt.memos", "ctxrt.slots",
                                         "ctxrt.compile.pipeline"}
