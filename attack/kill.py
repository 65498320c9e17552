"""SIGKILL a process mid record batch, many rounds: the store verifies, requests() reads, order kept."""
import os, random, signal, subprocess, sys, tempfile, time
import trio
from ctxrt import open_runtime
from ctxrt.testing import verify

def main(rounds):
    rng = random.Random(1)
    totals = dict(rounds=0, made=0, durable=0, found=0)
    with tempfile.TemporaryDirectory() as d:
        made, durable = {}, {}
        for rnd in range(rounds):
            p = subprocess.Popen([sys.executable, "attack/kill_writer.py", d, str(rnd)], stdout=subprocess.PIPE)
            line = p.stdout.readline()
            assert line.strip() == b"ready", line
            time.sleep(rng.uniform(0.05, 0.8))
            os.kill(p.pid, signal.SIGKILL)
            rest = p.stdout.read().decode().splitlines()
            p.wait()
            for l in rest:
                parts = l.split()
                if len(parts) != 4:
                    continue
                kind, ns, t, rid = parts
                if kind == "made":
                    made.setdefault(ns, {})[rid] = int(t) + 10 * rnd
                    totals["made"] += 1
                elif kind == "durable":
                    # all made before by that task are durable too
                    durable.setdefault(ns, set()).update(i for i, tt in made[ns].items() if tt == int(t) + 10 * rnd)
            out = trio.run(check, d, made, durable)
            report = verify(d)
            assert report.status == "sound", report
            totals["records_verified"] = report.records
            totals["rounds"] += 1
            totals["found"] = sum(out.values())
        totals["durable"] = sum(len(v) for v in durable.values())
    print(totals)

async def check(path, made, durable):
    async with open_runtime(path, durability="os") as rt:
        out = {}
        for ns, r in (("agents/ann", "ann"), ("agents/bob", "bob")):
            m = await rt.open(ns, view_reader=r)
            found = await m.requests(limit=1_000_000)
            ids = [x.id for x in found]
            assert len(ids) == len(set(ids)), "dup"
            assert [x.sequence for x in found] == sorted(x.sequence for x in found), "sequence order"
            lost = durable.get(ns, set()) - set(ids)
            assert not lost, f"{ns}: {len(lost)} durable records lost"
            mine = made.get(ns, {})
            assert not set(ids) - mine.keys(), f"{ns}: records never made"
            for task in set(mine.values()):
                order = [i for i, t in mine.items() if t == task]
                got = set(ids)
                assert [i for i in ids if mine[i] == task] == [i for i in order if i in got], f"{ns}: order"
            for x in found[-3:]:
                rb = await m.rebuild_request(x)
                assert rb.matches or rb.edited, "rebuild"
            out[ns] = len(ids)
            await m.aclose()
        return out

if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10)
