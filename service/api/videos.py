"""Videos: ``GET /v1/videos/{id}`` (the file, streamed with HTTP range requests so a browser can seek) and
``GET /v1/videos/{id}/frame?t=`` (the frame at ``t`` seconds as a JPEG). A video moment found by a search is an
image id whose ``/v1/images/{id}`` is its thumbnail frame (``deps.moment_seconds``).

Both carry strong validators and answer conditional and range requests and ``HEAD`` as service/api/files.py says;
the file's media type is sniffed from its content. A frame is decoded under the media admission
(service/decoding.py), scaled while it is decoded to what is asked: ``?size=`` (its longer side), else at most
``JOINTSPACE_MAX_FRAME_PIXELS``."""
from __future__ import annotations

import io
import os
import pathlib
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import Response
from PIL import Image

from index.video_decode import MAX_SIDE, VideoError, frame_at, frame_cost
from training.data.media import file_head, sniff_video

from ..contract import error_responses
from ..state import ServiceState
from .deps import gallery_entry, private_headers, service
from .files import (RANGE_NOT_SATISFIABLE, get_and_head, VideoId, decoded, file_response, not_modified,
                    validators)

VIDEO_TYPES = ("video/mp4", "video/quicktime", "video/webm", "video/x-matroska", "video/x-msvideo")
_VALIDATOR_HEADERS = {
    "ETag": {"description": "the file's version (content hash, size and mtime, index generation): send it as "
                            "If-None-Match for a 304, or as If-Range with a Range", "schema": {"type": "string"}},
    "Last-Modified": {"description": "the file's modification time", "schema": {"type": "string"}},
    "Cache-Control": {"description": "private: no-cache, or no-store when an API key is required",
                      "schema": {"type": "string"}}}
_NOT_MODIFIED = {"description": "Not Modified: If-None-Match names the current ETag (or is *), or "
                                "If-Modified-Since is no older than the file", "headers": _VALIDATOR_HEADERS}


def media_headers(content: str, info: os.stat_result, state: ServiceState, variant: object) -> dict[str, str]:
    """The caching and validator headers of a gallery file, or of what is made of it (``variant``)."""
    gallery = state.loaded.gallery
    return {**private_headers(state), **validators(content, info, gallery.manifest.get("index_id", ""),
                                                   gallery.generation, variant)}


async def video_response(request: Request, video_id: int, state: ServiceState) -> Response:
    """``GET``/``HEAD /v1/videos/{video_id}``: the file (or the bytes of a ``Range``)."""
    row, path, info = gallery_entry(state.loaded.gallery.meta.video, video_id, "video")
    media = sniff_video(file_head(path)) or "application/octet-stream"
    return file_response(request, path, info.st_size, media, media_headers(row.sha256 or row.path, info, state, "file"))


def thumbnail_size(max_thumbnail: int, description: str) -> Any:
    """The ``?size=`` query parameter of a thumbnail or frame: an integer from 16 to ``max_thumbnail`` (a setting,
    declared per app so that the OpenAPI document states it). The endpoint's parameter is annotated ``int`` so
    that the document states an integer; when it is absent its value is None: no thumbnail, the file itself."""
    return Query(None, ge=16, le=max_thumbnail, description=description)


def _jpeg(path: pathlib.Path, seconds: float, size: int | None, max_pixels: int) -> bytes:
    image = frame_at(path, seconds, side=None if size is None else max(size, 16),
                     max_pixels=max_pixels if size is None else None)
    if size is not None:
        image.thumbnail((size, size), Image.Resampling.LANCZOS)
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=85)
    return out.getvalue()


def headers_only(headers: dict[str, str], media: str) -> Response:
    """A HEAD's answer for something made on request (a thumbnail, a frame): its headers, not made, so no length."""
    response = Response(status_code=200, headers=headers, media_type=media)
    del response.headers["content-length"]
    return response


