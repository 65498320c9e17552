"""A PostgreSQL wire proxy on a Unix socket that counts what clients send (a test helper).

Round trips are counted on the wire, where the server sees them, not inside a driver: each Sync
message ('S') a client sends is one wait for the server's answer in the extended protocol.
"""

from __future__ import annotations

import socket
import struct
import tempfile
import threading
import urllib.parse
from pathlib import Path
from types import TracebackType

_STARTUP = 196608  # protocol 3.0: the startup packet (no type byte) ends the untyped prelude


class _Link:
    """One client connection: its bytes copied both ways, its frontend messages counted."""

    def __init__(self, client: socket.socket, upstream: str) -> None:
        self.client = client
        self.server = socket.socket(socket.AF_UNIX)
        self.server.connect(upstream)
        self.syncs = 0
        self.statements = bytearray()  # every message body the client sent (for telling links apart)
        self.lock = threading.Lock()
        threading.Thread(target=self._frontend, daemon=True).start()
        threading.Thread(target=self._backend, daemon=True).start()

    def _frontend(self) -> None:
        buffer, typed = b"", False
        try:
            while chunk := self.client.recv(65536):
                self.server.sendall(chunk)
                buffer += chunk
                while True:
                    head = 5 if typed else 4
                    if len(buffer) < head:
                        break
                    length = struct.unpack("!I", buffer[head - 4:head])[0]
                    if len(buffer) < head - 4 + length:
                        break
                    message, buffer = buffer[:head - 4 + length], buffer[head - 4 + length:]
                    if not typed:
                        typed = struct.unpack("!I", message[4:8])[0] == _STARTUP
                        continue
                    with self.lock:
                        self.syncs += message[:1] == b"S"
                        self.statements += message[5:]
        except OSError:
            pass
        finally:
            self.close()

    def _backend(self) -> None:
        try:
            while chunk := self.server.recv(65536):
                self.client.sendall(chunk)
        except OSError:
            pass
        finally:
            self.close()

    def close(self) -> None:
        for end in (self.client, self.server):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def count(self) -> tuple[int, bytes]:
        with self.lock:
            return self.syncs, bytes(self.statements)


class WireCounter:
    """A proxy in front of the server a libpq ``url`` names by its socket (``host`` a directory):
    ``url`` is the same database through the proxy. ``syncs_of(marker)``: the Syncs sent so far on
    each connection that has sent ``marker`` (bytes of a statement's text)."""

    def __init__(self, url: str) -> None:
        parts = urllib.parse.urlsplit(url)
        query = urllib.parse.parse_qs(parts.query)
        port = query["port"][0]
        self._upstream = str(Path(query["host"][0]) / f".s.PGSQL.{port}")
        self._directory = tempfile.TemporaryDirectory(prefix="ctxrt-wire-")
        query["host"] = [self._directory.name]
        self.url = urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, urllib.parse.urlencode(query, doseq=True), ""))
        self._listener = socket.socket(socket.AF_UNIX)
        self._listener.bind(str(Path(self._directory.name) / f".s.PGSQL.{port}"))
        self._listener.listen()
        self._links: list[_Link] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        try:
            while True:
                client, _ = self._listener.accept()
                self._links.append(_Link(client, self._upstream))
        except OSError:
            pass

    def syncs_of(self, marker: bytes) -> list[int]:
        counts = [link.count() for link in list(self._links)]
        return [syncs for syncs, statements in counts if marker in statements]

    def __enter__(self) -> WireCounter:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        self._listener.close()
        for link in list(self._links):
            link.close()
        self._directory.cleanup()
