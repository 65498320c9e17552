"""``ctxrt messages``: the messages of a slot on a branch, as stored, audience included.

A page of them (``--offset``, ``--limit``) or the last few (``--tail``), from a read-only open;
the rule that ``--tail`` goes alone is this command's own usage rule.
"""

from __future__ import annotations

import argparse

from rich.markup import escape

from ..content import codec
from ..namespace import states
from .output import emit, out
from .stores import STORE_HELP, NotFoundError, open_readonly, require_branch
from .subcommand import Subcommand, in_trio, whole

DEFAULT_LIMIT = 50


def _options(messages: argparse.ArgumentParser) -> None:
    messages.add_argument("store", metavar="STORE", help=STORE_HELP)
    messages.add_argument("--branch", default="main", help="the branch to read (default: %(default)s)")
    messages.add_argument("--slot", default="messages",
                          help="the slot: 'messages' (shared) or '<namespace>/messages' for an isolated "
                               "namespace; `inspect` lists them (default: %(default)s)")
    messages.add_argument("--offset", type=whole(0), metavar="N",
                          help="the first message to show, counting from 0 (default: 0)")
    messages.add_argument("--limit", type=whole(0), metavar="N",
                          help=f"how many messages to show from --offset (default: {DEFAULT_LIMIT})")
    messages.add_argument("--tail", type=whole(0), metavar="N",
                          help="show the last N messages instead (not with --offset or --limit)")


def _complaint(args: argparse.Namespace) -> str | None:
    if args.tail is not None and (args.offset is not None or args.limit is not None):
        return "--tail shows the last N messages: give it alone, or --offset and --limit instead"
    return None


async def _messages(args: argparse.Namespace) -> int:
    async with open_readonly(args.store) as runtime:
        await require_branch(runtime, args)
        engine = runtime.engine
        slots = sorted(state.name for state in engine.list_states() if state.kind == "log" and states.is_slot(state.name))
        if args.slot not in slots:
            raise NotFoundError(f"no slot {args.slot!r} in {args.store}; its slots: {', '.join(slots) or 'none'}")
        branch_id = engine.branch(args.branch).id
        head = engine.read_head(args.slot, branch_id)
        if args.tail is not None:
            start, stop = max(0, head.length - args.tail), head.length
        else:
            start = args.offset or 0
            stop = start + (args.limit if args.limit is not None else DEFAULT_LIMIT)
        items = engine.read_items(args.slot, branch_id, at=head.revision, start=start, stop=stop)
        messages = [codec.message_from_json(item.data, sequence=item.sequence, store=engine.data_path)
                    for item in items]
    if args.json:
        emit({"total": head.length, "start": start, "messages": [
            {"id": m.id, "participant": m.participant, "timestamp_ms": m.timestamp_ms,
             "content": [codec.to_jsonable(b) for b in m.content], "metadata": m.metadata} for m in messages]})
        return 0
    if messages:
        out.print(f"{args.slot} on {args.branch}: messages {start}..{start + len(messages) - 1} "
                  f"(positions counting from 0, as --offset counts; ids under --json) of {head.length}",
                  markup=False)
    else:
        out.print(f"{args.slot} on {args.branch}: no messages from {start} on; it holds {head.length}", markup=False)
    for position, message in enumerate(messages, start):
        parts = []
        for block in message.content:
            text = getattr(block, "text", None) or getattr(block, "name", None) or block.type
            audience = getattr(block, "audience", None)
            parts.append(f"{text}" + (f" [audience: {', '.join(audience)}]" if audience else ""))
        line = " | ".join(parts)
        line = line if len(line) <= 300 else line[:299] + "…"
        out.print(f"[dim]{position:>8}[/] [bold]{escape(message.participant)}[/]: {escape(line)}")
    return 0


MESSAGES = Subcommand(
    "messages", "messages of a slot, as stored",
    "Messages of a slot on a branch as stored (audience included). Shows --limit messages "
    "from --offset, or the last --tail ones. Opens the store read-only.",
    _options, in_trio(_messages), _complaint)
