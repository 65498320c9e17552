"""Layers one way (DESIGN §2): ctxrt's modules import only downward, with no cycle.

Each module belongs to a layer; a module may import modules of its own layer or lower ones,
never higher. Imports under ``TYPE_CHECKING`` count too: a type that points upward is a
dependency that points upward. Read from the source with ``ast``, so the rule holds whatever
imports happen to be lazy.
"""

from __future__ import annotations

import ast
from pathlib import Path

import ctxrt

PACKAGE = Path(ctxrt.__file__).parent

# Lowest first. The arrows of data flow: manager -> namespace actor -> strategy -> views -> slot
# cache -> store. Within a layer, imports may go either way but never in a cycle.
LAYERS: list[tuple[str, ...]] = [
    ("ctxrt.errors", "ctxrt.mailbox", "ctxrt.content", "ctxrt.events", "ctxrt.store.keys", "ctxrt.store.seals",
     "ctxrt.store.files", "ctxrt.anthropic_rules", "ctxrt.openai_rules", "ctxrt.pgcluster", "ctxrt.tracing"),
    ("ctxrt.checks", "ctxrt.queries"),
    ("ctxrt.codec", "ctxrt.tokens"),
    ("ctxrt.store.urls", "ctxrt.store.records", "ctxrt.store.interface", "ctxrt.store.batch", "ctxrt.store.engine", "ctxrt.store.postgres", "ctxrt.store.protocol",
     "ctxrt.store.environment", "ctxrt.store.writer", "ctxrt.store.actor", "ctxrt.store.verify_postgres",
     "ctxrt.store.verify"),
    ("ctxrt.slots",),
    ("ctxrt.views",),
    ("ctxrt.wire", "ctxrt.openai_wire"),
    ("ctxrt.compile",),
    ("ctxrt.model",),
    ("ctxrt.openai_model",),
    ("ctxrt.strategies.base", "ctxrt.strategies.shaping", "ctxrt.strategies.live"),
    ("ctxrt.strategies.records",),  # autobiographical memory's parts, then the policy over them
    ("ctxrt.strategies.chunking", "ctxrt.strategies.queue", "ctxrt.strategies.prompts"),
    ("ctxrt.strategies.selection",),
    ("ctxrt.strategies.policy",),
    ("ctxrt.strategies.passthrough", "ctxrt.strategies.windowed", "ctxrt.strategies.autobiographical"),
    ("ctxrt.strategies.knowledge",),
    ("ctxrt.strategies.catalog",),
    ("ctxrt.namespace.states", "ctxrt.namespace.core"),
    ("ctxrt.namespace.context", "ctxrt.namespace.protocol", "ctxrt.namespace.effects"),
    ("ctxrt.namespace.machine",),
    ("ctxrt.namespace.actor",),
    ("ctxrt.namespace.registry",),
    ("ctxrt.manager",),
    ("ctxrt.trio_guard",),
    ("ctxrt.runtime",),
    ("ctxrt.aio.stream", "ctxrt.aio.guest"),  # the asyncio front: a shell over the public API above
    ("ctxrt.aio.front",),
    ("ctxrt.aio",),
    ("ctxrt.testing",),
    ("ctxrt.loadtest", "ctxrt.demo"),
    ("ctxrt.inspector.pages", "ctxrt.inspector.app"),
    ("ctxrt.cli",),
    ("ctxrt", "ctxrt.__main__"),
    # The framework adapters: users of the public API (the facade), as a host is; nothing imports them.
    ("ctxrt.integrations", "ctxrt.integrations.blocks"),
    ("ctxrt.integrations.openai_agents", "ctxrt.integrations.langchain", "ctxrt.integrations.pydantic_ai",
     "ctxrt.integrations.autogen"),
]
PACKAGES = {"ctxrt.store", "ctxrt.namespace", "ctxrt.strategies", "ctxrt.inspector"}  # empty __init__ files


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    name = ".".join(parts)
    return name[: -len(".__init__")] if name.endswith(".__init__") else name


def imports_of(path: Path) -> set[str]:
    """The ctxrt modules ``path`` imports (``from .x import y`` resolves to ``x``, or ``x.y`` when that is a module)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("ctxrt")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.startswith("ctxrt"):
                target = node.module
            else:
                continue
            for alias in node.names:
                candidate = f"{target}.{alias.name}"
                found.add(candidate if candidate in all_modules() else target)
    return found - PACKAGES


def all_modules() -> dict[str, Path]:
    return {module_name(path): path for path in PACKAGE.rglob("*.py")}


def layer_of() -> dict[str, int]:
    return {module: index for index, layer in enumerate(LAYERS) for module in layer}


def test_every_module_has_a_layer() -> None:
    """Layers: a new module says where it stands before it can import anything."""
    missing = sorted(set(all_modules()) - set(layer_of()) - PACKAGES)
    assert missing == [], f"add these modules to LAYERS in tests/test_layers.py: {missing}"


def test_no_module_imports_a_higher_layer() -> None:
    """Layers: strategies import neither namespace nor runtime, namespace doesn't import runtime or
    manager, model doesn't import compile; every import points down or across."""
    layers = layer_of()
    upward = []
    for module, path in all_modules().items():
        for imported in imports_of(path):
            if imported in layers and module in layers and layers[imported] > layers[module]:
                upward.append(f"{module} imports {imported}")
    assert upward == []


def test_no_import_cycle_among_ctxrts_modules() -> None:
    """Layers: the import graph has no cycle, within a layer included."""
    graph = {module: imports_of(path) & set(all_modules()) for module, path in all_modules().items()}
    state: dict[str, str] = {}
    cycles: list[list[str]] = []

    def visit(module: str, trail: list[str]) -> None:
        state[module] = "open"
        for imported in sorted(graph.get(module, ())):
            if imported == module:
                continue
            if state.get(imported) == "open":
                cycles.append(trail[trail.index(imported):] + [imported] if imported in trail else [module, imported])
            elif imported not in state:
                visit(imported, trail + [imported])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def test_the_checker_sees_an_upward_import() -> None:
    """Layers: the checker itself works: manager importing runtime would be caught."""
    layers = layer_of()
    assert layers["ctxrt.runtime"] > layers["ctxrt.manager"]
    assert "ctxrt.namespace.protocol" in imports_of(all_modules()["ctxrt.manager"])


def test_only_the_store_package_touches_lmdb_or_a_raw_transaction() -> None:
    """The engine read API (docs/architecture.md): no module outside ctxrt/store imports lmdb or
    opens an engine transaction, so another engine can stand behind the same calls."""
    offenders = []
    for name, path in all_modules().items():
        if name.startswith("ctxrt.store"):
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import) and any(alias.name.split(".")[0] == "lmdb" for alias in node.names):
                offenders.append(f"{name} imports lmdb")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "lmdb":
                offenders.append(f"{name} imports from lmdb")
            elif (isinstance(node, ast.Attribute) and node.attr in ("reader", "log_items", "log_head", "log_item")
                  and ast.unparse(node.value).split(".")[-1].endswith("engine")):
                offenders.append(f"{name} calls engine.{node.attr} (line {node.lineno})")
    assert offenders == []
