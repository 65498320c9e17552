"""Two Pydantic AI agents over one ctxrt conversation, each seeing only what is meant for it.

    pip install 'ctxrt[pydantic-ai]'
    python examples/pydantic_ai_team.py

Its store goes in a new temporary directory each run (printed first); set ``CTXRT_STORE``
to keep one, which a rerun then adds to.

Each agent gets a ``CtxrtHistory`` capability over a manager opened with its own reader: before
each model request it writes the run's new messages to the shared slot and hands the model that
reader's compiled view (the agent's system prompt first). A line written for ann
(``audience: ["ann"]``) reaches ann's model and never bob's.

Offline as written: each agent answers with pydantic_ai's ``FunctionModel``. For a real model,
pass its name instead (``Agent("openai:gpt-5", ...)``).
"""

from __future__ import annotations

import asyncio
import os
import tempfile

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import ctxrt
import ctxrt.aio
from ctxrt.integrations.pydantic_ai import CtxrtHistory


async def main(store: str) -> dict[str, list[str]]:
    seen: dict[str, list[str]] = {}

    def offline(name: str) -> FunctionModel:
        def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            seen[name] = [str(getattr(part, "content", "")) for m in messages for part in m.parts]
            return ModelResponse(parts=[TextPart(f"{name} here, noted.")])

        return FunctionModel(answer)

    async with ctxrt.aio.open_runtime(store) as rt:
        agents = {}
        for name in ("ann", "bob"):
            manager = await rt.open(f"agents/{name}", view_reader=name)
            history = CtxrtHistory(manager, budget=ctxrt.Budget(max_tokens=50_000))
            agents[name] = Agent(offline(name), system_prompt=f"You are {name}, one of a team.", capabilities=[history])
        host = await rt.open("host")  # the team's own writes: no reader, so it writes for anyone
        await host.add_message("user", [{"type": "text", "text": "ann: the deploy key is K-7781.", "audience": ["ann"]}])

        await agents["ann"].run("Standup in five minutes.")
        await agents["bob"].run("Bob, anything to add?")
        for name in agents:
            print(f"{name}'s model was handed:", seen[name])
        return seen


if __name__ == "__main__":
    # A new store in a temp directory each run, so a rerun starts over rather than adding the same
    # turns again; CTXRT_STORE names one to keep, which a rerun adds to.
    store = os.environ.get("CTXRT_STORE") or tempfile.mkdtemp(prefix="ctxrt-pydantic-ai-team-")
    print(f"store: {store}" + (" (CTXRT_STORE: added to)" if "CTXRT_STORE" in os.environ else " (new, temporary)"))
    asyncio.run(main(store))
