"""``ctxrt inspect``: each branch of a store with its slots and namespaces.

Per branch: the messages each slot holds, and per namespace its reader, narrowing floor,
summaries per level and quarantined compression units, read from a read-only open.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from typing import Any

from rich.markup import escape
from rich.table import Table

from ..inspector.pages import quarantined
from ..namespace import states
from .output import emit, jsonable, out
from .stores import STORE_HELP, open_readonly
from .subcommand import Subcommand, in_trio


def _options(inspect: argparse.ArgumentParser) -> None:
    inspect.add_argument("store", metavar="STORE", help=STORE_HELP)


async def _inspect(args: argparse.Namespace) -> int:
    async with open_readonly(args.store) as runtime:
        engine = runtime.engine
        branches = await runtime.list_branches()
        data: dict[str, Any] = {"store": str(runtime.path), "sequence": engine.last_sequence, "branches": []}
        for branch in branches:
            row = engine.branch(branch.name)
            slots = {}
            summaries: dict[str, Counter[int]] = {}
            for state in engine.list_states():
                if state.kind != "log":
                    continue
                if states.is_slot(state.name):
                    slots[state.name] = len(engine.read_log(state.name, row.id))
                elif (owner := states.namespace_of_strategy_state(state.name, "summaries")) is not None:
                    summaries[owner] = Counter(json.loads(item.data)["level"]
                                               for item in engine.read_log(state.name, row.id))
            namespaces = [
                {"namespace": info.namespace, "reader": info.reader, "narrowing_floor": info.narrowing_floor,
                 "summaries_per_level": dict(sorted(summaries.get(info.namespace, Counter()).items())),
                 "quarantined": quarantined(runtime, row, info.namespace)}
                for info in await runtime.list_namespaces(branch.name)
            ]
            data["branches"].append({**jsonable(branch), "slots": slots, "namespaces": namespaces})
    if args.json:
        emit(data)
        return 0
    out.print(f"[bold]{escape(data['store'])}[/] — store sequence {data['sequence']}")
    for branch in data["branches"]:
        parent = f" (from {branch['parent']} at {branch['fork_sequence']})" if branch["parent"] else ""
        out.print(f"\n[bold]branch {escape(branch['name'])}[/]{escape(parent)}, head {branch['head_sequence']}")
        for slot, count in branch["slots"].items():
            out.print(f"  slot {slot}: {count} messages", markup=False)
        table = Table("namespace", "reader", "narrowing floor", "summaries per level", "quarantined")
        for info in branch["namespaces"]:
            table.add_row(escape(info["namespace"]), escape(str(info["reader"])), str(info["narrowing_floor"]),
                          ", ".join(f"L{k}: {v}" for k, v in info["summaries_per_level"].items()) or "-",
                          escape(", ".join(info["quarantined"])) or "-")
        out.print(table)
    return 0


INSPECT = Subcommand(
    "inspect", "branches, namespaces, readers, slots, summaries and floors of a store",
    "Each branch with its slots (messages stored) and namespaces (reader, narrowing floor, "
    "summaries per level, quarantined compression units). Opens the store read-only.",
    _options, in_trio(_inspect))
