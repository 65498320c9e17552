"""Refuse, with a clear error, to run ctxrt under an event loop other than trio's.

ctxrt's actors are trio tasks in trio nurseries. Awaited from asyncio, the first nursery fails
deep inside trio with ``AttributeError: 'RunContext' object has no attribute 'runner'``, which
names neither the cause nor a fix. ``require_trio`` is called at the entry points (the first
thing ``open_runtime`` does, before it touches the disk), and says both.
"""

from __future__ import annotations

import sniffio  # installed with trio, which uses it to say which library is running

from .errors import NotTrioError

BRIDGES = (
    "ctxrt runs on trio only. Run your code with trio.run(main); from asyncio code, run ctxrt's trio code "
    "in a worker thread (await asyncio.to_thread(trio.run, main)), or bridge the two loops with "
    "trio-asyncio (https://trio-asyncio.readthedocs.io)"
)


def require_trio(api: str) -> None:
    """Return if the calling task runs under trio.

    Raises:
        NotTrioError: ``api`` (e.g. ``"ctxrt.open_runtime"``) was awaited under another async
            library, or outside any; the message names the library found and how to bridge.
    """
    try:
        library = sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        library = None
    if library == "trio":
        return
    found = f"under {library}" if library else "outside any async library sniffio recognises"
    raise NotTrioError(f"{api} was awaited {found}, but {BRIDGES}")
