"""The web inspector in a real browser: the OS's headless Chromium driven by Selenium through the
OS's chromedriver (``make test`` installs both, as it installs PostgreSQL), against ``ctxrt serve``
run as a process on a store the demo made. Screenshots go to ``$CTXRT_SCREENSHOTS`` (else a
temporary directory pytest keeps)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import re
import tempfile
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from selenium import webdriver
from selenium.common.exceptions import NoAlertPresentException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.select import Select
from selenium.webdriver.support.expected_conditions import staleness_of
from selenium.webdriver.support.ui import WebDriverWait

import ctxrt
from ctxrt.demo import run_demo
from ctxrt.inspector import pages

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
# What works here as root: no sandbox, no GPU, nothing fetched from the network behind our back.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1200,900")
HOSTILE = '<script>window.pwned=1</script><img id="pwned" src=x onerror="window.pwned=2">'
WAIT_S = 15
ELEMENT_ID = re.compile(r'\bid="([^"]+)"')


def serve(store: Path) -> Iterator[str]:
    """``ctxrt serve STORE --port 0`` as a process; yields its URL, then stops it with Ctrl-C."""
    process = subprocess.Popen([sys.executable, "-m", "ctxrt", "serve", str(store), "--port", "0", "--json"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line, process.stderr.read() if process.stderr else "no output"
        yield json.loads(line)["url"]
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# Enough turns for more summaries than a page of the summary tree holds (50), with the oldest ones,
# which a reader's request sends, on its second page.
DEMO_TURNS = 1_600


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    store = tmp_path_factory.mktemp("demo") / "store"
    report = trio.run(lambda: run_demo(store, messages=DEMO_TURNS))
    assert report.ok, report.problems
    return store


@pytest.fixture(scope="module")
def demo_url(demo_store: Path) -> Iterator[str]:
    yield from serve(demo_store)


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    for path in (CHROMIUM, CHROMEDRIVER):  # an error, never a skip: `make test` installs them
        assert os.access(path, os.X_OK), f"{path} is missing: make test installs chromium and chromium-driver"
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    profile = tempfile.TemporaryDirectory(prefix="ctxrt-chromium-")
    options.add_argument(f"--user-data-dir={profile.name}")  # a new, empty profile each run
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        profile.cleanup()


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = Path(os.environ.get("CTXRT_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def text(driver: webdriver.Chrome, css: str = "main") -> str:
    return str(driver.find_element(By.CSS_SELECTOR, css).text)


def follow(driver: webdriver.Chrome, element: Any) -> None:
    """Click a link or button and wait for the page it leads to (a click doesn't wait for it)."""
    page = driver.find_element(By.TAG_NAME, "html")
    element.click()
    WebDriverWait(driver, WAIT_S).until(gone(page))


def gone(page: Any) -> Callable[[Any], bool]:
    """``staleness_of``, also when chromedriver, asked mid-navigation, says the node left the
    document in words of its own (a WebDriverException, not StaleElementReferenceException)."""
    stale = staleness_of(page)

    def check(driver: Any) -> bool:
        try:
            return bool(stale(driver))
        except WebDriverException as exc:
            if "does not belong to the document" in str(exc):
                return True
            raise

    return check


def nothing_ran(driver: webdriver.Chrome) -> None:
    assert driver.execute_script("return window.pwned === undefined") is True
    assert driver.find_elements(By.ID, "pwned") == []
    with pytest.raises(NoAlertPresentException):
        driver.switch_to.alert.text  # noqa: B018 - reading it is the check


def test_clicking_through_each_view_of_the_demo_store(
    browser: webdriver.Chrome, demo_url: str, screenshots: Path
) -> None:
    """Branches, namespaces, as reader ann and bob (ann's lines only in ann's), a summary's covered
    messages, the summary tree, the timeline's audience badges and the diff of two readers, each
    reached by clicking (W1, W3, W4, W5)."""
    driver = browser
    driver.get(demo_url + "/")
    assert "main" in text(driver, "#branches")
    forks = [row.text for row in driver.find_elements(By.CSS_SELECTOR, "#branches tbody tr") if "main" in row.text]
    assert len(forks) >= 2  # main, and the demo's fork of it with its fork point
    driver.save_screenshot(str(screenshots / "branches.png"))
    follow(driver, driver.find_element(By.LINK_TEXT, "main"))
    namespaces = text(driver, "#namespaces")
    assert all(f"agents/{name}" in namespaces for name in ("ann", "bob", "cy"))
    driver.save_screenshot(str(screenshots / "branch.png"))

    follow(driver, driver.find_element(By.LINK_TEXT, "as ann"))
    shown = text(driver)
    assert "As reader ann" in shown and "[for ann #" in shown
    assert "[for bob #" not in shown and "[for cy #" not in shown
    assert "cache breakpoint" in shown and "render_stats()" in shown
    driver.save_screenshot(str(screenshots / "reader-ann.png"))
    assert driver.find_elements(By.CSS_SELECTOR, "#parts .block.private")  # ann's own lines, badged
    assert all("for ann" in badge.text for badge in driver.find_elements(By.CSS_SELECTOR, "#parts .block.private"))
    bars = driver.find_elements(By.CSS_SELECTOR, "#zone-bar .seg")  # token bars by zone, CSS only
    assert len(bars) == 4 and sum(bar.size["width"] for bar in bars) > 0
    follow(driver, driver.find_elements(By.CSS_SELECTOR, "a.covers")[0])  # the messages a summary stands in for
    covered = text(driver)
    assert "What summary" in covered and "as reader ann" in covered
    assert driver.find_elements(By.CSS_SELECTOR, "#covered tr.message")
    assert "[for bob #" not in covered and "[for cy #" not in covered  # in ann's view
    driver.save_screenshot(str(screenshots / "covered.png"))
    driver.back()
    follow(driver, driver.find_element(By.LINK_TEXT, "summary tree"))
    assert driver.find_elements(By.CSS_SELECTOR, "#summaries li.level-1")
    assert "covers" in text(driver, "#summaries")
    driver.save_screenshot(str(screenshots / "summaries.png"))

    follow(driver, driver.find_element(By.LINK_TEXT, "main"))
    follow(driver, driver.find_element(By.LINK_TEXT, "as bob"))
    shown = text(driver)
    assert "As reader bob" in shown and "[for bob #" in shown and "[for ann #" not in shown
    driver.save_screenshot(str(screenshots / "reader-bob.png"))

    follow(driver, driver.find_element(By.LINK_TEXT, "main"))
    Select(driver.find_element(By.NAME, "a")).select_by_value("agents/ann")
    Select(driver.find_element(By.NAME, "b")).select_by_value("agents/bob")
    follow(driver, driver.find_element(By.CSS_SELECTOR, "#compare button"))
    assert "Two readers' views" in text(driver)
    only_ann, only_bob = [], []
    pages = len(driver.find_elements(By.CSS_SELECTOR, ".pager a")) + 1
    for number in range(pages):  # pages of the diff, reached through its pager
        if number:
            follow(driver, driver.find_element(By.CSS_SELECTOR, ".pager").find_element(By.LINK_TEXT, str(number)))
        only_ann += [cell.text for cell in driver.find_elements(By.CSS_SELECTOR, "#diff td.only-a")]
        only_bob += [cell.text for cell in driver.find_elements(By.CSS_SELECTOR, "#diff td.only-b")]
        if any("[for ann #" in cell for cell in only_ann) and any("[for bob #" in cell for cell in only_bob):
            break  # enough pages seen: each reader's own lines, each on its side
    assert any("[for ann #" in cell for cell in only_ann) and any("[for bob #" in cell for cell in only_bob)
    assert not any("[for ann #" in cell for cell in only_bob) and not any("[for bob #" in cell for cell in only_ann)
    driver.save_screenshot(str(screenshots / "diff.png"))
    nothing_ran(driver)


def test_searching_and_filtering_keep_to_the_readers_view(browser: webdriver.Chrome, demo_url: str,
                                                          screenshots: Path) -> None:
    """Searching as bob for ann's lines finds nothing and as ann finds them, badged; the reader
    page's zone and audience filters narrow its request; a reader page followed live reloads
    itself (W9, W10, W12)."""
    driver = browser
    driver.get(demo_url + "/branch?branch=main")
    follow(driver, driver.find_element(By.LINK_TEXT, "search as bob"))
    driver.find_element(By.NAME, "q").send_keys("[for ann #")
    follow(driver, driver.find_element(By.CSS_SELECTOR, "#search button"))
    assert text(driver, "#hits") .endswith("Nothing found.") and "[for ann #" not in text(driver, "#hits")
    Select(driver.find_element(By.NAME, "namespace")).select_by_value("agents/ann")
    follow(driver, driver.find_element(By.CSS_SELECTOR, "#search button"))
    hits = driver.find_elements(By.CSS_SELECTOR, "#hits tr.message")
    assert hits and all("[for ann #" in hit.text and "for ann" in hit.text for hit in hits)
    assert not any("[for bob #" in hit.text for hit in hits)
    driver.save_screenshot(str(screenshots / "search.png"))

    driver.get(demo_url + "/reader?branch=main&namespace=agents%2Fann")
    every = len(driver.find_elements(By.CSS_SELECTOR, "#parts tr.part"))
    Select(driver.find_element(By.NAME, "zone")).select_by_value("recent")
    follow(driver, driver.find_element(By.CSS_SELECTOR, "#filters button"))
    zones = [cell.text for cell in driver.find_elements(By.CSS_SELECTOR, "#parts td.zone")]
    assert zones and all(zone.startswith("recent") for zone in zones) and len(zones) < every
    Select(driver.find_element(By.NAME, "zone")).select_by_value("")
    Select(driver.find_element(By.NAME, "audience")).select_by_value("ann")
    follow(driver, driver.find_element(By.CSS_SELECTOR, "#filters button"))
    parts = driver.find_elements(By.CSS_SELECTOR, "#parts tr.part")
    assert parts and all("for ann" in part.text for part in parts)
    driver.save_screenshot(str(screenshots / "reader-filtered.png"))
    follow(driver, driver.find_element(By.LINK_TEXT, "follow live"))
    assert "live: reloads every" in text(driver, "header")
    WebDriverWait(driver, WAIT_S).until(gone(driver.find_element(By.TAG_NAME, "html")))  # it reloads itself
    follow(driver, driver.find_element(By.LINK_TEXT, "stop"))
    assert "follow live" in text(driver, "header")


def test_clicking_through_the_request_history_diff_and_audit(browser: webdriver.Chrome, demo_store: Path,
                                                             demo_url: str, screenshots: Path) -> None:
    """On the demo store with its readers' requests recorded (each namespace's ledger on): from the
    branch page to ann's request history, one request as sent (in ann's view), the diff with the
    one before, and the audit of a message it held, listing ann's and bob's requests (W14-W17)."""

    async def record() -> None:
        async with ctxrt.open_runtime(demo_store) as writer:
            for name in ("agents/ann", "agents/bob"):
                manager = await writer.open(name, ledger=True, strategy=pages.recorded_strategy(
                    writer, name, "main", 20_000))
                for turn in range(3):
                    await manager.add_message("user", f"turn {turn} for {name}")
                    result = await manager.compile(ctxrt.Budget(20_000, 2_000))
                    await manager.record_request(result, form="anthropic", model="claude-x", latency_ms=900.0,
                                                 usage=ctxrt.Usage(5_000, 300, cache_read_input_tokens=4_000))

    trio.run(record)
    driver = browser
    driver.get(demo_url + "/branch?branch=main")
    follow(driver, driver.find_elements(By.CSS_SELECTOR, "a.history")[0])
    assert "Request history" in text(driver) and "agents/ann" in text(driver, "h1")
    rows = driver.find_elements(By.CSS_SELECTOR, "#history tr.request")
    assert len(rows) >= 3 and all("claude-x" in row.text and "4000" in row.text for row in rows)
    assert driver.find_elements(By.CSS_SELECTOR, "#history .stack .seg")  # tokens by zone
    driver.save_screenshot(str(screenshots / "history.png"))

    follow(driver, rows[0].find_element(By.CSS_SELECTOR, "td a"))
    assert "byte for byte what was sent" in text(driver, "#rebuilt")
    body = text(driver, "#body")
    assert "[for ann #" in body or "turn 2 for agents/ann" in body
    assert "[for bob #" not in body and "[for cy #" not in body
    driver.save_screenshot(str(screenshots / "request.png"))

    follow(driver, driver.find_element(By.LINK_TEXT, "diff with the one before"))
    assert "Held:" in text(driver, "#prefix") or "Broke at" in text(driver, "#prefix")
    assert text(driver, "#joined") != "none"  # the turn appended between them
    driver.save_screenshot(str(screenshots / "request-diff.png"))
    driver.back()

    held = [a for a in driver.find_elements(By.CSS_SELECTOR, "#held a") if "turn" not in a.text]
    follow(driver, held[-1])  # the newest message it held: a turn both readers' later requests hold too
    audited = text(driver)
    assert "Every request that held" in audited and "agents/ann" in audited
    assert driver.find_elements(By.CSS_SELECTOR, "table.audit tr.request")
    driver.save_screenshot(str(screenshots / "audit.png"))
    nothing_ran(driver)


def fragment_links(driver: webdriver.Chrome) -> set[str]:
    """The page's links that point at a place in a page (``...#sL3-20``), absolute, as the browser
    resolves them."""
    return {href for a in driver.find_elements(By.CSS_SELECTOR, "main a[href*='#']")
            if (href := a.get_attribute("href")) is not None}


def element_ids(url: str) -> set[str]:
    """The ids of the page at ``url``'s elements, fetched without the browser: thousands of
    links are checked, and a page load in Chromium costs some 100 ms where a fetch costs a few."""
    with urllib.request.urlopen(url, timeout=WAIT_S) as reply:
        return set(ELEMENT_ID.findall(reply.read().decode()))


def test_every_link_to_a_place_in_a_page_finds_its_target(browser: webdriver.Chrome, demo_url: str) -> None:
    """From reader ann's page and every page of ann's summary tree, each link to a summary or a
    message opens the page that holds it: a summary on the tree's second page included (the
    reader page's links once led to the tree's first page, where they found nothing)."""
    driver = browser
    namespace = "namespace=agents%2Fann"
    starts = [f"{demo_url}/reader?branch=main&{namespace}", f"{demo_url}/summaries?branch=main&{namespace}"]
    driver.get(starts[1])
    pager = [a.get_attribute("href") for a in driver.find_elements(By.CSS_SELECTOR, ".pager a")]
    assert pager, "the demo store's summary tree fits one page: no link here reaches a second"
    targets: dict[str, set[str]] = {}  # a page's URL: the places in it that links point at
    for start in [*starts, *pager]:
        driver.get(start)
        for href in fragment_links(driver):
            page, place = href.split("#", 1)
            targets.setdefault(page, set()).add(place)
    later = [page for page in targets if "/summaries" in page and any(f"at=L{level}-" in page for level in (2, 3))]
    assert later, "the reader page links to no merged summary"
    for page, places in targets.items():
        assert places <= element_ids(page), f"{page} lacks {places - element_ids(page)}"
    # The defect's own case: a link from the reader page to a summary the tree shows on page 2.
    driver.get(starts[0])
    summary = driver.find_element(By.CSS_SELECTOR, ".summary-source a")
    follow(driver, summary)
    assert driver.find_element(By.CSS_SELECTOR, ".pager strong").text == "2"
    assert driver.execute_script("return document.querySelector(':target') !== null")


def test_the_timeline_follows_a_live_writer(browser: webdriver.Chrome, demo_store: Path, demo_url: str) -> None:
    """A timeline followed live shows a line a writer appends in another process while the page is
    open, with its audience badge, without a click (W3)."""
    driver = browser
    driver.get(demo_url + "/timeline?branch=main&live=1")
    assert "following the writer" in text(driver)

    async def append() -> None:
        async with ctxrt.open_runtime(demo_store) as writer:
            manager = await writer.open("agents/ann")
            await manager.add_message("ann", [{"type": "text", "text": "appended while the browser watches",
                                               "audience": ["ann"]}])

    trio.run(append)
    # The page reloads itself: the timeline found may go stale before its text is read, so read both in one script.
    WebDriverWait(driver, WAIT_S).until(lambda d: "appended while the browser watches" in str(
        d.execute_script("const t = document.querySelector('#timeline'); return t ? t.innerText : ''")))
    # Read in one script: the page reloads itself, which would leave a row found first stale.
    row = driver.execute_script("return Array.from(document.querySelectorAll('#timeline tr.message')).pop().innerText")
    assert "appended while the browser watches" in row and "for ann" in row


@pytest.fixture(scope="module")
def hostile_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    store = tmp_path_factory.mktemp("hostile") / "store"

    async def write() -> None:
        async with ctxrt.open_runtime(store, model=ctxrt.OfflineModel()) as writer:
            strategy = ctxrt.Autobiographical("offline", target_chunk_tokens=60, recent_window_tokens=60,
                                              l1_holdback_chunks=0, head_window_tokens=20)
            manager = await writer.open(f"ns/{HOSTILE}", view_reader=HOSTILE, strategy=strategy)
            for i in range(30):
                await manager.add_message(HOSTILE, [
                    {"type": "text", "text": f"{i} {HOSTILE} and some words to summarise"},
                    {"type": "text", "text": f"only for {HOSTILE}", "audience": [HOSTILE]},
                ], metadata={HOSTILE: HOSTILE})
            await manager.wait_ready()
            await manager.fork(f"b-{HOSTILE}")

    trio.run(write)
    yield from serve(store)


def test_hostile_strings_in_the_store_show_as_text_and_never_run(
    browser: webdriver.Chrome, hostile_url: str, screenshots: Path
) -> None:
    """Script and markup written into messages, participants, metadata, namespace, reader and
    branch names and summaries show as text on every page and run nowhere (W2)."""
    driver = browser
    driver.get(hostile_url + "/")
    nothing_ran(driver)
    assert HOSTILE in text(driver, "#branches")
    follow(driver, driver.find_element(By.PARTIAL_LINK_TEXT, "b-<script>"))
    nothing_ran(driver)
    for link in ("timeline", f"as {HOSTILE}", "summary tree"):
        driver.get(hostile_url + "/branch?branch=main")
        assert HOSTILE in text(driver, "#namespaces")
        follow(driver, driver.find_element(By.LINK_TEXT, link))
        nothing_ran(driver)
        assert HOSTILE in text(driver)
    driver.save_screenshot(str(screenshots / "hostile.png"))
