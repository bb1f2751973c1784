"""ASGI middlewares of the app, outermost first (service/app.py): the request body received whole under its own
budget (:class:`BodyMiddleware`), then admission control with in-flight counts for the model's routes
(:class:`InFlightMiddleware`). A request reaches admission only once its body is complete, so admission, the
in-flight counts and the deadline count work, never bytes still on their way. (Thumbnails and video frames have an
admission of their own, which knows what each will cost: service/decoding.py.)"""
from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from typing import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

SMALL_BODY = 64 * 1024      # bodies up to this many bytes (JSON queries, small images) take no upload buffer


def _response(status: int, detail: str, headers: dict[str, str] | None = None) -> tuple[Message, Message]:
    """A JSON error response as its two ASGI messages, rendered once."""
    body = json.dumps({"detail": detail}).encode()
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    head += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    return {"type": "http.response.start", "status": status, "headers": head}, \
        {"type": "http.response.body", "body": body}


async def _answer(send: Send, messages: tuple[Message, Message]) -> None:
    await send(messages[0])
    await send(messages[1])


class BodyMiddleware:
    """Receives every request body whole, under a budget of its own, before the request goes further in.

    * **Size**: a body over ``limit`` bytes is answered 413 — from ``Content-Length`` at once, or while it streams —
      so an oversized upload is never held whole.
    * **Time** (the rule of Apache's mod_reqtimeout): a body gets ``timeout_s`` seconds from its first byte wait,
      plus one second for every ``min_rate`` bytes it has sent; a body that falls behind is answered 408 (and the
      connection closed), never 503: a slow uplink is the client's budget, not the service's overload. A 9 MB photo
      at 1 MB/s needs 9 s and is allowed ``timeout_s`` + 9e6 / ``min_rate`` s.
    * **Memory**: the bytes of a body over :data:`SMALL_BODY` bytes (or sent chunked) are counted as they arrive,
      until its request is answered, against ``buffer_bytes`` for all clients and ``peer_bytes`` for its client's
      address (``scope["client"]``). An upload that would take either past its bound while other bodies hold
      some of it is answered 503 + Retry-After: at once, before its body is read (and before a client that asked
      for ``100-continue`` sends it), when its ``Content-Length`` says so; else when the bytes that do not fit
      arrive. A stalled upload holds only what it has sent — 128 connections that declared 2 MB and sent 1 KB
      hold 128 KB, not 256 MB — and one address cannot hold more than ``peer_bytes``, so no client can deny
      uploads to others. Small bodies — every JSON query — take nothing from it, so uploads cannot crowd out a
      text search.

    The request then goes on with its body replayed from memory, as the chunks it arrived in, each dropped once
    read; after it, ``receive`` is the server's again (a disconnect is still seen)."""

    def __init__(self, app: ASGIApp, limit: int, timeout_s: float, min_rate: float, buffer_bytes: int,
                 peer_bytes: int | None = None, retry_after_s: int = 1, metrics=None):
        self.app, self.limit, self.timeout_s, self.min_rate = app, limit, timeout_s, min_rate
        self.buffer_bytes, self.metrics = buffer_bytes, metrics
        self.peer_bytes = buffer_bytes if peer_bytes is None else peer_bytes
        self.held = 0                       # bytes of counted bodies received and not yet answered
        self.held_by: dict[str, int] = {}   # the same, per client address
        self.receiving = 0                  # bodies being received now
        self._too_large = _response(413, f"request body larger than {limit:,} bytes", {"connection": "close"})
        # refused before (or while) the body is read: the connection is closed rather than left to read it to its
        # end
        retry = {"retry-after": str(retry_after_s), "connection": "close"}
        self._full = _response(503, f"the service is receiving {buffer_bytes:,} bytes of uploads already; retry "
                                    f"after {retry_after_s} s", retry)
        self._peer_full = _response(503, f"this client is sending {self.peer_bytes:,} bytes of uploads already; "
                                         f"retry after {retry_after_s} s", retry)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length: int | None = None
        chunked = False
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit():
                length = int(value)
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
        if not length and not chunked:          # no body: nothing to wait for
            await self.app(scope, receive, send)
            return
        if length is not None and length > self.limit:
            await _answer(send, self._too_large)
            return
        counted = length is None or length > SMALL_BODY
        client = scope.get("client")
        peer = client[0] if client else ""
        if counted and length is not None:
            refusal = self._overflow(peer, length, 0)
            if refusal is not None:
                await _answer(send, refusal)
                return
        body = _Held(self, peer) if counted else None
        try:
            chunks = await self._receive_body(receive, send, length, body)
            if chunks is not None:
                await self.app(scope, _replay(chunks, receive), send)
        finally:
            if body is not None:
                body.release()

    def _overflow(self, peer: str, more: int, mine: int) -> tuple[Message, Message] | None:
        """The refusal when ``more`` bytes for a body from ``peer`` that holds ``mine`` already would take the
        buffer or the peer's share past its bound while other bodies hold some of it; else None."""
        for held, cap, refusal, reason in ((self.held, self.buffer_bytes, self._full, "buffer_full"),
                                           (self.held_by.get(peer, 0), self.peer_bytes, self._peer_full,
                                            "peer_full")):
            if held > mine and held + more > cap:
                if self.metrics is not None:
                    self.metrics.shed.labels("uploads", reason).inc()
                return refusal
        return None

    async def _receive_body(self, receive: Receive, send: Send, length: int | None,
                            held: _Held | None) -> deque[bytes] | None:
        """The body's chunks; None when it was answered (408, 413, 503) or the client went away."""
        chunks: deque[bytes] = deque()
        received = 0
        start = time.monotonic()
        self.receiving += 1
        self._gauge()
        try:
            while True:
                remaining = start + self.timeout_s + received / self.min_rate - time.monotonic()
                try:
                    if remaining <= 0:
                        raise TimeoutError
                    async with asyncio.timeout(remaining):
                        message = await receive()
                except TimeoutError:
                    await self._too_slow(send, received, length, time.monotonic() - start)
                    return None
                if message["type"] != "http.request":           # http.disconnect: nobody to answer
                    return None
                body = message.get("body", b"")
                if body:
                    received += len(body)
                    if received > self.limit:
                        await _answer(send, self._too_large)
                        return None
                    if held is not None:
                        refusal = self._overflow(held.peer, len(body), held.bytes)
                        if refusal is not None:
                            await _answer(send, refusal)
                            return None
                        held.add(len(body))
                    chunks.append(body)
                if not message.get("more_body", False):
                    return chunks
        finally:
            self.receiving -= 1
            self._gauge()

    async def _too_slow(self, send: Send, received: int, length: int | None, elapsed: float) -> None:
        if self.metrics is not None:
            self.metrics.body_timeouts.inc()
        of = f" of {length:,}" if length is not None else ""
        await _answer(send, _response(
            408, f"the request body arrived too slowly: {received:,}{of} bytes in {elapsed:.1f} s; a body gets "
                 f"{self.timeout_s:g} s plus 1 s for every {self.min_rate:,.0f} bytes sent", {"connection": "close"}))

    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.bodies_receiving.set(self.receiving)


