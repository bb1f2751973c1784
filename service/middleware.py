"""ASGI middlewares of the app, outermost first (service/app.py): the request body received whole under its own
budget (:class:`BodyMiddleware`), then admission control with in-flight counts for the model's routes and for
thumbnails (:class:`InFlightMiddleware`). A request reaches admission only once its body is complete, so
admission, the in-flight counts and the deadline count work, never bytes still on their way."""
from __future__ import annotations

import asyncio
import json
import re
import time
from collections import deque

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
    * **Memory**: a body over :data:`SMALL_BODY` bytes reserves its ``Content-Length`` (``limit`` when it is sent
      chunked) of ``buffer_bytes`` from when it starts to when its request is answered; when that would exceed
      ``buffer_bytes`` it is answered 503 + Retry-After at once, before its body is read (and before a client
      that asked for ``100-continue`` sends it). Small bodies — every JSON query — take nothing from it, so stalled
      uploads cannot crowd out a text search.

    The request then goes on with its body replayed from memory, as the chunks it arrived in, each dropped once
    read; after it, ``receive`` is the server's again (a disconnect is still seen)."""

    def __init__(self, app: ASGIApp, limit: int, timeout_s: float, min_rate: float, buffer_bytes: int,
                 retry_after_s: int = 1, metrics=None):
        self.app, self.limit, self.timeout_s, self.min_rate = app, limit, timeout_s, min_rate
        self.buffer_bytes, self.metrics = buffer_bytes, metrics
        self.reserved = 0                   # bytes of the buffer taken by the large bodies in the service now
        self.receiving = 0                  # bodies being received now
        self._too_large = _response(413, f"request body larger than {limit:,} bytes", {"connection": "close"})
        # refused before the body was read: the connection is closed rather than left to read it to its end
        self._full = _response(503, f"the service is receiving {buffer_bytes:,} bytes of uploads already; retry "
                                    f"after {retry_after_s} s", {"retry-after": str(retry_after_s),
                                                                 "connection": "close"})

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
        reserve = length if length is not None else self.limit
        if reserve <= SMALL_BODY:
            reserve = 0
        elif self.reserved and self.reserved + reserve > self.buffer_bytes:
            self._shed()
            await _answer(send, self._full)
            return
        self.reserved += reserve
        try:
            chunks = await self._receive_body(receive, send, length)
            if chunks is not None:
                await self.app(scope, _replay(chunks, receive), send)
        finally:
            self.reserved -= reserve

    async def _receive_body(self, receive: Receive, send: Send, length: int | None) -> deque[bytes] | None:
        """The body's chunks; None when it was answered (408, 413) or the client went away."""
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

    def _shed(self) -> None:
        if self.metrics is not None:
            self.metrics.shed.labels("uploads", "buffer_full").inc()

    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.bodies_receiving.set(self.receiving)


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
_IMAGE_PATH = re.compile(r"/v1/images/[^/]+$")


def _is_thumbnail(scope: Scope) -> bool:
    """``GET /v1/images/{id}?size=…``: a thumbnail, decoded and encoded again (the file itself is only read)."""
    if scope["method"] not in ("GET", "HEAD") or not _IMAGE_PATH.search(scope["path"]):
        return False
    return any(part.split(b"=", 1)[0] == b"size" for part in scope.get("query_string", b"").split(b"&"))


class InFlightMiddleware:
    """Admission control and in-flight counts for the model's routes, and for thumbnails.

    Counts the requests inside the app that will reach the model (``counts[name]``: ``text`` searches, ``image``
    uploads to caption search, ``compose``d queries uploaded with an image, ``caption`` generation,
    ``paraphrase`` generation, and ``direct`` for the model routes that use no batcher — a caption search by
    gallery image id, and requests that will be refused for their content type), from when their body is complete
    (:class:`BodyMiddleware` is outside this one) until the response starts — parsing and decoding included — so
    a batcher knows whether more requests are on their way (see ``DynamicBatcher.pending``). A JSON request to
    ``/v1/search/images`` counts as a text search even when it composes a query from a gallery image (the body
    is not parsed here): at worst a text batch waits ``max_wait_ms`` for it.

    Load shedding: when ``limit`` requests are in already, one more is answered 503 + Retry-After at once, before
    any work is spent on it — the cheapest refusal there is. Every admitted request gets its admission time in
    ``scope["state"][ARRIVAL]``, from which the routes compute its deadline: the deadline starts when the request
    is complete, not when its first byte arrived.

    Thumbnails (``GET /v1/images/{id}?size=``) have a bound of their own, ``thumbnail_limit`` being made at once
    (one more: 503 + Retry-After at once): they are not model work and do not count towards ``limit``, so a flood
    of them is refused without crowding out a search."""

    def __init__(self, app: ASGIApp, counts: dict[str, int], limit: int | None = None, retry_after_s: int = 1,
                 metrics=None, thumbnail_limit: int | None = None):
        self.app, self.counts, self.limit, self.metrics = app, counts, limit, metrics
        self.thumbnail_limit, self.thumbnails = thumbnail_limit, 0
        # the refusals are rendered once: under overload they are most of what the server sends, and they must
        # cost as little event-loop time as possible (every refusal is time not spent answering admitted requests)
        retry = {"retry-after": str(retry_after_s)}
        self._busy = _response(503, f"the service is at capacity: {limit} requests are in already; retry after "
                                    f"{retry_after_s} s", retry)
        self._thumbnails_busy = _response(503, f"the service is at capacity: {thumbnail_limit} thumbnails are "
                                               f"being made already; retry after {retry_after_s} s", retry)

    def _batcher(self, scope: Scope) -> str | None:
        if scope["type"] != "http" or scope["method"] != "POST":
            return None
        path = scope["path"]
        multipart = dict(scope.get("headers", ())).get(b"content-type", b"").lower().startswith(b"multipart/")
        if path.endswith("/v1/search/images"):
            return "compose" if multipart else "text"
        if path.endswith("/v1/search/captions"):
            return "image" if multipart else "direct"
        if path.endswith("/v1/captions"):
            return "caption" if multipart else "direct"
        if path.endswith("/v1/paraphrases"):
            return "paraphrase"
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        name = self._batcher(scope)
        if name is None:
            if scope["type"] == "http" and self.thumbnail_limit is not None and _is_thumbnail(scope):
                await self._thumbnail(scope, receive, send)
            else:
                await self.app(scope, receive, send)
            return
        if self.limit is not None and sum(self.counts.values()) >= self.limit:
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

    async def _thumbnail(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert self.thumbnail_limit is not None
        if self.thumbnails >= self.thumbnail_limit:
            if self.metrics is not None:
                self.metrics.shed.labels("thumbnail", "queue_full").inc()
            await _answer(send, self._thumbnails_busy)
            return
        self.thumbnails += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.thumbnails -= 1

    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.in_flight.set(sum(self.counts.values()))
