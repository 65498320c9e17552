"""The inspector's web app (Starlette) and its server (Hypercorn's trio worker, on 127.0.0.1).

Every route answers GET (and HEAD) only: Starlette answers any other method 405, and nothing
here writes (the runtime is read-only besides). Pages are rendered on the server by Jinja2 with
autoescape on for every template, so each string the store holds reaches the page as text; the
Content-Security-Policy allows no script at all, a second wall behind the escaping. Requests
whose Host isn't this machine's loopback name are refused (DNS rebinding).
"""

from __future__ import annotations

import errno
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
import trio
from hypercorn.config import Config
from hypercorn.trio import serve as hypercorn_serve
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from ..budget import Budget
from ..errors import (
    BranchNotFoundError,
    CtxrtError,
    StoreCorruptError,
    StoreFormatError,
    StorePermissionError,
    StoreUnavailableError,
)
from ..manager import ContextManager
from ..runtime import Runtime
from ..store.records import BranchRow
from . import pages
from .prices import Price

logger = logging.getLogger("ctxrt.inspector")

HERE = Path(__file__).parent
HOST = "127.0.0.1"
LOOPBACK_NAMES = (HOST, "localhost")
OPEN_MANAGERS = 16  # managers kept open for breakdowns (warm compiles); the oldest is closed past this
DEFAULT_BUDGET = 100_000
DEFAULT_RESERVE = 4_000
LIVE_REFRESH_S = 2
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
                               "base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


class BadRequest(Exception):
    """A query parameter that isn't what the page takes."""


class LoopbackOnly:
    """Refuses a request whose Host isn't this machine's loopback name (DNS rebinding) with
    ``refuse``'s page: Starlette's own middleware answers a bare text body."""

    def __init__(self, app: ASGIApp, refuse: Callable[[str], Response]) -> None:
        self.app = app
        self.refuse = refuse

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = Headers(scope=scope).get("host", "").split(":")[0]
            if host not in LOOPBACK_NAMES:
                await self.refuse(host)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _query_text(request: Request, name: str) -> str | None:
    """A text query parameter, None when absent or empty (an empty filter filters nothing)."""
    return request.query_params.get(name) or None


def status_of(error: CtxrtError) -> int:
    """The HTTP status of the page saying ``error``: the store's own failure (damaged, of another
    format, not readable) is the server's (500), a database not answering is 503, a branch deleted
    while the page was made 404; any other is a refusal (a compile refused) 409."""
    if isinstance(error, StoreUnavailableError):
        return 503
    if isinstance(error, StoreCorruptError | StoreFormatError | StorePermissionError):
        return 500
    if isinstance(error, BranchNotFoundError):
        return 404
    return 409


