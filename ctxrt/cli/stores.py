"""How the read-only commands open a store, and find the branch and namespace they were given.

``inspect``, ``messages``, ``compile``, ``summaries`` and ``serve`` open a store (a directory
or a postgresql:// URL) the same way, read-only with its pages checked, so they work beside a
live writer; those given a ``--branch`` or ``--namespace`` refuse an unknown one with the names
the store has. That is one rule for all of them, so it stands alone.
"""

from __future__ import annotations

import argparse
from contextlib import AbstractAsyncContextManager

from ..errors import BranchNotFoundError, CtxrtError
from ..runtime import Runtime, open_runtime


STORE_HELP = "the store: a directory, or a postgresql:// URL"


class NotFoundError(CtxrtError):
    """The store has no namespace or slot of the name the command was given."""


def open_readonly(store: str) -> AbstractAsyncContextManager[Runtime]:
    """The store at ``store``, opened read-only with its pages checked."""
    return open_runtime(store, readonly=True, check_pages=True)


async def require_branch(runtime: Runtime, args: argparse.Namespace) -> None:
    """Raises BranchNotFoundError naming the store's branches, if ``--branch`` isn't one."""
    names = [info.name for info in await runtime.list_branches()]
    if args.branch not in names:
        raise BranchNotFoundError(f"no branch {args.branch!r} in {args.store}; its branches: {', '.join(names)}")


async def require_namespace(runtime: Runtime, args: argparse.Namespace) -> str:
    """The namespace ``--namespace`` names, normalised; NotFoundError if the store has none such.

    A read-only open of an unknown namespace would compile the shared slot as if it existed.
    """
    await require_branch(runtime, args)
    namespace = args.namespace or "default"  # "" and "default" are one namespace (API.md)
    known = sorted(info.namespace for info in await runtime.list_namespaces(args.branch))
    if namespace not in known:
        listing = f"its namespaces: {', '.join(known)}" if known else "it has no namespaces yet"
        raise NotFoundError(f"no namespace {namespace!r} in {args.store} on branch {args.branch!r}; {listing}")
    return namespace
