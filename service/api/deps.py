"""What the ``/v1`` routes share: the service once it is ready, the API key, load shedding by deadline and queue,
and decoding an image (an upload or a gallery file) off the event loop."""
from __future__ import annotations

import asyncio
import os
import pathlib
import secrets
import stat
import time
from typing import Any, Callable, Literal, TypeVar

import torch
from fastapi import Depends, HTTPException, Request
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from index.metadata import ImageRow, VideoRow
from training.data.decode_cost import DecodeBusy
from index.video_decode import FRAME_SIDE, MAX_SIDE, VideoError, frame_at, frame_cost

from ..batcher import DeadlineExceeded, DynamicBatcher, Shed
from ..images import ImageError, upload_to_pixels
from ..middleware import ARRIVAL
from ..state import ServiceState
from .files import decoded

_api_key_header = APIKeyHeader(name="X-API-Key", auto_error=False, description="the key set as JOINTSPACE_API_KEY")
_bearer = HTTPBearer(auto_error=False, description="the key set as JOINTSPACE_API_KEY")

# the error responses of every POST route (the 401 is added to every /v1 route when a key is set: service/app.py)
POST_ERRORS = (400, 408, 413, 415, 422, 503)


async def service(request: Request) -> ServiceState:
    # dependencies are ``async def`` on purpose: FastAPI runs plain ``def`` ones in a worker thread, a thread
    # hop per request
    state: ServiceState = request.app.state.service
    if not state.ready:
        # the loading error itself (it names server paths) is for the operator: the log and /readyz
        detail = ("not ready: loading the model or the index failed (the service's log and /readyz say why)"
                  if state.error else f"not ready: {state.phase}")
        raise HTTPException(503, detail, headers={"Retry-After": "5"})
    return state


def _given_key(request: Request) -> str | None:
    """The one key a request's credentials are checked with: its X-API-Key header, else its Authorization
    header's Bearer token (an Authorization header of another scheme carries none). HTTPException 400 for two
    X-API-Key headers or two Bearer tokens: one request must not try many keys."""
    keys = request.headers.getlist("x-api-key")
    tokens = []
    for value in request.headers.getlist("authorization"):
        scheme, _, token = value.strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            tokens.append(token.strip())
    if len(keys) > 1 or len(tokens) > 1:
        raise HTTPException(400, f"the request carries {max(len(keys), len(tokens))} "
                                 f"{'X-API-Key headers' if len(keys) > 1 else 'Bearer tokens'}; send one key")
    return keys[0] if keys else tokens[0] if tokens else None


