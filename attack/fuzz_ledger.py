"""Attack the request ledger's fast path as a host would, outside the suite.

Each seed drives one random host session (two managers of a namespace, a second namespace,
edits, removals, forks, budget and strategy changes, injections, breakpoints, audience blocks,
tool_use without result, results mutated in place, recorded twice, out of order, dry runs) on a
store, twice: once as shipped (fast path), once with the fast path off (the scan: the two
``followed`` methods answer None). Checked per record: its digest is the digest of the body the
host made at record time, ``rebuild_request`` matches; per run: requests() reads back what was
returned, a fresh runtime rebuilds every unedited record, ``verify`` passes; across runs: the
records' bytes (ids and clocks masked) are equal.

    PYTHONPATH=. python attack/fuzz_ledger.py [seeds] [lmdb|postgres|both]
"""

from __future__ import annotations

import contextlib
import random
import re
import sys
import tempfile
import traceback
from typing import Any

import attrs
import trio

import ctxrt
from ctxrt import Budget, CompiledMessage, Injection, MessageInjection, Text, ToolUse, WindowedPassthrough, open_runtime
from ctxrt import request_ledger
from ctxrt.request_ledger import BodyDigests, RequestEncoder
from ctxrt.testing import body_digest, verify

FORMS = ("anthropic", "openai_chat", "openai_responses")
OPTIONS = [{"assistant": "Claude"}, {"assistant": ["Claude", "bot"]}, {"assistant": "Claude", "system": "be brief"}]

captured: list[bytes] = []
_encode = request_ledger.encode_record


def _capturing(record: Any, **kw: Any) -> bytes:
    data = _encode(record, **kw)
    captured.append(data)
    return data


request_ledger.encode_record = _capturing


def masked(data: bytes, ids: dict[str, str]) -> bytes:
    def name(m: re.Match[bytes]) -> bytes:
        return b'"' + ids.setdefault(m.group(1).decode(), f"R{len(ids)}").encode() + b'"'
    data = re.sub(rb'"([0-9a-f]{32})"', name, data)
    data = re.sub(rb'"at_ms":\d+', b'"at_ms":0', data)
    return re.sub(rb'"(trace_id|span_id)":"[^"]*"', rb'"\1":null', data)


def host_body(result: ctxrt.CompileResult, form: str, options: dict[str, Any]) -> Any:
    return getattr(result, f"to_{form}")(**options)


class Session:
    def __init__(self, rt: ctxrt.Runtime, rng: random.Random, log: list[str]) -> None:
        self.rt, self.rng, self.log = rt, rng, log
        self.records: list[tuple[ctxrt.ContextManager, ctxrt.RequestRecord, str]] = []
        self.failures: list[str] = []
        self.checked = 0
        # A calm host (odd seeds): one manager, one form, mostly plain turns (the fast path's case)
        self.calm: tuple[str, dict[str, Any]] | None = None
        self.changes = 0  # edits and removals so far
        self.stale: set[str] = set()
        self.stale_failed = 0
        self.names: dict[int, str] = {}
        self.compiles: dict[str, int] = {}

    async def record(self, m: ctxrt.ContextManager, result: ctxrt.CompileResult, label: str,
                     stale: bool = False) -> None:
        """``stale``: a message the result holds was edited or removed since its compile (a
        record names versions as of its recording: known, and counted apart)."""
        form, options = self.calm if self.calm and self.rng.random() < 0.9 else (
            self.rng.choice(FORMS), dict(self.rng.choice(OPTIONS)))
        try:
            body = host_body(result, form, options)
        except (ctxrt.EmptyRequestError,) as exc:
            self.log.append(f"{label}: empty {exc!s:.40}")
            return
        want = body_digest(body)
        try:
            record = await m.record_request(result, form=form, options=options)
        except (ValueError, ctxrt.EmptyRequestError) as exc:
            self.log.append(f"{label}: refused {type(exc).__name__} {exc!s:.60}")
            return
        self.log.append(f"{label}: {form} {options} {len(result.messages)} msgs by {self.names[id(m)]} "
                        f"from compile {self.compiles.get(result.provenance.compile_id)}")
        self.checked += 1
        if record.body_digest != want:
            self.failures.append(f"{label}: digest is not the host body's ({form})")
        self.records.append((m, record, label))
        if stale:
            self.stale.add(record.id)
        try:
            rebuilt = await m.rebuild_request(record)
        except ctxrt.MessageNotFoundError:
            if not stale:
                raise
            self.stale_failed += 1
            return
        if not rebuilt.matches or body_digest(rebuilt.body) != want:
            if stale:
                self.stale_failed += 1
                return
            self.failures.append(f"{label}: rebuild doesn't match ({form}, matches={rebuilt.matches})")


