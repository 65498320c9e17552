import sys, time, trio, tempfile, statistics
import ctxrt
async def main(busy, dur):
    d = tempfile.mkdtemp(dir="/var/tmp")
    async with ctxrt.open_runtime(d + "/s", durability=dur) as rt:
        m = await rt.open("a", isolate=True)
        stop = trio.Event(); times = []
        async def burner():
            while not stop.is_set():
                until = time.perf_counter() + 0.001
                while time.perf_counter() < until: pass
                await trio.sleep(0)
        async with trio.open_nursery() as n:
            if busy: n.start_soon(burner)
            t_end = time.perf_counter() + 3
            while time.perf_counter() < t_end:
                s = time.perf_counter(); await m.add_message("user", "x" * 100); times.append(time.perf_counter() - s)
            stop.set()
        await m.aclose()
    times.sort()
    print(f"busy={busy} {dur}: n={len(times)} median {statistics.median(times)*1e3:.3f} ms p99 {times[int(len(times)*.99)]*1e3:.2f} max {times[-1]*1e3:.1f}")
for busy in (False, True):
    for dur in ("sync", "os"):
        trio.run(main, busy, dur)
