"""The examples run as a newcomer runs them (``python examples/NAME.py``) leave nothing in the
directory they are run from, and a rerun starts over instead of adding the same turns again."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import trio

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


async def run_example(name: str, cwd: Path, temp: Path) -> str:
    environment = {key: value for key, value in os.environ.items() if key != "CTXRT_STORE"}
    result = await trio.run_process([sys.executable, str(EXAMPLES / f"{name}.py")], cwd=cwd, capture_stdout=True,
                                    capture_stderr=True, env={**environment, "TMPDIR": str(temp)})
    return result.stdout.decode()


@pytest.mark.parametrize("name", ["openai_agents_team", "langchain_team", "pydantic_ai_team", "autogen_team"])
async def test_an_example_keeps_its_store_out_of_the_checkout_and_a_rerun_starts_over(name: str, tmp_path: Path) -> None:
    cwd, temp = tmp_path / "cwd", tmp_path / "tmp"
    cwd.mkdir()
    temp.mkdir()
    first = await run_example(name, cwd, temp)
    second = await run_example(name, cwd, temp)
    assert list(cwd.iterdir()) == []
    stores = [output.splitlines()[0] for output in (first, second)]
    assert all(line.startswith(f"store: {temp}") and line.endswith("(new, temporary)") for line in stores), stores
    assert stores[0] != stores[1]
    # What each model was handed is the same on the rerun: nothing from the first run added to it.
    assert first.splitlines()[1:] == second.splitlines()[1:]
