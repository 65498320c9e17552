"""ctxrt ships its types (PEP 561) and they catch a host's mistakes (the newcomer issue, item 3).

`make test` runs mypy over ctxrt and tests/typecheck/typing_usage.py (correct use, checked
strictly) before pytest; here mypy is run on a file holding only the two mistakes that went
unnoticed without types, and must report both.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytest.importorskip("mypy")


def test_ctxrt_ships_the_py_typed_marker() -> None:
    assert (ROOT / "ctxrt" / "py.typed").is_file()


def test_mypy_rejects_a_misspelled_method_and_a_string_max_tokens(tmp_path: Path) -> None:
    source = tmp_path / "mistakes.py"
    source.write_text(textwrap.dedent("""\
        import ctxrt


        async def host(manager: ctxrt.ContextManager) -> None:
            await manager.compil()
            ctxrt.Budget(max_tokens="3000")
    """))
    # Run where a host's script lives, outside the checkout: the installed ctxrt (make test's
    # editable install) must be visible to the type checker from there. make test's own mypy
    # settings and cache (when there is one) spare analysing ctxrt again.
    cache = ROOT / ".venv" / "mypy_cache" if (ROOT / ".venv").is_dir() else tmp_path / "mypy_cache"
    completed = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(cache),
         "--no-error-summary", str(source)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    output = completed.stdout + completed.stderr
    assert completed.returncode == 1, output
    errors = [line for line in output.splitlines() if ": error:" in line]
    assert any(':5: error: "ContextManager" has no attribute "compil"' in line for line in errors), output
    assert any(":6: error: " in line and '"max_tokens"' in line and '"str"' in line for line in errors), output
    assert len(errors) == 2, output
