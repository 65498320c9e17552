"""The web inspector over HTTP (ctxrt/inspector): a real Hypercorn server on 127.0.0.1 serving a
read-only runtime beside a live writer, on LMDB and PostgreSQL, fetched with a plain HTTP client.
What a browser does with the pages is tests/test_inspector_browser.py's."""

from __future__ import annotations

import base64
import html
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
ROUTES = ("/", "/branch", "/timeline", "/reader", "/summaries", "/diff")


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
                view = await pages.breakdown(bob, budget)
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
