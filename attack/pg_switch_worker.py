"""Appender process: appends tagged messages in a loop on namespace ns (opened on main) until stdin
says stop; prints one JSON line per outcome, then a summary."""
from __future__ import annotations
import json, sys, traceback
import trio
import ctxrt
from ctxrt.errors import BranchNotFoundError


async def main(url: str, tag: str) -> None:
    async with ctxrt.open_runtime(url) as rt:
        m = await rt.open("ns")
        stop = trio.Event()
        acked, errors, i = [], [], 0

        async def wait_for_stop() -> None:
            await trio.to_thread.run_sync(sys.stdin.readline)
            stop.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait_for_stop)
            while not stop.is_set():
                text = f"{tag}-{i}"
                i += 1
                try:
                    kw = {}
                    if i % 3 == 0:
                        kw["host_state"] = {"last": text}
                    if i % 7 == 0:
                        kw["hold_compression"] = True
                    mid = await m.add_message("user", text, **kw)
                    acked.append([text, mid, m.branch])
                except BranchNotFoundError as exc:
                    errors.append(["BranchNotFound", text, str(exc)[:120]])
                    await m.aclose()
                    m = await rt.open("ns")
                except Exception as exc:
                    errors.append([type(exc).__module__ + "." + type(exc).__name__, text, str(exc)[:200],
                                   traceback.format_exc()[-600:]])
                    await trio.sleep(0.01)
        print(json.dumps({"acked": acked, "errors": errors, "tried": i}), flush=True)


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2])
