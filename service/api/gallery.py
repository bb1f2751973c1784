"""The gallery: ``GET /v1/folders`` (its folders, for the folder filter) and ``GET /v1/images/{id}`` (an image
file, or a JPEG thumbnail with ``?size=``; for a video moment, its thumbnail frame)."""
from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends, HTTPException, Path, Query
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, Response

from ..contract import IMAGE_TYPES, MAX_ID, error_responses
from ..images import ImageError, media_type_of, thumbnail
from ..schemas import Folder, Folders
from ..state import ServiceState
from .deps import gallery_file, service
from .videos import frame_response, moment_seconds

router = APIRouter(prefix="/v1")


@router.get("/folders", response_model=Folders, responses=error_responses(503),
            summary="The gallery's folders (for the folder filter), with how many images each holds directly")
async def folders(state: ServiceState = Depends(service)):
    gallery = state.loaded.gallery
    loop = asyncio.get_running_loop()
    photos = await loop.run_in_executor(state.decode_pool, lambda: gallery.photos)
    return Folders(folders=[Folder(folder=f, images=n) for f, n in photos.folder_counts()])


@router.get("/images/{image_id}", responses={**error_responses(404, 422, 503), 200: {
                "content": {t: {"schema": {"type": "string", "format": "binary"}} for t in IMAGE_TYPES},
                "description": "the image file (its sniffed type), or with ?size= a JPEG thumbnail"}},
            response_class=Response, summary="A gallery image file, or a JPEG thumbnail with ?size= (a video "
                                             "moment: its thumbnail frame as a JPEG)")
async def get_image(image_id: int = Path(..., ge=0, le=MAX_ID), state: ServiceState = Depends(service),
                    size: int | None = Query(None, ge=16, description="longest side of a JPEG thumbnail")):
    if size is not None and size > state.settings.max_thumbnail:
        # the limit is a setting, so not in the Query above: the OpenAPI document states it (service/app.py)
        raise RequestValidationError([{"type": "less_than_equal", "loc": ("query", "size"), "input": size,
                                       "msg": f"size must be at most {state.settings.max_thumbnail}"}])
    path = gallery_file(image_id, state)
    row = state.loaded.gallery.meta.image(image_id)
    if row is not None and row.video_id is not None:          # a video moment: its frame
        return await frame_response(path, moment_seconds(row), size, state, f"gallery image {image_id}")
    headers = {"Cache-Control": "public, max-age=3600"}
    if size is None:
        return FileResponse(path, media_type=media_type_of(path), headers=headers)
    loop = asyncio.get_running_loop()
    try:
        data, media = await loop.run_in_executor(state.decode_pool, thumbnail, path, size, state.settings.max_pixels)
    except ImageError as err:
        raise HTTPException(404 if err.status == 415 else err.status, f"gallery image {image_id}: {err.detail}")
    return Response(data, media_type=media, headers=headers)
