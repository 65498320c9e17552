"""ctxrt.aio's front is the trio API, name by name and signature by signature (issue 23, item 1).

Determinism rules: introspection of the classes as imported, and one real asyncio loop over a
real LMDB store in a temp dir for the attributes a trio object sets on itself.
"""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path
from typing import Any

import pytest

import ctxrt
import ctxrt.aio


def kind(member: Any) -> str:
    if isinstance(member, property):
        return "property"
    if inspect.iscoroutinefunction(member):
        return "awaited"
    if inspect.isasyncgenfunction(inspect.unwrap(member)):
        return "async context"
    return "plain"


def public(cls: type) -> dict[str, Any]:
    return {name: member for name, member in vars(cls).items() if not name.startswith("_")}


@pytest.mark.parametrize(("trio_class", "front"), [
    (ctxrt.Runtime, ctxrt.aio.Runtime), (ctxrt.ContextManager, ctxrt.aio.ContextManager),
    (ctxrt.HostState, ctxrt.aio.HostState),
])
def test_the_front_has_every_public_member_of_the_trio_class_with_its_signature_and_docstring(
    trio_class: type, front: type
) -> None:
    """Every public member of Runtime, ContextManager and HostState (M9) is on the front under the same name, of the
    same kind (awaited, async context, plain, property), with the same signature and docstring (H1)."""
    assert sorted(public(front)) == sorted(public(trio_class))
    assert front.__doc__ == trio_class.__doc__
    for name, member in public(trio_class).items():
        mirrored = public(front)[name]
        assert kind(mirrored) == kind(member), name
        assert mirrored.__doc__ == member.__doc__, name
        if not isinstance(member, property):
            assert inspect.signature(mirrored) == inspect.signature(member), name


def test_open_runtime_takes_the_trio_parameters_and_carries_the_trio_docstring() -> None:
    """ctxrt.aio.open_runtime has ctxrt.open_runtime's signature, and its docstring is the trio one
    after a paragraph on what asyncio changes (H1)."""
    assert inspect.signature(ctxrt.aio.open_runtime) == inspect.signature(ctxrt.open_runtime)
    assert ctxrt.open_runtime.__doc__ and ctxrt.open_runtime.__doc__ in (ctxrt.aio.open_runtime.__doc__ or "")


def test_what_a_trio_object_sets_on_itself_reads_through_the_front(tmp_path: Path) -> None:
    """The runtime's path, readonly and model, and a derived manager's derivation, read the same
    through the front; a manager opened or derived through the front is itself a front (H1)."""

    async def main() -> None:
        async with ctxrt.aio.open_runtime(tmp_path / "store", model=ctxrt.OfflineModel()) as rt:
            assert isinstance(rt, ctxrt.aio.Runtime)
            assert (rt.path, rt.readonly, type(rt.model)) == (tmp_path / "store", False, ctxrt.OfflineModel)
            manager = await rt.open("agents/ann", view_reader="ann")
            child = await manager.derive(branch="child")
            assert isinstance(manager, ctxrt.aio.ContextManager) and isinstance(child, ctxrt.aio.ContextManager)
            assert child.derivation == ctxrt.Derivation("main", "child", "agents/ann", None, "ann", False, ())
            assert (child.namespace, child.branch, child.view_reader) == ("agents/ann", "child", "ann")
            async with child:
                pass
            with pytest.raises(ctxrt.ManagerClosedError):
                await child.compile()

    asyncio.run(main())
