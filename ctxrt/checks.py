"""Argument checks at the public edge (M7): before anything is sent or written.

A wrong type raises ``TypeError`` naming the parameter; a wrong value a ``ValueError`` subclass
(``MalformedContentError`` with ``.path`` for names and readers). Pure functions, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from .errors import MalformedContentError

# Longer than any host waits; keeps clock arithmetic finite (a hold of 10**400 s overflowed it).
MAX_TIMEOUT_S = 10.0**9


def _kind(value: object) -> str:
    return type(value).__name__


def name(value: Any, parameter: str, *, max_bytes: int | None = None) -> str:
    """A branch, reader, namespace or message-id-like name: non-empty text a store key can hold."""
    checked = text(value, parameter)
    if not checked:
        raise MalformedContentError(parameter, "must not be empty")
    if "\x00" in checked:
        raise MalformedContentError(parameter, "must not contain NUL")
    if max_bytes is not None and (size := len(checked.encode("utf-8"))) > max_bytes:
        raise MalformedContentError(parameter, f"must be at most {max_bytes} bytes of UTF-8, not {size}")
    return checked


def optional_name(value: Any, parameter: str) -> str | None:
    return None if value is None else name(value, parameter)


def text(value: Any, parameter: str) -> str:
    """Any text a store can hold (may be empty)."""
    if not isinstance(value, str):
        raise TypeError(f"{parameter} must be a string, not {_kind(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise MalformedContentError(parameter, "must be valid text (it holds a lone surrogate)") from None
    return value


def optional_text(value: Any, parameter: str) -> str | None:
    return None if value is None else text(value, parameter)


def flag(value: Any, parameter: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{parameter} must be True or False, not {_kind(value)}")
    return value


def shown(value: Any) -> str:
    """``repr(value)`` for an error message; an integer too long to print (Python refuses past
    4,300 digits) is shown by its size."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 256:
        return f"an integer of {value.bit_length():,} bits"
    return repr(value)


def integer(value: Any, parameter: str, *, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{parameter} must be an integer, not {_kind(value)}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{parameter} must be at least {minimum}, not {shown(value)}")
    return value


def optional_integer(value: Any, parameter: str, *, minimum: int | None = None) -> int | None:
    return None if value is None else integer(value, parameter, minimum=minimum)


def timeout(value: Any, parameter: str) -> float:
    """A positive, finite number of seconds, at most ``MAX_TIMEOUT_S``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{parameter} must be a number of seconds, not {_kind(value)}")
    try:
        seconds = float(value)
    except OverflowError:
        seconds = math.inf
    if not 0 < seconds <= MAX_TIMEOUT_S:
        raise ValueError(f"{parameter} must be a positive number of seconds up to {MAX_TIMEOUT_S:g}, not {shown(value)}")
    return seconds


def names(value: Any, parameter: str) -> tuple[str, ...]:
    """A sequence (not a string) of names, such as message ids."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{parameter} must be a sequence of strings, not {_kind(value)}")
    return tuple(name(item, f"{parameter}[{index}]") for index, item in enumerate(value))


def sequence(value: Any, parameter: str) -> tuple[Any, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{parameter} must be a sequence, not {_kind(value)}")
    return tuple(value)


T = TypeVar("T")


def instances(value: Any, parameter: str, kind: type[T]) -> tuple[T, ...]:
    """A sequence whose every item is a ``kind``."""
    items = sequence(value, parameter)
    for index, item in enumerate(items):
        if not isinstance(item, kind):
            raise TypeError(f"{parameter}[{index}] must be a {kind.__name__}, not {_kind(item)}")
    return items


def mapping_with_names(value: Any, parameter: str) -> Mapping[str, Any] | None:
    """None or a mapping whose keys are non-empty strings."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TypeError(f"{parameter} must be a mapping or None, not {_kind(value)}")
    for key in value:
        if not isinstance(key, str):
            raise TypeError(f"{parameter} keys must be strings, not {_kind(key)} ({key!r})")
        name(key, f"{parameter}[{key!r}]")
    return value


def optional_instance(value: Any, parameter: str, kind: type[T]) -> T | None:
    if value is not None and not isinstance(value, kind):
        raise TypeError(f"{parameter} must be a {kind.__name__} or None, not {_kind(value)}")
    return value


def callable_or_none(value: Any, parameter: str) -> Any:
    if value is not None and not callable(value):
        raise TypeError(f"{parameter} must be callable or None, not {_kind(value)}")
    return value