async def frame_response(request: Request, path: pathlib.Path, seconds: float, size: int | None,
                         frame_size: tuple[int, int] | None, state: ServiceState, what: str,
                         headers: dict[str, str]) -> Response:
    """The frame of ``path`` at ``seconds`` as a JPEG (longest side at most ``size``) decoded under the media
    admission, its cost estimated from ``frame_size`` (the video's as indexed; unknown: the largest a video may
    have); 304 or headers alone when the request asks for no more; 404 when the file no longer decodes."""
    if not_modified(request, headers):
        return Response(status_code=304, headers=headers)
    if request.method == "HEAD":
        return headers_only(headers, "image/jpeg")
    max_pixels = state.settings.max_frame_pixels
    cost = frame_cost(frame_size or (MAX_SIDE, MAX_SIDE), None if size is None else max(size, 16),
                      max_pixels if size is None else None)
    try:
        data = await decoded(state, cost, _jpeg, path, seconds, size, max_pixels)
    except VideoError as err:
        raise HTTPException(404, f"{what} cannot be decoded: {err}") from None
    return Response(data, media_type="image/jpeg", headers=headers)


async def frame_of_video(request: Request, video_id: int, state: ServiceState, t: float,
                         size: int | None) -> Response:
    """``GET``/``HEAD /v1/videos/{video_id}/frame``: the frame at ``t`` seconds as a JPEG, of longest side
    ``size``."""
    row, path, info = gallery_entry(state.loaded.gallery.meta.video, video_id, "video")
    if row.duration is not None:
        t = min(t, row.duration)                     # past the end: the last frame
    headers = media_headers(row.sha256 or row.path, info, state, f"frame {t!r} {size}")
    frame_size = (row.width, row.height) if row.width and row.height else None
    return await frame_response(request, path, t, size, frame_size, state, f"gallery video {video_id}", headers)


_VIDEO_RESPONSES: dict[int | str, dict] = {
    **error_responses(404, 422, 503),
    200: {"content": {t: {"schema": {"type": "string", "format": "binary"}} for t in VIDEO_TYPES},
          "description": "the whole video file (its media type sniffed from its content)",
          "headers": {**_VALIDATOR_HEADERS, "Accept-Ranges": {"schema": {"type": "string"}}}},
    206: {"content": {t: {"schema": {"type": "string", "format": "binary"}} for t in VIDEO_TYPES},
          "description": "the bytes asked for with a `Range: bytes=first-last` header (and an If-Range naming the "
                         "current ETag or Last-Modified, if any)",
          "headers": {**_VALIDATOR_HEADERS, "Content-Range": {"schema": {"type": "string"}},
                      "Accept-Ranges": {"schema": {"type": "string"}}}},
    304: _NOT_MODIFIED,
    **RANGE_NOT_SATISFIABLE}
_FRAME_RESPONSES: dict[int | str, dict] = {
    **error_responses(404, 422, 503),
    200: {"content": {"image/jpeg": {"schema": {"type": "string", "format": "binary"}}},
          "description": "the frame at `t` seconds (the first at or after it; past the end, the last frame), as a "
                         "JPEG", "headers": _VALIDATOR_HEADERS},
    304: _NOT_MODIFIED}


def router(max_thumbnail: int) -> APIRouter:
    """The video routes, ``?size=`` of a frame declared up to ``max_thumbnail`` (``JOINTSPACE_MAX_THUMBNAIL``)."""
    routes = APIRouter(prefix="/v1")

    @get_and_head(routes, "/videos/{video_id}", responses=_VIDEO_RESPONSES, response_class=Response,
                  summary="A gallery video file; a `Range` header gets those bytes (206)")
    async def get_video(request: Request, video_id: VideoId, state: ServiceState = Depends(service)):
        return await video_response(request, video_id, state)

    @get_and_head(routes, "/videos/{video_id}/frame", responses=_FRAME_RESPONSES, response_class=Response,
                  summary="A frame of a gallery video as a JPEG (a thumbnail with ?size=)")
    async def get_frame(request: Request, video_id: VideoId, state: ServiceState = Depends(service),
                        t: float = Query(0.0, ge=0, le=7 * 24 * 3600, description="seconds from the start"),
                        size: int = thumbnail_size(max_thumbnail, "longest side of the JPEG")):
        return await frame_of_video(request, video_id, state, t, size)

    return routes
