"""SIGKILL a process appending durably to LMDB (one and many tasks) at random moments; reopen, verify."""
import os, random, signal, subprocess, sys, tempfile, time
import trio, ctxrt
CHILD = r'''
import sys, trio, ctxrt
async def main(path, many):
    async with ctxrt.open_runtime(path, durability="sync") as rt:
        m = await rt.open("ann", isolate=True)
        async def task(k):
            n = 0
            while True:
                text = f"{sys.argv[3]} {k} {n}"
                await m.add_message("user", text)
                print(text, flush=True); n += 1
        async with trio.open_nursery() as nursery:
            for k in range(many): nursery.start_soon(task, k)
trio.run(main, sys.argv[1], int(sys.argv[2]))
'''
async def stored(path):
    async with ctxrt.open_runtime(path) as rt:
        m = await rt.open("ann", isolate=True)
        return [x.content[0].text for x in await m.get_all_messages()]
rng = random.Random(1)
bad = 0; runs = 0
for many in (1, 6):
    for i in range(8):
        path = tempfile.mkdtemp(prefix="attpg-kill-")
        acked = []
        for round_ in range(2):
            p = subprocess.Popen([sys.executable, "-c", CHILD, path, str(many), str(round_)], stdout=subprocess.PIPE, text=True)
            time.sleep(1.0 + rng.random())
            p.send_signal(signal.SIGKILL)
            out, _ = p.communicate()
            acked += out.split("\n")[:-1]  # a line cut mid-print is not an ack
        texts = trio.run(stored, path)
        v = subprocess.run([sys.executable, "-m", "ctxrt", "verify", path], capture_output=True, text=True)
        runs += 1
        dup = len(texts) - len(set(texts)); missing = set(acked) - set(texts)
        if dup or missing or v.returncode:
            bad += 1
            print("BAD", many, i, "dup", dup, "missing", len(missing), "verify", v.returncode, v.stdout[-300:], v.stderr[-300:])
        subprocess.run(["rm", "-rf", path])
print("runs", runs, "bad", bad, "last acked", len(acked))
