"""ctxrt from asyncio: the whole public API awaited from asyncio code (FastAPI and uvicorn
servers, agent frameworks), on the same trio actors, in one trio guest run per asyncio loop
(docs/asyncio.md).

This module re-exports the front's public names and defines nothing.
"""

from .front import ContextManager as ContextManager
from .front import HostState as HostState
from .front import Runtime as Runtime
from .front import open_runtime as open_runtime
from .stream import EventStream as EventStream
