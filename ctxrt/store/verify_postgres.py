"""The store's part of ``ctxrt verify`` for a store in PostgreSQL: every row of ctxrt's tables read
and checked (each log item by the ``check_item`` the layer above hands in: the store never decodes
a message), then every log and value read as the runtime reads them. Never writes. (A damaged row
can't crash the process that reads it, as a damaged LMDB page can, so the walk runs in this
process.)"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from ..errors import CtxrtError, StoreCorruptError
from .postgres import _LAST_VALUE, PostgresEngine
from .urls import redact
from .verify import (
    Findings,
    EngineCheck,
    ItemCheck,
    VerifyReport,
    check_head,
    engine_findings,
    read_through_engine,
)


def walk_postgres(url: str, check_item: ItemCheck, *,
                  emit: Callable[[dict[str, Any]], None] | None = None,
                  check_engine: EngineCheck | None = None) -> VerifyReport:
    """Walk the store in the database at ``url`` and report what is damaged (a report, never
    raised), each log item checked by ``check_item``, then the store as the engine reads it by
    ``check_engine``."""
    found = Findings(redact(url), emit)
    try:
        engine = PostgresEngine(url, create=False)
    except StoreCorruptError as exc:  # a branch or state row the engine can't even load
        found.damaged("branch and state tables", exc.what)
        found.note("the walk stopped there: the store can't be opened until that row is repaired")
        return found.report()
    except CtxrtError as exc:
        found.refused = str(exc)
        return found.report()
    try:
        _check_meta(engine, found)
        _walk_rows(engine, found, check_item)
        read_through_engine(engine, found)
        if check_engine is not None and not found.damage:
            engine_findings(engine, found, check_engine)
    except Exception as exc:  # noqa: BLE001 - a table that can't be read (dropped, altered) is a finding
        found.damaged("ctxrt's tables", f"can't be walked: {exc!r}")
    finally:
        engine.close()
    return found.report()


def _check_meta(engine: PostgresEngine, found: Findings) -> None:
    """The counters a write relies on: present, and past every stored row (or writes reuse them)."""
    meta = {key: int(value) for key, value in engine.rows("SELECT key, value FROM ctxrt_meta")}
    # Schema 2 draws sequences from the database sequence ctxrt_sequence; schema 1 kept a row.
    counters = ("format", "next_branch", "next_state") + (("sequence",) if meta.get("format") == 1 else ())
    for key in counters:
        if key not in meta:
            found.damaged("ctxrt_meta", f"has no {key!r} row (every write needs it)")
    if meta.get("format") != 1:
        meta["sequence"] = int(engine.rows(_LAST_VALUE)[0][0])
    [(top, branch, state)] = engine.rows(
        "SELECT greatest((SELECT max(version) FROM ctxrt_items), (SELECT max(version) FROM ctxrt_values),"
        " (SELECT max(revision) FROM ctxrt_heads)), (SELECT max(id) FROM ctxrt_branches),"
        " (SELECT max(number) FROM ctxrt_states)")
    for key, stored, what in (("sequence", top, "sequence"), ("next_branch", branch, "branch id"),
                              ("next_state", state, "state number")):
        if key in meta and stored is not None:
            limit = meta[key] if key == "sequence" else meta[key] - 1
            if stored > limit:
                where = "ctxrt_sequence" if key == "sequence" and meta.get("format") != 1 else f"ctxrt_meta {key!r}"
                found.damaged(where, f"{meta[key]} is behind the stored rows (a {what} up to {stored}): new writes "
                                     f"would reuse it")


def _walk_rows(engine: PostgresEngine, found: Findings, check_item: ItemCheck) -> None:
    rows = engine.rows
    branches = {row_id for (row_id,) in rows("SELECT id FROM ctxrt_branches")}  # deleted ones too: lineages read them
    for row in engine.list_branches():
        for level, _ in ((row.parent, None), *row.lineage):
            if level is not None and level not in branches:
                found.damaged(f"branch {row.id} ({row.name!r})", f"descends from branch {level}, which has no row")
    states = {info.number: info for info in engine.list_states()}
    blob_refs: dict[str, str] = {}
    for state, branch, version, head in rows("SELECT state, branch, version, head FROM ctxrt_heads"):
        found.records += 1
        place = f"state {states[state].name if state in states else state!r} branch {branch} head @{version}"
        if state not in states or branch not in branches:
            found.damaged(place, "belongs to a state or branch that has no row")
            continue
        try:
            check_head(bytes(head), place, found)
        except Exception as exc:  # noqa: BLE001 - a checker reports whatever a record does, and goes on
            found.damaged(place, f"doesn't decode: {exc!r}")
    for state, branch, ordinal, version, sequence, data in rows(
        "SELECT state, branch, ordinal, version, sequence, data FROM ctxrt_items"
    ):
        found.records += 1
        info = states.get(state)
        place = f"state {info.name if info else state!r} branch {branch} item {ordinal} @{version}"
        if info is None or branch not in branches:
            found.damaged(place, "belongs to a state or branch that has no row")
        elif info.kind != "log":
            found.damaged(place, "an item row in a value state")
        elif sequence > version:
            found.damaged(place, f"its origin sequence {sequence} is after its own {version}")
        else:
            try:
                for sha256 in check_item(info.name, bytes(data), sequence, place):
                    blob_refs.setdefault(sha256, place)  # the blob itself is checked with the blob table
            except Exception as exc:  # noqa: BLE001 - as above
                found.damaged(place, f"doesn't decode: {exc!r}")
    for state, branch, version, data in rows("SELECT state, branch, version, data FROM ctxrt_values"):
        found.records += 1
        place = f"value state {states[state].name if state in states else state!r} branch {branch} @{version}"
        try:
            json.loads(bytes(data))
        except ValueError as exc:
            found.damaged(place, f"doesn't decode: {exc!r}")
    stored = set()
    for sha256, data in rows("SELECT sha256, data FROM ctxrt_blobs"):
        found.records += 1
        key = bytes(sha256)
        if hashlib.sha256(bytes(data)).digest() != key:
            found.damaged(f"blob {key.hex()}", f"its {len(data)} bytes don't hash to its key")
        stored.add(key.hex())
    for sha256, place in blob_refs.items():
        if sha256 not in stored:
            found.damaged(place, f"refers to blob {sha256}, which is not stored")
