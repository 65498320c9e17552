"""A host that drops a message from a result's list before recording it: what the record says it held."""
import tempfile

import trio

from ctxrt import Budget, open_runtime


async def main() -> None:
    async with open_runtime(tempfile.mkdtemp(prefix="att38h-"), durability="os") as rt:
        m = await rt.open("agents/ann", view_reader="ann", ledger=True)
        ids = [await m.add_message("user" if n % 2 == 0 else "Claude", f"m{n}") for n in range(4)]
        result = await m.compile(Budget(10_000))
        del result.messages[0]  # the host sends m1..m3
        record = await m.record_request(result, form="anthropic", options={"assistant": "Claude"})
        print("sent:", ids[1:], "held:", [h.id for h in record.held], "matches:",
              (await m.rebuild_request(record)).matches)
        print("requests(holding=m0):", len(await m.requests(holding=ids[0])),
              "holding=m3:", len(await m.requests(holding=ids[3])))
        await m.aclose()


trio.run(main)
