"""The request forms of a compile: the Anthropic Messages API and OpenAI's (Chat Completions,
Responses), built from the runs of messages an earlier body was made from (P7, P10, P14,
P15). The rules every body satisfies keep their documented paths, ``ctxrt.anthropic_rules``
and ``ctxrt.openai_rules``.
"""
