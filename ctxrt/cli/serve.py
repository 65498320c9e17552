"""``ctxrt serve``: the read-only web inspector of a store, on 127.0.0.1, until Ctrl-C.

The inspector is ``ctxrt.inspector.app``, an optional extra: without its packages the command
says how to install them. It prints where it serves (the URL of a database store with its
password hidden).
"""

from __future__ import annotations

import argparse
import json
from functools import partial

import trio

from ..errors import CtxrtError
from ..inspector.prices import Price, read_prices
from ..store.urls import is_postgres_url, redact
from .output import err
from .stores import STORE_HELP, open_readonly
from .subcommand import Subcommand, in_trio, whole


class InspectorMissingError(CtxrtError):
    """``serve`` without the inspector's packages (Starlette, Hypercorn, Jinja2) installed."""


def _prices(path: str) -> dict[str, Price]:
    try:
        return read_prices(path)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _options(serve: argparse.ArgumentParser) -> None:
    serve.add_argument("store", metavar="STORE", help=STORE_HELP)
    serve.add_argument("--port", type=whole(0, 65_535), default=8765, metavar="PORT",
                       help="the port on 127.0.0.1 (0: any free one; default: %(default)s)")
    serve.add_argument("--prices", type=_prices, default=None, metavar="FILE",
                       help='a JSON price table pricing recorded requests: {"MODEL": {"input": 3.0, "output": 15.0, '
                            '"cache_read": 0.3, "cache_creation": 3.75}}, US dollars per million tokens '
                            "(cache prices default to input's)")


async def _serve(args: argparse.Namespace) -> int:
    try:
        from ..inspector.app import serve
    except ImportError as exc:
        raise InspectorMissingError(f"ctxrt serve needs the inspector extra: pip install 'ctxrt[inspector]' "
                                    f"({exc})") from None
    async with open_readonly(args.store) as runtime:
        label = redact(args.store) if is_postgres_url(args.store) else str(runtime.path)
        async with trio.open_nursery() as nursery:
            url = await nursery.start(partial(serve, runtime, label, port=args.port, prices=args.prices))
            err.print(f"inspecting {label} (read-only) at {url}/ ; Ctrl-C stops", markup=False)
            if args.json:
                print(json.dumps({"url": url, "store": label}), flush=True)
    return 0


SERVE = Subcommand(
    "serve", "a read-only web inspector of a store, on 127.0.0.1",
    "Serve a read-only web inspector of the store on 127.0.0.1: branches and fork points, "
    "namespaces (reader, strategy, floor, health, quarantined units), a paged timeline with "
    "audience badges that follows the writer, each reader's request broken down (private lines "
    "badged, token bars, filters), summary trees and what each summary covers in its reader's view, "
    "two readers' views side by side, a search, as stored or as a reader, and each namespace's "
    "recorded requests (history, one as sent, a diff of two, an audit of a message); every page can follow "
    "the writer live. Works beside a live writer; writes nothing. Needs "
    "pip install 'ctxrt[inspector]'.",
    _options, in_trio(_serve))
