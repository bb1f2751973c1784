"""A text query's three search modes, shared by ``jointspace index search --text`` and ``POST /v1/search/images``:

- ``vector``: the embedding ranking (the model's similarity between the sentence and each image);
- ``keyword``: the images whose keyword row (file name, folder names, OCR text, captions: index/keywords.py) holds
  any of the query's words, best BM25 first;
- ``hybrid``: both lists fused by reciprocal rank fusion (Cormack et al., 2009): an image at rank r_v in the
  vector list and r_k in the keyword list (ranks from 1; absent from a list: no term) scores

      w_v / (RRF_K + r_v) + w_k / (RRF_K + r_k)

  with :data:`RRF_K` = 60 (the paper's constant) and :data:`WEIGHTS` w_v = w_k = 1. The vector list is taken
  :data:`DEPTH` deep (at least ``k + offset``), so a keyword match ranked far down by its look can still rise to
  the first page. Without keyword hits the fused order is the vector order.

In every mode a hit's ``score`` is its embedding similarity (the same number ``vector`` gives; for an image found by
its words only, computed for it), ``min_score`` cuts on it, and relevance is computed from it (index/relevance.py);
the filters apply to both lists. Each hit also carries the query words its keyword row holds (``matched``), its BM25
score and, in hybrid mode, its fused score.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .choices import DEFAULT_MODE, MODES, SORT_DEPTH
from .keywords import MAX_HITS, query_words
from .order import by_time, check_sort
from .people import text_queries
from .query import page
from .relevance import Ranking

RRF_K = 60
WEIGHTS = {"vector": 1.0, "keyword": 1.0}
DEPTH = 100


@dataclass(frozen=True)
class TextRanking(Ranking):
    """A :class:`~index.relevance.Ranking` with, per hit, the query words it matched, its BM25 score (None: no
    keyword match) and its fused score (hybrid mode; else None)."""
    matched: list[list[str]] | None = None
    keyword_scores: list[float | None] | None = None
    fused: list[float | None] | None = None


def rrf(lists: Sequence[Sequence[int]], weights: Sequence[float], k: int = RRF_K) -> list[tuple[int, float]]:
    """Reciprocal rank fusion of best-first id lists: ``(id, Σ w / (k + rank))``, best first (ties: the order in
    which the lists first give the ids)."""
    scores: dict[int, float] = {}
    for ids, weight in zip(lists, weights):
        for rank, i in enumerate(ids, start=1):
            scores[i] = scores.get(i, 0.0) + weight / (k + rank)
    return sorted(scores.items(), key=lambda item: -item[1])


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    return mode


@dataclass(frozen=True)
class TextPaging:
    """Which hits a text search returns: ``k`` from ``offset`` on, scoring at least ``min_score``; ``sort``
    ``newest``/``oldest``: those passing ``min_score`` by capture time (index/order.py; the vector list then taken
    ``SORT_DEPTH`` deep, whatever the page)."""
    k: int = 10
    offset: int = 0
    min_score: float | None = None
    sort: str = "relevance"


DEFAULT_PAGING = TextPaging()


def search_text(gallery, query: np.ndarray, text: str, mode: str = DEFAULT_MODE, paging: TextPaging = DEFAULT_PAGING,
                allowed: np.ndarray | None = None) -> TextRanking:
    """One text query (``query``: its embedding, shape ``(1, dim)``; ``text``: its words, which also say whether it
    names a person: index/people.py) on a loaded
    :class:`~index.gallery.Gallery` in ``mode``, the hits ``paging`` says; ``allowed``: the image ids a filter lets
    through (None: all)."""
    k, offset, min_score, sort = paging.k, paging.offset, paging.min_score, paging.sort
    check_mode(mode)
    check_sort(sort)
    query = text_queries(query, [text])       # whether it names a person, for the person discount (index/people.py)
    terms = query_words(text)
    keyword: list[tuple[int, float]] = []
    if mode != "vector":
        keyword = gallery.meta.keyword_search(terms, MAX_HITS)
        if allowed is not None:
            keep = set(np.asarray(allowed).tolist())
            keyword = [h for h in keyword if h[0] in keep]
    bm25 = dict(keyword)
    fused: dict[int, float] = {}
    if mode == "vector":
        hits = gallery.search_images(query, k, offset=offset, min_score=min_score, allowed=allowed, sort=sort)[0]
    else:
        depth = max(k + offset, DEPTH) if sort == "relevance" else SORT_DEPTH
        vector = gallery.search_images(query, depth, allowed=allowed)[0] if mode == "hybrid" else []
        scores = dict(vector)
        if mode == "hybrid":
            order = rrf([[i for i, _ in vector], [i for i, _ in keyword]], [WEIGHTS["vector"], WEIGHTS["keyword"]],
                        RRF_K)
            fused = dict(order)
            ids = [i for i, _ in order]
        else:
            ids = [i for i, _ in keyword]
        missing = [i for i in ids if i not in scores]
        if missing:                       # found by their words only: their similarity, from a search among them
            scores.update(gallery.search_images(query, len(missing), allowed=np.asarray(missing, np.int64))[0])
        listed = page([(i, scores[i]) for i in ids if i in scores], len(ids), 0, min_score)
        hits = page(by_time(listed, gallery.photos.ids, gallery.photos.taken, sort), k, offset)
    ranking = gallery.ranked("images", query, [hits])[0]
    ids = [i for i, _ in ranking.hits]
    words = gallery.meta.keyword_matches(terms, ids)
    return TextRanking(ranking.hits, ranking.relevance, matched=[words.get(i, []) for i in ids],
                       keyword_scores=[bm25.get(i) for i in ids],
                       fused=[fused.get(i) for i in ids] if mode == "hybrid" else None)
