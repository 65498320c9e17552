"""The web inspector over HTTP (ctxrt/inspector): a real Hypercorn server on 127.0.0.1 serving a
read-only runtime beside a live writer, on LMDB and PostgreSQL, fetched with a plain HTTP client.
What a browser does with the pages is tests/test_inspector_browser.py's."""

from __future__ import annotations

import base64
import html
import json
import re
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import trio

import ctxrt
from ctxrt.inspector import app, pages
from ctxrt.testing import ScriptedModel, files
from support import damage, rename_items_table

GUARD_S = 30
HOSTILE = '<script>window.pwned=1</script><img id="pwned" src=x onerror="window.pwned=2">'
ROUTES = ("/", "/branch", "/timeline", "/reader", "/summaries", "/diff", "/search")


def fetch(url: str, *, method: str = "GET", headers: dict[str, str] | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def get(url: str, **kwargs: Any) -> tuple[int, str]:
    return await trio.to_thread.run_sync(partial(fetch, url, **kwargs))


@asynccontextmanager
async def serving(store: Any) -> AsyncIterator[str]:
    """The inspector of ``store`` (opened read-only, beside whatever writer is open) on a free port."""
    async with ctxrt.open_runtime(store, readonly=True) as runtime, trio.open_nursery() as nursery:
        url = await nursery.start(partial(app.serve, runtime, "the store", port=0))
        yield url
        nursery.cancel_scope.cancel()


def autobio() -> ctxrt.Autobiographical:
    return ctxrt.Autobiographical("model-x", target_chunk_tokens=60, recent_window_tokens=60, l1_holdback_chunks=0,
                                  summary_target_tokens=40, head_window_tokens=20)


async def two_readers(writer: ctxrt.Runtime, count: int = 40) -> tuple[ctxrt.ContextManager, ctxrt.ContextManager]:
    ann = await writer.open("agents/ann", view_reader="ann", strategy=autobio())
    bob = await writer.open("agents/bob", view_reader="bob", strategy=autobio())
    for i in range(count):
        content: list[dict[str, Any]] = [{"type": "text", "text": f"line {i:03d} of the shared talk, said plainly"}]
        if i % 7 == 3:
            content.append({"type": "text", "text": f"[ann only {i:03d}] the vault code", "audience": ["ann"]})
        await ann.add_message("user" if i % 2 else "Claude", content)
    for manager in (ann, bob):
        await manager.wait_ready()
    return ann, bob


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("script", "img", "iframe", "object") or any(
                name.startswith("on") or (name == "id" and value == "pwned") for name, value in attrs):
            self.found.append(f"<{tag} {attrs}>")


def injected(page: str) -> list[str]:
    """Elements of the page that markup in a stored string would have made: scripts, images,
    event handlers (the inspector's own pages have none of these)."""
    parser = _Tags()
    parser.feed(page)
    return parser.found


def texts(page: str) -> str:
    """The page's text as a reader sees it (tags out, entities decoded)."""
    return html.unescape(re.sub(r"<[^>]+>", " ", page))


async def test_the_inspector_answers_only_reads_on_loopback(tmp_path: Path) -> None:
    """It listens on 127.0.0.1, answers GET and HEAD, refuses every other method with 405 on every
    route, and refuses a Host that isn't loopback's (W1)."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "s") as writer:
            await two_readers(writer, 10)
            async with serving(tmp_path / "s") as url:
                assert url.startswith("http://127.0.0.1:")
                for route in ROUTES:
                    query = "?branch=main&namespace=agents/ann&a=agents/ann&b=agents/bob"
                    assert (await get(url + route + query))[0] == 200, route
                    assert (await get(url + route + query, method="HEAD"))[0] == 200, route
                    for method in ("POST", "PUT", "PATCH", "DELETE"):
                        assert (await get(url + route + query, method=method))[0] == 405, (route, method)
                status, _ = await get(url + "/", headers={"Host": "attacker.example"})
                assert status == 400


async def test_an_unknown_path_or_method_gets_the_styled_error_page(tmp_path: Path) -> None:
    """A path no page has, a static file that isn't there and a method other than GET or HEAD are
    answered with the inspector's error page naming what was asked (404, 405 with its Allow
    header), as ctxrt's own errors are, never a bare text body (W8)."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "s") as writer:
            await two_readers(writer, 3)
        async with serving(tmp_path / "s") as url:
            for path, method, status in (("/nope", "GET", 404), ("/static/nope.css", "GET", 404),
                                         ("/timeline", "POST", 405)):
                got, page = await get(url + path, method=method)
                assert got == status, (path, method)
                assert "<html" in page.lower() and f"{method} {path}" in texts(page), (path, page[:300])


