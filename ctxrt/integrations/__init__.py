"""Adapters that put ctxrt under the agent frameworks teams already use (docs/integrations.md).

Each adapter is a module of its own, imported by name, with its framework as an optional extra:

- ``ctxrt.integrations.openai_agents``: a ``Session`` for the OpenAI Agents SDK
  (``pip install 'ctxrt[openai-agents]'``);
- ``ctxrt.integrations.langchain``: an ``AgentMiddleware`` for LangChain 1.x agents
  (``pip install 'ctxrt[langchain]'``);
- ``ctxrt.integrations.pydantic_ai``: a history-processing capability for Pydantic AI
  (``pip install 'ctxrt[pydantic-ai]'``);
- ``ctxrt.integrations.autogen``: a ``ChatCompletionContext`` for AutoGen's agents
  (``pip install 'ctxrt[autogen]'``).

Every adapter wraps one ``ctxrt.aio`` manager opened with the agent's reader: the agent's model
sees that reader's compiled view of the shared slot, and what the agent says is written to the
slot for the other residents. This package imports no framework; ``blocks`` holds what the
adapters share.
"""