class Managers:
    """Managers the breakdowns compile with, one per (branch, namespace), kept open so the next look
    compiles warm (and ``stable_prefix_tokens`` compares with the last look); at most
    ``OPEN_MANAGERS``, the least recently used closed first.

    Each is kept with the id of the branch it was opened on: a branch deleted and made again under
    its name is another branch (a new id), and the manager of the deleted one (retired with it) is
    closed and a new one opened."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._open: OrderedDict[tuple[str, str], tuple[int, ContextManager]] = OrderedDict()
        self._lock = trio.Lock()

    async def get(self, branch: BranchRow, namespace: str) -> ContextManager:
        async with self._lock:  # two requests for one namespace open one manager
            key = (branch.name, namespace)
            found = self._open.get(key)
            if found is not None and found[0] == branch.id:
                self._open.move_to_end(key)
                return found[1]
            if found is not None:
                del self._open[key]
                await found[1].aclose()
            strategy = pages.recorded_strategy(self.runtime, namespace, branch.name, DEFAULT_BUDGET)
            manager = await self.runtime.open(namespace, branch=branch.name, strategy=strategy)
            self._open[key] = (branch.id, manager)
            while len(self._open) > OPEN_MANAGERS:
                _, (_, oldest) = self._open.popitem(last=False)
                await oldest.aclose()
            return manager

    async def aclose(self) -> None:
        while self._open:
            _, (_, manager) = self._open.popitem()
            await manager.aclose()


def _query_int(request: Request, name: str, default: int | None, minimum: int = 0) -> int | None:
    text = request.query_params.get(name)
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise BadRequest(f"{name} must be a whole number, not {text!r}") from None
    if value < minimum:
        raise BadRequest(f"{name} must be {minimum} or more, not {value}")
    return value


def _budget(request: Request) -> Budget:
    budget = _query_int(request, "budget", DEFAULT_BUDGET, 1)
    reserve = _query_int(request, "reserve", DEFAULT_RESERVE, 0)
    assert budget is not None and reserve is not None
    try:
        return Budget(budget, reserve)
    except ValueError as exc:
        raise BadRequest(str(exc)) from None


def build_app(runtime: Runtime, label: str, managers: Managers, prices: dict[str, Price] | None = None) -> Starlette:
    """The inspector of ``runtime``'s store (read-only), titled ``label``; ``prices`` (a model's
    dollars per million tokens) prices the recorded requests."""
    prices = prices or {}
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True, undefined=jinja2.StrictUndefined,
    )

    def link(path: str, **query: Any) -> str:
        return path + ("?" + urlencode({k: v for k, v in query.items() if v is not None}) if query else "")

    environment.globals.update(link=link, label=label, page_numbers=pages.page_numbers, percent=pages.percent,
                               refresh=LIVE_REFRESH_S, live=False, follow=None, record_zones=pages.RECORD_ZONES,
                               part_label=pages.part_label)
    environment.filters["when"] = lambda ms: (datetime.fromtimestamp(ms / 1000, timezone.utc)
                                               .strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC")

    def render(template: str, status: int = 200, **context: Any) -> HTMLResponse:
        html = environment.get_template(template).render(**context)
        return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)

    def follow(request: Request) -> dict[str, Any]:
        """What a page that follows the store needs: ``live`` (``live=1`` asked; the page reloads
        every ``LIVE_REFRESH_S``, an HTML refresh, no script) and the links on and off."""
        query = {k: v for k, v in request.query_params.items() if k != "live"}
        return {"live": request.query_params.get("live") == "1",
                "follow": (link(request.url.path, **query, live=1), link(request.url.path, **query))}

    def page(handler: Callable[[Request], Awaitable[HTMLResponse]]) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                return await handler(request)
            except pages.NotFound as exc:
                return render("error.html", 404, title="not found", message=str(exc))
            except BadRequest as exc:
                return render("error.html", 400, title="bad request", message=str(exc))
            except CtxrtError as exc:  # a damaged store, a refused compile, a deleted branch: said, never a bare 500
                return render("error.html", status_of(exc), title=type(exc).__name__, message=str(exc))
        return endpoint

    def branch_of(request: Request) -> Any:
        return pages.branch_row(runtime, request.query_params.get("branch", "main"))

    async def index(request: Request) -> HTMLResponse:
        branches = await runtime.list_branches()
        engine = runtime.engine
        if getattr(engine, "standby", False):
            # A standby's horizon waits for its replay (up to 30 s): off the loop, so the other pages
            # answer meanwhile and a cancel (Ctrl-C) doesn't wait for it.
            sequence = await trio.to_thread.run_sync(lambda: engine.last_sequence, abandon_on_cancel=True)
        else:
            sequence = engine.last_sequence
        return render("index.html", branches=branches, sequence=sequence, **follow(request))

    async def branch(request: Request) -> HTMLResponse:
        row = branch_of(request)
        return render("branch.html", branch=row.name, slots=pages.slots(runtime, row),
                      namespaces=await pages.namespaces(runtime, row), **follow(request))

    async def timeline(request: Request) -> HTMLResponse:
        row = branch_of(request)
        slot = request.query_params.get("slot", "messages")
        at = _query_int(request, "at", None, 0)
        shown = pages.timeline(runtime, row, slot, _query_int(request, "page", None), at)
        live = request.query_params.get("live") == "1" and shown.page == shown.pages - 1
        return render("timeline.html", branch=row.name, timeline=shown, marked=at,
                      **{**follow(request), "live": live})

    async def reader(request: Request) -> HTMLResponse:
        row = branch_of(request)
        namespace = await pages.require_namespace(runtime, row, request.query_params.get("namespace", ""))
        budget = _budget(request)
        manager = await managers.get(row, namespace)
        view = await pages.breakdown(runtime, manager, budget)
        filters = {name: _query_text(request, name) for name in ("zone", "participant", "audience", "q")}
        shown = pages.filter_parts(view.parts, zone=filters["zone"], participant=filters["participant"],
                                   audience=filters["audience"], text=filters["q"])
        return render("reader.html", branch=row.name, view=view, parts=shown, filters=filters,
                      audiences=sorted({name for part in view.parts for block in part.blocks
                                        for name in block.audience or ()}),
                      participants=sorted({part.participant for part in view.parts}), **follow(request))

    async def covered(request: Request) -> HTMLResponse:
        row = branch_of(request)
        namespace = await pages.require_namespace(runtime, row, request.query_params.get("namespace", ""))
        shown = await pages.covered(runtime, row, await managers.get(row, namespace),
                                    request.query_params.get("summary", ""), _query_int(request, "page", None))
        return render("covered.html", branch=row.name, covered=shown, **follow(request))

    async def search(request: Request) -> HTMLResponse:
        row = branch_of(request)
        known = [line.namespace for line in await runtime.list_namespaces(row.name)]
        namespace, reader = _query_text(request, "namespace"), None
        if namespace is not None:
            namespace = await pages.require_namespace(runtime, row, namespace)
            reader = (await managers.get(row, namespace)).view_reader
            slot = pages.slot_of_namespace(runtime, namespace)
        else:
            slot = request.query_params.get("slot", "messages")
        filters = {name: _query_text(request, name) for name in ("participant", "audience", "q")}
        found = pages.search(runtime, row, slot, namespace=namespace, reader=reader, text=filters["q"],
                             participant=filters["participant"], audience=filters["audience"],
                             before=_query_int(request, "before", None),
                             summaries_of=known if namespace is None else [namespace])
        return render("search.html", branch=row.name, found=found, filters=filters, namespaces=sorted(known),
                      **follow(request))

    async def summaries(request: Request) -> HTMLResponse:
        row = branch_of(request)
        namespace = await pages.require_namespace(runtime, row, request.query_params.get("namespace", ""))
        shown = pages.summary_page(runtime, row, namespace, _query_int(request, "page", None),
                                   request.query_params.get("at"))
        return render("summaries.html", branch=row.name, summaries=shown, **follow(request))

    async def diff(request: Request) -> HTMLResponse:
        row = branch_of(request)
        a = await pages.require_namespace(runtime, row, request.query_params.get("a", ""))
        b = await pages.require_namespace(runtime, row, request.query_params.get("b", ""))
        slot = request.query_params.get("slot", "messages")
        shown = await pages.diff(runtime, row, slot, _query_int(request, "page", None),
                                 await managers.get(row, a), await managers.get(row, b), _budget(request))
        return render("diff.html", branch=row.name, diff=shown, **follow(request))

    async def ledger_manager(request: Request) -> tuple[Any, ContextManager]:
        row = branch_of(request)
        namespace = await pages.require_namespace(runtime, row, request.query_params.get("namespace", ""))
        return row, await managers.get(row, namespace)

    def index_of(request: Request, name: str) -> int:
        index = _query_int(request, name, None, 0)
        if index is None:
            raise BadRequest(f"{name} (a request's number in the ledger) is missing")
        return index

    async def history(request: Request) -> HTMLResponse:
        row, manager = await ledger_manager(request)
        shown = await pages.history(runtime, row, manager, _query_int(request, "page", None), prices)
        return render("history.html", branch=row.name, history=shown, **follow(request))

    async def one_request(request: Request) -> HTMLResponse:
        row, manager = await ledger_manager(request)
        found = await pages.entry(runtime, row, manager, index_of(request, "n"), prices)
        return render("request.html", branch=row.name, namespace=manager.namespace, priced=bool(prices),
                      sent=await pages.as_sent(manager, found),
                      newer=found.index + 1 < pages.ledger_length(runtime, row, manager.namespace))

    async def request_diff(request: Request) -> HTMLResponse:
        row, manager = await ledger_manager(request)
        a, b = [await pages.entry(runtime, row, manager, index_of(request, name), prices) for name in ("a", "b")]
        return render("request_diff.html", branch=row.name, namespace=manager.namespace, diff=await pages.request_diff(manager, a, b))

    async def audit(request: Request) -> HTMLResponse:
        row = branch_of(request)
        item = request.query_params.get("item", "")
        if not item:
            raise BadRequest("item (the id of a message or summary) is missing")
        asked = _query_text(request, "namespace")
        names = [await pages.require_namespace(runtime, row, asked)] if asked is not None else sorted(
            info.namespace for info in await runtime.list_namespaces(row.name) if pages.has_ledger(runtime, info.namespace))
        since = _query_int(request, "since", None, 0)
        lines = [await pages.audit(runtime, row, await managers.get(row, name), item, since, prices) for name in names]
        return render("audit.html", branch=row.name, item=item, lines=lines, asked=asked, **follow(request))

    routes: list[BaseRoute] = [
        Route(path, page(handler), methods=["GET"])
        for path, handler in (("/", index), ("/branch", branch), ("/timeline", timeline), ("/reader", reader),
                              ("/summaries", summaries), ("/diff", diff), ("/covered", covered),
                              ("/search", search), ("/history", history), ("/request", one_request),
                              ("/request-diff", request_diff), ("/audit", audit))
    ]
    routes.append(Mount("/static", StaticFiles(directory=HERE / "static"), name="static"))

    async def http_error(request: Request, exc: Exception) -> Response:
        # An unknown path or a method other than GET: the styled error page, as ctxrt's own errors get.
        assert isinstance(exc, HTTPException)
        response = render("error.html", exc.status_code, title=exc.detail.lower(),
                          message=f"{request.method} {request.url.path}: {exc.detail}")
        response.headers.update(exc.headers or {})
        return response

    async def server_error(request: Request, exc: Exception) -> Response:
        # A fault of the inspector's own (not a ctxrt error, which its page says): the styled page
        # naming its type, never the traceback (Starlette re-raises it after, for the server's log).
        return render("error.html", 500, title="internal error",
                      message=f"{request.method} {request.url.path}: {type(exc).__name__} (the server's log has the rest)")

    def refuse(host: str) -> Response:
        return render("error.html", 400, title="bad request",
                      message=f"the Host {host!r} isn't this machine's loopback name ({', '.join(LOOPBACK_NAMES)}): "
                              "the inspector answers only those (DNS rebinding)")

    return Starlette(routes=routes, middleware=[Middleware(LoopbackOnly, refuse=refuse)],
                     exception_handlers={404: http_error, 405: http_error, Exception: server_error})


async def serve(
    runtime: Runtime, label: str, *, port: int = 0, prices: dict[str, Price] | None = None,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Serve the inspector of ``runtime`` (opened read-only) on 127.0.0.1 until cancelled (or
    ``shutdown_trigger`` returns); ``task_status.started`` gets its URL (``port`` 0: any free one).
    ``prices``: each model's dollars per million tokens, to price recorded requests (prices.py)."""
    config = Config()
    config.bind = [f"{HOST}:{port}"]
    config.accesslog = None
    config.errorlog = logger
    managers = Managers(runtime)
    app = build_app(runtime, label, managers, prices)
    try:
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(_serve_app, app, config, shutdown_trigger)
            task_status.started(binds[0])
    finally:
        with trio.CancelScope(shield=True):
            await managers.aclose()


async def _serve_app(app: Starlette, config: Config, shutdown_trigger: Callable[[], Awaitable[None]] | None,
                     task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
    try:
        await hypercorn_serve(app, config, shutdown_trigger=shutdown_trigger, task_status=task_status)  # type: ignore[arg-type]
    except BaseExceptionGroup as group:  # hypercorn binds inside its nurseries
        taken, _ = group.split(lambda exc: isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE)
        if taken is None:
            raise
        raise OSError(errno.EADDRINUSE, f"{config.bind[0]} is taken (another ctxrt serve?): pick another port, "
                                        "or port 0 for any free one (ctxrt serve --port 0)") from None