async def test_every_stored_string_is_escaped(tmp_path: Path) -> None:
    """Hostile HTML in message text, tool input, participants, metadata, branch, namespace and
    reader names and summaries reaches every page as text, never as markup (W2)."""
    with trio.fail_after(GUARD_S):
        model = ScriptedModel(lambda request: f"summary {HOSTILE}")
        async with ctxrt.open_runtime(tmp_path / "s", model=model) as writer:
            hostile_ns = f"ns/{HOSTILE}"
            m = await writer.open(hostile_ns, view_reader=HOSTILE, strategy=autobio())
            for i in range(30):
                await m.add_message(
                    HOSTILE if i % 3 == 0 else "user",
                    [{"type": "text", "text": f"{i} {HOSTILE}"},
                     {"type": "text", "text": f"for the reader {HOSTILE}", "audience": [HOSTILE]}],
                    metadata={HOSTILE: HOSTILE},
                )
            await m.add_message("Claude", [{"type": "tool_use", "id": "t1", "name": "run", "input": {"q": HOSTILE}}])
            await m.add_message("user", [{"type": "tool_result", "tool_use_id": "t1", "content": HOSTILE}])
            await m.wait_ready()
            await m.fork(f"b-{HOSTILE}")
            async with serving(tmp_path / "s") as url:
                from urllib.parse import quote
                pages_seen = []
                for branch in ("main", f"b-{HOSTILE}"):
                    for route in ROUTES:
                        query = (f"?branch={quote(branch)}&namespace={quote(hostile_ns)}&a={quote(hostile_ns)}"
                                 f"&b={quote(hostile_ns)}")
                        status, page = await get(url + route + query)
                        assert status == 200, (route, page[:500])
                        pages_seen.append(page)
                status, page = await get(url + "/branch?branch=" + quote(HOSTILE))  # an error page names it
                assert status == 404
                pages_seen.append(page)
    for page in pages_seen:
        assert injected(page) == []
    everything = "".join(pages_seen)
    assert "&lt;script&gt;window.pwned=1&lt;/script&gt;" in everything
    assert HOSTILE in texts(everything)  # shown, as text


async def test_a_timeline_page_shows_its_messages_with_audience_badges_and_follows_the_writer(tmp_path: Path) -> None:
    """A timeline page holds that page's messages (by index), each audience as a badge; a place
    by sequence opens the page holding it; the last page shows what the writer appends next (W3)."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "s") as writer:
            ann, _ = await two_readers(writer, 120)
            async with serving(tmp_path / "s") as url:
                status, page = await get(url + "/timeline?branch=main&page=1")
                shown = texts(page)
                assert status == 200
                assert "line 050" in shown and "line 099" in shown and "line 049" not in shown and "line 100" not in shown
                assert "for ann" in shown and "[ann only 052]" in shown
                third = (await ann.get_message_window(70, 1)).messages[0]
                status, page = await get(url + f"/timeline?branch=main&at={third.sequence}")
                assert 'class="message marked"' in page and "line 070" in texts(page)
                new_id = await ann.add_message("user", "appended while the inspector looks")
                _, page = await get(url + "/timeline?branch=main&live=1")
                assert "appended while the inspector looks" in page and f'id="m{new_id}"' in page
                assert 'http-equiv="refresh"' in page


async def test_a_timeline_shows_every_block_kind_with_its_audience(tmp_path: Path) -> None:
    """Audio, video, generated images, tool attempts and notices show on the timeline by their kind
    and the note a request form sends for them, each audience a badge; the new fields of tool
    calls, results and documents show too (W3, M8)."""
    wav = base64.b64encode(b"RIFF0000WAVEfmt ").decode()
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "s") as writer:
            m = await writer.open("agents/ann", view_reader="ann")
            await m.add_message("user", [
                ctxrt.Text("media"),
                ctxrt.Audio({"type": "base64", "media_type": "audio/wav", "data": wav}, duration=3, transcript="hi",
                            audience=("ann",)),
                ctxrt.Video({"type": "url", "url": "https://example.com/v"}),
                ctxrt.GeneratedImage({"type": "url", "url": "https://example.com/g"}, prompt="a cat"),
                ctxrt.ToolAttempt("search", {"q": 1}, reason="refused", audience=("bob",)),
                ctxrt.ToolNotice(("search disabled",), tool_name="search"),
                ctxrt.ToolUse("t1", "search", {}, unparseable_input="{q: oops"),
            ])
            await m.add_message("tool", [ctxrt.ToolResult("t1", "found", tool_name="search"), ctxrt.Document(
                {"type": "text", "media_type": "text/plain", "data": "d"}, filename="notes.txt")])
            async with serving(tmp_path / "s") as url:
                status, page = await get(url + "/timeline?branch=main")
    shown = texts(page)
    assert status == 200
    for expected in ("[audio: 3 s, audio/wav, transcript: hi]", "for ann", "[video: https://example.com/v]",
                     "[generated image: https://example.com/g, prompt: a cat]", "for bob",
                     '[tool call not run: search {"q":1}; reason: refused]', "[tool notice (search): search disabled]",
                     "unparsed: {q: oops", "[t1] search found", "notes.txt"):
        assert expected in shown, expected
    for kind in ("audio", "video", "generated_image", "tool_attempt", "tool_notice"):
        assert re.search(f'class="block {kind}( private)?"', page), kind


async def test_a_readers_breakdown_is_the_compile_its_namespace_would_make(tmp_path: Path) -> None:
    """As reader X: the page lists the very messages a compile of that namespace makes for its
    reader now, zone by zone, with summaries linking to what they cover and token counts from
    render_stats; bob's never holds ann's audience lines (W4)."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "s", model=ScriptedModel(lambda r: "the gist")) as writer:
            await two_readers(writer, 60)
            budget = ctxrt.Budget(600, 100)
            async with ctxrt.open_runtime(tmp_path / "s", readonly=True) as reader_rt:
                strategy = pages.recorded_strategy(reader_rt, "agents/bob", "main", 600)
                bob = await reader_rt.open("agents/bob", branch="main", strategy=strategy)
                expected = await bob.compile(budget)
                stats = bob.render_stats()
                view = await pages.breakdown(reader_rt, bob, budget)
                assert [p.blocks for p in view.parts] == [tuple(pages.shown(b) for b in m.content)
                                                          for m in expected.messages]
                assert stats is not None and view.dropped_ids == stats.dropped_ids
                assert view.zone_tokens["recent"] == stats.tail_tokens
                assert {p.zone for p in view.parts} >= {"summary", "recent"}
            async with serving(tmp_path / "s") as url:
                _, bob_page = await get(url + "/reader?branch=main&namespace=agents/bob&budget=600&reserve=100")
                _, ann_page = await get(url + "/reader?branch=main&namespace=agents/ann&budget=600&reserve=100")
    assert "As reader bob" in texts(bob_page) and "ann only" not in bob_page
    assert "ann only" in ann_page
    assert 'class="covers"' in bob_page and "/timeline?branch=main&amp;at=" in bob_page
    summary = next(p for p in view.parts if p.summaries).summaries[0]
    assert f"{summary.first_id}–{summary.last_id}" in bob_page
    assert "render_stats()" in bob_page and "cache breakpoint" in bob_page


