"""The order of an image search's results: ``relevance`` (best first, the index's ranking) or by capture time,
``newest`` or ``oldest`` first — applied after the relevance cut.

A sorted search takes the best ``SORT_DEPTH`` images (index/choices.py) that pass the filters, drops those scoring under
``min_score``, and orders the rest by capture time (the metadata's ``taken``: EXIF DateTimeOriginal, else the
file's mtime; a video moment: its video's), ties broken by image id, then pages them: the list is the same
whatever ``k`` and ``offset`` ask, so paging is stable. Images without a capture time come last (in id order),
newest or oldest alike. Without ``min_score`` the cut is the strong matches (``Gallery.search_images``,
index/relevance.py's ``strong_match``), so the list holds what the query describes; ``min_score`` −1 sorts every
result.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .choices import SORTS


def check_sort(sort: str) -> str:
    if sort not in SORTS:
        raise ValueError(f"sort must be one of {', '.join(SORTS)}, not {sort!r}")
    return sort


def by_time(hits: Sequence[tuple[int, float]], ids: np.ndarray, taken: np.ndarray,
            sort: str) -> list[tuple[int, float]]:
    """``(id, score)`` hits in capture-time order (``newest`` or ``oldest`` first; ``relevance``: as they are).
    ``ids`` (sorted) and ``taken`` (Unix seconds, NaN where unknown): the gallery's images (``PhotoTable``).
    Ties by id; hits without a capture time last."""
    check_sort(sort)
    if sort == "relevance" or not hits:
        return list(hits)
    hit_ids = np.asarray([i for i, _ in hits], dtype=np.int64)
    when = np.full(len(hit_ids), np.nan)
    if len(ids):
        pos = np.clip(np.searchsorted(ids, hit_ids), 0, len(ids) - 1)
        found = ids[pos] == hit_ids
        when[found] = taken[pos[found]]
    unknown = np.isnan(when)
    key = np.where(unknown, 0.0, -when if sort == "newest" else when)
    order = np.lexsort((hit_ids, key, unknown))          # last key first: unknown last, then time, then id
    return [hits[i] for i in order]