class _Held:
    """The bytes one body holds of :class:`BodyMiddleware`'s buffer and of its client's share."""

    def __init__(self, owner: BodyMiddleware, peer: str):
        self.owner, self.peer, self.bytes = owner, peer, 0

    def add(self, n: int) -> None:
        self.bytes += n
        self.owner.held += n
        self.owner.held_by[self.peer] = self.owner.held_by.get(self.peer, 0) + n

    def release(self) -> None:
        owner = self.owner
        owner.held -= self.bytes
        left = owner.held_by.get(self.peer, 0) - self.bytes
        if left > 0:
            owner.held_by[self.peer] = left
        else:
            owner.held_by.pop(self.peer, None)
        self.bytes = 0


def _replay(chunks: deque[bytes], receive: Receive) -> Receive:
    """A ``receive`` that gives ``chunks`` (dropping each once given), then is ``receive`` again."""
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if not replayed:
            body = chunks.popleft() if chunks else b""
            replayed = not chunks
            return {"type": "http.request", "body": body, "more_body": not replayed}
        return await receive()

    return replay


ARRIVAL = "jointspace_arrival"      # scope["state"] key: time.monotonic() when the request was admitted


class InFlightMiddleware:
    """Admission control and in-flight counts for the model's routes.

    ``admission(method, path)`` is None for a route that is not a model operation; for one, a function of whether
    the body is multipart that names the request's admission class — the batcher its operation waits in,
    ``direct`` for one that uses none (and for a body of a content type the route does not take). It is the table
    of operations' (service/operations.py, ``ServedTable.admission``), so every model route is admitted and
    counted. Counts the requests inside the app
    that will reach the model (``counts[class]``) from when their body is complete (:class:`BodyMiddleware` is
    outside this one) until the response starts — parsing and decoding included — so a batcher knows whether more
    requests are on their way (see ``DynamicBatcher.pending``). The body is not parsed here: a JSON request to a
    route with several JSON operations counts under the first's class (``/v1/search/images``: a text search even
    when it composes a query from a gallery image; at worst a text batch waits ``max_wait_ms`` for it).

    Load shedding: when ``limit`` requests are in already, one more is answered 503 + Retry-After at once, before
    any work is spent on it — the cheapest refusal there is. Every admitted request gets its admission time in
    ``scope["state"][ARRIVAL]``, from which the routes compute its deadline: the deadline starts when the request
    is complete, not when its first byte arrived. Thumbnails and video frames are not model work and do not count
    towards ``limit`` (service/decoding.py admits them)."""

    def __init__(self, app: ASGIApp, counts: dict[str, int],
                 admission: Callable[[str, str], Callable[[bool], str] | None],
                 limit: int | None = None, retry_after_s: int = 1, metrics=None, shared=None):
        """``shared``: the admission count of the whole service when this app is one of several worker
        processes (service/workers.py ``SharedAdmission``): ``limit`` then bounds the requests in every worker
        together; ``counts`` stays this worker's (its batchers' ``pending``)."""
        self.app, self.counts, self.admission, self.limit, self.metrics = app, counts, admission, limit, metrics
        self.shared = shared
        # the refusal is rendered once: under overload it is most of what the server sends, and it must cost as
        # little event-loop time as possible (every refusal is time not spent answering admitted requests)
        self._busy = _response(503, f"the service is at capacity: {limit} requests are in already; retry after "
                                    f"{retry_after_s} s", {"retry-after": str(retry_after_s)})

    def _class(self, scope: Scope) -> str | None:
        if scope["type"] != "http":
            return None
        admitted = self.admission(scope["method"], scope["path"])
        if admitted is None:
            return None
        return admitted(dict(scope.get("headers", ())).get(b"content-type", b"").lower().startswith(b"multipart/"))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        name = self._class(scope)
        if name is None:
            await self.app(scope, receive, send)
            return
        shared = self.shared
        if self.limit is not None and (sum(self.counts.values()) >= self.limit if shared is None
                                       else not shared.enter(self.limit)):
            if self.metrics is not None:
                self.metrics.shed.labels("admission", "queue_full").inc()
            await _answer(send, self._busy)
            return
        scope.setdefault("state", {})[ARRIVAL] = time.monotonic()
        self.counts[name] += 1
        self._gauge()
        counted = True

        def done() -> None:
            nonlocal counted
            if counted:
                counted = False
                self.counts[name] -= 1
                if shared is not None and self.limit is not None:
                    shared.leave()
                self._gauge()

        async def send_wrapper(message) -> None:
            # answered: the request has left the batcher. Counting until the task ends instead would let a
            # keep-alive client's next request find itself "not alone" and wait max_wait_ms for nobody.
            if message["type"] == "http.response.start":
                done()
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            done()

    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.in_flight.set(sum(self.counts.values()))
