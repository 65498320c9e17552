"""The README's main job from a fresh clone: `make demo` makes its own light environment and runs
offline (the newcomer's first command; `make test` is what CI runs on a fresh clone already)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("pytest", "mypy", "langchain", "autogen_agentchat", "pydantic_ai", "agents", "selenium")


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="needs the project's git checkout to clone")
def test_make_demo_on_a_fresh_clone_installs_only_the_package_and_runs_offline(tmp_path: Path) -> None:
    """`make demo` in a fresh clone, with no API key: it makes .venv with the package, its runtime
    dependencies and the inspector's (none of the test extra: no pytest, mypy, framework or
    Selenium), runs the demo to its privacy check, and leaves its store in the clone's
    git-ignored demo-store/."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    environment = {key: value for key, value in os.environ.items()
                   if key not in ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "VIRTUAL_ENV", "PYTHONPATH")}
    python = Path(sys.base_prefix) / "bin" / "python3"  # what this venv was made from, not the venv
    done = subprocess.run(["make", "demo", f"PYTHON={python}"], cwd=clone, env=environment, capture_output=True,
                          text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "privacy check passed" in done.stdout, done.stdout[-2000:]
    site = next((clone / ".venv" / "lib").glob("python3*/site-packages"))
    installed = {path.name.split("-")[0].lower() for path in site.iterdir()}
    assert "trio" in installed and "lmdb" in installed
    assert not installed & set(HEAVY), sorted(installed & set(HEAVY))
    assert (clone / "demo-store").is_dir()
    status = subprocess.run(["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True, check=True)
    assert status.stdout == "", status.stdout
