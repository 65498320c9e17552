"""Every Python snippet in the README and the guides runs as pasted, in order after the one before
it, and prints what the page says it prints.

Each ```` ```python ```` block of a page is a program: it runs in a fresh interpreter, in one
temporary directory per page (so a store a snippet makes is there for the next, as in a reader's
own directory). A block followed by a line ``prints`` and a plain ```` ``` ```` block must print
exactly that. An HTML comment on the line before a block (invisible on GitHub) changes how it runs:

- ``<!-- snippet: needs ANTHROPIC_API_KEY -->``: it calls the real API; skipped. The page shows an
  offline snippet beside it, which runs.
- ``<!-- snippet: postgresql -->``: it runs against a throwaway PostgreSQL database, whose URL
  replaces the ``postgresql://`` URL the snippet shows.
- ``<!-- snippet: excerpt of PATH -->``: lines from the file PATH (a runnable example); each of
  its lines must be in that file, in order, so the excerpt can't drift from the code it shows.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = ("README.md", "docs/guide.md", "docs/asyncio.md", "docs/integrations.md")
FENCE = re.compile(r"^(\s{0,3})```(\w*)\s*$")
MARKER = re.compile(r"^\s*<!-- snippet: (.+?) -->\s*$")
URL = re.compile(r"postgresql://[^\"'\s]+")
TIMEOUT_S = 120


@attrs.frozen
class Snippet:
    line: int  # where its fence opens, counting from 1
    code: str
    marker: str | None  # the snippet: comment before it, if any
    prints: str | None  # the output the page shows for it


def snippets(path: Path) -> list[Snippet]:
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[tuple[int, str, str]] = []  # (line, language, text), fenced blocks in order
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        indent, language, start = len(opening.group(1)), opening.group(2), index
        index += 1
        body = []
        while index < len(lines) and not FENCE.match(lines[index]):
            body.append(lines[index][indent:])
            index += 1
        blocks.append((start, language, "\n".join(body) + "\n"))
        index += 1
    found = []
    for number, (start, language, text) in enumerate(blocks):
        if language != "python":
            continue
        marker = MARKER.match(lines[start - 1]) if start else None
        prints = None
        if number + 1 < len(blocks) and blocks[number + 1][1] == "":
            between = lines[start + text.count("\n") + 2:blocks[number + 1][0]]
            if [line.strip() for line in between if line.strip()] == ["prints"]:
                prints = blocks[number + 1][2]
        found.append(Snippet(start + 1, text, marker.group(1) if marker else None, prints))
    return found


def is_excerpt(code: str, path: Path) -> bool:
    """Whether each non-blank line of ``code`` is a line of the file at ``path``, in order."""
    source = iter(line.rstrip() for line in path.read_text(encoding="utf-8").splitlines())
    return all(any(line == held for held in source) for line in (text.rstrip() for text in code.splitlines()) if line)


def run(snippet: Snippet, page: str, directory: Path, pg_url: str | None) -> None:
    code = snippet.code
    if snippet.marker == "postgresql":
        assert pg_url is not None and URL.search(code), f"{page}:{snippet.line} shows no postgresql:// URL"
        code = URL.sub(pg_url, code)
    result = subprocess.run([sys.executable, "-c", code], cwd=directory, capture_output=True, text=True,
                            timeout=TIMEOUT_S, check=False)
    assert result.returncode == 0, f"{page}:{snippet.line} failed:\n{result.stderr}"
    if snippet.prints is not None:
        assert result.stdout == snippet.prints, f"{page}:{snippet.line} printed:\n{result.stdout}"


def check_page(page: str, directory: Path, pg_url: str | None) -> None:
    """Runs each of the page's snippets in order (those needing a key aside), or checks an excerpt."""
    for snippet in snippets(ROOT / page):
        excerpt = re.fullmatch(r"excerpt of (\S+)", snippet.marker or "")
        if excerpt is not None:
            assert is_excerpt(snippet.code, ROOT / excerpt.group(1)), (
                f"{page}:{snippet.line} is not an excerpt of {excerpt.group(1)}")
        elif snippet.marker != "needs ANTHROPIC_API_KEY":
            assert snippet.marker in (None, "postgresql"), f"{page}:{snippet.line}: unknown marker {snippet.marker!r}"
            run(snippet, page, directory, pg_url)


@pytest.mark.parametrize("page", ["README.md", "docs/guide.md", "docs/asyncio.md"])
def test_each_snippet_runs_as_pasted_in_order(page: str, tmp_path: Path, pg_url: str) -> None:
    check_page(page, tmp_path, pg_url)


def test_each_integrations_snippet_is_an_excerpt_of_its_runnable_example(tmp_path: Path) -> None:
    """docs/integrations.md shows each adapter as lines of its example (no PostgreSQL needed)."""
    check_page("docs/integrations.md", tmp_path, None)


def test_a_snippet_needing_a_key_stands_beside_one_that_runs_offline() -> None:
    """Only snippets calling the real API are skipped, and each follows an offline one."""
    for page in PAGES:
        found = snippets(ROOT / page)
        for number, snippet in enumerate(found):
            if snippet.marker == "needs ANTHROPIC_API_KEY":
                assert number and found[number - 1].marker is None, f"{page}:{snippet.line} has no offline snippet before it"


def test_the_reader_finds_what_a_snippet_prints(tmp_path: Path) -> None:
    """The parser's rules on a page of its own: a marker, a ``prints`` block, an indented block."""
    page = tmp_path / "page.md"
    page.write_text("text\n\n```python\nprint(1)\n```\n\nprints\n\n```\n1\n```\n\n<!-- snippet: postgresql -->\n"
                    "- item\n\n  ```python\n  x = 'postgresql://a@b/c'\n  ```\n")
    first, second = snippets(page)
    assert (first.code, first.prints, first.marker) == ("print(1)\n", "1\n", None)
    assert (second.code, second.prints, second.marker) == ("x = 'postgresql://a@b/c'\n", None, None)