async def test_the_summary_tree_and_two_readers_diff(tmp_path: Path) -> None:
    """The summary tree shows each summary's level, what it covers and its children; the diff of
    ann and bob shows ann's audience lines only on ann's side, and how each compile carries each
    message (W5)."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "s", model=ScriptedModel(lambda r: "the gist")) as writer:
            await two_readers(writer, 80)
            async with serving(tmp_path / "s") as url:
                _, tree = await get(url + "/summaries?branch=main&namespace=agents/ann")
                _, diff = await get(url + "/diff?branch=main&a=agents/ann&b=agents/bob&page=0&budget=800&reserve=100")
    assert re.search(r'class="badge level">L1<', tree) and "covers" in tree
    rows = re.findall(r'<tr id="m\d+">(.*?)</tr>', diff, re.S)
    assert rows
    for row in rows:
        cells = re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
        only_a, only_b = texts(cells[3]), texts(cells[4])
        assert "ann only" not in texts(cells[2]) and "ann only" not in only_b
        if "ann only" in row:
            assert "ann only" in only_a
    carried = " ".join(texts(re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)[5]) for row in rows)
    assert "in summary" in carried


async def test_unknown_names_and_bad_numbers_are_said_not_crashed(tmp_path: Path) -> None:
    """An unknown branch, slot or namespace is a 404 naming what there is; a bad page or budget a
    400 (W1)."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "s") as writer:
            await two_readers(writer, 5)
            async with serving(tmp_path / "s") as url:
                status, page = await get(url + "/branch?branch=nope")
                assert status == 404 and "main" in texts(page)
                status, page = await get(url + "/reader?branch=main&namespace=agents/zed")
                assert status == 404 and "agents/ann" in texts(page)
                status, page = await get(url + "/timeline?branch=main&slot=other")
                assert status == 404 and "messages" in texts(page)
                assert (await get(url + "/timeline?branch=main&page=x"))[0] == 400
                assert (await get(url + "/reader?branch=main&namespace=agents/ann&budget=10&reserve=20"))[0] == 400


