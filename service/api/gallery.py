"""The gallery: ``GET /v1/folders`` (its folders, for the folder filter) and ``GET /v1/images/{id}`` (an image
file, or a JPEG thumbnail with ``?size=``; for a video moment, its thumbnail frame).

Images are private: ``Cache-Control: private`` — ``no-cache`` (a browser keeps the image but asks again, and the
``ETag`` makes that a bodiless 304) or, when an API key is required, ``no-store`` — so no shared cache keeps a
photo, and since ids restart at 0 when an index is rebuilt, no cache shows another photo under an old URL. The
``ETag`` is made from the file's content hash (as indexed), its size and mtime now, the index and its generation,
and the thumbnail size. ``Cross-Origin-Resource-Policy: same-origin``: other sites cannot embed the images."""
from __future__ import annotations

import asyncio
import hashlib
import os

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, Response

from index.metadata import ImageRow

from ..contract import IMAGE_TYPES, MAX_ID, error_responses
from ..images import ImageError, media_type_of, thumbnail
from ..schemas import Folder, Folders
from ..state import ServiceState
from .deps import gallery_entry, private_headers, service
from .videos import frame_response, moment_seconds

router = APIRouter(prefix="/v1")


@router.get("/folders", response_model=Folders, responses=error_responses(503),
            summary="The gallery's folders (for the folder filter), with how many images each holds directly")
async def folders(state: ServiceState = Depends(service)):
    gallery = state.loaded.gallery
    loop = asyncio.get_running_loop()
    photos = await loop.run_in_executor(state.decode_pool, lambda: gallery.photos)
    return Folders(folders=[Folder(folder=f, images=n) for f, n in photos.folder_counts()])


def image_etag(row: ImageRow, info: os.stat_result, state: ServiceState, size: int | None) -> str:
    gallery = state.loaded.gallery
    digest = hashlib.sha256()
    for part in (row.sha256 or row.path, info.st_size, info.st_mtime_ns, gallery.manifest.get("index_id", ""),
                 gallery.generation, size or "file"):
        digest.update(f"{part}\0".encode())
    return f'"{digest.hexdigest()[:32]}"'


def _matches(if_none_match: str | None, etag: str) -> bool:
    """Whether an ``If-None-Match`` header names ``etag`` (weak comparison, as RFC 9110 asks for this header)."""
    if not if_none_match:
        return False
    tags = [t.strip() for t in if_none_match.split(",")]
    return "*" in tags or any(t.removeprefix("W/") == etag for t in tags)


_IMAGE_HEADERS = {"ETag": {"description": "the image's version (content hash, index generation, size): send it "
                                          "as If-None-Match to get 304 when unchanged",
                           "schema": {"type": "string"}, "required": True},
                  "Cache-Control": {"description": "private: no-cache, or no-store when an API key is required",
                                    "schema": {"type": "string"}, "required": True}}


@router.get("/images/{image_id}", responses={**error_responses(404, 422, 503), 200: {
                "content": {t: {"schema": {"type": "string", "format": "binary"}} for t in IMAGE_TYPES},
                "description": "the image file (its sniffed type), or with ?size= a JPEG thumbnail",
                "headers": _IMAGE_HEADERS},
                304: {"description": "Not Modified: If-None-Match names the image's current ETag"}},
            response_class=Response, summary="A gallery image file, or a JPEG thumbnail with ?size= (a video "
                                             "moment: its thumbnail frame as a JPEG)")
async def get_image(request: Request, image_id: int = Path(..., ge=0, le=MAX_ID),
                    state: ServiceState = Depends(service),
                    size: int | None = Query(None, ge=16, description="longest side of a JPEG thumbnail")):
    if size is not None and size > state.settings.max_thumbnail:
        # the limit is a setting, so not in the Query above: the OpenAPI document states it (service/app.py)
        raise RequestValidationError([{"type": "less_than_equal", "loc": ("query", "size"), "input": size,
                                       "msg": f"size must be at most {state.settings.max_thumbnail}"}])
    row, path, info = gallery_entry(image_id, state)
    headers = {**private_headers(state), "ETag": image_etag(row, info, state, size)}
    if _matches(request.headers.get("if-none-match"), headers["ETag"]):
        return Response(status_code=304, headers=headers)
    if row.video_id is not None:          # a video moment: its frame
        return await frame_response(path, moment_seconds(row), size, state, f"gallery image {image_id}", headers)
    if size is None:
        return FileResponse(path, media_type=media_type_of(path), headers=headers)
    loop = asyncio.get_running_loop()
    try:
        data, media = await loop.run_in_executor(state.thumbnail_pool, thumbnail, path, size,
                                                   state.settings.max_pixels)
    except ImageError as err:
        raise HTTPException(404 if err.status == 415 else err.status, f"gallery image {image_id}: {err.detail}")
    return Response(data, media_type=media, headers=headers)
