"""A turn through each framework adapter (``ctxrt.integrations``) at 20,000 messages, against the
same turn on the framework's own default memory holding the same history.

    python -m bench.adapters [--quick]

A turn is one call of the framework's own turn API with a new user line, answered by the
framework's own offline model (so only the memory differs): ``Runner.run`` (OpenAI Agents SDK),
``agent.ainvoke`` (LangChain 1.x), ``agent.run`` (Pydantic AI), ``AssistantAgent.on_messages``
(AutoGen). Each side starts from 20,000 messages of about 200 bytes (as ``bench.aio`` builds them)
and keeps what its turns add.

- ctxrt: the adapter over a ``ctxrt.aio`` manager with a reader (Passthrough, a 20,000-token
  budget), on an LMDB store with durability "sync" (each message written is on disk before the
  turn goes on): ``CtxrtSession``, ``CtxrtMiddleware`` (no checkpointer), ``CtxrtHistory``,
  ``CtxrtModelContext``.
- the framework's default: the Agents SDK's ``SQLiteSession`` on a file; LangGraph's
  ``AsyncSqliteSaver`` on a file, the agent's thread holding the history; Pydantic AI's
  ``message_history`` (the list ``result.all_messages()`` gives back, in memory); AutoGen's
  ``UnboundedChatCompletionContext`` (its default, in memory).

Figures: the median ms per turn of each (median of a round's turns; median, min and max across
rounds, each round running all ten sides in a random order) and the ratio default / ctxrt. Target:
ctxrt at least 10x faster. One more row prices ``CtxrtSession.run_config()``'s per-call budget
filter: an Agents SDK turn with a tool round (two model calls, each filtered) on ctxrt, with
``run_config=session.run_config()`` against without, both on one slot; target: at most 1.10x. Public APIs only. Results are printed and written to
``bench/results-adapters.md``; ``CTXRT_BENCH_DIR`` chooses where the stores live.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

from . import harness
from .harness import TABLE_HEAD, measured, scratch

HERE = Path(__file__).resolve().parent
RESULTS_PATH = HERE / "results-adapters.md"
MESSAGES = 20_000
BUDGET_TOKENS = 20_000
TARGET = 10.0
TEXT = "a message of about two hundred bytes, as a resident might write it in a shared conversation: " * 2
FRAMEWORKS = {
    "openai-agents": ("OpenAI Agents SDK", "SQLiteSession (file)"),
    "langchain": ("LangChain 1.x", "LangGraph AsyncSqliteSaver (file)"),
    "pydantic-ai": ("Pydantic AI", "message_history list"),
    "autogen": ("AutoGen 0.7", "UnboundedChatCompletionContext"),
}
FILTER = "openai-agents-filter"  # the filter's row: its sides are "with" and "without"
FILTER_TARGET = 1.10
Turn = Callable[[int], Awaitable[Any]]


def _settings(quick: bool) -> dict[str, int]:
    return {"rounds": 3, "turns": 3} if quick else {"rounds": 5, "turns": 5}


def _said(n: int) -> str:
    return f"{TEXT} #{n}"


# -- each framework: a turn on ctxrt, a turn on its default memory ------------------------------


@asynccontextmanager
async def _agents_sdk(manager: Any, db: Path | None) -> AsyncIterator[Turn]:
    from agents import Agent, Runner, SQLiteSession, set_tracing_disabled
    from agents.testing import ScriptedModel, assistant_message

    from ctxrt import Budget
    from ctxrt.integrations.openai_agents import CtxrtSession

    set_tracing_disabled(True)
    model = ScriptedModel([{"responder": lambda call: [assistant_message(TEXT)]} for _ in range(1000)])
    agent = Agent(name="ann", model=model)
    if manager is not None:
        session: Any = CtxrtSession(manager, budget=Budget(max_tokens=BUDGET_TOKENS))
    else:
        session = SQLiteSession("ann", db)
        if not await session.get_items(limit=1):
            await session.add_items([{"role": "user", "content": _said(n)} for n in range(MESSAGES)])

    async def turn(n: int) -> None:
        await Runner.run(agent, f"turn {n}", session=session)

    try:
        yield turn
    finally:
        if manager is None:
            session.close()


@asynccontextmanager
async def _agents_sdk_filtered(manager: Any, filtered: bool) -> AsyncIterator[Turn]:
    """A turn whose model asks for a tool, then answers: two model calls, each through
    ``run_config()``'s filter when ``filtered``."""
    from agents import Agent, Runner, function_tool, set_tracing_disabled
    from agents.testing import ScriptedModel, assistant_message, function_call

    from ctxrt import Budget
    from ctxrt.integrations.openai_agents import CtxrtSession

    @function_tool
    def lookup(key: str) -> str:
        """Looks a key up."""
        return f"{key}: {TEXT}"

    set_tracing_disabled(True)
    steps: list[Any] = []
    for n in range(1000):
        steps += [{"responder": lambda call, n=n: [function_call("lookup", {"key": f"k{n}"}, call_id=f"call_{n}")]},
                  {"responder": lambda call: [assistant_message(TEXT)]}]
    agent = Agent(name="ann", model=ScriptedModel(steps), tools=[lookup])
    session = CtxrtSession(manager, budget=Budget(max_tokens=BUDGET_TOKENS))
    config = session.run_config() if filtered else None

    async def turn(n: int) -> None:
        await Runner.run(agent, f"turn {n}", session=session, run_config=config)

    yield turn


