"""Live context settings: what ``update_context_settings`` changes in a running namespace, how a
change is checked, and how the changes are stored (docs/behaviours.md T14).

A namespace stores the *changes* made to it, with the description of the strategy config they
were made under (``catalog.describe``): they override that config's values for as long as the
namespace runs an equal config (a reopen with the same config keeps them, a fork carries them);
under another config (``set_strategy``, a reopen with other values) only the default budget,
which is the namespace's rather than its strategy's, stays in force. A strategy that takes the
window and pace settings is a ``LiveSettings``; the others take the default budget only. Pure
data and functions: the namespace machine swaps the settings at one mailbox turn.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import attrs

from ..budget import Budget, non_negative_int
from ..errors import StrategyRefusedError
from .base import at_least, flag

logger = logging.getLogger("ctxrt.namespace")

BUDGET = "default_budget"


@attrs.frozen
class StrategySettings:
    """The settings a ``LiveSettings`` strategy runs with; validated as its config's fields are."""

    head_window_tokens: int = attrs.field(validator=non_negative_int)
    recent_window_tokens: int = attrs.field(validator=non_negative_int)
    target_chunk_tokens: int = attrs.field(validator=at_least(1))
    merge_threshold: int = attrs.field(validator=at_least(2))
    auto_tick: bool = attrs.field(validator=flag)


STRATEGY_SETTINGS = tuple(field.name for field in attrs.fields(StrategySettings))
NAMES = (BUDGET, *STRATEGY_SETTINGS)


@attrs.frozen
class ContextSettings:
    """A namespace's live settings (``ContextManager.context_settings``): the budget a compile
    without one uses (None: ``Budget()``), and the windows, chunk target, merge threshold and
    auto-tick its strategy runs with (None: its strategy has no such setting)."""

    default_budget: Budget | None = None
    head_window_tokens: int | None = None
    recent_window_tokens: int | None = None
    target_chunk_tokens: int | None = None
    merge_threshold: int | None = None
    auto_tick: bool | None = None


@runtime_checkable
class LiveSettings(Protocol):
    """A strategy whose windows, chunk target, merge threshold and auto-tick change while it runs."""

    def default_settings(self) -> StrategySettings:
        """The settings its config gives."""
        ...

    def use_settings(self, settings: StrategySettings) -> None:
        """Run with ``settings`` from the next call on; what it holds (chunks closed, summaries,
        work in flight) stays valid."""
        ...


def checked(changes: Mapping[str, Any]) -> dict[str, Any]:
    """``changes`` checked, in ``NAMES`` order.

    Raises:
        TypeError: a name that isn't a setting (named, with the settings listed).
        ValueError: a value the setting refuses, naming it (None is refused but for ``default_budget``).
    """
    unknown = [name for name in changes if name not in NAMES]
    if unknown:
        raise TypeError(f"no context setting {unknown[0]!r}; the settings are {', '.join(NAMES)}")
    fields = attrs.fields_dict(StrategySettings)
    for name, value in changes.items():
        if name == BUDGET:
            if value is not None and not isinstance(value, Budget):
                raise ValueError(f"default_budget must be a Budget or None, got {value!r}")
        else:
            validate = fields[name].validator
            assert validate is not None
            validate(None, fields[name], value)
    return {name: changes[name] for name in NAMES if name in changes}


def refuse_unsupported(strategy: object, name: str, changes: Mapping[str, Any]) -> None:
    """Raise ``StrategyRefusedError`` naming the first of ``changes`` strategy ``name`` doesn't take."""
    if isinstance(strategy, LiveSettings):
        return
    for setting in changes:
        if setting != BUDGET:
            raise StrategyRefusedError(f"strategy {name!r} has no live setting {setting!r}; it takes {BUDGET} only")


def apply(strategy: object, changes: Mapping[str, Any]) -> ContextSettings:
    """Run ``strategy`` with its config's settings overridden by ``changes`` (``checked``, and taken
    by it: ``refuse_unsupported``); the settings in force, as reported."""
    budget = changes.get(BUDGET)
    if not isinstance(strategy, LiveSettings):
        return ContextSettings(budget)
    running = attrs.evolve(strategy.default_settings(), **{k: v for k, v in changes.items() if k != BUDGET})
    strategy.use_settings(running)
    return ContextSettings(budget, **attrs.asdict(running))


def record(changes: Mapping[str, Any], described: Any) -> dict[str, Any]:
    """``changes`` as stored (JSON), with the description of the config they were made under."""
    data = dict(changes)
    budget = data.get(BUDGET)
    if budget is not None:
        data[BUDGET] = [budget.max_tokens, budget.reserve_for_response]
    return {"config": described, "changes": data}


def in_force(stored: Any, described: Any, where: str = "the namespace") -> dict[str, Any]:
    """The changes stored in ``stored`` (``record``'s) that hold under the config described as
    ``described``: all of them under the config they were made under, else the default budget.
    A record this version can't read (another version's, a host's bug), checked value by value as
    ``update_context_settings`` checks them, holds nothing: the config's values are in force, and
    an ERROR naming ``where`` (the namespace and branch) says the live changes were lost."""
    if stored is None:
        return {}
    try:
        if not isinstance(stored, dict) or not isinstance(stored.get("changes"), dict):
            raise ValueError("not a record of changes")
        data = dict(stored["changes"])
        budget = data.get(BUDGET)
        if budget is not None:
            if not isinstance(budget, (list, tuple)) or len(budget) != 2:
                raise ValueError(f"default_budget must be stored as [max_tokens, reserve_for_response], got {budget!r}")
            data[BUDGET] = Budget(*budget)
        changes = checked(data)
    except (TypeError, ValueError) as exc:
        logger.error("the stored context settings %r of %s can't be read (%s); running with the config's settings: "
                     "the live changes made before are lost", stored, where, exc)
        return {}
    if stored.get("config") != described:
        return {BUDGET: changes[BUDGET]} if BUDGET in changes else {}
    return changes
