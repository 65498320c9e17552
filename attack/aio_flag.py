"""Attack through ctxrt.aio (Q2, Q8): an asyncio task opening the namespace with ledger=False,
cancelled at each of the loop's turns, while a manager that recorded (the flag read on) keeps
recording: once the flag is off in the store, every record is refused."""
import asyncio, tempfile, pathlib
import ctxrt
import ctxrt.aio as aio
from ctxrt import Budget

B = Budget(max_tokens=10_000)

async def main():
    bad = cancelled = 0
    for spins in range(0, 30):
        with tempfile.TemporaryDirectory() as d:
            async with aio.open_runtime(pathlib.Path(d) / "s") as rt:
                m = await rt.open("ns", ledger=True)
                await m.add_message("user", "hi")
                first = await m.compile(B)
                await m.record_request(first, form="anthropic")
                task = asyncio.ensure_future(rt.open("ns", ledger=False))
                for _ in range(spins):
                    await asyncio.sleep(0)
                task.cancel()
                try:
                    other = await task
                    await other.aclose()
                except asyncio.CancelledError:
                    cancelled += 1
                try:
                    await m.record_request(first, form="anthropic")
                except ctxrt.LedgerOffError:
                    pass
                result = await m.compile(B)
                await rt.create_branch("probe")
                probe = await rt.open("ns", branch="probe")
                try:
                    await probe.record_request(await probe.compile(B), form="anthropic"); on = True
                except ctxrt.LedgerOffError:
                    on = False
                try:
                    await m.record_request(result, form="anthropic"); kept = True
                except ctxrt.LedgerOffError:
                    kept = False
                if kept != on:
                    bad += 1
                    print(f"spins {spins}: flag on={on} but record kept={kept}  <-- BUG")
                await probe.aclose(); await m.aclose()
    print(f"tried 30, cancelled {cancelled}, broke {bad}")

asyncio.run(main())