async def test_the_inspector_serves_a_postgresql_store_beside_its_writer(pg_url: str) -> None:
    """On PostgreSQL too: branches, the timeline (following the writer) and a reader's breakdown (W1, W3)."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(pg_url) as writer:
            ann, _ = await two_readers(writer, 12)
            async with serving(pg_url) as url:
                assert (await get(url + "/"))[0] == 200
                await ann.add_message("user", "a line from the writing process")
                _, page = await get(url + "/timeline?branch=main")
                assert "a line from the writing process" in page
                status, page = await get(url + "/reader?branch=main&namespace=agents/ann")
                assert status == 200 and "ann only" in page


async def test_a_branch_deleted_and_made_again_is_inspected_afresh(tmp_path: Path) -> None:
    """A branch deleted and made again under the same name while the inspector runs: its reader
    and diff pages show the new branch's messages, never the old one's and never a refusal (W7)."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "s") as writer:
            await two_readers(writer, 5)
            async with serving(tmp_path / "s") as url:
                for line in ("the first feat's line", "the second feat's line"):
                    await writer.create_branch("feat")
                    async with await writer.open("agents/ann", branch="feat") as feat:
                        await feat.add_message("user", line)
                    status, reader = await get(url + "/reader?branch=feat&namespace=agents/ann")
                    _, diff = await get(url + "/diff?branch=feat&a=agents/ann&b=agents/bob")
                    assert status == 200 and line in texts(reader) and line in texts(diff), reader[-600:]
                    await writer.delete_branch("feat")
    assert "the first feat's line" not in texts(reader) + texts(diff)


async def test_a_store_damaged_while_served_is_said_on_every_page(tmp_path: Path) -> None:
    """A store whose file is damaged while the inspector serves it: every page answers 500 with a
    page naming the damaged file (StoreCorruptError), never a bare 500 or a traceback, and the
    inspector goes on serving (W8)."""
    store = tmp_path / "s"
    query = "?branch=main&namespace=agents/ann&a=agents/ann&b=agents/bob"
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store) as writer:
            await two_readers(writer, 10)
        async with serving(store) as url:
            for route in ROUTES:
                assert (await get(url + route + query))[0] == 200, route
            damage(store, rename_items_table)
            for _ in range(2):
                for route in ROUTES:
                    status, page = await get(url + route + query)
                    shown = texts(page)
                    assert status == 500 and "StoreCorruptError" in shown, (route, page[:300])
                    assert str(files.data_path(store)) in shown and "Traceback" not in page


def beside_forms(page: str) -> str:
    """The page's main part without its forms, which echo the filters asked for (as the header's
    links to follow the page live do)."""
    main = re.search(r"<main>(.*)</main>", page, re.S)
    assert main
    return re.sub(r"<form.*?</form>", "", main.group(1), flags=re.S)


def rows_of(page: str, table: str) -> list[str]:
    """The text of each body row of table ``#table``."""
    body = re.search(rf'<table id="{table}">.*?<tbody>(.*?)</tbody>', page, re.S)
    assert body, table
    return [texts(row) for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body.group(1), re.S)]


async def test_a_readers_request_badges_its_private_lines_and_filters_keep_to_its_view(tmp_path: Path) -> None:
    """On ann's request each line private to ann carries its audience as a badge; bob's request
    holds none of ann's lines, and no filter or text search on bob's page finds one. Filters by
    zone, participant, audience and text show only the messages that pass (W9, W10, W4)."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "s", model=ScriptedModel(lambda r: "the gist")) as writer:
            await two_readers(writer, 60)
            async with serving(tmp_path / "s") as url:
                base = url + "/reader?branch=main&budget=800&reserve=100&namespace="
                _, ann = await get(base + "agents/ann")
                bob_pages = [(await get(base + "agents/bob" + query))[1] for query in (
                    "", "&q=vault", "&audience=ann", "&audience=*", "&q=ann+only&zone=recent")]
                _, ann_private = await get(base + "agents/ann&audience=ann")
                _, ann_vault = await get(base + "agents/ann&q=VAULT")
                _, ann_recent = await get(base + "agents/ann&zone=recent")
                _, ann_user = await get(base + "agents/ann&participant=user")
                _, ann_shared = await get(base + "agents/ann&audience=-")
    private = re.findall(r'<div class="block text private">(.*?)</div>', ann, re.S)
    assert private and all("for ann" in texts(block) and "ann only" in texts(block) for block in private)
    for page in map(beside_forms, bob_pages):
        assert "ann only" not in page and "vault" not in page and "for ann" not in texts(page)
    assert rows_of(bob_pages[1], "parts") == [" No message of this request passes the filters. "]
    for page in (ann_private, ann_vault):
        rows = rows_of(page, "parts")
        assert rows and all("ann only" in row and "for ann" in row for row in rows)
    assert rows_of(ann_recent, "parts") and all(" recent " in row for row in rows_of(ann_recent, "parts"))
    assert all(" user " in row for row in rows_of(ann_user, "parts"))
    assert rows_of(ann_shared, "parts") and not any("ann only" in row for row in rows_of(ann_shared, "parts"))
    assert len(rows_of(ann_recent, "parts")) < len(rows_of(ann, "parts"))


async def test_a_summarys_covered_range_shows_in_its_readers_view(tmp_path: Path) -> None:
    """A summary's covered messages page lists exactly the messages from its first to its last,
    as its namespace's reader sees them: ann's private lines badged on ann's, never on bob's; the
    reader page and the summary tree link to it (W9)."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "s", model=ScriptedModel(lambda r: "the gist")) as writer:
            ann, bob = await two_readers(writer, 80)
            summaries = {name: [s for s in await m.search_summaries(text="gist", include_merged=True)]
                         for name, m in (("agents/ann", ann), ("agents/bob", bob))}
            async with serving(tmp_path / "s") as url:
                _, reader = await get(url + "/reader?branch=main&namespace=agents/bob&budget=800&reserve=100")
                _, tree = await get(url + "/summaries?branch=main&namespace=agents/ann")
                seen = {}
                for namespace, found in summaries.items():
                    for match in found:
                        summary = match.summary if hasattr(match, "summary") else match
                        _, page = await get(url + f"/covered?branch=main&namespace={namespace}&summary={summary.id}")
                        seen[(namespace, summary.id)] = (summary, page)
                status, missing = await get(url + "/covered?branch=main&namespace=agents/bob&summary=nope")
    assert status == 404 and "nope" in texts(missing)
    assert 'class="covers" href="/covered?branch=main&amp;namespace=agents%2Fbob&amp;summary=' in reader
    assert 'class="covers" href="/covered?branch=main&amp;namespace=agents%2Fann&amp;summary=' in tree
    assert {namespace for namespace, _ in seen} == {"agents/ann", "agents/bob"}
    ann_private = False
    for (namespace, _), (summary, page) in seen.items():
        ids = [int(i) for i in re.findall(r'<tr id="m(\d+)"', page)]
        assert ids and ids[0] == int(summary.first_id) and ids[-1] == int(summary.last_id), (summary, ids)
        if namespace == "agents/bob":
            assert "ann only" not in page
        else:
            ann_private |= "ann only" in page
            assert all("for ann" in texts(b) for b in re.findall(r'class="block text private">(.*?)</div>', page, re.S))
    assert ann_private


