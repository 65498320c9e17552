"""``ctxrt compile``: a dry-run compile of a namespace for its reader, as a host would make it.

Nothing is written: the store is opened read-only and the compile is a dry run. The strategy is
the one the namespace recorded, unless ``--strategy`` says otherwise; the budget must leave room
after the response's reserve, this command's own usage rule.
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.markup import escape

from ..budget import Budget
from ..content.blocks import Block
from ..inspector.pages import recorded_strategy
from ..runtime import Runtime
from ..content.tokens import estimate_blocks
from ..content.validation import blocks_from_content
from .output import emit, out
from .stores import STORE_HELP, open_readonly, require_namespace
from .subcommand import Subcommand, in_trio, whole


def _options(compile_: argparse.ArgumentParser) -> None:
    compile_.add_argument("store", metavar="STORE", help=STORE_HELP)
    compile_.add_argument("--namespace", required=True, help="the namespace to compile (`inspect` lists them)")
    compile_.add_argument("--reader", help="the reader to compile for (default: the one the namespace records)")
    compile_.add_argument("--branch", default="main", help="the branch (default: %(default)s)")
    compile_.add_argument("--budget", type=whole(1), default=100_000, metavar="TOKENS",
                          help="max tokens, the response's reserve included (default: %(default)s)")
    compile_.add_argument("--reserve", type=whole(0), default=4_000, metavar="TOKENS",
                          help="tokens kept for the response; must be less than --budget (default: %(default)s)")
    compile_.add_argument("--assistant", default="Claude",
                          help="the participant who speaks as the assistant (default: %(default)s)")
    compile_.add_argument("--strategy", choices=("auto", "passthrough", "autobiographical"), default="auto",
                          help="auto: the strategy config the namespace records (a store from before that: "
                               "autobiographical if it keeps summaries, else passthrough) (default: %(default)s)")


def _complaint(args: argparse.Namespace) -> str | None:
    try:
        Budget(args.budget, args.reserve)
    except ValueError:
        return (f"--budget {args.budget} leaves no room after --reserve {args.reserve} (the tokens kept "
                f"for the response): --budget must be more than --reserve")
    return None


async def _compile(args: argparse.Namespace) -> int:
    async with open_readonly(args.store) as runtime:
        namespace = await require_namespace(runtime, args)
        manager = await runtime.open(namespace, view_reader=args.reader, branch=args.branch,
                                     strategy=_stored_strategy(runtime, namespace, args))
        result = await manager.compile(Budget(args.budget, args.reserve), dry_run=True)
        body = result.to_anthropic(assistant=args.assistant)
        await manager.aclose()
    # The request is turns (a role's run of messages is one turn), so turns are what it counts,
    # each with its tokens by ctxrt's estimate, the one the budget is held to.
    turns = [(message["role"], estimate_blocks(result_blocks(message["content"]))) for message in body["messages"]]
    total = sum(tokens for _, tokens in turns)
    if args.json:
        emit({"reader": manager.view_reader, "request": body, "tokens": total,
              "turn_tokens": [tokens for _, tokens in turns], "usable": args.budget - args.reserve})
        return 0
    out.print(f"dry-run compile of {namespace} on {args.branch} for reader {manager.view_reader!r}: "
              f"{len(turns)} turn{'s' if len(turns) != 1 else ''}, {total:,} tokens of the budget's {args.budget - args.reserve:,} "
              f"(nothing written)", markup=False)
    for message, (role, tokens) in zip(body["messages"], turns, strict=True):
        text = " ".join(block.get("text", f"[{block['type']}]") for block in message["content"])
        out.print(f"[bold]{role}[/] [dim]({tokens:,} tokens)[/]: {escape(text[:200])}")
    return 0


def result_blocks(content: list[dict[str, Any]]) -> tuple[Block, ...]:
    """A request turn's blocks as ctxrt's own, its cache markers left out."""
    return blocks_from_content([{key: value for key, value in block.items() if key != "cache_control"}
                                for block in content])


def _stored_strategy(runtime: Runtime, namespace: str, args: argparse.Namespace) -> Any:
    """The strategy config the namespace recorded on its branch (what its residents run); for a
    store from before configs were recorded, or a host's own strategy, Autobiographical if it keeps
    summaries, else Passthrough. ``--strategy`` overrides."""
    from ..strategies.autobiographical import Autobiographical
    from ..strategies.passthrough import Passthrough

    if args.strategy == "passthrough":
        return Passthrough()
    found = recorded_strategy(runtime, namespace, args.branch, args.budget)
    if args.strategy == "auto" or isinstance(found, Autobiographical):
        return found
    return Autobiographical("inspection", recent_window_tokens=args.budget // 2)


COMPILE = Subcommand(
    "compile", "a dry-run compile of a namespace (writes nothing)",
    "Compile a namespace for its reader as a host would, without writing anything, and print "
    "the request body. Opens the store read-only.",
    _options, in_trio(_compile), _complaint)
