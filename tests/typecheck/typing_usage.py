"""The public API used as a host would, for mypy (`make test` checks this file strictly).

Not a pytest module (no ``test_`` prefix) and never run: it only has to type-check, with no
``type: ignore``. tests/test_typing.py shows that the mistakes the annotations exist to catch
(a misspelled method, a string ``max_tokens``) are rejected.
"""

from __future__ import annotations

import ctxrt


def keep(message: ctxrt.Message) -> bool:
    return message.participant != "tool"


async def host(path: str) -> None:
    async with ctxrt.open_runtime(path, model=ctxrt.OfflineModel()) as runtime:
        manager = await runtime.open(
            "agent", strategy=ctxrt.WindowedPassthrough(re_anchor_fraction=0.5), view_reader="agent",
            view_filter=keep, model=ctxrt.OfflineModel(),
        )
        message_id: str = await manager.add_message("user", "hello")
        await manager.add_message("assistant", [ctxrt.Text("hi", audience=("agent",))])
        stored: ctxrt.Message | None = await manager.get_message(message_id)
        if stored is not None:
            print(stored.sequence)

        result: ctxrt.CompileResult = await manager.compile(
            ctxrt.Budget(max_tokens=3000),
            injections=[ctxrt.Injection("memory", "before_user", "remember this")],
            message_injections=[ctxrt.MessageInjection("user", "a nudge", depth=1)],
        )
        body = result.to_anthropic(assistant="assistant")
        print(len(result.messages), body["messages"])
        preview: ctxrt.PreviewResult | None = await manager.preview_context(ctxrt.Budget())
        if preview is not None and not preview.fits:
            print(preview.final_tokens)

        await manager.set_strategy(ctxrt.Autobiographical(compression_model="some-model"))
        config: ctxrt.StrategyConfig | ctxrt.Strategy = manager.strategy
        print(config)
        matches: list[ctxrt.SummaryMatch] = await manager.search_summaries(text="hello")
        for match in matches:
            summary: ctxrt.Summary = match.summary
            print(summary.id, match.matches)
        one: ctxrt.Summary | None = await manager.get_summary("s1")
        in_range: list[ctxrt.Summary] = await manager.get_summaries_in_range(level=1)
        print(one, in_range)

        child = await manager.derive(branch="child", strategy=ctxrt.Knowledge(compression_model="m"))
        derivation: ctxrt.Derivation | None = child.derivation
        if derivation is not None:
            await runtime.reopen_derived(derivation, strategy=ctxrt.Passthrough())
        health: ctxrt.NamespaceHealth = await manager.health()
        branches: list[ctxrt.BranchInfo] = await runtime.list_branches()
        print(health.ready, [b.name for b in branches], runtime.statistics().namespace_actors)
        await child.aclose()
        await manager.aclose()
