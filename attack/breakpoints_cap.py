"""Many cache breakpoints (more than the 4 markers a body keeps: the cap copies turns) set by the host
on a result's messages before recording, turns of merged roles, each form: every record's digest is
the host body's and rebuilds; fast and scan agree on the digests (the fast path's MadeFrom copies)."""
import random
import sys
import tempfile

import attrs
import trio

from ctxrt import Budget, open_runtime
from ctxrt.request_ledger import BodyDigests, RequestEncoder
from ctxrt.testing import body_digest

FORMS = {"anthropic": {"assistant": "Claude"}, "openai_chat": {"assistant": "Claude"},
         "openai_responses": {"assistant": "Claude"}}


async def run(seed: int) -> tuple[list[str], list[str]]:
    rng, digests, failures = random.Random(seed), [], []
    async with open_runtime(tempfile.mkdtemp(prefix="att38b-"), durability="os") as rt:
        m = await rt.open("agents/ann", view_reader="ann", ledger=True)
        await m.add_message("user", "the start")
        for n in range(60):
            for _ in range(rng.randint(0, 3)):
                await m.add_message(rng.choice(["user", "carol", "Claude"]), f"t{n} " + "w " * rng.randint(0, 30))
            result = await m.compile(Budget(max_tokens=rng.choice([800, 20_000]), reserve_for_response=100))
            for k in rng.sample(range(len(result.messages)), min(len(result.messages), rng.randint(0, 8))):
                result.messages[k] = attrs.evolve(result.messages[k], cache_breakpoint=True)
            form = rng.choice(sorted(FORMS))
            want = body_digest(getattr(result, f"to_{form}")(**FORMS[form]))
            record = await m.record_request(result, form=form, options=FORMS[form])
            digests.append(record.body_digest)
            if record.body_digest != want or not (await m.rebuild_request(record)).matches:
                failures.append(f"seed {seed} turn {n} {form}")
        await m.aclose()
    return digests, failures


def main() -> None:
    bad = 0
    for seed in range(int(sys.argv[1]) if len(sys.argv) > 1 else 20):
        fast, failures = trio.run(run, seed)
        saved = RequestEncoder.followed, BodyDigests.followed
        RequestEncoder.followed = lambda self, result: None
        BodyDigests.followed = lambda self, items, made: None
        try:
            scan, _ = trio.run(run, seed)
        finally:
            RequestEncoder.followed, BodyDigests.followed = saved
        if fast != scan:
            failures.append(f"seed {seed}: digests differ from the scan's")
        bad += bool(failures)
        print(seed, failures[:3] or "ok", len(fast))
    print("failed seeds:", bad)


if __name__ == "__main__":
    main()
