"""Cancel add_message at its k-th traced line (every k until it completes uncancelled), with and
without request records waiting and host_state given, on LMDB and PostgreSQL: a returned id is
stored once; a cancelled call stored at most once; records taken land (Q1, Q11: in order); the
next append works."""
from __future__ import annotations
import os, sys, tempfile, types
import trio
import ctxrt
from ctxrt import Budget

ROOT = os.path.dirname(ctxrt.__file__)


async def one(url, k: int, records: bool, host_state: bool) -> tuple[str, list[str]]:
    problems = []
    async with ctxrt.open_runtime(url) as rt:
        m = await rt.open("n", ledger=True)
        await m.add_message("user", "seed")
        await m.add_message("user", "seed2")
        rec_ids = []
        if records:
            res = await m.compile(Budget(10_000, 100))
            rec_ids.append((await m.record_request(res, form="anthropic")).id)
        kw = {"host_state": {"turn": k}} if host_state else {}
        scope = trio.CancelScope()
        lines = 0
        me = trio.lowlevel.current_task()

        def trace(frame: types.FrameType, event: str, arg):
            nonlocal lines
            if not frame.f_code.co_filename.startswith(ROOT):
                return None
            # only in the caller's own task: a cancel lands between two of its steps, as a real one does
            if event == "line" and _task() is me:
                lines += 1
                if lines == k:
                    scope.cancel()
            return trace

        got = None
        sys.settrace(trace)
        try:
            with scope:
                got = await m.add_message("user", "target", **kw)
        finally:
            sys.settrace(None)
        outcome = "returned" if got is not None else "cancelled"
        after = await m.add_message("user", "after")
        msgs = await m.get_all_messages()
        texts = [x.content[0].text for x in msgs]
        n = texts.count("target")
        if got is not None and (n != 1 or [x.id for x in msgs if x.content[0].text == "target"] != [got]):
            problems.append(f"returned {got} but stored {n}")
        if n > 1:
            problems.append(f"doubled {n}")
        if texts[-1] != "after" or int(after) <= max(int(x.id) for x in msgs[:-1]):
            problems.append("next append out of order")
        if records:
            got_recs = [r.id for r in await m.requests()]
            if got_recs != rec_ids:
                problems.append(f"records {got_recs} != {rec_ids}")
        if host_state:
            value = await (await rt.host_state("turn")).get()
            if value != (k if n else None):  # both commit or neither (M9)
                problems.append(f"host_state {value} with {n} stored")
        return outcome + ("+" if n else "-"), problems


def _task():
    try:
        return trio.lowlevel.current_task()
    except RuntimeError:
        return None


def main() -> None:
    kind = sys.argv[1]
    from contextlib import ExitStack
    with ExitStack() as stack:
        if kind == "pg":
            from ctxrt.pgcluster import temporary_cluster
            cluster = stack.enter_context(temporary_cluster())
            counter = iter(range(10**6))
            make = lambda: cluster.create_database(f"c{next(counter)}")
        else:
            base = stack.enter_context(tempfile.TemporaryDirectory())
            counter = iter(range(10**6))
            make = lambda: os.path.join(base, f"s{next(counter)}")
        for records in (False, True):
            for host_state in (False, True):
                outcomes = {}
                bad = 0
                for k in range(1, 4000):
                    outcome, problems = trio.run(one, make(), k, records, host_state)
                    outcomes[outcome] = outcomes.get(outcome, 0) + 1
                    if problems:
                        bad += 1
                        print(kind, records, host_state, k, outcome, problems)
                    if outcome.startswith("returned") and k > 5 and outcomes.get("returned+", 0) > 3:
                        break
                print(kind, "records" if records else "no-records", "host_state" if host_state else "-",
                      "k up to", k, outcomes, "bad", bad, flush=True)


main()
