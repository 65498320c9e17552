"""An adapter's arguments checked: the ``ctxrt.aio`` manager it writes through, its budget and
the agent it speaks for, before anything is written. Apart from ``blocks`` because it names the
runtime (the asyncio front's manager), which the pure rules there don't load.
"""

from __future__ import annotations

from typing import Any

from .. import aio, checks
from ..budget import Budget
from .blocks import PERSON, RESERVED


def adapter_arguments(kind: str, manager: Any, budget: Any, agent: Any) -> tuple[aio.ContextManager, Budget, str]:
    """An adapter's ``manager``, ``budget`` and ``agent``, checked as ctxrt's API checks its own
    arguments (``TypeError`` or ``ValueError`` naming the parameter), before anything is written;
    an agent named as a role (``RESERVED``) is refused (I14)."""
    if not isinstance(manager, aio.ContextManager):
        raise TypeError(f"{kind}: manager must be a ctxrt.aio ContextManager (from ctxrt.aio.open_runtime(...).open), "
                        f"not {type(manager).__name__}")
    if manager.view_reader is None:
        raise ValueError(f"{kind} needs a manager opened with view_reader=<the agent's reader>")
    checks.optional_instance(budget, "budget", Budget)
    checks.optional_name(agent, "agent")
    speaks = agent if agent is not None else manager.view_reader
    if speaks.lower() in RESERVED or speaks.lower().startswith(PERSON):
        raise ValueError(f"{kind} agent {speaks!r} (default: the manager's reader) is a name the request forms read as "
                         f"a role ({', '.join(RESERVED)}) or a person's escape ({PERSON}...): name the agent otherwise")
    return manager, budget if budget is not None else Budget(), speaks
