"""The documentation holds together: the README and docs/ link only to files in the repository
(and each ``#anchor`` to a heading there, by GitHub's slug rules), every behaviour number the
code and tests cite has its anchor in docs/behaviours.md, and no file in the repository points
at internal documents that users don't get.

Read from the files as they are, with no Markdown library: links and headings inside fenced
code blocks and inline code don't count, as on GitHub.
"""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = ("architecture.md", "api.md", "guarantees.md", "audience.md", "behaviours.md", "cli.md", "asyncio.md",
         "inspector.md", "integrations.md")

# Built from parts so this file doesn't hold the strings it looks for.
INTERNAL_REFERENCES = tuple(
    "".join(parts) for parts in ((".", "./shared"), ("shared/", "DESIGN.md"), ("shared/", "API.md"), ("shared/", "spec"))
)
SKIPPED_DIRECTORIES = {".git", ".venv", "__pycache__", ".pytest_cache", ".hypothesis", "build"}

FENCE = re.compile(r"^\s{0,3}(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:[^>]*\s)?(?:id|name)=\"([^\"]+)\"", re.IGNORECASE)
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # https:, mailto:, ...
BEHAVIOUR = re.compile(r"\b([ABCDEFHIKLMPRSTVW][0-9]{1,2})\b")


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def prose_lines(text: str) -> list[str]:
    """The lines of a Markdown text outside fenced code blocks, with inline code removed."""
    lines, fenced = [], None
    for line in text.splitlines():
        fence = FENCE.match(line)
        if fence is not None:
            if fenced is None:
                fenced = fence.group(1)
            elif fence.group(1) == fenced:
                fenced = None
            continue
        if fenced is None:
            lines.append(INLINE_CODE.sub("", line))
    return lines


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text lowercased, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link counts as its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor a Markdown file offers: its headings' slugs (a repeated one gets -1, -2...)
    and explicit ``<a id=...>`` anchors."""
    found: set[str] = set()
    seen: Counter[str] = Counter()
    text = path.read_text(encoding="utf-8")
    fenced = None
    for line in text.splitlines():
        fence = FENCE.match(line)
        if fence is not None:
            fenced = fence.group(1) if fenced is None else (None if fence.group(1) == fenced else fenced)
            continue
        if fenced is not None:
            continue
        heading = HEADING.match(line)
        if heading is not None:
            slug = github_slug(heading.group(1))
            found.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
            seen[slug] += 1
        found.update(HTML_ANCHOR.findall(line))
    return found


def links(path: Path) -> list[str]:
    """The link targets of a Markdown file: inline links, images and reference definitions."""
    found = []
    for line in prose_lines(path.read_text(encoding="utf-8")):
        found += INLINE_LINK.findall(line)
        definition = REFERENCE_DEFINITION.match(line)
        if definition is not None:
            found.append(definition.group(1))
    return found


def relative_links() -> list[tuple[Path, str]]:
    return [(path, target) for path in markdown_files() for target in links(path) if not EXTERNAL.match(target)]


def repository_files() -> list[Path]:
    """The files git tracks (as they are in the working tree), or every file outside build and
    environment directories when this is not a git checkout."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
        ).stdout.decode("utf-8", "surrogateescape")
    except (OSError, subprocess.SubprocessError):
        return [
            path for path in ROOT.rglob("*")
            if path.is_file() and not SKIPPED_DIRECTORIES.intersection(path.relative_to(ROOT).parts)
            and not any(part.endswith(".egg-info") for part in path.relative_to(ROOT).parts)
        ]
    paths = (ROOT / name for name in listed.split("\0") if name)
    return [path for path in paths if path.is_file() and ".venv" not in path.relative_to(ROOT).parts]


# -- the slug rules the checks below rely on -------------------------------------------------------


@pytest.mark.parametrize(
    ("heading", "slug"),
    [
        ("Guarantees", "guarantees"),
        ("What a refused call leaves unchanged", "what-a-refused-call-leaves-unchanged"),
        ("The reader's view (A)", "the-readers-view-a"),
        ("Budgets, injections, results", "budgets-injections-results"),
        ("`open_runtime`", "open_runtime"),
        ("Runtime.open", "runtimeopen"),
        ("C8", "c8"),
        ("Links: [the API](api.md) and more", "links-the-api-and-more"),
        ("Flow — store → cache", "flow--store--cache"),
    ],
    ids=lambda value: value,
)
def test_headings_slug_as_github_does(heading: str, slug: str) -> None:
    """GitHub's anchor rule: lowercase, punctuation and symbols dropped, each space a hyphen."""
    assert github_slug(heading) == slug