async def require_api_key(request: Request, key: str | None = Depends(_api_key_header),
                          bearer: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> None:
    """With ``JOINTSPACE_API_KEY`` set (the app then adds this dependency to ``/v1``): the key as ``X-API-Key``
    or as ``Authorization: Bearer`` — either, as the OpenAPI document's two alternative security schemes say, one
    key tried a request (``_given_key``). A client address that sent too many wrong keys is answered 429 +
    Retry-After, whatever key it sends, until it has waited (``FailureLimiter``)."""
    state: ServiceState = request.app.state.service
    expected = state.settings.api_key
    if expected is None:
        return
    given = _given_key(request)
    client = request.client.host if request.client else ""
    wait = state.auth_failures.wait(client)
    if wait:
        raise HTTPException(429, f"too many wrong API keys from this client address; retry after {wait} s",
                            headers={"Retry-After": str(wait)})
    if given is None or not secrets.compare_digest(given.encode(), expected.get_secret_value().encode()):
        if given is not None:
            state.auth_failures.failed(client)
        raise HTTPException(401, "missing or wrong API key (send it as X-API-Key: KEY or Authorization: Bearer KEY)",
                            headers={"WWW-Authenticate": "Bearer"})


async def api_key_schemes(key: str | None = Depends(_api_key_header),
                          bearer: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> None:
    """The API key's two security schemes, as :func:`require_api_key` states them in the OpenAPI document, for the
    routes whose class checks the key itself, before the body is read (the model routes: service/api/routing.py):
    the document says what they require, and the key is checked once, there."""


def _shed(err: Shed, state: ServiceState) -> HTTPException:
    why = ("its deadline passed before work on it began" if isinstance(err, DeadlineExceeded)
           else "too many requests are waiting")
    return HTTPException(503, f"the service is overloaded: {why}; retry after {state.settings.retry_after_s} s",
                         headers={"Retry-After": str(state.settings.retry_after_s)})


def _deadline(request: Request, state: ServiceState) -> float | None:
    return state.deadline(request.scope.get("state", {}).get(ARRIVAL))


def check_deadline(request: Request, state: ServiceState, name: str) -> None:
    """Sheds a request whose deadline has passed before expensive work (decoding an image) is spent on it."""
    deadline = _deadline(request, state)
    if deadline is not None and time.monotonic() >= deadline:
        state.metrics.shed.labels(name, DeadlineExceeded.reason).inc()
        raise _shed(DeadlineExceeded(), state)


async def submit(batcher: DynamicBatcher, item: Any, state: ServiceState, request: Request) -> Any:
    """``item`` through ``batcher``, with the request's deadline; 503 + Retry-After when it is shed."""
    try:
        return await batcher.submit(item, deadline=_deadline(request, state))
    except Shed as err:
        raise _shed(err, state) from None


async def upload_pixels(data: bytes, state: ServiceState, request: Request, name: str) -> torch.Tensor:
    """An uploaded image's bytes → preprocessed pixels, decoded off the event loop; the image's own 4xx when it
    cannot be read."""
    check_deadline(request, state, name)
    loop = asyncio.get_running_loop()
    try:
        return await loop.run_in_executor(state.decode_pool, upload_to_pixels, data, state.settings.max_pixels,
state.loaded.model.preprocess, state.device, state.settings.decode,
                                          state.decode_budget)
    except ImageError as err:
        raise HTTPException(err.status, err.detail) from None
    except DecodeBusy as err:
        raise _decode_busy(err, state, name) from None


def _decode_busy(err: DecodeBusy, state: ServiceState, name: str) -> HTTPException:
    state.metrics.shed.labels(name, "decode_memory").inc()
    return HTTPException(503, f"{err}; retry after {state.settings.retry_after_s} s",
                         headers={"Retry-After": str(state.settings.retry_after_s)})


def gallery_file(image_id: int, state: ServiceState) -> pathlib.Path:
    """The file of a gallery image; 404 when the id is unknown or the file is gone."""
    return gallery_entry(state.loaded.gallery.meta.image, image_id, "image")[1]


Row = TypeVar("Row", ImageRow, VideoRow)


def gallery_entry(lookup: Callable[[int], Row | None], item_id: int,
                  what: Literal["image", "video"]) -> tuple[Row, pathlib.Path, os.stat_result]:
    """A gallery image's or video's metadata row (``lookup``: the metadata's ``image`` or ``video``), its file and
    the file's ``stat``; 404 when the id is unknown, the file is gone, or its path now leads through a symbolic link
    (the index stores every path with its links resolved, so a link there was made after indexing: it is not
    followed, docs/index.md)."""
    row = lookup(item_id)
    if row is None:
        raise HTTPException(404, f"no gallery {what} with id {item_id}")
    path = pathlib.Path(row.path)
    try:
        info = path.stat()
    except OSError:
        info = None
    if info is None or not stat.S_ISREG(info.st_mode):
        raise HTTPException(404, f"gallery {what} {item_id} is no longer on disk")
    if os.path.realpath(path) != os.path.abspath(path):
        raise HTTPException(404, f"gallery {what} {item_id} is not served: its path now leads through a symbolic "
                                 f"link (run jointspace index sync)")
    return row, path, info


def moment_seconds(row: ImageRow) -> float:
    """The time of a video moment's thumbnail frame."""
    return float(row.t_frame if row.t_frame is not None else row.t_start or 0.0)


async def gallery_pixels(image_id: int, state: ServiceState, request: Request) -> torch.Tensor:
    """A gallery image's file, decoded and preprocessed like an upload; 404 when unknown or gone."""
    path = gallery_file(image_id, state)
    check_deadline(request, state, "compose")
    loop = asyncio.get_running_loop()
    row = state.loaded.gallery.meta.image(image_id)
    if row is not None and row.video_id is not None:          # a video moment: its thumbnail frame
        video = state.loaded.gallery.meta.video(row.video_id)
        size = (video.width, video.height) if video and video.width and video.height else (MAX_SIDE, MAX_SIDE)
        try:
            image = await decoded(state, frame_cost(size, FRAME_SIDE), frame_at, path, moment_seconds(row))
        except VideoError as err:
            raise HTTPException(404, f"gallery image {image_id} cannot be decoded: {err}") from None
        return state.loaded.model.preprocess.pixels(image)
    try:
        return await loop.run_in_executor(state.decode_pool, upload_to_pixels, path, state.settings.max_pixels,
state.loaded.model.preprocess, state.device, state.settings.decode,
                                          state.decode_budget)
    except ImageError as err:
        raise HTTPException(404 if err.status == 415 else err.status,
                            f"gallery image {image_id}: {err.detail}") from None
    except DecodeBusy as err:
        raise _decode_busy(err, state, "compose") from None


def private_headers(state: ServiceState) -> dict[str, str]:
    """The caching and embedding headers of every answer holding gallery content — image files, thumbnails, video
    files and frames (service/api/gallery.py): private to the browser, never kept by a shared cache."""
    headers = {"Cache-Control": "private, no-cache", "Cross-Origin-Resource-Policy": "same-origin",
               "X-Content-Type-Options": "nosniff"}
    if state.settings.api_key is not None:
        headers["Cache-Control"] = "private, no-store"
        headers["Vary"] = "X-API-Key, Authorization"          # the answer (200 or 401) depends on them
    return headers
