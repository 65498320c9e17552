"""The whole exception tree (docs/api.md, Errors).

Every message says what was refused and why, and names the namespace, branch, reader(s) or
place involved. A refused call changes nothing in the store.
"""

from __future__ import annotations

import attrs


class CtxrtError(Exception):
    """Base class of every error ctxrt raises on purpose."""


class MalformedContentError(CtxrtError, ValueError):
    """Content, metadata or an audience was refused at the edge; nothing was stored.

    ``path`` names the place, e.g. ``content[2].source.media_type``.
    """

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


class ReaderConflictError(CtxrtError):
    """A namespace records another reader (or a reader where the manager compiles for none)."""


class ValueConflictError(CtxrtError):
    """A conditional store write found another value stored (another process wrote it first)."""

    def __init__(self, state: str, stored: object, message: str | None = None) -> None:
        self.state = state
        self.stored = stored
        super().__init__(message or f"state {state!r} holds {stored!r}, not the value this write expected")


class NarrowingRefusedError(CtxrtError):
    """An edit would hide a block that compression may already have read."""


class StrategyRefusedError(CtxrtError):
    """A strategy was refused, e.g. one that doesn't mark compression reads under a reader."""


class ConfigConflictError(CtxrtError):
    """An open disagrees with the configuration of the running namespace actor."""


class LedgerOffError(CtxrtError):
    """``record_request`` on a namespace that keeps no request ledger (open it with ``ledger=True``, Q2)."""


class MessageNotFoundError(CtxrtError, KeyError):
    """No message with this id on the manager's branch and slot."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class BranchNotFoundError(CtxrtError, KeyError):
    """No branch of this name."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class BranchExistsError(CtxrtError):
    """A branch of this name already exists."""


class ManagerClosedError(CtxrtError):
    """The manager was closed (or its runtime was)."""


class StoreLockedError(CtxrtError):
    """Another runtime writes this store; ``path`` names the lock file."""

    def __init__(self, path: str, detail: str = "") -> None:
        self.path = path
        message = f"store is locked by another writing runtime: {path}"
        if detail:
            message += f" ({detail})"
        super().__init__(message)


class ReadOnlyStoreError(CtxrtError):
    """A write was attempted through a runtime opened with ``readonly=True``, or a PostgreSQL hot
    standby (a read-only replica) was opened to write."""


class StoreFormatError(CtxrtError):
    """The store records a format this version doesn't read (or isn't a ctxrt store)."""


class StoreCorruptError(CtxrtError):
    """The store's files are damaged; ``path`` names the file and ``what`` says what is wrong.

    Raised at open when the files fail the checks made before LMDB reads them (K7), and by a
    read or write that meets a record that doesn't decode. Nothing is written to a damaged store.
    """

    def __init__(self, path: str, what: str) -> None:
        self.path = path
        self.what = what
        where = "store" if "://" in path else "store file"  # a database URL, or LMDB's data file
        super().__init__(f"{where} {path} is damaged: {what}")


class StoreFullError(CtxrtError):
    """The disk or the map can't take the write; nothing of the refused batch was written (L6).

    ``path`` names the data file. The runtime keeps serving reads, and writes again once space
    is freed.
    """

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"the store at {path} can't take the write: {reason}; nothing was written")


class StoreUnavailableError(CtxrtError):
    """The store's database can't be reached or dropped the connection; ``url`` names it without
    credentials. A write it answers was not acknowledged; when ``reason`` says the connection was
    lost during the batch, whether it committed is unknown (as with any database client)."""

    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.reason = reason
        super().__init__(f"store database {url} is unavailable: {reason}")


class StoreUnsupportedError(CtxrtError):
    """The database's server lacks something a ctxrt store relies on (a server that speaks
    PostgreSQL's protocol but whose session advisory locks exclude no one, as CockroachDB's);
    ``url`` names it without credentials, ``reason`` says what is missing. Nothing was written."""

    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.reason = reason
        super().__init__(f"store database {url} can't hold a ctxrt store: {reason}")


class StorePermissionError(CtxrtError, PermissionError):
    """The store's directory or files can't be opened as asked (permissions, a read-only filesystem).

    ``path`` names the file or directory refused. A writer on a store this user may only read
    can open it with ``readonly=True`` instead.
    """

    def __init__(self, path: str, reason: str, errno: int | None = None) -> None:
        CtxrtError.__init__(self, f"{path}: {reason}")
        self.path = path
        self.reason = reason
        self.errno = errno
        self.filename = path

    def __str__(self) -> str:  # OSError would format its own fields
        return str(self.args[0]) if self.args else ""


class UnknownStateError(CtxrtError, KeyError):
    """A write or read named a state that was never registered."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class StateKindError(CtxrtError, TypeError):
    """An operation doesn't fit the state's kind (an append to a value state, say)."""


class RuntimeClosedError(CtxrtError):
    """The runtime (or one of its actors) has stopped and can't answer."""


@attrs.frozen
class OverBudgetDiagnostics:
    """Why a compile that refuses rather than drops (``enforce_budget``, docs/behaviours.md T11)
    was refused: the zones' tokens as it would have shown them, what the middle needs at the
    fold it reached (``middle_needed_tokens``), that fold (each middle chunk's id and level, 0
    raw, oldest first; empty without adaptive resolution) and its ``deepest_level`` (the coarsest
    shown), and what it lacked: the keys of the compression units that would make the missing
    summaries (a chunk's id for its level-1 summary, the merged summaries' ids, comma-separated,
    for a merge), as ``health().quarantined`` names units."""

    head_tokens: int = 0
    summary_tokens: int = 0
    middle_raw_tokens: int = 0
    tail_tokens: int = 0
    middle_needed_tokens: int = 0
    levels: tuple[tuple[str, int], ...] = ()
    deepest_level: int = 0
    lacking: tuple[str, ...] = ()


class OverBudgetError(CtxrtError):
    """Even the newest message does not fit the budget, or (``enforce_budget``) the history
    doesn't at full folding; ``diagnostics`` says why in the second case (else None)."""

    def __init__(self, message: str, *, budget: int, actual: int,
                 diagnostics: OverBudgetDiagnostics | None = None) -> None:
        self.budget = budget
        self.actual = actual
        self.diagnostics = diagnostics
        super().__init__(message)


class EmptyRequestError(CtxrtError):
    """A compile holds no message the API could take (P8, P10): the slot is empty in the
    reader's view, or nothing fits the budget. ``to_anthropic``, ``to_openai_chat`` and
    ``to_openai_responses`` raise it rather than return an empty message list, which the APIs refuse."""


class InvalidRequestError(CtxrtError, ValueError):
    """``to_anthropic(strict=True)`` made a body the Messages API would refuse (P8), or
    ``to_openai_chat``/``to_openai_responses`` one that breaks an OpenAI rule (P11).

    ``violations`` lists each broken rule with its place (``messages[3].content[0]: ...``);
    ``api`` names whose rules they are.
    """

    def __init__(self, violations: list[str], *, api: str = "Messages API") -> None:
        self.violations = tuple(violations)
        self.api = api
        shown = "; ".join(violations[:10]) + (f"; and {len(violations) - 10} more" if len(violations) > 10 else "")
        super().__init__(f"the request body breaks {len(violations)} {api} rule(s): {shown}")


class ModelError(CtxrtError):
    """A model call failed; ``retryable`` says whether trying again may help."""

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        self.retryable = retryable
        super().__init__(message)


class NotTrioError(CtxrtError, RuntimeError):
    """A ctxrt entry point was awaited under another async library (asyncio, say), not trio."""
