"""A writer: tasks appending to the store-wide shared slot ("shared", every process) and own slot."""
import json, sys, trio, ctxrt

async def main(url, process, messages):
    errors = []
    async with ctxrt.open_runtime(url) as rt:
        own = await rt.open(f"own-{process}", isolate=True)
        shared = await rt.open("shared")
        print("ready", flush=True)
        await trio.to_thread.run_sync(sys.stdin.readline)
        ids = []
        async def task(number):
            manager = own if number % 2 else shared
            for n in range(messages):
                try:
                    ids.append(await manager.add_message("user", f"p{process} t{number} m{n}"))
                except Exception as exc:
                    errors.append(f"{type(exc).__name__}: {exc}")
        async with trio.open_nursery() as nursery:
            for number in range(4):
                nursery.start_soon(task, number)
    print(json.dumps({"ids": ids, "errors": errors[:10]}), flush=True)

trio.run(main, sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