async def session(store: str, seed: int) -> tuple[list[str], list[str], int]:
    rng = random.Random(seed)
    log: list[str] = []
    async with open_runtime(store, durability="os") as rt:
        s = Session(rt, rng, log)
        calm = seed % 2 == 1
        if calm:
            s.calm = (FORMS[seed // 2 % 3], dict(OPTIONS[seed // 6 % 3]))
        a = await rt.open("agents/ann", view_reader="ann", ledger=True)
        a2 = await rt.open("agents/ann", view_reader="ann", ledger=True)
        b = await rt.open("agents/bob", view_reader="bob", ledger=True)
        c = await rt.open("agents/cat", view_reader="ann", ledger=True)  # ann's view of the slot, shared
        managers = [a, a2, b, c]
        s.names.update({id(a): "a", id(a2): "a2", id(b): "b", id(c): "c"})
        ids: dict[int, list[str]] = {id(m): [] for m in managers}
        budget = Budget(max_tokens=rng.choice([400, 1200, 10_000]), reserve_for_response=100)
        pending: list[tuple[ctxrt.ContextManager, ctxrt.CompileResult, int]] = []
        for step in range(rng.randint(30, 70)):
            m = a if calm and rng.random() < 0.9 else rng.choice(managers)
            op = rng.random()
            if calm and rng.random() < 0.85:  # a plain turn: a message, or a compile and record
                op = rng.random() * 0.35 if rng.random() < 0.5 else 0.55 + rng.random() * 0.45
            mine = ids[id(m)] if m is not a2 else ids[id(a)]
            try:
                if op < 0.35:
                    who = rng.choice(["user", "Claude", "user", "carol"])
                    kind = rng.random()
                    if kind < 0.1 and who == "Claude":
                        content: Any = [Text("calling"), ToolUse(id=f"t{step}", name="search", input={"q": step})]
                    elif kind < 0.2:
                        content = [Text(f"for ann {step}", audience=("ann",)), Text(f"all {step}")]
                    else:
                        content = f"{who} says {step} " + "x" * rng.randint(0, 200)
                    mid = await m.add_message(who, content)
                    mine.append(mid)
                    log.append(f"{step}: add {who}")
                elif op < 0.42 and mine:
                    target = rng.choice(mine)
                    await m.edit_message(target, f"edited {step}")
                    s.changes += 1
                    log.append(f"{step}: edit")
                elif op < 0.46 and mine:
                    target = rng.choice(mine)
                    await m.remove_message(target)
                    s.changes += 1
                    mine.remove(target)
                    log.append(f"{step}: remove")
                elif op < 0.49:
                    budget = Budget(max_tokens=rng.choice([400, 1200, 10_000]), reserve_for_response=100)
                    log.append(f"{step}: budget {budget.max_tokens}")
                elif op < 0.51:
                    await m.set_strategy(rng.choice([WindowedPassthrough(), ctxrt.Passthrough()]))
                    log.append(f"{step}: strategy")
                elif op < 0.53 and m in (a, a2):
                    name = await a.fork(f"f{seed}-{step}")
                    await a.switch_branch(name) if rng.random() < 0.5 else None
                    log.append(f"{step}: fork")
                elif op < 0.55 and m in (a, a2):
                    branches = [x.name for x in await a.list_branches()]
                    await rng.choice([a, a2]).switch_branch(rng.choice(branches))
                    log.append(f"{step}: switch")
                else:
                    kw: dict[str, Any] = {}
                    if rng.random() < (0.05 if calm else 0.2):
                        kw["injections"] = [Injection("sys", rng.choice(["system", "before_user", "after_user"]),
                                                      f"inj {step % 3}")]
                    if rng.random() < (0.04 if calm else 0.15):
                        kw["message_injections"] = [MessageInjection("note", f"mi {step % 2}", rng.randint(0, 3))]
                    dry = rng.random() < (0.02 if calm else 0.08)
                    result = await m.compile(budget, dry_run=dry, **kw)
                    s.compiles[result.provenance.compile_id] = step
                    if kw or dry:
                        log.append(f"{step}: compile dry={dry} {kw}")
                    mutate = min(1.0, rng.random() * (4 if calm else 1))
                    if mutate < 0.06 and result.messages:
                        result.messages.append(result.messages[0])
                        log.append(f"{step}: mutate append")
                    elif mutate < 0.12 and len(result.messages) > 1:
                        k = rng.randrange(len(result.messages))
                        old = result.messages[k]
                        result.messages[k] = CompiledMessage(old.participant, (*old.content, Text("host edit")),
                                                             old.cache_breakpoint)
                        log.append(f"{step}: mutate replace {k}")
                    elif mutate < 0.16 and len(result.messages) > 1:
                        k = rng.randrange(len(result.messages))
                        result.messages[k] = attrs.evolve(result.messages[k], cache_breakpoint=True)
                        log.append(f"{step}: mutate breakpoint {k}")
                    elif mutate < 0.19 and len(result.messages) > 1:
                        del result.messages[0]
                        log.append(f"{step}: mutate drop first")
                    how = min(1.0, rng.random() * (3 if calm else 1))
                    if how < 0.15:
                        pending.append((m, result, s.changes))
                        log.append(f"{step}: compile, held back")
                    elif how < 0.25 and pending:
                        pm, pr, then = pending.pop(rng.randrange(len(pending)))
                        await s.record(pm, pr, f"{step} late", stale=then != s.changes)
                        await s.record(m, result, f"{step}")
                    elif how < 0.3:
                        await s.record(m, result, f"{step}")
                        await s.record(m, result, f"{step} twice")
                    elif how < 0.34:
                        other = rng.choice(managers)
                        await s.record(other, result, f"{step} other")
                    else:
                        await s.record(m, result, f"{step}")
                    if rng.random() < (0.03 if calm else 0.1) and result.messages:  # the host reuses the list after recording
                        result.messages.append(result.messages[-1])
                        log.append(f"{step}: grow recorded list")
                    if rng.random() < 0.05 and result.messages:
                        result.messages.insert(0, result.messages[-1])
                        log.append(f"{step}: insert into recorded list")
            except (ctxrt.EmptyRequestError, ctxrt.OverBudgetError, ctxrt.MessageNotFoundError) as exc:
                # the last: an edit or removal of a message of the branch the manager left
                log.append(f"{step}: {type(exc).__name__}")
            except Exception as exc:
                s.failures.append(f"{step}: {type(exc).__name__}: {exc!s:.200}\n{traceback.format_exc()[-1500:]}")
        # read back: what was returned is what requests() reads; on a fresh runtime, rebuilt
        for m in managers:
            with contextlib.suppress(Exception):
                await m.requests()
        returned = {r.id: r for _, r, _ in s.records}
        for m in managers:
            await m.aclose()
    async with open_runtime(store, durability="os") as rt2:
        for ns, reader in (("agents/ann", "ann"), ("agents/bob", "bob"), ("agents/cat", "ann")):
            m = await rt2.open(ns, view_reader=reader)
            for branch in [x.name for x in await m.list_branches()]:
                await m.switch_branch(branch)
                try:
                    found = await m.requests(limit=10_000)
                except ctxrt.StoreCorruptError as exc:
                    s.failures.append(f"fresh runtime: {ns} on {branch}: {exc}")
                    continue
                for record in found:
                    if record.branch != branch:
                        continue
                    if record.id in returned and returned[record.id] != record:
                        s.failures.append(f"record {record.id} reads back other than returned")
                    if record.id in s.stale:
                        continue
                    try:
                        rebuilt = await m.rebuild_request(record)
                    except ctxrt.MessageNotFoundError as exc:
                        label = next((lb for _, r, lb in s.records if r.id == record.id), "?")
                        s.failures.append(f"fresh runtime: record {label} on {branch}: {exc}")
                        continue
                    if not rebuilt.edited and not rebuilt.matches:
                        label = next((lb for _, r, lb in s.records if r.id == record.id), "?")
                        s.failures.append(f"fresh runtime: record {label} on {branch} doesn't rebuild")
            await m.aclose()
    log.append(f"stale records: {len(s.stale)}, of which {s.stale_failed} don't rebuild")
    return s.failures, log, s.checked


@contextlib.contextmanager
def scan_only() -> Any:
    saved = RequestEncoder.followed, BodyDigests.followed
    RequestEncoder.followed = lambda self, result: None  # type: ignore[method-assign]
    BodyDigests.followed = lambda self, items, made: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        RequestEncoder.followed, BodyDigests.followed = saved  # type: ignore[method-assign]


def stores(kind: str) -> Any:
    if kind == "lmdb":
        n = 0
        while True:
            n += 1
            yield tempfile.mkdtemp(prefix="att38-")
    else:
        from ctxrt.testing import temporary_cluster
        with temporary_cluster() as cluster:
            n = 0
            while True:
                n += 1
                yield cluster.create_database(f"att38_{n}")


def main() -> None:
    seeds = range(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
    kinds = sys.argv[2:] or ["lmdb"]
    totals = {"sessions": 0, "records": 0, "failed": 0}
    for kind in kinds:
        made = stores(kind)
        for seed in seeds:
            captured.clear()
            store = next(made)
            failures, log, checked = trio.run(session, store, seed)
            report = verify(str(store))
            if report.status != "sound":
                failures.append(f"verify: {report}")
            fast = captured[:]
            captured.clear()
            with scan_only():
                failures2, log2, _ = trio.run(session, next(made), seed)
            scan = captured[:]
            if log != log2:
                failures.append("the scan run went another way (nondeterministic session)")
            else:
                ids_f: dict[str, str] = {}
                ids_s: dict[str, str] = {}
                for n, (x, y) in enumerate(zip(fast, scan)):
                    if masked(x, ids_f) != masked(y, ids_s):
                        failures.append(f"record #{n}: bytes differ from the scan's\n  fast {masked(x, {})[:300]!r}\n  scan {masked(y, {})[:300]!r}")
                        break
                if len(fast) != len(scan):
                    failures.append(f"{len(fast)} records fast, {len(scan)} scanned")
            failures += [f"[scan] {f}" for f in failures2]
            totals["sessions"] += 1
            totals["records"] += checked
            if failures:
                totals["failed"] += 1
                print(f"{kind} seed {seed}: FAIL")
                for f in failures[:8]:
                    print("   ", f if "Traceback" not in f else f.split("\n")[0] + " | " + f.strip().split("\n")[-1])
            else:
                print(f"{kind} seed {seed}: ok ({checked} records; {log[-1]})")
    print(totals)


if __name__ == "__main__":
    main()
