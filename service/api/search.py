"""Search: ``POST /v1/search/images`` (a sentence, or an image ± words → gallery images) and
``POST /v1/search/captions`` (an image → captions of the corpus). Both take JSON, or multipart/form-data with an
uploaded image, read alike (service/api/bodies.py); best first, paged, with a score threshold, and for images the
folder and date filters applied inside the index search. Each hit has its relevance and each list says whether it
holds a strong match (index/relevance.py)."""
from __future__ import annotations

import asyncio
import os

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import Response
from pydantic import BaseModel

from index.query import ImageFilter, UnknownFolderError, format_time
from index.relevance import Ranking
from training.models.protocol import can_compose

from ..contract import error_responses
from ..engine import Options
from ..schemas import (CaptionHit, CaptionResults, ImageHit, ImageIdCompose, ImageResults, ImageSearch,
                       Paging)
from ..state import ServiceState
from .bodies import body_kind, read_form, read_json
from .deps import POST_ERRORS, check_deadline, gallery_pixels, service, submit, upload_pixels

router = APIRouter(prefix="/v1")


def _no_composition(state: ServiceState) -> None:
    if not can_compose(state.loaded.model):
        raise HTTPException(409, "query composition (an image ± words) needs a model that embeds an image as one "
                                 "vector; the loaded model uses region attention (STT-ATT)")


async def _options(state: ServiceState, query: ImageSearch) -> Options:
    """A search's :class:`Options`; a filter is resolved to the image ids it lets through (off the event loop: the
    first filter of a generation reads its photo table). A folder without images: 404."""
    flt = ImageFilter.parse(query.folder, query.taken_after, query.taken_before, query.media)    # validated
    allowed = None
    if flt.active:
        loop = asyncio.get_running_loop()
        try:
            allowed = await loop.run_in_executor(state.decode_pool, state.loaded.gallery.allowed_ids, flt)
        except UnknownFolderError as err:
            raise HTTPException(404, err.public) from None
    return Options(k=query.k, offset=query.offset, min_score=query.min_score, allowed=allowed,
                   subtract=tuple(query.subtract))


def _page(query: Paging) -> Options:
    """A caption search's :class:`Options`."""
    return Options(k=query.k, offset=query.offset, min_score=query.min_score)


def _json(body: BaseModel) -> Response:
    """The response, serialised once by pydantic's own encoder: the route's ``response_model`` documents it, and
    FastAPI does not validate and encode it a second time (per-request time on the event loop, which bounds a fast
    encoder's throughput)."""
    return Response(body.model_dump_json(), media_type="application/json")


def _relevance(ranking: Ranking) -> list[float | None]:
    return list(ranking.relevance) if ranking.relevance is not None else [None] * len(ranking.hits)


def _image_results(ranking: Ranking, state: ServiceState, root: str) -> ImageResults:
    gallery = state.loaded.gallery
    rows = gallery.meta.images([i for i, _ in ranking.hits])
    out = []
    for (i, s), relevance in zip(ranking.hits, _relevance(ranking)):
        row = rows.get(i)
        moment = {} if row is None or row.video_id is None else {
            "media": "video", "video_id": row.video_id, "start": row.t_start, "end": row.t_end, "frame": row.t_frame}
        out.append(ImageHit(id=i, score=s, relevance=relevance, uri=f"{root}/v1/images/{i}",
                            taken=format_time(row.taken) if row else None,
                            name=os.path.basename(row.path) if row else None,
                            folder=gallery.photos.relative(row.folder) if row and row.folder else None,
                            width=row.width if row else None, height=row.height if row else None, **moment))
    return ImageResults(results=out, strong_match=ranking.strong_match)


@router.post("/search/images", response_model=ImageResults, responses=error_responses(*POST_ERRORS, 404, 409),
             summary="Text → gallery images, or a photo (± words) → similar gallery images; best first, filtered, "
                     "paged",
             description="JSON `{\"text\", \"subtract\", \"k\", ...}`: images for a sentence, minus the meaning "
                         "of the `subtract` words. Query by example and composition (W2VV §IV-C): multipart "
                         "`image` (+ `add`, `subtract`, `k`, ...) — an uploaded photo — or JSON `{\"image_id\", "
                         "\"add\", \"subtract\", \"k\", ...}` for a gallery image: images like the query image, "
                         "with the meaning of the `add` words added and of the `subtract` words taken away. Every "
                         "form also takes `offset` and `min_score` (paging and threshold) and the filters `folder`, "
                         "`taken_after`, `taken_before`, `media` (applied inside the index search: the best `k` of "
                         "the images that pass; `media`: only photos or only video moments). An unknown folder is "
                         "404; an empty date range 422. A model with region "
                         "attention (STT-ATT) cannot compose: 409.")
async def search_images(request: Request, state: ServiceState = Depends(service)):
    kind = body_kind(request, ("form", "json"), "send JSON {\"text\": ..., \"k\": ...}, or for a composed query "
                                                "multipart/form-data with an 'image' file (and optional 'add', "
                                                "'subtract', 'k') or JSON {\"image_id\": ..., \"add\": [...], "
                                                "\"subtract\": [...], \"k\": ...}")
    if kind == "form":
        data, upload = await read_form(request, state, state.bodies.compose_upload)
        _no_composition(state)
        opts = await _options(state, upload)
        pixels = await upload_pixels(data, state, request, "compose")
        ranking = await submit(state.compose_batcher, (pixels, tuple(upload.add), tuple(upload.subtract), opts),
                               state, request)
    else:
        body = await read_json(request, state.bodies.search_images)
        if isinstance(body, ImageIdCompose):
            _no_composition(state)
            opts = await _options(state, body)
            pixels = await gallery_pixels(body.image_id, state, request)
            ranking = await submit(state.compose_batcher, (pixels, tuple(body.add), tuple(body.subtract), opts),
                                   state, request)
        else:
            ranking = await submit(state.text_batcher, (body.text, await _options(state, body)), state, request)
    return _json(_image_results(ranking, state, request.scope.get("root_path", "")))


@router.post("/search/captions", response_model=CaptionResults, responses=error_responses(*POST_ERRORS, 404),
             summary="Image (upload, or a gallery image id) → captions of the corpus, best first (paged, with a "
                     "threshold)")
async def search_captions(request: Request, state: ServiceState = Depends(service)):
    kind = body_kind(request, ("form", "json"), "send multipart/form-data with an 'image' file (and optional 'k'), "
                                                "or JSON {\"image_id\": ..., \"k\": ...}")
    ranking: Ranking
    if kind == "form":
        data, upload = await read_form(request, state, state.bodies.caption_search)
        pixels = await upload_pixels(data, state, request, "image")
        ranking = await submit(state.image_batcher, (pixels, _page(upload)), state, request)
    else:
        body = await read_json(request, state.bodies.image_id_search)
        check_deadline(request, state, "direct")
        loop = asyncio.get_running_loop()
        try:
            ranking = await loop.run_in_executor(state.compute_pool, state.loaded.engine.search_image_id,
                                                 body.image_id, _page(body))
        except KeyError:
            raise HTTPException(404, f"no gallery image with id {body.image_id}") from None
    rows = state.loaded.gallery.meta.captions([i for i, _ in ranking.hits])
    results = [CaptionHit(caption=rows[i].text, score=s, id=i, relevance=r)
               for (i, s), r in zip(ranking.hits, _relevance(ranking)) if i in rows]
    return _json(CaptionResults(results=results, strong_match=ranking.strong_match))
