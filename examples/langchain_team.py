"""Two LangChain 1.x agents over one ctxrt conversation, each seeing only what is meant for it.

    pip install 'ctxrt[langchain]'
    python examples/langchain_team.py

Its store goes in a new temporary directory each run (printed first); set ``CTXRT_STORE``
to keep one, which a rerun then adds to.

Each agent (``create_agent``) gets a ``CtxrtMiddleware`` over a manager opened with its own reader:
at each model call the middleware writes what the agent's state added to the shared slot and
hands the model that reader's compiled view. A line written for ann (``audience: ["ann"]``) reaches
ann's model and never bob's. No checkpointer is needed: the conversation lives in ctxrt.

Offline as written: each agent answers with langchain_core's ``GenericFakeChatModel``. For a real
model, pass one instead (``init_chat_model("openai:gpt-5")``, ``ChatAnthropic(...)``).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from typing import Any

from langchain.agents import create_agent
from langchain_core.callbacks import AsyncCallbackHandler
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage

import ctxrt
import ctxrt.aio
from ctxrt.integrations.langchain import CtxrtMiddleware


class Handed(AsyncCallbackHandler):
    """What the model was handed at its last call (LangChain's own callback)."""

    def __init__(self) -> None:
        self.messages: list[BaseMessage] = []

    async def on_chat_model_start(self, serialized: Any, messages: list[list[BaseMessage]], **kwargs: Any) -> None:
        self.messages = messages[0]


async def main(store: str) -> dict[str, list[str]]:
    async with ctxrt.aio.open_runtime(store) as rt:
        agents = {}
        for name in ("ann", "bob"):
            manager = await rt.open(f"agents/{name}", view_reader=name)
            model = GenericFakeChatModel(messages=iter([AIMessage(f"{name} here, noted.")] * 10))
            agents[name] = create_agent(model, system_prompt=f"You are {name}, one of a team.",
                                        middleware=[CtxrtMiddleware(manager, budget=ctxrt.Budget(max_tokens=50_000))])
        host = await rt.open("host")  # the team's own writes: no reader, so it writes for anyone
        await host.add_message("user", [{"type": "text", "text": "ann: the deploy key is K-7781.", "audience": ["ann"]}])

        seen = {}
        for name, said in (("ann", "Standup in five minutes."), ("bob", "Bob, anything to add?")):
            handed = Handed()
            await agents[name].ainvoke({"messages": [{"role": "user", "content": said}]}, config={"callbacks": [handed]})
            seen[name] = [str(m.content) for m in handed.messages]
            print(f"{name}'s model was handed:", seen[name])
        return seen


if __name__ == "__main__":
    # A new store in a temp directory each run, so a rerun starts over rather than adding the same
    # turns again; CTXRT_STORE names one to keep, which a rerun adds to.
    store = os.environ.get("CTXRT_STORE") or tempfile.mkdtemp(prefix="ctxrt-langchain-team-")
    print(f"store: {store}" + (" (CTXRT_STORE: added to)" if "CTXRT_STORE" in os.environ else " (new, temporary)"))
    asyncio.run(main(store))
