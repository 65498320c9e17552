"""Does the store engine's head cache (known_heads) keep the heads of deleted branches? Forks made
and deleted in a loop, each written to once. usage: python attack/known_heads.py FORKS"""
import sys, tempfile, trio, ctxrt

async def main() -> None:
    forks = int(sys.argv[1])
    with tempfile.TemporaryDirectory() as d:
        async with ctxrt.open_runtime(d, durability="os") as rt:
            m = await rt.open("a")
            ids = [await m.add_message("user", f"m{k}") for k in range(50)]
            for k in range(0, 40, 2):
                await m.remove_message(ids[k])
            for k in range(forks):
                f = await rt.open("a")
                await f.fork(f"f{k}")
                await f.add_message("user", "on the fork")
                await f.aclose()
                await rt.delete_branch(f"f{k}")
            heads = rt.engine.known_heads
            print(f"{forks} forks made and deleted: {len(heads)} heads known, "
                  f"{sum(len(h.removed) for h in heads.values())} removed intervals held; live branches "
                  f"{len(await rt.list_branches())}")

trio.run(main)
