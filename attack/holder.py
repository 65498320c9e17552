"""Attack host: one runtime holding agents/a (Autobiographical + OfflineModel, auto_tick) writing
in a loop: add_message, tick (compression units write strategy state), pin, set_strategy.
argv: url lease_ms mode(loop|take). Prints JSON lines."""
import json, sys, time, random
import trio
import ctxrt, ctxrt.store.postgres

def say(**a):
    a["t"] = time.time()
    print(json.dumps(a), flush=True)

def strat():
    return ctxrt.Autobiographical("x", auto_tick=False, target_chunk_tokens=50, recent_window_tokens=50,
                                  l1_holdback_chunks=0)

async def main(url, mode):
    async with ctxrt.open_runtime(url, model=ctxrt.OfflineModel()) as rt:
        while True:
            try:
                m = await rt.open("agents/a", strategy=strat())
                break
            except ctxrt.ConfigConflictError:
                if mode == "loop":
                    say(held=False); return
                await trio.sleep(0.05)
        say(held=True)
        if mode == "take":
            line = await trio.to_thread.run_sync(sys.stdin.readline)
        n = 0
        while True:
            n += 1
            op = random.choice(["add", "add", "tick", "pin", "strategy"])
            try:
                if op == "add":
                    await m.add_message("user", f"words {n} here. " * 20)
                elif op == "tick":
                    await m.tick()
                elif op == "pin":
                    ids = [x.id for x in await m.get_all_messages()]
                    if ids:
                        i = random.randrange(len(ids)); await m.pin_range(ids[i], ids[i])
                elif op == "strategy":
                    await m.set_strategy(strat())
                say(ok=op, n=n)
            except ctxrt.CtxrtError as exc:
                say(error=type(exc).__name__, op=op, message=str(exc)[:200])
                if mode == "take" and n <= 30:
                    continue
                return
            if mode == "take" and n > 30:
                return

if __name__ == "__main__":
    ctxrt.store.postgres.LEASE_MS = int(sys.argv[2])
    trio.run(main, sys.argv[1], sys.argv[3])
