"""Search: the handlers of ``POST /v1/search/images`` (a sentence, or an image ± words → gallery images) and
``POST /v1/search/captions`` (an image → captions of the corpus); their bodies, batchers and documentation are
entries of the table of operations (service/operations.py). Both routes take JSON, or multipart/form-data with an
uploaded image; best first, paged, with a score threshold, and for images the folder and date filters applied
inside the index search. Each hit has its relevance and each list says whether it holds a strong match
(index/relevance.py)."""
from __future__ import annotations

import asyncio
import os

import torch
from fastapi import HTTPException
from fastapi.responses import Response
from pydantic import BaseModel

from index.hits import image_hits, relevances
from index.query import ImageFilter, UnknownFolderError
from index.relevance import Ranking
from training.models.protocol import can_compose

from ..contract import Uploaded
from ..engine import Options
from ..schemas import (CaptionHit, CaptionResults, CaptionSearch, ComposeUpload, ImageHit, ImageIdCompose,
                       ImageIdSearch, ImageResults, ImageSearch, Paging, TextSearch)
from ..state import ServiceState
from .deps import gallery_pixels
from .routing import Call


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
            allowed = await loop.run_in_executor(state.decode_pool, _allowed, state.loaded.gallery, flt)
        except UnknownFolderError as err:
            raise HTTPException(404, err.public) from None
    return Options(k=query.k, offset=query.offset, min_score=query.min_score, allowed=allowed,
                   subtract=tuple(query.subtract), mode=getattr(query, "mode", "vector"), sort=query.sort)


OUTSIDE_FOLDER = ("no indexed images in that folder: folders are relative to the gallery's root folder (GET "
                  "/v1/folders lists them)")


def _allowed(gallery, flt: ImageFilter):
    """The ids ``flt`` lets through. Its folder is relative to the gallery's root folder: an absolute path, or one
    that climbs out of the root, is answered 404 as a folder without images — every such path alike, whether it
    exists on the server or not, and without repeating it — unless it is the name ``GET /v1/folders`` gives a
    folder outside the root."""
    if flt.folder is not None:
        name = os.path.normpath(flt.folder.strip())
        if (os.path.isabs(name) or name == os.pardir or name.startswith(os.pardir + os.sep)) \
                and name not in {gallery.photos.relative(f) for f in gallery.photos.folders}:
            err = UnknownFolderError(flt.folder, gallery.photos.root)
            err.public = OUTSIDE_FOLDER
            raise err
    return gallery.allowed_ids(flt)


def _page(query: Paging) -> Options:
    """A caption search's :class:`Options`."""
    return Options(k=query.k, offset=query.offset, min_score=query.min_score)


def _json(body: BaseModel) -> Response:
    """The response, serialised once by pydantic's own encoder: the route's ``response_model`` documents it, and
    FastAPI does not validate and encode it a second time (per-request time on the event loop, which bounds a fast
    encoder's throughput)."""
    return Response(body.model_dump_json(), media_type="application/json")


def _image_results(ranking: Ranking, state: ServiceState, root: str) -> ImageResults:
    gallery = state.loaded.gallery
    out = [ImageHit(id=h.id, score=h.score, relevance=h.relevance, uri=f"{root}/v1/images/{h.id}", taken=h.taken,
                    name=os.path.basename(h.path) if h.path else None,
                    folder=gallery.photos.relative(h.folder) if h.folder else None,
                    width=h.width, height=h.height, **h.moment(), **h.words())
           for h in image_hits(gallery, ranking)]
    return ImageResults(results=out, strong_match=ranking.strong_match)


def _caption_results(ranking: Ranking, state: ServiceState) -> CaptionResults:
    rows = state.loaded.gallery.meta.captions([i for i, _ in ranking.hits])
    results = [CaptionHit(caption=rows[i].text, score=s, id=i, relevance=r)
               for (i, s), r in zip(ranking.hits, relevances(ranking)) if i in rows]
    return CaptionResults(results=results, strong_match=ranking.strong_match)


# --- the operations' handlers (the table: service/operations.py) ---------------------------------------------------

async def text_search(call: Call, body: TextSearch) -> Response:
    ranking = await call.run((body.text, await _options(call.state, body)))
    return _json(_image_results(ranking, call.state, call.root))


async def _composed(call: Call, pixels: torch.Tensor, query: ComposeUpload, opts: Options) -> Response:
    ranking = await call.run((pixels, tuple(query.add), tuple(query.subtract), opts))
    return _json(_image_results(ranking, call.state, call.root))


async def compose_upload(call: Call, body: Uploaded[ComposeUpload]) -> Response:
    _no_composition(call.state)
    opts = await _options(call.state, body.fields)
    return await _composed(call, await call.pixels(body.image), body.fields, opts)


async def compose_gallery_image(call: Call, body: ImageIdCompose) -> Response:
    _no_composition(call.state)
    opts = await _options(call.state, body)
    return await _composed(call, await gallery_pixels(body.image_id, call.state, call.request), body, opts)


async def caption_search_upload(call: Call, body: Uploaded[CaptionSearch]) -> Response:
    ranking = await call.run((await call.pixels(body.image), _page(body.fields)))
    return _json(_caption_results(ranking, call.state))


async def caption_search_gallery_image(call: Call, body: ImageIdSearch) -> Response:
    try:
        ranking = await call.run((body.image_id, _page(body)))
    except KeyError:
        raise HTTPException(404, f"no gallery image with id {body.image_id}") from None
    return _json(_caption_results(ranking, call.state))