def test_a_repeated_heading_gets_a_numbered_anchor(tmp_path: Path) -> None:
    """The second "Branches" heading of a page is #branches-1; headings in code blocks don't count."""
    page = tmp_path / "page.md"
    page.write_text("# Branches\n\n```\n# Not a heading\n```\n\n## Branches\n<a id=\"k7\"></a>\n")
    assert anchors(page) == {"branches", "branches-1", "k7"}


def test_links_in_code_are_not_links(tmp_path: Path) -> None:
    """Inline code and fenced blocks hold examples, not links; reference definitions are links."""
    page = tmp_path / "page.md"
    page.write_text("See [a](a.md) and `[b](b.md)`.\n\n```\n[c](c.md)\n```\n\n[d]: d.md#x\n")
    assert links(page) == ["a.md", "d.md#x"]


# -- the documentation -----------------------------------------------------------------------------


def test_every_docs_page_exists_and_the_readme_links_each_one() -> None:
    """README.md's Documentation section reaches every page under docs/."""
    readme_targets = {target.partition("#")[0] for target in links(ROOT / "README.md")}
    pages = {path.name for path in DOCS.glob("*.md")}
    assert set(PAGES) <= pages
    assert sorted(f"docs/{page}" for page in pages if f"docs/{page}" not in readme_targets) == []


def test_every_relative_link_resolves_to_a_file_in_the_repository() -> None:
    """Each relative link in README.md and docs/*.md names a file or directory that exists, inside
    the repository (users get the repository alone)."""
    broken = []
    for path, target in relative_links():
        file_part = target.partition("#")[0]
        if not file_part:
            continue  # an anchor in the same page: checked below
        resolved = (path.parent / file_part).resolve()
        if not resolved.exists() or not resolved.is_relative_to(ROOT):
            broken.append(f"{path.relative_to(ROOT)}: {target}")
    assert broken == []


def test_every_link_anchor_names_a_heading_of_its_target() -> None:
    """A link's #anchor names a heading (or an explicit anchor) of the Markdown page it points to."""
    broken = []
    for path, target in relative_links():
        file_part, _, anchor = target.partition("#")
        if not anchor:
            continue
        page = (path.parent / file_part).resolve() if file_part else path
        if page.suffix == ".md" and page.is_file() and anchor not in anchors(page):
            broken.append(f"{path.relative_to(ROOT)}: {target}")
    assert broken == []


def test_every_cited_behaviour_has_an_anchor_in_the_behaviours_page() -> None:
    """A number such as (C8) in the code, tests or benchmarks resolves to docs/behaviours.md#c8."""
    offered = anchors(DOCS / "behaviours.md")
    cited: dict[str, str] = {}
    for directory in ("ctxrt", "tests", "bench"):
        for path in sorted((ROOT / directory).rglob("*.py")):
            if path == Path(__file__).resolve():
                continue
            for number in BEHAVIOUR.findall(path.read_text(encoding="utf-8")):
                cited.setdefault(number, str(path.relative_to(ROOT)))
    assert sorted(f"{number} (cited in {where})" for number, where in cited.items() if number.lower() not in offered) == []


def test_the_readme_starts_with_the_two_setup_commands() -> None:
    """README.md's first code block is the way in: make demo, then make test."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```[a-z]*\n(.*?)```", text, re.S)
    assert block is not None
    commands = [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.strip()]
    assert commands == ["make demo", "make test"]


def test_no_file_in_the_repository_points_at_internal_documents() -> None:
    """The internal design notes are not shipped: no tracked file (outside .venv) refers to them."""
    offending = []
    for path in repository_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary data
        for reference in INTERNAL_REFERENCES:
            if reference in text:
                offending.append(f"{path.relative_to(ROOT)}: {reference}")
    assert offending == []
