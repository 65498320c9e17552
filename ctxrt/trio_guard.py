"""Refuse, with a clear error, to run ctxrt under an event loop other than trio's.

ctxrt's actors are trio tasks in trio nurseries. Awaited from asyncio, the first nursery fails
deep inside trio with ``AttributeError: 'RunContext' object has no attribute 'runner'``, which
names neither the cause nor a fix. ``require_trio`` is called at the entry points (the first
thing ``open_runtime`` does, before it touches the disk), and says both: asyncio code uses
``ctxrt.aio``, the same API on a trio guest run in its own loop.
"""

from __future__ import annotations

import sniffio  # installed with trio, which uses it to say which library is running

from .errors import NotTrioError

BRIDGES = (
    "ctxrt.open_runtime runs on trio. From asyncio code (FastAPI, uvicorn, agent frameworks) use ctxrt.aio, the "
    "same API awaited from asyncio: async with ctxrt.aio.open_runtime(path) as rt: ... (docs/asyncio.md); "
    "from trio code, run it with trio.run(main)"
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