async def test_a_search_finds_only_what_its_reader_sees(tmp_path: Path) -> None:
    """A search as ann finds her private lines, badged; the same search as bob finds nothing, nor
    does any filter naming ann; a search as stored finds every line; a text search finds a
    namespace's summaries; a search reads back page by page, newest first (W10)."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "s", model=ScriptedModel(lambda r: "the gist")) as writer:
            await two_readers(writer, 120)
            async with serving(tmp_path / "s") as url:
                search = url + "/search?branch=main"
                _, ann = await get(search + "&namespace=agents/ann&q=vault")
                bob = [(await get(search + "&namespace=agents/bob" + query))[1] for query in (
                    "&q=vault", "&audience=ann", "&audience=*", "&q=ann+only&participant=user", "&q=gist")]
                _, stored = await get(search + "&q=VAULT")
                _, users = await get(search + "&namespace=agents/ann&participant=user")
                _, first = await get(search + "&q=shared+talk")
                older = re.search(r'id="older" href="([^"]+)"', first)
                assert older
                _, second = await get(url + html.unescape(older.group(1)))
                _, gist = await get(search + "&namespace=agents/ann&q=gist")
    hits = rows_of(ann, "hits")
    assert len(hits) == len([i for i in range(120) if i % 7 == 3])
    assert all("ann only" in row and "for ann" in row for row in hits)
    for page in map(beside_forms, bob[:4]):
        assert "ann only" not in page and "for ann" not in texts(page) and rows_of(page, "hits") == [" Nothing found. "]
    assert "ann only" not in bob[4] and 'id="summary-hits"' in bob[4]
    assert len(rows_of(stored, "hits")) == len(hits) and "for ann" in texts(stored)
    assert rows_of(users, "hits") and all(" user " in row for row in rows_of(users, "hits"))
    numbers = [int(n) for page in (first, second) for n in re.findall(r"line (\d{3}) of", texts(page))]
    assert numbers == list(range(119, 19, -1))  # 50 a page, newest first, no line twice
    assert 'id="summary-hits"' in gist and "the gist" in texts(gist)


async def test_every_page_that_shows_the_store_can_follow_it_live(tmp_path: Path) -> None:
    """Each page that shows the store offers to follow it live (the request history and the audit
    included); followed, it reloads itself (an HTML refresh, no script) and shows what the writer
    adds: a reader's request, a search and the timeline (W12)."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "s") as writer:
            ann, _ = await two_readers(writer, 10)
            async with serving(tmp_path / "s") as url:
                query = "?branch=main&namespace=agents/ann&a=agents/ann&b=agents/bob&item=1"
                for route in (*ROUTES, "/history", "/audit"):
                    _, still = await get(url + route + query)
                    _, live = await get(url + route + query + "&live=1")
                    assert 'http-equiv="refresh"' not in still and "follow live" in texts(still), route
                    assert 'http-equiv="refresh"' in live and "stop" in texts(live), route
                await ann.add_message("user", "said after the pages were opened")
                for route in ("/reader", "/search", "/timeline"):
                    _, live = await get(url + route + query + "&live=1")
                    assert "said after the pages were opened" in texts(live), route


