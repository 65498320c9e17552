"""Cancel record_request at every checkpoint (a sibling cancels its scope after k schedule points),
and interleave two managers of one namespace and a second namespace in concurrent tasks, each form,
with the fast path in use: every record returned reads back equal, its digest is the host body's,
it rebuilds (here and on a fresh runtime); a cancelled one is kept whole or not at all (kept only
when it committed the LEDGER_WAITING-th, Q11); ``verify`` passes.

    PYTHONPATH=. python attack/cancel_ledger.py [lmdb|postgres]
"""

from __future__ import annotations

import signal
import sys
import tempfile
from typing import Any

import trio

import ctxrt
from ctxrt import Budget, Injection, open_runtime
from ctxrt.testing import body_digest, verify

FORMS = {"anthropic": {"assistant": "Claude"}, "openai_chat": {"assistant": ["Claude"], "system": "sys"},
         "openai_responses": {"assistant": "Claude"}}
BUDGET = Budget(max_tokens=3_000, reserve_for_response=100)


async def cancelled_record(m: ctxrt.ContextManager, result: ctxrt.CompileResult, form: str, k: int,
                           ki: bool = False) -> Any:
    """record_request, its scope cancelled (``ki``: a SIGINT raised, trio's KeyboardInterrupt) after
    ``k`` schedule points of a sibling; None if cancelled or interrupted."""
    out: list[Any] = []

    async def cancel(scope: trio.CancelScope) -> None:
        for _ in range(k):
            await trio.lowlevel.checkpoint()
        if ki:
            signal.raise_signal(signal.SIGINT)
            await trio.sleep_forever()
        scope.cancel()

    async def record() -> None:
        out.append(await m.record_request(result, form=form, options=FORMS[form]))

    with trio.CancelScope() as scope:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(record)
                nursery.start_soon(cancel, scope)
        except* KeyboardInterrupt:
            pass
    return out[0] if out else None


async def session(store: str, stats: dict[str, int]) -> list[str]:
    failures: list[str] = []
    made: dict[str, tuple[ctxrt.RequestRecord, str]] = {}  # id -> (record, digest of the host's body)
    async with open_runtime(store, durability="os") as rt:
        a = await rt.open("agents/ann", view_reader="ann", ledger=True)
        a2 = await rt.open("agents/ann", view_reader="ann", ledger=True)
        b = await rt.open("agents/bob", view_reader="bob", ledger=True)
        for form in FORMS:
            for k in range(0, 40):
                for m in (a, a2, b):
                    if k % 3:
                        await m.add_message("user" if k % 2 else "Claude", f"{form} {k} " + "w " * k)
                    kw = {"injections": [Injection("n", "after_user", f"n{k % 2}")]} if k % 5 == 0 else {}
                    result = await m.compile(BUDGET, **kw)
                    want = body_digest(getattr(result, f"to_{form}")(**FORMS[form]))
                    record = await cancelled_record(m, result, form, k // 2, ki=k % 2 == 1)
                    if record is None:
                        stats["cancelled"] += 1
                    else:
                        stats["kept"] += 1
                        made[record.id] = (record, want)
                        if record.body_digest != want:
                            failures.append(f"{form} k={k}: digest is not the host body's")
            # concurrent turns: the three managers in tasks, records racing
            async with trio.open_nursery() as nursery:
                for m in (a, a2, b):
                    async def turns(m: ctxrt.ContextManager = m) -> None:
                        for n in range(20):
                            if n % 2:
                                await m.add_message("user", f"race {n}")
                            result = await m.compile(BUDGET)
                            want = body_digest(getattr(result, f"to_{form}")(**FORMS[form]))
                            record = await m.record_request(result, form=form, options=FORMS[form])
                            made[record.id] = (record, want)
                            stats["raced"] += 1
                            if record.body_digest != want:
                                failures.append(f"{form} race {n}: digest is not the host body's")
                    nursery.start_soon(turns)
        # the LEDGER_WAITING-th record commits the waiting ones: cancelled at each of its points
        for k in range(12):
            await a.add_message("user", f"batch {k}")  # commits what waits: the count starts afresh
            for n in range(70):
                result = await a.compile(BUDGET)
                want = body_digest(result.to_anthropic(**FORMS["anthropic"]))
                record = await cancelled_record(a, result, "anthropic", k if n == 63 else 10_000)
                if record is None:
                    stats["cancelled"] += 1
                    continue
                stats["kept"] += 1
                made[record.id] = (record, want)
                if record.body_digest != want:
                    failures.append(f"batch k={k}: digest is not the host body's")
        for m, ns in ((a, "agents/ann"), (b, "agents/bob")):
            found = await m.requests(limit=100_000)
            ids = {r.id for r in found}
            for record, want in made.values():
                if record.namespace == ns and record.id not in ids:
                    failures.append(f"a returned record of {ns} is not in the ledger")
            for record in found:
                if record.id in made and made[record.id][0] != record:
                    failures.append("a record reads back other than returned")
                if record.id not in made:
                    stats["kept though cancelled"] += 1
                rebuilt = await m.rebuild_request(record)
                if not rebuilt.matches:
                    failures.append(f"record of {ns} doesn't rebuild")
                elif record.id in made and made[record.id][1] != body_digest(rebuilt.body):
                    failures.append(f"record of {ns}: rebuilt body is not the host's")
        for m in (a, a2, b):
            await m.aclose()
    async with open_runtime(store, durability="os") as rt:
        for ns, reader in (("agents/ann", "ann"), ("agents/bob", "bob")):
            m = await rt.open(ns, view_reader=reader)
            for record in await m.requests(limit=100_000):
                stats["fresh rebuilds"] += 1
                if not (await m.rebuild_request(record)).matches:
                    failures.append(f"fresh runtime: a record of {ns} doesn't rebuild")
            await m.aclose()
    return failures


def main() -> None:
    kind = sys.argv[1] if len(sys.argv) > 1 else "lmdb"
    stats = {"kept": 0, "cancelled": 0, "raced": 0, "kept though cancelled": 0, "fresh rebuilds": 0}
    if kind == "lmdb":
        store = tempfile.mkdtemp(prefix="att38c-")
        failures = trio.run(session, store, stats)
        report = verify(store)
    else:
        from ctxrt.testing import temporary_cluster
        with temporary_cluster() as cluster:
            store = cluster.create_database("att38c")
            failures = trio.run(session, store, stats)
            report = verify(store)
    print(kind, stats)
    print("verify:", report.ok if hasattr(report, "ok") else report)
    for f in failures[:20]:
        print("FAIL", f)
    print("failures:", len(failures))


if __name__ == "__main__":
    main()
