"""The measuring side of ``bench/prefix.py``: one ctxrt version, one strategy, one multi-resident run.

    python bench/prefix_probe.py STORE_DIR STRATEGY TURNS   (with PYTHONPATH naming the ctxrt to measure)

STRATEGY is ``windowed`` or ``autobiographical``. It uses only the public API both designs share
(``ctxrt.open_runtime``, ``Runtime.open``, ``add_message``, ``compile``, ``wait_ready``,
``CompileResult.to_anthropic``, ``Budget``, ``WindowedPassthrough``, ``Autobiographical``,
``ctxrt.testing.ScriptedModel``).

The run: three residents (ann, bob, cat) share one namespace (one slot). Each turn the resident
whose turn it is (in turn order) compiles, takes ``to_anthropic(assistant=<itself>)`` as its
request, then adds its message (text of a varied size, 10 to 600 estimated tokens, seeded). Under
Autobiographical, ``wait_ready()`` runs the compressions that are due between turns.

Each request is measured against the same resident's previous request (a provider's prompt cache
serves a request from an earlier one with the same bytes; the other residents' requests give
them other roles, so they share no prefix with it) by ``cached_share``: the share of the
request's estimated tokens in its longest prefix byte-identical to the previous request up to one
of that request's ``cache_control`` positions. It works on the body alone, so it measures both
designs alike. A resident's first request (nothing before it) is not counted.

Prints one JSON line: ``{"ctxrt": <path imported>, "shares": [...], "stable": [...], "seconds": s}``;
``stable`` is each counted compile's ``stable_prefix_tokens`` over the compile's own token estimate
(``ctxrt.content.tokens.estimate_blocks``) where the design has that field, else empty; it compares with
the manager's previous compile, another resident's (the compiled messages are the same for all
three: there are no reader views here).
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from typing import Any

if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]  # bench/ itself: its modules are no business of the version measured here

RESIDENTS = ("ann", "bob", "cat")
WORDS = ("context", "runtime", "agent", "prefix", "cache", "window", "summary", "turn", "token", "slot",
         "resident", "message", "anchor", "budget", "seam", "request", "model", "store", "branch", "reader")


# -- the measure (standard library only: the parent imports it too) ---------------------------


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _marked(value: Any) -> bool:
    if isinstance(value, dict):
        return "cache_control" in value or any(_marked(v) for v in value.values())
    if isinstance(value, list):
        return any(_marked(v) for v in value)
    return False


def flatten(body: dict[str, Any]) -> list[tuple[str, float, bool]]:
    """A request body as the provider's cache sees it: one item per system prompt and per content
    block, in order, each ``(bytes without cache_control, estimated tokens, carries cache_control)``.

    A block's key holds its turn's index and role, so a prefix ends at a block whatever comes after
    it in its turn (a turn that grows by a merged block keeps the prefix before it). Tokens are
    estimated as the characters of each item's JSON over 4.
    """
    items: list[tuple[str, float, bool]] = []
    system = body.get("system")
    if system:
        key = json.dumps(["system", _strip(system)], sort_keys=True)
        items.append((key, len(key) / 4, _marked(system)))
    for index, turn in enumerate(body["messages"]):
        for block in turn["content"]:
            key = json.dumps([index, turn["role"], _strip(block)], sort_keys=True)
            items.append((key, len(key) / 4, _marked(block)))
    return items


def cached_share(previous: list[tuple[str, float, bool]], current: list[tuple[str, float, bool]]) -> float:
    """The share of ``current``'s tokens in its longest prefix byte-identical to ``previous`` up to one
    of ``previous``'s cache_control positions (what the cache ``previous`` wrote can serve)."""
    total = sum(tokens for _, tokens, _ in current)
    if not total:
        return 0.0
    served = running = 0.0
    for (mine, tokens, _), (theirs, _, marked) in zip(current, previous):
        if mine != theirs:
            break
        running += tokens
        if marked:
            served = running
    return served / total


# -- the run -------------------------------------------------------------------------------------


def text_of(rng: random.Random, turn: int) -> str:
    size = int(rng.choice((10, 20, 40, 80, 120, 200, 300, 600)) * rng.uniform(0.7, 1.3))  # tokens
    words = [f"Turn {turn}."]
    chars = len(words[0])
    while chars < size * 4:
        word = rng.choice(WORDS)
        words.append(word)
        chars += len(word) + 1
    return " ".join(words)


async def run(store: str, strategy: str, turns: int) -> dict[str, Any]:
    import ctxrt
    from ctxrt.testing import ScriptedModel
    from ctxrt.content.tokens import estimate_blocks

    memory = "A memory of these turns: " + " ".join(WORDS * 8)  # about 250 tokens

    if strategy == "windowed":
        config: Any = ctxrt.WindowedPassthrough(re_anchor_fraction=0.5)
        budget = ctxrt.Budget(max_tokens=24_000, reserve_for_response=0)
        model = None
    else:
        config = ctxrt.Autobiographical("scripted", target_chunk_tokens=1_500, head_window_tokens=3_000,
                                        recent_window_tokens=6_000, summary_target_tokens=250)
        budget = ctxrt.Budget(max_tokens=150_000, reserve_for_response=0)
        model = ScriptedModel(lambda request: memory)
    rng = random.Random(11)
    previous: dict[str, list[tuple[str, float, bool]]] = {}
    shares: list[float] = []
    stable: list[float] = []
    started = time.perf_counter()
    async with ctxrt.open_runtime(store, durability="os") as rt:
        m = await rt.open("slot", strategy=config, model=model)
        for turn in range(turns):
            resident = RESIDENTS[turn % len(RESIDENTS)]
            if turn:
                result = await m.compile(budget)
                items = flatten(result.to_anthropic(assistant=resident))
                if resident in previous:
                    shares.append(cached_share(previous[resident], items))
                    reported = getattr(result, "stable_prefix_tokens", None)
                    if reported is not None:  # over the compile's own estimate of its tokens
                        estimated = sum(estimate_blocks(c.content) for c in result.messages)
                        stable.append(reported / max(1, estimated))
                previous[resident] = items
            await m.add_message(resident, text_of(rng, turn))
            if model is not None:
                await m.wait_ready()
    return {"ctxrt": os.path.dirname(ctxrt.__file__), "shares": shares, "stable": stable,
            "seconds": time.perf_counter() - started}


def main() -> None:
    import trio

    store, strategy, turns = sys.argv[1], sys.argv[2], int(sys.argv[3])
    print(json.dumps(trio.run(run, store, strategy, turns)), flush=True)


if __name__ == "__main__":
    main()