async def test_the_branch_page_lists_a_namespaces_strategy_a_setting_a_line(tmp_path: Path) -> None:
    """The branch page shows a namespace's recorded strategy as its kind with each setting given a
    value on a line of its own, and names those left unset, not as one long string (W13)."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "s") as writer:
            await two_readers(writer, 3)
            async with serving(tmp_path / "s") as url:
                _, page = await get(url + "/branch?branch=main")
    cell = re.search(r'<td class="config">(.*?)</td>', page, re.S)
    assert cell and "<summary>autobiographical" in cell.group(1)
    pairs = dict(re.findall(r"<dt>(.*?)</dt><dd>(.*?)</dd>", cell.group(1)))
    assert pairs["target_chunk_tokens"] == "60" and pairs["compression_model"] == "model-x"
    assert "unset (defaults):" in texts(cell.group(1))


class FaultyRuntime:
    """A runtime whose store listing fails with an error no ctxrt error names: a fault the
    inspector didn't foresee."""

    async def list_branches(self) -> list[Any]:
        raise RuntimeError("a fault of the inspector's own")


async def test_a_refused_host_and_an_inspector_fault_get_the_styled_error_page(tmp_path: Path) -> None:
    """A Host that isn't loopback's is refused (400) and a fault of the inspector's own is 500,
    each on the inspector's error page saying what happened, never a bare text body or a
    traceback (W8)."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "s") as writer:
            await two_readers(writer, 3)
        async with serving(tmp_path / "s") as url:
            status, page = await get(url + "/", headers={"Host": "attacker.example"})
            assert status == 400 and "<html" in page and "attacker.example" in texts(page)
        async with trio.open_nursery() as nursery:
            url = await nursery.start(partial(app.serve, FaultyRuntime(), "a faulty store", port=0))
            status, page = await get(url + "/")
            assert status == 500 and "<html" in page and "RuntimeError" in texts(page)
            assert "Traceback" not in page and "a fault of the inspector" not in page
            nursery.cancel_scope.cancel()


PRICES = {"claude-x": {"input": 3.0, "output": 15.0, "cache_read": 0.3}}


async def record_turns(writer: ctxrt.Runtime, namespace: str, turns: int, budget: ctxrt.Budget) -> list[Any]:
    """``turns`` turns of ``namespace`` (its ledger on), each a line appended, then the compile
    recorded as sent in the anthropic form, with usage and latency; committed before it returns."""
    manager = await writer.open(namespace, ledger=True)
    records = []
    for turn in range(turns):
        await manager.add_message("user", f"turn {turn} of {namespace}")
        result = await manager.compile(budget)
        records.append(await manager.record_request(
            result, form="anthropic", model="claude-x", latency_ms=700.0 + turn,
            usage=ctxrt.Usage(1_000_000, 100_000, cache_read_input_tokens=500_000)))
    await manager.requests(limit=1)  # the records waiting for the next commit are committed (Q1)
    return records


@asynccontextmanager
async def serving_priced(store: Any, prices: Any = None) -> AsyncIterator[str]:
    from ctxrt.inspector.prices import parse_prices
    async with ctxrt.open_runtime(store, readonly=True) as runtime, trio.open_nursery() as nursery:
        url = await nursery.start(partial(app.serve, runtime, "the store", port=0,
                                          prices=None if prices is None else parse_prices(prices)))
        yield url
        nursery.cancel_scope.cancel()


async def test_a_namespaces_request_history_pages_its_records_newest_first_with_costs(tmp_path: Path) -> None:
    """The history lists a namespace's recorded requests newest first, 50 a page: time, tokens by
    zone, usage and cache read, cost from the price table (a model it has no price for shows
    none), latency; each links to the request and a diff with the one before; a namespace that
    recorded nothing says so (W14)."""
    budget = ctxrt.Budget(800, 100)
    with trio.fail_after(GUARD_S * 2):
        async with ctxrt.open_runtime(tmp_path / "s", model=ScriptedModel(lambda r: "the gist")) as writer:
            await two_readers(writer, 20)
            records = await record_turns(writer, "agents/ann", 55, budget)
        async with serving_priced(tmp_path / "s", PRICES) as url:
            _, newest = await get(url + "/history?branch=main&namespace=agents/ann")
            _, oldest = await get(url + "/history?branch=main&namespace=agents/ann&page=0")
            _, none = await get(url + "/history?branch=main&namespace=agents/bob")
            _, branch = await get(url + "/branch?branch=main")
        async with serving_priced(tmp_path / "s") as url:
            _, unpriced = await get(url + "/history?branch=main&namespace=agents/ann")
    numbers = [int(n) for n in re.findall(r'<tr id="r(\d+)" class="request">', newest)]
    assert numbers == list(range(54, 4, -1))
    assert [int(n) for n in re.findall(r'<tr id="r(\d+)"', oldest)] == list(range(49, -1, -1))
    rows = rows_of(newest, "history")
    # (1M - 0.5M fresh) x $3 + 0.5M read x $0.3 + 0.1M out x $15 per million: $1.5 + $0.15 + $1.5
    assert all("$3.1500" in row and "500000" in row and "ms" in row and "claude-x" in row for row in rows)
    assert str(records[-1].total_tokens) in rows[0] and "754 ms" in rows[0]
    assert 'class="seg zone-' in newest and 'href="/request-diff?branch=main&amp;namespace=agents%2Fann&amp;a=53&amp;b=54"' in newest
    assert "$" not in "".join(rows_of(unpriced, "history")) and "cost" not in texts(unpriced).split("Request history")[1][:0]
    assert "recorded no request" in texts(none)
    assert 'class="history" href="/history?branch=main&amp;namespace=agents%2Fann"' in branch
    assert 'class="history" href="/history?branch=main&amp;namespace=agents%2Fbob"' not in branch


async def test_one_request_is_shown_as_sent_and_names_what_was_edited_since(tmp_path: Path) -> None:
    """A request's page rebuilds its body from the store, the very body that was sent, in its
    reader's view (bob's never holds ann's line); once a message it held is edited, the page
    names that message as edited since and still shows it as sent (W15)."""
    budget = ctxrt.Budget(800, 100)
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "s", model=ScriptedModel(lambda r: "the gist")) as writer:
            ann, _ = await two_readers(writer, 20)
            bob = await writer.open("agents/bob", ledger=True)
            sent = (await bob.compile(budget))
            await bob.record_request(sent, form="anthropic", options={"assistant": "Claude"})
            await bob.requests(limit=1)  # committed, for the inspector's runtime to read
            body = sent.to_anthropic(assistant="Claude")
            await record_turns(writer, "agents/ann", 2, budget)
            async with serving_priced(tmp_path / "s") as url:
                _, bob_page = await get(url + "/request?branch=main&namespace=agents/bob&n=0")
                _, before = await get(url + "/request?branch=main&namespace=agents/ann&n=1")
                held = re.findall(r'href="/audit\?branch=main&amp;item=(\d+)"', before)
                await ann.edit_message(held[-1], "a line edited after it was sent")
                _, after = await get(url + "/request?branch=main&namespace=agents/ann&n=1")
                status, missing = await get(url + "/request?branch=main&namespace=agents/ann&n=2")
    shown = re.search(r'<pre id="body">(.*?)</pre>', bob_page, re.S)
    assert shown and json.loads(html.unescape(shown.group(1))) == json.loads(json.dumps(body, default=dict))
    assert "byte for byte what was sent" in texts(bob_page) and "ann only" not in bob_page
    assert "byte for byte" in texts(before) and "edited" not in texts(before)
    assert "messages edited or removed since" in texts(after) and held[-1] in texts(after).split("edited or removed since")[1]
    assert "a line edited after it was sent" not in texts(after) and "byte for byte" in texts(after)
    assert status == 404 and "holds 2" in texts(missing)


async def test_the_diff_of_two_requests_says_what_joined_left_and_where_the_cache_broke(tmp_path: Path) -> None:
    """The diff of two requests names the messages that joined and left, marks the first message
    that differs, and says whether the second kept the first's cached prefix (up to its last cache
    breakpoint) or where it broke: a message both carried, edited between them, breaks it (W16)."""
    budget = ctxrt.Budget(800, 100)
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "s", model=ScriptedModel(lambda r: "the gist")) as writer:
            ann, _ = await two_readers(writer, 30)
            await record_turns(writer, "agents/ann", 2, budget)
            async with serving_priced(tmp_path / "s") as url:
                _, kept = await get(url + "/request-diff?branch=main&namespace=agents/ann&a=0&b=1")
                first = re.search(r'<tr class="pair[^"]*">\s*<td>0</td>\s*<td>\w+: message (\d+)', kept)
                assert first, kept
                await ann.edit_message(first.group(1), "the first line, edited")
                await record_turns(writer, "agents/ann", 1, budget)
                _, broke = await get(url + "/request-diff?branch=main&namespace=agents/ann&a=1&b=2")
    assert "Held: request 1 begins with request 0's first" in texts(kept), re.search(r'<p id="prefix">(.*?)</p>', kept, re.S)
    joined = texts(re.search(r'<td id="joined">(.*?)</td>', kept, re.S).group(1)).split()  # type: ignore[union-attr]
    assert len(joined) == 1 and texts(re.search(r'<td id="left">(.*?)</td>', kept, re.S).group(1)).strip() == "none"  # type: ignore[union-attr]
    assert "Broke at message 0" in texts(broke) and 'class="pair changed first-change"' in broke


async def test_an_audit_lists_every_request_that_held_a_message_and_only_those(tmp_path: Path) -> None:
    """The audit of a message lists, per namespace, every recorded request that held it, each
    linking to the request; a message only ann may read is held by ann's requests and never by
    bob's (W17)."""
    budget = ctxrt.Budget(100_000, 100)
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "s") as writer:
            ann, bob = await two_readers(writer, 6)
            private = await ann.add_message("user", [{"type": "text", "text": "ann's alone", "audience": ["ann"]}])
            shared = await ann.add_message("user", "for both")
            await record_turns(writer, "agents/ann", 3, budget)
            await record_turns(writer, "agents/bob", 2, budget)
            async with serving_priced(tmp_path / "s") as url:
                _, of_private = await get(url + f"/audit?branch=main&item={private}")
                _, of_shared = await get(url + f"/audit?branch=main&item={shared}")
                _, timeline = await get(url + "/timeline?branch=main")
    sections = dict(re.findall(r"<h2>(agents/\w+) <small>.*?</small></h2>\s*<table class=\"audit\">(.*?)</table>",
                               of_shared, re.S))
    assert set(sections) == {"agents/ann", "agents/bob"}
    assert len(re.findall(r'<tr class="request">', sections["agents/ann"])) == 3
    assert len(re.findall(r'<tr class="request">', sections["agents/bob"])) == 2
    private_sections = dict(re.findall(r"<h2>(agents/\w+) <small>.*?</small></h2>\s*<table class=\"audit\">(.*?)</table>",
                                       of_private, re.S))
    assert len(re.findall(r'<tr class="request">', private_sections["agents/ann"])) == 3
    assert "<tr class=\"request\">" not in private_sections["agents/bob"] and "None held it." in texts(private_sections["agents/bob"])
    assert 'href="/request?branch=main&amp;namespace=agents%2Fbob&amp;n=1"' in of_shared
    assert f'href="/audit?branch=main&amp;item={private}"' in timeline


