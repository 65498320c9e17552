"""An AutoGen group chat over one ctxrt conversation: each agent sees only what is meant for it.

    pip install 'ctxrt[autogen]' autogen-ext
    python examples/autogen_team.py

Its store goes in a new temporary directory each run (printed first); set ``CTXRT_STORE``
to keep one, which a rerun then adds to.

Each ``AssistantAgent`` gets a ``CtxrtModelContext`` over a manager opened with its own reader, all
listed in one ``Team``: the group chat hands every agent everyone's messages, and each is written
to the shared slot once. A line written for ann (``audience: ["ann"]``) reaches ann's model and
never bob's, and so does what ann's ``Memory`` adds to her context (a system message, kept for her
reader alone).

Offline as written: each agent answers with autogen_ext's ``ReplayChatCompletionClient``. For a
real model, pass ``OpenAIChatCompletionClient(model=...)`` instead.
"""

from __future__ import annotations

import asyncio
import os
import tempfile

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.teams import RoundRobinGroupChat
from autogen_ext.models.replay import ReplayChatCompletionClient

import ctxrt
import ctxrt.aio
from ctxrt.integrations.autogen import CtxrtModelContext, Team


async def main(store: str) -> dict[str, list[str]]:
    async with ctxrt.aio.open_runtime(store) as rt:
        members = Team(["ann", "bob"])
        clients, agents = {}, []
        for name in ("ann", "bob"):
            manager = await rt.open(f"agents/{name}", view_reader=name)
            clients[name] = ReplayChatCompletionClient([f"{name} here, noted."] * 10)
            context = CtxrtModelContext(manager, team=members, budget=ctxrt.Budget(max_tokens=50_000))
            agents.append(AssistantAgent(name, model_client=clients[name], model_context=context,
                                         system_message=f"You are {name}, one of a team."))
        host = await rt.open("host")  # the team's own writes: no reader, so it writes for anyone
        await host.add_message("user", [{"type": "text", "text": "ann: the deploy key is K-7781.", "audience": ["ann"]}])

        chat = RoundRobinGroupChat(agents, termination_condition=MaxMessageTermination(3))
        await chat.run(task="Standup in five minutes.")
        seen = {}
        for name, client in clients.items():
            seen[name] = [str(m.content) for m in client.create_calls[-1]["messages"]]
            print(f"{name}'s model was handed:", seen[name])
        return seen


if __name__ == "__main__":
    # A new store in a temp directory each run, so a rerun starts over rather than adding the same
    # turns again; CTXRT_STORE names one to keep, which a rerun adds to.
    store = os.environ.get("CTXRT_STORE") or tempfile.mkdtemp(prefix="ctxrt-autogen-team-")
    print(f"store: {store}" + (" (CTXRT_STORE: added to)" if "CTXRT_STORE" in os.environ else " (new, temporary)"))
    asyncio.run(main(store))