@asynccontextmanager
async def _langchain(manager: Any, db: Path | None) -> AsyncIterator[Turn]:
    from langchain.agents import create_agent
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, HumanMessage

    from ctxrt import Budget
    from ctxrt.integrations.langchain import CtxrtMiddleware

    model = GenericFakeChatModel(messages=iter([AIMessage(TEXT) for _ in range(1000)]))
    async with AsyncExitStack() as stack:
        if manager is not None:
            agent = create_agent(model, middleware=[CtxrtMiddleware(manager, budget=Budget(max_tokens=BUDGET_TOKENS))])
            config: dict[str, Any] = {}
        else:
            from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

            saver = await stack.enter_async_context(AsyncSqliteSaver.from_conn_string(str(db)))
            agent = create_agent(model, checkpointer=saver)
            config = {"configurable": {"thread_id": "ann"}}
            if not (await agent.aget_state(config)).values:
                await agent.aupdate_state(config, {"messages": [HumanMessage(_said(n)) for n in range(MESSAGES)]})

        async def turn(n: int) -> None:
            await agent.ainvoke({"messages": [{"role": "user", "content": f"turn {n}"}]}, config=config)

        yield turn


_PYDANTIC_HISTORY: list[Any] = []  # the default side's history: in memory, kept across rounds


@asynccontextmanager
async def _pydantic_ai(manager: Any, db: Path | None) -> AsyncIterator[Turn]:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart
    from pydantic_ai.models.function import FunctionModel

    from ctxrt import Budget
    from ctxrt.integrations.pydantic_ai import CtxrtHistory

    model = FunctionModel(lambda messages, info: ModelResponse(parts=[TextPart(TEXT)]))
    if manager is not None:
        agent = Agent(model, capabilities=[CtxrtHistory(manager, budget=Budget(max_tokens=BUDGET_TOKENS))])

        async def turn(n: int) -> None:
            await agent.run(f"turn {n}")
    else:
        agent = Agent(model)
        if not _PYDANTIC_HISTORY:
            _PYDANTIC_HISTORY.extend(ModelRequest(parts=[UserPromptPart(_said(n))]) for n in range(MESSAGES))

        async def turn(n: int) -> None:
            result = await agent.run(f"turn {n}", message_history=_PYDANTIC_HISTORY)
            _PYDANTIC_HISTORY[:] = result.all_messages()

    yield turn


_AUTOGEN_HISTORY: list[Any] = []  # the default side's context messages: in memory, kept across rounds


@asynccontextmanager
async def _autogen(manager: Any, db: Path | None) -> AsyncIterator[Turn]:
    from autogen_agentchat.agents import AssistantAgent
    from autogen_agentchat.messages import TextMessage
    from autogen_core import CancellationToken
    from autogen_core.model_context import UnboundedChatCompletionContext
    from autogen_core.models import UserMessage
    from autogen_ext.models.replay import ReplayChatCompletionClient

    from ctxrt import Budget
    from ctxrt.integrations.autogen import CtxrtModelContext

    client = ReplayChatCompletionClient([TEXT] * 1000)
    if manager is not None:
        context: Any = CtxrtModelContext(manager, budget=Budget(max_tokens=BUDGET_TOKENS))
    else:
        if not _AUTOGEN_HISTORY:
            _AUTOGEN_HISTORY.extend(UserMessage(content=_said(n), source="user") for n in range(MESSAGES))
        context = UnboundedChatCompletionContext(initial_messages=_AUTOGEN_HISTORY)
    agent = AssistantAgent("ann", model_client=client, model_context=context)

    async def turn(n: int) -> None:
        await agent.on_messages([TextMessage(content=f"turn {n}", source="user")], CancellationToken())

    try:
        yield turn
    finally:
        if manager is None:
            _AUTOGEN_HISTORY[:] = await context.get_messages()


SIDES = {"openai-agents": _agents_sdk, "langchain": _langchain, "pydantic-ai": _pydantic_ai, "autogen": _autogen}


async def _turns(turn: Turn, count: int, first: int) -> float:
    """The median ms of ``count`` turns (after one uncounted turn)."""
    await turn(first)
    times = []
    for n in range(first + 1, first + 1 + count):
        started = time.perf_counter()
        await turn(n)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


async def _on_ctxrt(framework: str, store: Path, round_: int, turns: int) -> float:
    import ctxrt.aio

    async with ctxrt.aio.open_runtime(store, durability="sync") as rt:
        manager = await rt.open(f"agents/{framework}", view_reader=framework)
        async with SIDES[framework](manager, None) as turn:
            return await _turns(turn, turns, round_ * 100)


