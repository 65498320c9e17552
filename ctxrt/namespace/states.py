"""Every state id a namespace owns, built in one place (DESIGN §6).

Per branch a namespace has ``<ns>/reader`` (its reader record), ``<ns>/narrowing-floor``,
``<ns>/context`` (its context log), ``<ns>/strategy`` (the config it runs),
``<ns>/context-settings`` (the live settings changed in it), ``<ns>/ledger`` (whether it keeps
a request ledger) and ``<ns>/requests`` (the ledger, Q1), and its strategy's
``<ns>/<strategy>:<name>`` states. Message slots are ``messages`` (shared) or ``<ns>/messages``
(isolated). A host's own states (``Runtime.host_state``, M9) are ``host:value:<name>`` and
``host:log:<name>``: a host state's name holds no ``/`` and every namespace state's does, so no
namespace, however named, owns one, and none is read as a slot. Nothing else in ctxrt formats
these names.
"""

from __future__ import annotations

from .. import checks
from ..errors import MalformedContentError

DEFAULT_NAMESPACE = "default"
MAX_NAMESPACE_BYTES = 300  # leaves room for the longest suffix within the store's 400-byte state names
SHARED_SLOT = "messages"
_READER = "/reader"
_REQUESTS = "/requests"


def normalise_namespace(namespace: object) -> str:
    """None, ``""`` and ``"default"`` are one namespace; anything else must be a name.

    Raises ``TypeError`` for a non-string and ``MalformedContentError`` for text a state id can't hold.
    """
    if namespace is None or namespace == "":
        return DEFAULT_NAMESPACE
    return checks.name(namespace, "namespace", max_bytes=MAX_NAMESPACE_BYTES)


def slot_state(namespace: str, isolate: bool) -> str:
    return f"{namespace}/messages" if isolate else SHARED_SLOT


def is_slot(state: str) -> bool:
    """Whether ``state`` is a message slot (the shared one or a namespace's isolated one)."""
    return state == SHARED_SLOT or state.endswith("/messages")


def auxiliary_state(name: str | None) -> str:
    """The slot ``auxiliary_views`` names: None is the shared slot, a namespace its isolated one."""
    return SHARED_SLOT if name is None else f"{normalise_namespace(name)}/messages"  # raises naming "namespace"


def reader_state(namespace: str) -> str:
    return f"{namespace}{_READER}"


def floor_state(namespace: str) -> str:
    return f"{namespace}/narrowing-floor"


def context_state(namespace: str) -> str:
    return f"{namespace}/context"


def config_state(namespace: str) -> str:
    return f"{namespace}/strategy"


def settings_state(namespace: str) -> str:
    """The live context settings changed in it (strategies/settings.py)."""
    return f"{namespace}/context-settings"


def ledger_flag_state(namespace: str) -> str:
    """Whether the namespace keeps a request ledger (a value: True or False; never set is off)."""
    return f"{namespace}/ledger"


def ledger_state(namespace: str) -> str:
    """The namespace's request ledger: a log of encoded ``RequestRecord`` items (request_ledger.py)."""
    return f"{namespace}{_REQUESTS}"


def is_ledger(state: str) -> bool:
    return state.endswith(_REQUESTS)


def calibration_state(namespace: str) -> str:
    return f"{namespace}/token-calibration"


def strategy_state(namespace: str, strategy: str, name: str) -> str:
    return f"{namespace}/{strategy}:{name}"


def namespace_of_strategy_state(state: str, name: str) -> str | None:
    """The namespace whose strategy state ``<ns>/<strategy>:<name>`` is, or None for any other state."""
    suffix = f":{name}"
    if not state.endswith(suffix) or "/" not in state:
        return None
    return state[: -len(suffix)].rpartition("/")[0]


def namespace_of_reader_state(state: str) -> str | None:
    """The namespace whose reader record ``state`` is, or None for any other state."""
    return state[: -len(_READER)] if state.endswith(_READER) else None


_HOST_VALUE = "host:value:"
_HOST_LOG = "host:log:"
MAX_HOST_STATE_BYTES = 300  # as a namespace: the prefix fits within the store's 400-byte state names


def host_state_name(name: object, parameter: str = "name") -> str:
    """A host state's name: a name (``checks.name``) without ``/``, which every namespace state holds.

    Raises ``TypeError`` for a non-string and ``MalformedContentError`` naming ``parameter`` otherwise.
    """
    checked = checks.name(name, parameter, max_bytes=MAX_HOST_STATE_BYTES)
    if "/" in checked:
        raise MalformedContentError(
            parameter, f"a host state's name must not contain '/' (namespace states do): {checked!r}")
    return checked


def host_value_state(name: str) -> str:
    return f"{_HOST_VALUE}{name}"


def host_log_state(name: str) -> str:
    return f"{_HOST_LOG}{name}"


def is_host_log(state: str) -> bool:
    return state.startswith(_HOST_LOG) and "/" not in state
