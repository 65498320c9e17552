"""A host process for the multi-process PostgreSQL tests: ``residents`` residents in one runtime
on ``url``, each claiming a shared namespace for this process's reader and appending to the shared
slot, some lines only for this process's reader. Prints one JSON line per phase; waits for "go" on
stdin between them (the test's barrier)."""

from __future__ import annotations

import json
import re
import sys

import trio

import ctxrt
from ctxrt import Text


async def main(url: str, process: int, residents: int, messages: int) -> None:
    reader = f"p{process}"
    async with ctxrt.open_runtime(url) as rt:
        claimed: dict[int, ctxrt.ContextManager] = {}
        appended: list[str] = []

        async def resident(number: int) -> None:
            try:
                manager = await rt.open(f"ns{number}", view_reader=reader)
            except ctxrt.ReaderConflictError:
                manager = await rt.open(f"own-{reader}-{number}")
            else:
                claimed[number] = manager
            for index in range(messages):
                content = [Text(f"public {reader} r{number} m{index}")]
                if index % 3 == 0:
                    content.append(Text(f"secret-of-{reader} r{number} m{index}", audience=(reader,)))
                appended.append(await manager.add_message("user", content))
                await manager.compile()

        async with trio.open_nursery() as nursery:
            for number in range(residents):
                nursery.start_soon(resident, number)
        print(json.dumps({"phase": 1, "claimed": sorted(claimed), "appended": appended}), flush=True)

        total = int(await trio.to_thread.run_sync(sys.stdin.readline))  # the barrier: every process appended
        seen = {}
        leaks: list[str] = []
        own = 0
        for number, manager in claimed.items():
            compiled = await manager.compile()
            text = json.dumps([str(message) for message in compiled.messages])
            seen[number] = await manager.message_count()
            secrets = set(re.findall(r"secret-of-p\d+", text))
            own += f"secret-of-{reader}" in secrets
            leaks += sorted(secrets - {f"secret-of-{reader}"})
        print(json.dumps({"phase": 2, "counts": seen, "total": total, "leaks": leaks, "own_secrets_seen": own}),
              flush=True)


if __name__ == "__main__":
    trio.run(main, sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
