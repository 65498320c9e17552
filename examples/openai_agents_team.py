"""Two OpenAI Agents SDK agents over one ctxrt conversation, each seeing only what is meant for it.

    pip install 'ctxrt[openai-agents]'
    python examples/openai_agents_team.py

Its store goes in a new temporary directory each run (printed first); set ``CTXRT_STORE``
to keep one, which a rerun then adds to.

Each agent gets a ``CtxrtSession`` over a manager opened with its own reader, and runs with
``run_config=session.run_config()``, so every model call of a run (each tool round included) is
compiled under the session's budget. A line written for ann (``audience: ["ann"]``) is in ann's
session and never in bob's; what either agent says is in both, led by its name (``[ann] ...``).
Old turns are compressed (Autobiographical; here by ctxrt's offline summariser, in production
``ctxrt.AnthropicModel()`` or ``ctxrt.OpenAIModel()``).

Offline as written: each agent answers with the SDK's own ``ScriptedModel``. For a real model,
leave ``model=`` out of ``Agent(...)`` (the SDK's default, with ``OPENAI_API_KEY`` set).
"""

from __future__ import annotations

import asyncio
import os
import tempfile

from agents import Agent, Runner, set_tracing_disabled
from agents.testing import ScriptedModel, assistant_message

import ctxrt
import ctxrt.aio
from ctxrt.integrations.openai_agents import CtxrtSession


def offline(name: str) -> ScriptedModel:
    """The SDK's test model: answers every turn, and keeps what it was handed (``calls``)."""
    return ScriptedModel([{"responder": lambda call: [assistant_message(f"{name} here, noted.")]}] * 10)


async def main(store: str) -> dict[str, list[str]]:
    memory = ctxrt.Autobiographical("offline", recent_window_tokens=20_000, auto_tick=True)
    async with ctxrt.aio.open_runtime(store, model=ctxrt.OfflineModel()) as rt:
        agents, sessions = {}, {}
        for name in ("ann", "bob"):
            manager = await rt.open(f"agents/{name}", view_reader=name, strategy=memory)
            sessions[name] = CtxrtSession(manager, budget=ctxrt.Budget(max_tokens=50_000))
            agents[name] = Agent(name=name, instructions=f"You are {name}, one of a team.", model=offline(name))
        host = await rt.open("host")  # the team's own writes: no reader, so it writes for anyone
        await host.add_message("user", [{"type": "text", "text": "ann: the deploy key is K-7781.", "audience": ["ann"]}])

        for name, said in (("ann", "Standup in five minutes."), ("bob", "Bob, anything to add?")):
            session = sessions[name]
            await Runner.run(agents[name], said, session=session, run_config=session.run_config())

        seen = {}
        for name, agent in agents.items():
            model = agent.model
            assert isinstance(model, ScriptedModel)
            seen[name] = [str(item.get("content")) for item in model.calls[-1].input]
            print(f"{name}'s model was handed:", seen[name])
        return seen


if __name__ == "__main__":
    set_tracing_disabled(True)  # no trace export: the example runs offline
    # A new store in a temp directory each run, so a rerun starts over rather than adding the same
    # turns again; CTXRT_STORE names one to keep, which a rerun adds to.
    store = os.environ.get("CTXRT_STORE") or tempfile.mkdtemp(prefix="ctxrt-agents-team-")
    print(f"store: {store}" + (" (CTXRT_STORE: added to)" if "CTXRT_STORE" in os.environ else " (new, temporary)"))
    asyncio.run(main(store))
