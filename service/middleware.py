"""ASGI middlewares of the app: request-body size limit, and admission control with in-flight counts for the
model's routes."""
from __future__ import annotations

import json
import time

from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send


class BodyLimitMiddleware:
    """Refuses request bodies over ``limit`` bytes with 413, from Content-Length at once or while streaming —
    so an oversized upload is never spooled whole."""

    def __init__(self, app: ASGIApp, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers", ())).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            await JSONResponse({"detail": f"request body larger than {self.limit:,} bytes"},
                               status_code=413)(scope, receive, send)
            return
        received = 0

        async def limited_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise StarletteHTTPException(413, f"request body larger than {self.limit:,} bytes")
            return message

        await self.app(scope, limited_receive, send)


ARRIVAL = "jointspace_arrival"      # request.state key: time.monotonic() when the request reached the app


class InFlightMiddleware:
    """Admission control and in-flight counts for the model's routes.

    Counts the requests inside the app that will reach the model (``counts[name]``: ``text`` searches, ``image``
    uploads to caption search, ``compose``d queries uploaded with an image, ``caption`` generation,
    ``paraphrase`` generation, and ``direct`` for the model routes that use no batcher — a caption search by
    gallery image id, and requests that will be refused for their content type), from their first byte until the
    response starts — parsing and decoding included — so a batcher knows whether more requests are on their way
    (see ``DynamicBatcher.pending``). A JSON request to ``/v1/search/images`` counts as a text search even when it
    composes a query from a gallery image (the body is not read here): at worst a text batch waits
    ``max_wait_ms`` for it.

    Load shedding: when ``limit`` requests are in already, one more is answered 503 + Retry-After at once, before
    its body is read — the cheapest refusal there is. Every admitted request gets its arrival time in
    ``scope["state"][ARRIVAL]``, from which the routes compute its deadline."""

    def __init__(self, app: ASGIApp, counts: dict[str, int], limit: int | None = None, retry_after_s: int = 1,
                 metrics=None):
        self.app, self.counts, self.limit, self.metrics = app, counts, limit, metrics
        # the refusal is rendered once: under overload it is most of what the server sends, and it must cost
        # as little event-loop time as possible (every refusal is time not spent answering admitted requests)
        body = json.dumps({"detail": f"the service is at capacity: {limit} requests are in already; retry after "
                                     f"{retry_after_s} s"}).encode()
        self._busy_start = {"type": "http.response.start", "status": 503, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"retry-after", str(retry_after_s).encode())]}
        self._busy_body = {"type": "http.response.body", "body": body}

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
            await self.app(scope, receive, send)
            return
        if self.limit is not None and sum(self.counts.values()) >= self.limit:
            if self.metrics is not None:
                self.metrics.shed.labels("admission", "queue_full").inc()
            await send(self._busy_start)
            await send(self._busy_body)
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

    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.in_flight.set(sum(self.counts.values()))
