"""Controls benchmark (issue 13): a long agent loop with tool output and screenshots, compiled after
every turn with the live-context controls on and off, side by side in one run, through the public API.

    python -m bench.controls [--quick]

Issue 13's figure: "a 2,000-turn agent loop with tool output and screenshots compiles within budget on
every turn with the controls on, and the share of the budget spent on stale tool output and images,
with and without them."

The loop (2,000 turns; quick: 300) is written through ``add_message`` into a real LMDB store (durability
"os") in a temporary directory, on the shared slot. Each turn is three messages:

- the assistant calls a tool (``ToolUse``): ``screenshot`` (3 turns in 10), ``run_command`` (6 in 10,
  a short command line) or ``write_file`` (1 in 10, its input carries a file of about 4,000
  characters: over ``tool_use_input_max_tokens`` = 500);
- the user answers with the ``ToolResult``: for a screenshot, a real PNG (random pixels, 128×96 RGB,
  made with zlib + struct, about 37 KiB; about 49 KiB of base64) as an image block nested in the
  result; for a command, about 3,000 characters of log output; for a write, one line;
- the assistant says one short sentence.

After every turn each configuration compiles with ``Budget(max_tokens=60_000, reserve_for_response=4_000)``
(56,000 usable tokens), in a shuffled order each turn, each in a namespace of its own on the same slot:

- WindowedPassthrough, controls ON: ``WindowedPassthrough(tool_result_max_last_n=10,
  tool_use_input_max_tokens=500)`` (and the image defaults: ``max_live_images=6``,
  ``max_live_image_bytes=20 MiB``, ``image_strip_depth_tokens=30,000``);
- WindowedPassthrough, controls OFF: ``WindowedPassthrough(max_live_images=10**6,
  max_live_image_bytes=2**40, image_strip_depth_tokens=10**9)`` (no tool pruning: the defaults);
- Autobiographical ON and OFF, the same settings, compressing with ``ctxrt.OfflineModel()`` (offline,
  deterministic; as ``ctxrt demo`` does without a key). After each turn's appends both Autobiographical
  namespaces run ``wait_ready()`` (not timed), so every compile sees compression caught up.

For each compile: whether it fits the budget (the estimated tokens of the compiled messages as sent,
``ctxrt.content.tokens.estimate_blocks`` over each message's blocks, and ``render_stats().total_tokens``, what
the strategy planned, both <= usable), whether ``result.to_anthropic(assistant="assistant",
strict=True)`` is accepted (it raises ``InvalidRequestError`` when the body breaks a Messages API rule,
such as more than 100 images or an image over 5 MB), how many images the body holds, and the share of
the compiled request's estimated tokens spent on STALE tool output and images: the tool results other
than the newest 10 in the request, and the images other than the newest 6 (an image's place counts
whether it was sent or replaced by the "[image dropped ...]" text; each stale block is counted once,
as sent). Also the share of the usable budget the request fills; the tokens the previous request's
prompt cache can serve (``CompileResult.stable_prefix_tokens``, P9) and the input billed per request at
Anthropic's cache prices (a cache read 0.1 of an input token, a write 1.25; every request ends on a
breakpoint, so what isn't read is written); and the compile's wall time (``await manager.compile(...)``
only).

Figures are over every compile of the run (one per turn and configuration): counts, and medians with
min–max. Results are printed and written to ``bench/results-controls.md``. ``CTXRT_BENCH_DIR`` chooses
where the store lives.
"""

from __future__ import annotations

import base64
import random
import statistics
import struct
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import trio

import ctxrt
from ctxrt.content.tokens import estimate_blocks

from . import harness
from .harness import TABLE_HEAD, measured, scratch