async def _on_filter(filtered: bool, store: Path, round_: int, turns: int) -> float:
    import ctxrt.aio

    async with ctxrt.aio.open_runtime(store, durability="sync") as rt:
        manager = await rt.open(f"agents/{FILTER}", view_reader=FILTER)
        async with _agents_sdk_filtered(manager, filtered) as turn:
            return await _turns(turn, turns, round_ * 100 + (50 if filtered else 0))


async def _on_default(framework: str, db: Path, round_: int, turns: int) -> float:
    async with SIDES[framework](None, db) as turn:
        return await _turns(turn, turns, round_ * 100)


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Measure each framework's turn on ctxrt and on its default memory; one dict per framework.
    Also writes ``bench/results-adapters.md``."""
    import trio

    settings = _settings(quick)
    rng = random.Random(20261224)
    started = time.perf_counter()
    figures: dict[tuple[str, str], list[float]] = {(f, side): [] for f in FRAMEWORKS for side in ("ctxrt", "default")}
    figures.update({(FILTER, "with"): [], (FILTER, "without"): []})
    versions = _versions()
    with scratch("ctxrt-bench-adapters-") as root:
        store = root / "store"
        build_s = trio.run(harness.fill, store, MESSAGES, _said)
        for round_ in range(settings["rounds"]):
            order = list(figures)
            rng.shuffle(order)
            for framework, side in order:
                if framework == FILTER:
                    value = asyncio.run(_on_filter(side == "with", store, round_, settings["turns"]))
                elif side == "ctxrt":
                    value = asyncio.run(_on_ctxrt(framework, store, round_, settings["turns"]))
                else:
                    value = asyncio.run(_on_default(framework, root / f"{framework}.sqlite", round_, settings["turns"]))
                figures[(framework, side)].append(value)
    rows = []
    for key, (title, default) in FRAMEWORKS.items():
        rows.append(harness.versus(
            f"{title}: a turn at {MESSAGES:,} messages, the adapter vs {default}", "ms",
            figures[(key, "ctxrt")], figures[(key, "default")], default, inverse=True, target=TARGET, op=">=",
        ))
    rows.append(harness.versus(
        f"run_config(): the Agents SDK's per-call budget filter, a turn with a tool round at {MESSAGES:,} "
        "messages, with vs without", "ms", figures[(FILTER, "with")], figures[(FILTER, "without")],
        "without run_config()", target=FILTER_TARGET, op="<=", by_round=True,
    ))
    info = {"quick": quick, "settings": settings, "build_s": build_s, "seconds": time.perf_counter() - started,
            "python": sys.executable, "versions": versions}
    for each in rows:
        each.update(info)
    RESULTS_PATH.write_text(to_markdown(rows))
    return rows


def _versions() -> str:
    from importlib.metadata import version

    names = ("openai-agents", "langchain", "langgraph-checkpoint-sqlite", "pydantic-ai-slim", "autogen-agentchat")
    return ", ".join(f"{name} {version(name)}" for name in names)


def to_markdown(rows: list[dict[str, Any]]) -> str:
    first = rows[0]
    settings = first["settings"]
    lines = [
        "## Framework adapters",
        "",
        measured("adapters", first["quick"], first["versions"]) + f" {settings['rounds']} rounds of "
        f"{settings['turns']} counted turns (after one uncounted) per side; each round runs all ten sides in a "
        f"random order. Both sides of a framework start from {MESSAGES:,} messages of about 200 bytes and keep "
        f"what their turns add (the store was built in {first['build_s']:.1f} s); the framework's own offline model "
        "answers every turn, so only the memory differs. ctxrt: the adapter over a manager with a reader, "
        f"Passthrough, a {BUDGET_TOKENS:,}-token budget, durability \"sync\". A figure is the median across rounds "
        "of each round's median ms per turn (min–max across rounds); the ratio is the default's median over "
        "ctxrt's. The filter's row: a turn whose model calls a tool and then answers (two model calls), on ctxrt "
        "with run_config=session.run_config() against without, one slot; its ratio is with over without, "
        "judged by the median of the per-round ratios.",
        "",
        *TABLE_HEAD,
    ]
    for each in rows:
        ratio, target = (f"{each['paired_ratio']:.2f}x", f"≤ {each['target']:.2f}x") if each["op"] == "<=" \
            else (f"{each['ratio']:.1f}x", f"≥ {each['target']:.0f}x")
        lines.append(
            f"| {each['measure']} | {harness.median_figure(each['ctxrt'], 'ms')} | "
            f"{harness.median_figure(each['comparison'], 'ms')} | {ratio} | {target} | "
            f"{'pass' if each['passed'] else 'FAIL'} |"
        )
    lines += ["", harness.paired_line(rows), ""]
    return "\n".join(lines)


main = harness.entry("adapters", __doc__, run, to_markdown, RESULTS_PATH,
                     quick_help="3 rounds of 3 turns per side (about a minute)")

if __name__ == "__main__":
    raise SystemExit(main())
