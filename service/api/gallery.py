"""The gallery: ``GET /v1/folders`` (its folders, for the folder filter) and ``GET /v1/images/{id}`` (an image
file, or a JPEG thumbnail with ``?size=``; for a video moment, its thumbnail frame).

Images are private: ``Cache-Control: private`` — ``no-cache`` (a browser keeps the image but asks again, and the
``ETag`` makes that a bodiless 304) or, when an API key is required, ``no-store`` — so no shared cache keeps a
photo, and since ids restart at 0 when an index is rebuilt, no cache shows another photo under an old URL. The
``ETag`` (with ``Last-Modified``, conditional and range requests, ``HEAD``: service/api/files.py) is made from the
file's content hash (as indexed), its size and mtime now, the index and its generation, and the thumbnail size.
``Cross-Origin-Resource-Policy: same-origin``: other sites cannot embed the images. A thumbnail is made under the
media admission (service/decoding.py), its memory estimated from the image's size as indexed."""
from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import Response

from ..contract import IMAGE_TYPES, error_responses
from ..images import THUMBNAIL_BYTES_PER_PIXEL, ImageError, media_type_of, thumbnail, thumbnail_cost
from ..schemas import Folder, Folders
from ..state import ServiceState
from .deps import gallery_entry, moment_seconds, service
from .files import RANGE_NOT_SATISFIABLE, get_and_head, ImageId, decoded, file_response, not_modified
from .videos import frame_response, headers_only, media_headers, thumbnail_size


async def folders(state: ServiceState = Depends(service)):
    gallery = state.loaded.gallery
    loop = asyncio.get_running_loop()
    photos = await loop.run_in_executor(state.decode_pool, lambda: gallery.photos)
    return Folders(folders=[Folder(folder=f, images=n) for f, n in photos.folder_counts()])


_IMAGE_HEADERS = {"ETag": {"description": "the image's version (content hash, size and mtime, index generation, "
                                          "thumbnail size): send it as If-None-Match to get 304 when unchanged",
                           "schema": {"type": "string"}, "required": True},
                  "Last-Modified": {"description": "the file's modification time", "schema": {"type": "string"},
                                    "required": True},
                  "Cache-Control": {"description": "private: no-cache, or no-store when an API key is required",
                                    "schema": {"type": "string"}, "required": True}}


_IMAGE_RESPONSES: dict[int | str, dict] = {
    **error_responses(404, 413, 422, 503),
    200: {"content": {t: {"schema": {"type": "string", "format": "binary"}} for t in IMAGE_TYPES},
          "description": "the image file (its sniffed type), or with ?size= a JPEG thumbnail", "headers": _IMAGE_HEADERS},
    206: {"content": {t: {"schema": {"type": "string", "format": "binary"}} for t in IMAGE_TYPES},
          "description": "the image file's bytes asked for with a `Range` header (not with ?size=)",
          "headers": {**_IMAGE_HEADERS, "Content-Range": {"schema": {"type": "string"}}}},
    304: {"description": "Not Modified: If-None-Match names the image's current ETag (or is *), or "
                         "If-Modified-Since is no older than the file"},
    **RANGE_NOT_SATISFIABLE}


async def image_response(request: Request, image_id: int, state: ServiceState, size: int | None) -> Response:
    """``GET``/``HEAD /v1/images/{image_id}``: the file, or a JPEG thumbnail of longest side ``size``."""
    row, path, info = gallery_entry(state.loaded.gallery.meta.image, image_id, "image")
    if row.video_id is not None:          # a video moment: its frame
        video = state.loaded.gallery.meta.video(row.video_id)
        seconds = moment_seconds(row)
        headers = media_headers(video.sha256 if video and video.sha256 else row.path, info, state,
                                f"frame {seconds!r} {size}")
        frame_size = (video.width, video.height) if video and video.width and video.height else None
        return await frame_response(request, path, seconds, size, frame_size, state, f"gallery image {image_id}",
                                    headers)
    headers = media_headers(row.sha256 or row.path, info, state, size or "file")
    if size is None:
        return file_response(request, path, info.st_size, media_type_of(path), headers)
    if not_modified(request, headers):
        return Response(status_code=304, headers=headers)
    if request.method == "HEAD":
        return headers_only(headers, "image/jpeg")
    max_pixels = state.settings.max_pixels
    if row.width and row.height:          # the size as indexed (the decode checks the file's own again)
        cost = thumbnail_cost((row.width, row.height), media_type_of(path) == "image/jpeg", size)
    else:
        cost = max_pixels * THUMBNAIL_BYTES_PER_PIXEL
    try:
        data, media = await decoded(state, cost, thumbnail, path, size, max_pixels)
    except ImageError as err:
        raise HTTPException(404 if err.status == 415 else err.status, f"gallery image {image_id}: {err.detail}")
    return Response(data, media_type=media, headers=headers)


def router(max_thumbnail: int) -> APIRouter:
    """The gallery's routes, ``?size=`` declared up to ``max_thumbnail`` (``JOINTSPACE_MAX_THUMBNAIL``)."""
    routes = APIRouter(prefix="/v1")
    routes.get("/folders", response_model=Folders, responses=error_responses(503),
               summary="The gallery's folders (for the folder filter), with how many images each holds "
                       "directly")(folders)

    @get_and_head(routes, "/images/{image_id}", responses=_IMAGE_RESPONSES, response_class=Response,
                  summary="A gallery image file, or a JPEG thumbnail with ?size= (a video moment: its thumbnail "
                          "frame as a JPEG)")
    async def get_image(request: Request, image_id: ImageId, state: ServiceState = Depends(service),
                        size: int = thumbnail_size(max_thumbnail, "longest side of a JPEG thumbnail")):
        return await image_response(request, image_id, state, size)

    return routes