HERE = Path(__file__).resolve().parent
RESULTS_PATH = HERE / "results-controls.md"
BUDGET = ctxrt.Budget(max_tokens=60_000, reserve_for_response=4_000)
USABLE = BUDGET.usable
LIVE_RESULTS = 10  # tool results newer than these are not stale
LIVE_IMAGES = 6  # nor images newer than these
TOOL_INPUT_CAP = 500
ASSISTANT = "assistant"
IMAGE_DROPPED = "[image dropped from live context"  # the placeholder's documented opening (docs/api.md)
PNG_SIZE = (128, 96)
# Input priced in base-input-token equivalents, as Anthropic bills prompt caching (5-minute cache): a
# cache read costs 0.1 of an input token, a cache write 1.25. Every request here ends on a breakpoint,
# so what its prefix doesn't read from the cache it writes.
CACHE_READ, CACHE_WRITE = 0.1, 1.25

CONTROLS = {"tool_result_max_last_n": LIVE_RESULTS, "tool_use_input_max_tokens": TOOL_INPUT_CAP}
NO_CONTROLS = {"max_live_images": 10**6, "max_live_image_bytes": 2**40, "image_strip_depth_tokens": 10**9}
CONFIGS: dict[str, tuple[str, bool]] = {  # name: (strategy, controls on)
    "windowed-on": ("windowed", True), "windowed-off": ("windowed", False),
    "auto-on": ("auto", True), "auto-off": ("auto", False),
}
STRATEGY_NAMES = {"windowed": "WindowedPassthrough", "auto": "Autobiographical"}


def strategy(name: str) -> Any:
    kind, on = CONFIGS[name]
    options = CONTROLS if on else NO_CONTROLS
    if kind == "windowed":
        return ctxrt.WindowedPassthrough(**options)
    return ctxrt.Autobiographical("offline", **options)


# -- the loop's content ------------------------------------------------------------------------------


