"""A minimal host: two anthropic records, the second compiled with an injection (seed 3, step 28)."""
import sys
import tempfile

import trio

import ctxrt
from ctxrt import Budget, Injection, open_runtime
from ctxrt.testing import body_digest


async def main(store: str, speakers: list[str], position: str) -> bool:
    async with open_runtime(store, durability="os") as rt:
        m = await rt.open("agents/ann", view_reader="ann", ledger=True)
        for n, who in enumerate(speakers):
            await m.add_message(who, f"{who} {n}")
        first = await m.compile(Budget(10_000))
        first.to_anthropic(assistant="Claude")
        await m.record_request(first, form="anthropic", options={"assistant": "Claude"})
        second = await m.compile(Budget(10_000), injections=[Injection("sys", position, "inj")])
        body = second.to_anthropic(assistant="Claude")
        record = await m.record_request(second, form="anthropic", options={"assistant": "Claude"})
        ok = record.body_digest == body_digest(body)
        await m.aclose()
        return ok


if __name__ == "__main__":
    import itertools
    bad = 0
    for n in range(2, 6):
        for speakers in itertools.product(["user", "carol", "Claude"], repeat=n):
            for position in ("before_user", "after_user"):
                if not trio.run(main, tempfile.mkdtemp(prefix="att38r-"), list(speakers), position):
                    bad += 1
                    if bad < 6:
                        print("digest differs:", speakers, position)
    print("bad", bad)