def test_serve_refuses_a_price_table_it_cant_read(tmp_path: Path) -> None:
    """``ctxrt serve --prices FILE`` with a file that isn't a price table is a usage error naming
    the file and what is wrong, before anything is served (W14)."""
    import subprocess
    import sys
    bad = tmp_path / "prices.json"
    for text, said in (('{"claude-x": {"input": 3}}', "no 'output' price"), ("[1]", "JSON object"),
                       ('{"m": {"input": 1, "output": -2}}', "non-negative"), ("{", "can't read")):
        bad.write_text(text)
        done = subprocess.run([sys.executable, "-m", "ctxrt", "serve", str(tmp_path / "none"), "--prices", str(bad)],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and str(bad) in done.stderr and said in done.stderr, done.stderr


async def test_requests_recorded_at_one_store_sequence_each_keep_their_place(tmp_path: Path) -> None:
    """Requests recorded with no commit between them share a store sequence: the history, each
    request's page and the audit still show each once, at its own place (W14, W15, W17)."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "s") as writer:
            await two_readers(writer, 4)
            await record_turns(writer, "agents/ann", 2, ctxrt.Budget(100_000, 100))
            ann = await writer.open("agents/ann")
            result = await ann.compile(ctxrt.Budget(100_000, 100))
            for latency in (11.0, 12.0, 13.0):
                await ann.record_request(result, form="anthropic", latency_ms=latency)
            await record_turns(writer, "agents/ann", 1, ctxrt.Budget(100_000, 100))
            ids = [record.id for record in await ann.requests(limit=50)]
            held = (await ann.requests(limit=1))[0].held[0].id
        async with serving_priced(tmp_path / "s") as url:
            shown = [(await get(url + f"/request?branch=main&namespace=agents/ann&n={n}"))[1] for n in range(6)]
            _, history = await get(url + "/history?branch=main&namespace=agents/ann&page=0")
            _, audit = await get(url + f"/audit?branch=main&item={held}")
    assert len(ids) == 6 and [re.search(r"<th>id</th><td>(\w+)</td>", page).group(1) for page in shown] == ids  # type: ignore[union-attr]
    assert [texts(page).count(f"{latency:.0f} ms") for page, latency in zip(shown[2:5], (11, 12, 13))] == [1, 1, 1]
    assert [int(n) for n in re.findall(r'<tr id="r(\d+)"', history)] == [5, 4, 3, 2, 1, 0]
    assert re.findall(r'n=(\d+)">\1</a>', audit) == [str(n) for n in range(6)]
