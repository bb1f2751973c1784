"""Videos: ``GET /v1/videos/{id}`` (the file, streamed with HTTP range requests so a browser can seek) and
``GET /v1/videos/{id}/frame?t=`` (the frame at ``t`` seconds as a JPEG). A video moment found by a search is an
image id whose ``/v1/images/{id}`` is its thumbnail frame (:func:`moment_image`)."""
from __future__ import annotations

import asyncio
import io
import os
import pathlib
import re

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from PIL import Image

from index.metadata import ImageRow
from index.video import VideoError, frame_at

from ..contract import MAX_ID, Error, error_responses
from ..state import ServiceState
from .deps import private_headers, service

router = APIRouter(prefix="/v1")

VIDEO_TYPES = {".mp4": "video/mp4", ".m4v": "video/mp4", ".mov": "video/quicktime", ".webm": "video/webm",
               ".mkv": "video/x-matroska", ".avi": "video/x-msvideo"}
CHUNK = 256 * 1024
_RANGE = re.compile(r"bytes=(\d*)-(\d*)")


def video_file(video_id: int, state: ServiceState) -> tuple[pathlib.Path, float | None]:
    """A gallery video's file and duration; 404 when the id is unknown or the file is gone."""
    row = state.loaded.gallery.meta.video(video_id)
    if row is None:
        raise HTTPException(404, f"no gallery video with id {video_id}")
    path = pathlib.Path(row.path)
    if not path.is_file():
        raise HTTPException(404, f"gallery video {video_id} is no longer on disk")
    if os.path.realpath(path) != os.path.abspath(path):       # a link made after indexing: not followed
        raise HTTPException(404, f"gallery video {video_id} is not served: its path now leads through a symbolic "
                                 f"link (run jointspace index sync)")
    return path, row.duration


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """One ``Range: bytes=`` range → ``(first, last)`` inclusive, clipped to the file; None to send the whole file
    (no header, another unit, several ranges, or a malformed one: RFC 9110 lets a server ignore them).
    ValueError when the range starts past the end (416)."""
    if header is None:
        return None
    m = _RANGE.fullmatch(header.strip())
    if m is None or (not m.group(1) and not m.group(2)):
        return None
    first, last = m.group(1), m.group(2)
    if not first:                                   # the last N bytes
        n = int(last)
        if n == 0:
            raise ValueError("an empty suffix range")
        return max(0, size - n), size - 1
    start = int(first)
    end = size - 1 if not last else min(int(last), size - 1)
    if start >= size or (last and int(last) < start):
        raise ValueError(f"bytes {start}- of a {size}-byte file")
    return start, end


def _chunks(path: pathlib.Path, first: int, last: int):
    with open(path, "rb") as fh:
        fh.seek(first)
        left = last - first + 1
        while left > 0:
            block = fh.read(min(CHUNK, left))
            if not block:
                return
            left -= len(block)
            yield block


@router.get("/videos/{video_id}", responses={**error_responses(404, 422, 503),
            200: {"content": {t: {"schema": {"type": "string", "format": "binary"}} for t in set(VIDEO_TYPES.values())},
                  "description": "the whole video file", "headers": {"Accept-Ranges": {"schema": {"type": "string"}}}},
            206: {"content": {t: {"schema": {"type": "string", "format": "binary"}} for t in set(VIDEO_TYPES.values())},
                  "description": "the bytes asked for with a `Range: bytes=first-last` header",
                  "headers": {"Content-Range": {"schema": {"type": "string"}},
                              "Accept-Ranges": {"schema": {"type": "string"}}}},
            416: {"model": Error, "description": "the Range header starts past the end of the file",
                  "headers": {"Content-Range": {"schema": {"type": "string"}}}}},
            response_class=Response, summary="A gallery video file; a `Range` header gets those bytes (206)")
async def get_video(request: Request, video_id: int = Path(..., ge=0, le=MAX_ID),
                    state: ServiceState = Depends(service)):
    path, _ = video_file(video_id, state)
    size = os.stat(path).st_size
    media = VIDEO_TYPES.get(path.suffix.lower(), "application/octet-stream")
    headers = {"Accept-Ranges": "bytes", **private_headers(state)}
    try:
        wanted = byte_range(request.headers.get("range"), size)
    except ValueError as err:
        return JSONResponse({"detail": f"range not satisfiable: {err}"}, status_code=416,
                            headers={"Content-Range": f"bytes */{size}"})
    first, last = wanted if wanted is not None else (0, size - 1)
    headers["Content-Length"] = str(last - first + 1)
    if wanted is None:
        return StreamingResponse(_chunks(path, 0, size - 1), media_type=media, headers=headers)
    headers["Content-Range"] = f"bytes {first}-{last}/{size}"
    return StreamingResponse(_chunks(path, first, last), status_code=206, media_type=media, headers=headers)


def _jpeg(path: pathlib.Path, seconds: float, size: int | None) -> bytes:
    image = frame_at(path, seconds, side=None if size is None else max(size, 16))
    if size is not None:
        image.thumbnail((size, size), Image.Resampling.LANCZOS)
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=85)
    return out.getvalue()


async def frame_response(path: pathlib.Path, seconds: float, size: int | None, state: ServiceState,
                         what: str, headers: dict[str, str] | None = None) -> Response:
    """The frame of ``path`` at ``seconds`` as a JPEG (longest side at most ``size``), decoded off the event loop;
    404 when the file no longer decodes."""
    if size is not None and size > state.settings.max_thumbnail:
        raise RequestValidationError([{"type": "less_than_equal", "loc": ("query", "size"), "input": size,
                                       "msg": f"size must be at most {state.settings.max_thumbnail}"}])
    loop = asyncio.get_running_loop()
    try:
        data = await loop.run_in_executor(state.thumbnail_pool, _jpeg, path, seconds, size)
    except VideoError as err:
        raise HTTPException(404, f"{what}: {err}") from None
    return Response(data, media_type="image/jpeg", headers=headers or private_headers(state))


@router.get("/videos/{video_id}/frame", responses={**error_responses(404, 422, 503), 200: {
                "content": {"image/jpeg": {"schema": {"type": "string", "format": "binary"}}},
                "description": "the frame at `t` seconds (the first at or after it; past the end, the last "
                               "frame), as a JPEG"}},
            response_class=Response, summary="A frame of a gallery video as a JPEG (a thumbnail with ?size=)")
async def get_frame(video_id: int = Path(..., ge=0, le=MAX_ID), state: ServiceState = Depends(service),
                    t: float = Query(0.0, ge=0, le=7 * 24 * 3600, description="seconds from the start"),
                    size: int | None = Query(None, ge=16, description="longest side of the JPEG")):
    path, duration = video_file(video_id, state)
    if duration is not None:
        t = min(t, duration)                         # past the end: the last frame
    return await frame_response(path, t, size, state, f"gallery video {video_id}")


def moment_seconds(row: ImageRow) -> float:
    """The time of a moment's thumbnail frame."""
    return float(row.t_frame if row.t_frame is not None else row.t_start or 0.0)
