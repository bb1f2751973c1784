"""Near-duplicates: ``GET /v1/duplicates`` — the gallery's groups of near-duplicate photos (index/duplicates.py),
the largest first, paged.

Each photo's nearest photos above the floor threshold are found once per loaded generation (off the event loop:
the photos' vectors read from the index and searched, k nearest each, never all pairs: index/duplicates.py), and
the groups of a threshold once from them (photos indexed before perceptual hashes were kept are hashed from their
files); both are kept while that generation is served, a newer generation computes its own.
"""
from __future__ import annotations

import asyncio
import os
import threading
import weakref

from fastapi import APIRouter, Depends, Query, Request

from index.duplicates import DEFAULT_THRESHOLD, FLOOR, NEIGHBOURS, GalleryNeighbours, Groups
from index.query import format_time

from ..contract import error_responses
from ..schemas import DuplicateGroup, DuplicateImage, Duplicates
from ..state import ServiceState
from .deps import service

router = APIRouter(prefix="/v1")
MAX_LIMIT = 100
MAX_GROUP_OFFSET = 100_000


_neighbours: weakref.WeakKeyDictionary[object, GalleryNeighbours] = weakref.WeakKeyDictionary()
_cache: weakref.WeakKeyDictionary[object, dict[float, Groups]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def _groups(gallery, threshold: float) -> Groups:
    """The groups of ``gallery`` at ``threshold``: its photos' neighbours found once per loaded generation, the
    groups of a threshold once from them."""
    with _lock:
        known = _cache.setdefault(gallery, {})
        if threshold not in known:
            if gallery not in _neighbours:
                _neighbours[gallery] = GalleryNeighbours(gallery)
            if len(known) >= 8:                    # a few thresholds per generation are kept
                known.pop(next(iter(known)))
            known[threshold] = _neighbours[gallery].groups(threshold)
        return known[threshold]


def _relative(gallery, folder: str | None) -> str | None:
    return gallery.photos.relative(folder) if folder else None


@router.get("/duplicates", response_model=Duplicates, responses=error_responses(422, 503),
            summary="Groups of near-duplicate photos (re-saved, resized, cropped copies, bursts), largest first, "
                    "paged",
            description=f"A photo and one of its {NEIGHBOURS} nearest photos whose embeddings' cosine similarity "
                        "is at least `threshold` are paired; the groups are the connected components of the pairs, "
                        "each labelled by kind. The first request of a served index finds every photo's nearest "
                        "(seconds for a large gallery); later thresholds and pages are read from what it found. A "
                        f"threshold outside [{FLOOR}, 1], a negative offset or a limit outside 1 to {MAX_LIMIT} is "
                        "422.")
async def duplicates(request: Request, state: ServiceState = Depends(service),
                     threshold: float = Query(DEFAULT_THRESHOLD, ge=FLOOR, le=1,
                                              description="cosine similarity from which two photos are "
                                                          "near-duplicates, from the floor "
                                                          f"{FLOOR} (the default is measured for the shipped "
                                                          "model: docs/index.md)"),
                     offset: int = Query(0, ge=0, le=MAX_GROUP_OFFSET, description="groups to skip (paging)"),
                     limit: int = Query(20, ge=1, le=MAX_LIMIT, description="groups per page")):
    gallery = state.loaded.gallery
    loop = asyncio.get_running_loop()
    found = await loop.run_in_executor(state.decode_pool, _groups, gallery, float(threshold))
    shown = found.groups[offset:offset + limit]
    rows = gallery.meta.images([i for g in shown for i in g.ids])
    root = request.scope.get("root_path", "")
    groups = [DuplicateGroup(kind=g.kind, min_score=g.min_score, images=[
        DuplicateImage(id=i, uri=f"{root}/v1/images/{i}", name=os.path.basename(rows[i].path),
                       folder=_relative(gallery, rows[i].folder),
                       taken=format_time(rows[i].taken), width=rows[i].width, height=rows[i].height,
                       size=rows[i].size) for i in g.ids if i in rows]) for g in shown]
    return Duplicates(threshold=found.threshold, photos=found.photos, total=len(found.groups), offset=offset,
                      limit=limit, groups=groups)
