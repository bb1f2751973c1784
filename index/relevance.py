"""A hit's *relevance*: how its score compares with the scores of a fixed reference set of typical items for the
same query — a number that means the same in every gallery, where a raw score does not.

A score (cosine, or QB-Norm's ``q·v − o``, index/querybank.py) has no fixed meaning: 0.31 is a good match for one
query and a poor one for another, and the best hit of a gallery is the best whether or not the gallery holds
anything the query describes. So an index built with a query bank also stores a *reference set* per side (up to
:data:`REFERENCE_SIZE` of the bank's own vectors of that side, evenly spaced through it, folded as that side's
items are: for the image index, typical photos of the model's training data; for the caption index, typical
captions), and a hit's relevance is

    relevance(q, hit) = |{r in reference : s(q, r) < s(q, hit)}| / |reference|

— the share of typical items the hit outscores for this query: in [0, 1], computed from the hit's own score
only, so adding or removing other photos never changes it. A result list has a *strong match* when one of its
hits reaches :data:`STRONG`; when none does, the list holds only the closest items, not ones the query describes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

STRONG = 0.99               # a hit outscoring 99% of the reference set for its query is a strong match
REFERENCE_SIZE = 1000       # reference items per index side, at most


def reference_rows(n: int, size: int = REFERENCE_SIZE) -> np.ndarray:
    """The rows of a bank of ``n`` vectors that form its reference set: ``min(n, size)`` of them, evenly spaced
    (row ``⌊i·n/m⌋`` for ``i < m``), so the same bank always gives the same set."""
    m = min(int(n), int(size))
    return (np.arange(m, dtype=np.int64) * int(n)) // max(m, 1)


class Reference:
    """The reference items of one index side, as that side stores its items (``[v, −o]`` when it is folded)."""

    def __init__(self, items: np.ndarray):
        items = np.asarray(items, dtype=np.float32)
        if items.ndim != 2 or len(items) == 0:
            raise ValueError(f"a reference set must be a non-empty (n, dim) array, got shape {items.shape}")
        self.items = np.ascontiguousarray(items)

    def __len__(self) -> int:
        return len(self.items)

    def relevance(self, queries: np.ndarray, scores: Sequence[Sequence[float]]) -> list[list[float]]:
        """``scores[i]``: the scores of query ``i``'s hits → their relevance. ``queries`` as the index searches
        them (``[q, 1]`` against a folded side), one row per list of scores."""
        ref = np.sort(np.asarray(queries, dtype=np.float32) @ self.items.T, axis=1)       # (Q, m), ascending
        n = ref.shape[1]
        return [(np.searchsorted(row, np.asarray(s, dtype=np.float32), side="left") / n).tolist()
                for row, s in zip(ref, scores)]


def strong_match(relevance: Sequence[float] | None) -> bool | None:
    """Whether a hit of a result list reaches :data:`STRONG` (None: the list has no relevance)."""
    return None if relevance is None else any(r >= STRONG for r in relevance)


@dataclass(frozen=True)
class Ranking:
    """One query's hits, best first, ``(id, score)``, with each hit's relevance (None: the index has no reference
    set for that side)."""
    hits: list[tuple[int, float]]
    relevance: list[float] | None = None

    @property
    def strong_match(self) -> bool | None:
        return strong_match(self.relevance)