def png(rng: random.Random, width: int = PNG_SIZE[0], height: int = PNG_SIZE[1]) -> bytes:
    """A real PNG (8-bit RGB) of random pixels: it doesn't compress, so its size is about its pixels'."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    rows = b"".join(b"\x00" + rng.randbytes(width * 3) for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows, 6)) + chunk(b"IEND", b"")


_LOG_WORDS = ["collected", "passed", "failed", "warning", "cache", "build", "step", "module", "test", "worker",
              "request", "compile", "store", "namespace", "budget", "window", "summary", "fetched", "wrote", "read",
              "opened", "closed", "retry", "timeout", "ok"]


def log_output(rng: random.Random, turn: int, chars: int = 3_000) -> str:
    lines: list[str] = []
    size = 0
    n = 0
    while size < chars:
        words = " ".join(rng.choice(_LOG_WORDS) for _ in range(rng.randint(4, 10)))
        line = f"[{turn}:{n:03d}] src/pkg/mod_{rng.randint(0, 99):02d}.py:{rng.randint(1, 999)} {words} t={rng.random():.3f}s"
        lines.append(line)
        size += len(line) + 1
        n += 1
    return "\n".join(lines)


def kind_of(turn: int) -> str:
    step = turn % 10
    return "screenshot" if step in (0, 3, 6) else "write_file" if step == 9 else "run_command"


def turn_messages(rng: random.Random, turn: int) -> list[tuple[str, list[dict[str, Any]]]]:
    """The three messages of turn ``turn``: tool call, tool result, a short remark."""
    kind = kind_of(turn)
    call = f"toolu_{turn:05d}"
    if kind == "screenshot":
        tool_input: dict[str, Any] = {"display": 0}
        data = base64.b64encode(png(rng)).decode("ascii")
        result: Any = [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}]
    elif kind == "run_command":
        tool_input = {"command": f"pytest -q tests/test_{turn % 37}.py -k case_{turn}"}
        result = log_output(rng, turn)
    else:
        tool_input = {"path": f"src/pkg/generated_{turn}.py", "content": log_output(rng, turn, 4_000)}
        result = f"wrote {len(tool_input['content'])} characters to src/pkg/generated_{turn}.py"
    return [
        (ASSISTANT, [{"type": "tool_use", "id": call, "name": kind, "input": tool_input}]),
        ("user", [{"type": "tool_result", "tool_use_id": call, "content": result}]),
        (ASSISTANT, f"Step {turn} done ({kind}); moving on to the next check."),
    ]


# -- one compile, judged ---------------------------------------------------------------------------------


def _is_image_slot(block: Any) -> bool:
    return type(block) is ctxrt.Image or (type(block) is ctxrt.Text and block.text.startswith(IMAGE_DROPPED))


def stale_tokens(result: ctxrt.CompileResult) -> tuple[int, int, int]:
    """(total, stale, large tool input) estimated tokens of the compiled messages as sent.

    Stale: tool results other than the newest LIVE_RESULTS, and images (sent, or replaced by the
    dropped-image text) other than the newest LIVE_IMAGES; newest first, each block counted once.
    Large tool input: tool calls estimated over TOOL_INPUT_CAP tokens (as sent)."""
    total = stale = large = 0
    results = images = 0
    for message in reversed(result.messages):
        total += estimate_blocks(message.content)
        for block in reversed(message.content):
            if type(block) is ctxrt.ToolResult:
                results += 1
                nested = block.content if isinstance(block.content, tuple) else ()
                slots = [b for b in nested if _is_image_slot(b)]
                old_images = sum(1 for k in range(len(slots)) if images + k >= LIVE_IMAGES)
                images += len(slots)
                if results > LIVE_RESULTS:
                    stale += estimate_blocks((block,))
                elif old_images:
                    stale += estimate_blocks(slots[:old_images])  # the oldest of its images
            elif _is_image_slot(block):
                images += 1
                if images > LIVE_IMAGES:
                    stale += estimate_blocks((block,))
            elif type(block) is ctxrt.ToolUse:
                tokens = estimate_blocks((block,))
                if tokens > TOOL_INPUT_CAP:
                    large += tokens
    return total, stale, large


def body_images(body: dict[str, Any]) -> int:
    count = 0
    for message in body["messages"]:
        content = message["content"]
        for block in content if isinstance(content, list) else ():
            if block.get("type") == "image":
                count += 1
            elif block.get("type") == "tool_result" and isinstance(block.get("content"), list):
                count += sum(1 for b in block["content"] if b.get("type") == "image")
    return count


async def compile_once(manager: ctxrt.ContextManager) -> dict[str, Any]:
    """One compile: its time, whether it fits and is a valid request, images, stale share."""
    figures: dict[str, Any] = {"error": None}
    started = time.perf_counter()
    try:
        result = await manager.compile(BUDGET)
    except ctxrt.CtxrtError as exc:
        figures.update(ms=(time.perf_counter() - started) * 1000, fits=False, valid=False, images=0,
                       error=f"compile raised {type(exc).__name__}: {exc}")
        return figures
    figures["ms"] = (time.perf_counter() - started) * 1000
    total, stale, large = stale_tokens(result)
    stats = manager.render_stats()
    planned = stats.total_tokens if stats is not None else total
    cached = result.stable_prefix_tokens
    figures.update(tokens=total, planned=planned, stale=stale, large_input=large, cached=cached,
                   uncached=total - cached, billed=CACHE_READ * cached + CACHE_WRITE * (total - cached),
                   fits=total <= USABLE and planned <= USABLE,
                   stale_share=stale / total if total else 0.0, fill=total / USABLE,
                   dropped=len(stats.dropped_ids) if stats is not None else 0)
    try:
        body = result.to_anthropic(assistant=ASSISTANT, strict=True)
    except (ctxrt.InvalidRequestError, ctxrt.EmptyRequestError) as exc:
        figures.update(valid=False, images=-1, error=f"to_anthropic raised {type(exc).__name__}: {exc}")
        return figures
    figures.update(valid=True, images=body_images(body), body_bytes=sum(len(str(m)) for m in body["messages"]))
    return figures


# -- the run -------------------------------------------------------------------------------------------


def _log(text: str) -> None:
    print(f"[controls] {text}", file=sys.stderr, flush=True)


async def _run(quick: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    settings = {"turns": 300 if quick else 2_000, "seed": 13}
    rng = random.Random(settings["seed"])
    order_rng = random.Random(settings["seed"] + 1)
    started = time.perf_counter()
    compiles: dict[str, list[dict[str, Any]]] = {name: [] for name in CONFIGS}
    append_s = ready_s = 0.0
    stored_bytes = 0
    with scratch("ctxrt-bench-controls-") as root:
        async with ctxrt.open_runtime(root / "store", durability="os") as rt:
            writer = await rt.open("agent")
            managers = {name: await rt.open(name, strategy=strategy(name),
                                            model=ctxrt.OfflineModel() if CONFIGS[name][0] == "auto" else None)
                        for name in CONFIGS}
            for turn in range(settings["turns"]):
                messages = turn_messages(rng, turn)
                t0 = time.perf_counter()
                for participant, content in messages:
                    await writer.add_message(participant, content)
                t1 = time.perf_counter()
                for name, manager in managers.items():
                    if CONFIGS[name][0] == "auto":
                        await manager.wait_ready()
                t2 = time.perf_counter()
                append_s += t1 - t0
                ready_s += t2 - t1
                order = list(managers)
                order_rng.shuffle(order)
                for name in order:
                    figures = await compile_once(managers[name])
                    figures["turn"] = turn
                    compiles[name].append(figures)
                    if figures["error"] is not None and sum(c["error"] is not None for c in compiles[name]) <= 3:
                        _log(f"turn {turn}, {name}: {figures['error'][:300]}")
                if turn % 100 == 99:
                    _log(f"turn {turn + 1} at {time.perf_counter() - started:.0f} s")
            summaries = {name: len(await managers[name].search_summaries(include_merged=True, limit=1 << 30))
                         for name in CONFIGS if CONFIGS[name][0] == "auto"}
            count = await writer.message_count()
            for manager in (writer, *managers.values()):
                await manager.aclose()
        stored_bytes = sum(f.stat().st_size for f in (root / "store").iterdir())
    info = {"quick": quick, "settings": settings, "seconds": time.perf_counter() - started, "append_s": append_s,
            "ready_s": ready_s, "messages": count, "store_mib": stored_bytes / 2**20, "summaries": summaries}
    return _rows(compiles, info), info


def _share(values: list[float]) -> dict[str, float]:
    return harness.summary(100 * v for v in values)


def _rows(compiles: dict[str, list[dict[str, Any]]], info: dict[str, Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for kind in ("windowed", "auto"):
        on, off = compiles[f"{kind}-on"], compiles[f"{kind}-off"]
        label = STRATEGY_NAMES[kind]
        total = len(on)
        good_on = sum(1 for c in on if c["fits"] and c["valid"])
        good_off = sum(1 for c in off if c["fits"] and c["valid"])
        errors = [f"turn {c['turn']}: {c['error']}" for c in on if c["error"]]
        over = [c["turn"] for c in on if not c["fits"] and c["error"] is None]
        rows.append({
            "measure": f"({kind[0]}1) {label}: compiles within budget and API-valid, every turn", "unit": "",
            "ctxrt": good_on, "comparison": good_off, "comparison_label": "controls OFF",
            "ratio": None, "target": total, "op": ">=", "passed": good_on >= total, "rounds": total,
            "detail": {"errors_on": errors[:5], "over_budget_on": over[:10],
                       "errors_off": [f"turn {c['turn']}: {c['error']}" for c in off if c["error"]][:5],
                       "over_budget_off": [c["turn"] for c in off if not c["fits"] and c["error"] is None][:10],
                       "dropped_on": sum(c.get("dropped", 0) > 0 for c in on),
                       "dropped_off": sum(c.get("dropped", 0) > 0 for c in off),
                       "dropped_max_on": max(c.get("dropped", 0) for c in on),
                       "dropped_max_off": max(c.get("dropped", 0) for c in off),
                       "dropped_last_on": on[-1].get("dropped", 0)},
        })
        ok_on = [c for c in on if c["error"] is None]
        ok_off = [c for c in off if c["error"] is None]
        share_on, share_off = [c["stale_share"] for c in ok_on], [c["stale_share"] for c in ok_off]
        rows.append({
            "measure": f"({kind[0]}2) {label}: share of the request's tokens in stale tool output and images", "unit": "%",
            "ctxrt": _share(share_on), "comparison": _share(share_off), "comparison_label": "controls OFF",
            "ratio": statistics.median(share_on) / statistics.median(share_off) if statistics.median(share_off) else None,
            "ratio_means": "ON / OFF", "target": None, "op": None, "passed": None, "rounds": len(ok_on),
            "budget_share": {"on": _share([c["stale"] / USABLE for c in ok_on]),
                             "off": _share([c["stale"] / USABLE for c in ok_off])},
            "large_input": {"on": _share([c["large_input"] / c["tokens"] for c in ok_on]),
                            "off": _share([c["large_input"] / c["tokens"] for c in ok_off])},
        })
        rows.append({
            "measure": f"({kind[0]}3) {label}: images per request", "unit": "",
            "ctxrt": harness.summary(c["images"] for c in ok_on), "comparison": harness.summary(c["images"] for c in ok_off),
            "comparison_label": "controls OFF", "ratio": None, "target": LIVE_IMAGES, "op": "<=",
            "passed": max(c["images"] for c in ok_on) <= LIVE_IMAGES, "rounds": len(ok_on),
        })
        rows.append({
            "measure": f"({kind[0]}4) {label}: request tokens / usable budget", "unit": "%",
            "ctxrt": _share([c["fill"] for c in ok_on]), "comparison": _share([c["fill"] for c in ok_off]),
            "comparison_label": "controls OFF", "ratio": None, "target": None, "op": None, "passed": None,
            "rounds": len(ok_on),
            "body_kib": {"on": harness.summary(c["body_bytes"] / 1024 for c in ok_on),
                         "off": harness.summary(c["body_bytes"] / 1024 for c in ok_off)},
        })
        rows.append({
            "measure": f"({kind[0]}5) {label}: tokens the previous request's cache can serve (`stable_prefix_tokens`)",
            "unit": "tokens", "ctxrt": harness.summary(c["cached"] for c in ok_on),
            "comparison": harness.summary(c["cached"] for c in ok_off), "comparison_label": "controls OFF",
            "ratio": None, "target": None, "op": None, "passed": None, "rounds": len(ok_on),
            "uncached": {"on": harness.summary(c["uncached"] for c in ok_on),
                         "off": harness.summary(c["uncached"] for c in ok_off)},
        })
        billed_on, billed_off = [c["billed"] for c in ok_on], [c["billed"] for c in ok_off]
        rows.append({
            "measure": f"({kind[0]}6) {label}: input billed per request, in input-token equivalents "
                       f"(cache read 0.1, write 1.25)", "unit": "tokens",
            "ctxrt": harness.summary(billed_on), "comparison": harness.summary(billed_off),
            "comparison_label": "controls OFF",
            "ratio": statistics.median(billed_on) / statistics.median(billed_off), "ratio_means": "ON / OFF",
            "target": None, "op": None, "passed": None, "rounds": len(ok_on),
            "billed_total": {"on": sum(billed_on), "off": sum(billed_off)},
        })
        rows.append(harness.versus(
            f"({kind[0]}7) {label}: compile time (`await compile(budget)`)", "ms",
            [c["ms"] for c in on], [c["ms"] for c in off], "controls OFF", target=None, op=None,
            ratio_means="ON / OFF",
        ))
    return rows


def run(quick: bool = False) -> list[dict[str, Any]]:
    """The loop, compiled every turn in the four configurations; one dict per figure."""
    return harness.run_trio(_run, quick)


# -- markdown --------------------------------------------------------------------------------------



def to_markdown(rows: list[dict[str, Any]]) -> str:
    first = rows[0]
    settings = first["settings"]
    turns = settings["turns"]
    lines = [
        "## Controls",
        "",
        measured("controls", first["quick"], f"trio {trio.__version__}")
        + f" The whole run took {first['seconds']:.0f} s.",
        "",
        f"**A {turns:,}-turn agent loop, compiled after every turn, through the public API.** Each turn: an "
        "assistant tool call (`screenshot` 3 in 10, `run_command` 6 in 10, `write_file` 1 in 10 with a "
        "~4,000-character input), the user's tool result (a real 128×96 random-pixel PNG, ~49 KiB of base64, "
        "nested in the result; ~3,000 characters of log output; or one line), and a short assistant remark: "
        f"{first['messages']:,} messages in an LMDB store ({first['store_mib']:,.0f} MiB on disk, durability "
        f"\"os\"; appends took {first['append_s']:.1f} s in all). Budget `Budget(max_tokens=60_000, "
        f"reserve_for_response=4_000)`: {USABLE:,} usable tokens. Controls ON: "
        "`tool_result_max_last_n=10, tool_use_input_max_tokens=500` and the image defaults "
        "(`max_live_images=6`, 20 MiB, `image_strip_depth_tokens=30_000`); OFF: `max_live_images=10**6, "
        "max_live_image_bytes=2**40, image_strip_depth_tokens=10**9`. Autobiographical compresses with "
        f"`OfflineModel()`; both its namespaces ran `wait_ready()` after every turn ({first['ready_s']:.1f} s "
        "in all, not timed; summaries stored: "
        + ", ".join(f"{k} {v:,}" for k, v in first["summaries"].items()) + "). The four configurations "
        "compile in a shuffled order each turn, each in a namespace of its own on the same slot.",
        "",
        ("A compile is *within budget* when the estimated tokens of its messages as sent and its "
        "`render_stats().total_tokens` are both within the usable budget, and *API-valid* when "
        "`to_anthropic(assistant=\"assistant\", strict=True)` accepts it. *Stale*: tool results other than the "
        "newest 10 in the request, and images other than the newest 6 (sent or replaced by the dropped-image "
        "text), as estimated tokens of the request. Figures are over every compile: counts, or medians "
        "(min–max)."),
        "",
        *TABLE_HEAD,
    ]
    for row in rows:
        unit = row["unit"]
        comparison = row.get("comparison")
        comparison = f"{row['comparison_label']}: {harness.median_figure(comparison, unit)}" if comparison is not None else ""
        ours = row["ctxrt"]
        if row["measure"].endswith("every turn"):
            ours, comparison = f"{ours:,} of {row['rounds']:,}", f"controls OFF: {row['comparison']:,} of {row['rounds']:,}"
        ratio = "" if row.get("ratio") is None else f"{row['ratio']:,.2f} ({row['ratio_means']})"
        target = "" if row["target"] is None else f"{row['op']} {row['target']:g}"
        verdict = "" if row["passed"] is None else "pass" if row["passed"] else "**fail**"
        lines.append(f"| {row['measure']} | {harness.median_figure(ours, unit)} | {comparison} | {ratio} | {target} | {verdict} |")
    lines += ["", harness.paired_line(rows), "", "Beside the table:", ""]
    for row in rows:
        if "detail" in row:
            d = row["detail"]
            lines.append(f"- {row['measure'].split(':')[0]}: compiles refused or invalid with controls ON: "
                         f"{'; '.join(d['errors_on']) or 'none'}; over budget ON (turns): {d['over_budget_on'] or 'none'}; "
                         f"refused or invalid OFF: {'; '.join(d['errors_off']) or 'none'}; over budget OFF (turns): "
                         f"{d['over_budget_off'] or 'none'}; compiles reporting dropped history "
                         f"(`render_stats().dropped_ids`): ON {d['dropped_on']:,}, OFF {d['dropped_off']:,} (at most "
                         f"{d['dropped_max_on']:,} and {d['dropped_max_off']:,} messages in one compile; "
                         f"{d['dropped_last_on']:,} in the last compile ON).")
        if "budget_share" in row:
            b, big = row["budget_share"], row["large_input"]
            lines.append(f"- {row['measure'].split(':')[0]}: stale tokens as a share of the usable budget: ON "
                         f"{harness.median_figure(b['on'], '%')}, OFF {harness.median_figure(b['off'], '%')}; tool inputs over 500 tokens as a "
                         f"share of the request: ON {harness.median_figure(big['on'], '%')}, OFF {harness.median_figure(big['off'], '%')}.")
        if "uncached" in row:
            u = row["uncached"]
            lines.append(f"- {row['measure'].split(':')[0]}: tokens per request not served from that cache: ON "
                         f"{harness.median_figure(u['on'], 'tokens')}, OFF {harness.median_figure(u['off'], 'tokens')}.")
        if "billed_total" in row:
            t = row["billed_total"]
            lines.append(f"- {row['measure'].split(':')[0]}: over the whole run: ON {t['on']:,.0f}, OFF "
                         f"{t['off']:,.0f} input-token equivalents ({t['on'] / t['off']:.2f}×).")
        if "body_kib" in row:
            k = row["body_kib"]
            lines.append(f"- {row['measure'].split(':')[0]}: request body size (the messages, as Python text): "
                         f"ON {harness.median_figure(k['on'], 'KiB')}, OFF {harness.median_figure(k['off'], 'KiB')}.")
    lines += ["", "What the figures say:", "", *_notes(rows)]
    return "\n".join(lines) + "\n"


def _notes(rows: list[dict[str, Any]]) -> list[str]:
    by = {row["measure"].split(")")[0] + ")": row for row in rows}
    notes = []
    w5, w6, w3 = by["(w5)"], by["(w6)"], by["(w3)"]
    notes.append(
        f"- With the controls ON, WindowedPassthrough's requests keep most of their cached prefix: the count "
        f"lines (images, tool results) move in steps of half their limit, so what is dropped changes once every "
        f"few turns. The median `stable_prefix_tokens` is {w5['ctxrt']['median']:,.0f} against "
        f"{w5['comparison']['median']:,.0f} with the controls OFF, on a request "
        f"{by['(w4)']['ctxrt']['median'] / by['(w4)']['comparison']['median']:.0%} the size, so the input billed "
        f"at Anthropic's cache prices is {w6['ratio']:.2f}× as much. (Before the steps, it was 3.0×: every turn "
        f"rewrote a block in the middle of what the last request cached.)")
    notes.append(
        f"- Images per request never pass {w3['ctxrt']['max']:.0f} with the controls ON: `tool_result_max_last_n=10` "
        f"prunes a screenshot's whole tool result before `max_live_images=6` binds (3 screenshots in 10 turns), "
        f"so the image count limit never acts here; without controls, up to {w3['comparison']['max']:.0f} "
        f"(the estimator prices every image at 1,600 tokens, whatever its pixels, so the budget caps them).")
    notes.append(
        f"- The compile costs {by['(w7)']['ratio']:.2f}× with the controls ON for WindowedPassthrough (the live "
        f"pass walks the window each compile; entries it changes the same way are handed back as the same "
        f"objects, so compile's memo reuses them: it was 2.2× before that).")
    a1 = by["(a1)"]["detail"]
    notes.append(
        f"- Autobiographical reports left-out history on {a1['dropped_on']:,} of {by['(a1)']['rounds']:,} compiles "
        f"with the controls ON (up to {a1['dropped_max_on']:,} messages in one compile): its level-3 summaries "
        f"outgrow the budget in a 2,000-turn loop; it shows the newest summaries that fit, so what is left out "
        f"is the oldest history, and `render_stats()` says so (`compile(strict=True)` refuses those compiles).")
    return notes


main = harness.entry("controls", __doc__, run, to_markdown, RESULTS_PATH,
                     quick_help="300 turns instead of 2,000 (well under 2 minutes)")


if __name__ == "__main__":
    raise SystemExit(main())
