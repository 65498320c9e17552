"""The adapters' runnable examples (examples/*_team.py), each run as written against a store in a
temporary directory: two agents of its framework, offline, where the line for ann reaches ann's
model and not bob's (I1)."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from typing import Any

import pytest
from agents import set_tracing_disabled

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
KEY = "the deploy key is K-7781"


def example(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["openai_agents_team", "langchain_team", "pydantic_ai_team", "autogen_team"])
def test_the_example_hands_ann_her_line_and_bob_the_conversation_without_it(name: str, tmp_path: Path) -> None:
    """The example's two agents: ann's model is handed the line for her, bob's the shared turns
    (ann's reply included) and never that line (I1)."""
    set_tracing_disabled(True)
    seen = asyncio.run(asyncio.wait_for(example(name).main(str(tmp_path / "store")), 60))
    assert any(KEY in text for text in seen["ann"])
    assert not any(KEY in text for text in seen["bob"])
    assert any("ann here, noted." in text for text in seen["bob"])
