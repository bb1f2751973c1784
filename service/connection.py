"""The HTTP connection protocol ``jointspace serve`` runs uvicorn with: uvicorn's own (httptools, else h11) plus a
deadline for the request line and headers.

uvicorn bounds the idle time between two requests of a kept-alive connection (``timeout_keep_alive``) and nothing
else before a request reaches the application: a client that opens a connection and sends nothing, or sends its
headers a byte at a time ("slowloris"), holds the connection (a file descriptor and a slot of
``limit_concurrency``) for as long as it likes. Here every request's line and headers must be complete within
``header_timeout_s`` seconds of the connection opening, or of the request's first byte on a kept-alive connection;
past that the client gets ``408 Request Timeout`` (a JSON ``detail``) and the connection is closed. The body has
its own budget, enforced in the application (``body_timeout_s``, service/app.py).
"""
from __future__ import annotations

import asyncio
import json
from typing import Any

from uvicorn.protocols.http.auto import AutoHTTPProtocol


class HeaderDeadline(asyncio.Protocol):
    """A mixin for uvicorn's HTTP protocols (``HttpToolsProtocol``, ``H11Protocol``): both create a new
    ``RequestResponseCycle`` (``self.cycle``) the moment a request's headers are complete, so a cycle other than
    the one current when the clock started means the headers are in."""
    header_timeout_s: float = 10.0
    # set by uvicorn's protocol classes
    cycle: Any
    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    server_state: Any

    _header_timer: asyncio.TimerHandle | None = None
    _waiting_since: Any = None                 # the cycle that was current when the clock started

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._start_clock()

    def data_received(self, data: bytes) -> None:
        if self._header_timer is None and (self.cycle is None or self.cycle.response_complete):
            self._start_clock()                # the first bytes of the next request on a kept-alive connection
        super().data_received(data)
        if self._header_timer is not None and self.cycle is not self._waiting_since:
            self._stop_clock()                 # its headers are complete

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_clock()
        super().connection_lost(exc)

    def _start_clock(self) -> None:
        self._waiting_since = self.cycle
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def _stop_clock(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if self.cycle is not self._waiting_since or self.transport.is_closing():
            return
        body = json.dumps({"detail": f"the request line and headers did not arrive within "
                                     f"{self.header_timeout_s:g} s"}).encode()
        head = [b"HTTP/1.1 408 Request Timeout\r\n"]
        head += [name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers]
        head += [b"content-type: application/json\r\n", b"content-length: %d\r\n" % len(body),
                 b"connection: close\r\n\r\n"]
        self.transport.write(b"".join(head) + body)
        self.transport.close()


def http_protocol(header_timeout_s: float) -> type[asyncio.Protocol]:
    """uvicorn's default HTTP protocol class with the header deadline (``uvicorn.run(..., http=...)``)."""
    return type("DeadlineHTTPProtocol", (HeaderDeadline, AutoHTTPProtocol), {"header_timeout_s": header_timeout_s})
