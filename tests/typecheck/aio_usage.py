"""ctxrt.aio used as an asyncio host would, for mypy (`make test` checks this file strictly).

Not a pytest module and never run: it only has to type-check, with no ``type: ignore``. The
front's calls are typed as the trio API's, which they are.
"""

from __future__ import annotations

import asyncio

import ctxrt
import ctxrt.aio


async def host(path: str) -> list[str]:
    async with ctxrt.aio.open_runtime(path, durability="os") as runtime:
        manager: ctxrt.aio.ContextManager = await runtime.open("agents/ann", view_reader="ann")
        message_id: str = await manager.add_message("user", "hello")
        result: ctxrt.CompileResult = await manager.compile(ctxrt.Budget(max_tokens=3000))
        body = result.to_anthropic(assistant="Claude")
        seen: list[str] = [message_id]
        async with manager.subscribe() as events:
            await manager.add_message("user", "again")
            async for event in events:
                if isinstance(event, ctxrt.Added):
                    seen.append(event.message.id)
                break
        statistics: ctxrt.RuntimeStatistics = runtime.statistics()
        print(body["messages"], statistics.batches)
        return seen


def main() -> None:
    print(asyncio.run(host("store")))
