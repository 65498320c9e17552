"""The bundled strategy configs as plain data, so a namespace can record the config it runs and a
reader (``ctxrt compile``, a reopen) can rebuild exactly that config."""

from __future__ import annotations

from typing import Any

import attrs

from .autobiographical import Autobiographical
from .knowledge import Knowledge
from .passthrough import Passthrough
from .windowed import WindowedPassthrough

_KINDS: dict[str, type] = {
    "passthrough": Passthrough,
    "windowed": WindowedPassthrough,
    "autobiographical": Autobiographical,
    "knowledge": Knowledge,
}
_NAMES = {kind: name for name, kind in _KINDS.items()}


def describe(config: Any) -> dict[str, Any] | None:
    """A bundled config as JSON-ready data (``{"kind": ..., field: value...}``); None for any
    other strategy (a host's own) and for one holding a host's function (``chunk_boundary``),
    which can't be rebuilt from data."""
    name = _NAMES.get(type(config))
    if name is None or (isinstance(config, Autobiographical) and config.chunk_boundary is not None):
        return None  # a host's function can't be rebuilt from data
    fields = {f.name: getattr(config, f.name) for f in attrs.fields(type(config)) if f.init}
    return {"kind": name, **fields}


def restore(data: Any) -> Any:
    """The config ``describe`` made ``data`` from, or None if ``data`` isn't one (another version's,
    a host's own strategy, damage)."""
    if not isinstance(data, dict) or data.get("kind") not in _KINDS:
        return None
    kind = _KINDS[data["kind"]]
    names = {f.name for f in attrs.fields(kind) if f.init}
    fields = {key: value for key, value in data.items() if key != "kind"}
    if not set(fields) <= names:
        return None
    try:
        return kind(**fields)
    except (TypeError, ValueError):
        return None
