"""A search's hits joined with what the index knows of each: its score and relevance (index/relevance.py) beside
its metadata row (index/metadata.py) — the file, folder, capture time, size, a video moment's span, and for a
keyword or hybrid search the words it matched (index/hybrid.py). One
implementation for ``jointspace index search`` (index/cli_search.py) and the service's image search
(service/api/search.py); each shows the fields it shows."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .hybrid import TextRanking
from .metadata import ImageRow
from .query import format_time
from .relevance import Ranking


@dataclass(frozen=True)
class GalleryHit:
    """One gallery image (or video moment) of a ranking. The metadata fields are None when the index has no row
    for the id (removed since the search)."""

    id: int
    score: float
    relevance: float | None
    path: str | None = None             # the file; a moment's: its video's
    folder: str | None = None           # as stored (absolute)
    taken: str | None = None            # capture time, ISO 8601 UTC (index.query.format_time)
    width: int | None = None
    height: int | None = None
    video_id: int | None = None         # a moment's video, its span and its thumbnail frame's time, in seconds
    start: float | None = None
    end: float | None = None
    frame: float | None = None
    matched: list[str] | None = None    # a keyword or hybrid search's: the query words it matched (else None),
    keyword_score: float | None = None  # its BM25 score (None: no keyword match)
    fused_score: float | None = None    # and its fused score (hybrid mode)

    @property
    def media(self) -> str:
        return "photo" if self.video_id is None else "video"

    def moment(self, frame: bool = True) -> dict[str, Any]:
        """A video moment's fields (``media``, ``video_id``, ``start``, ``end`` and, with ``frame``, ``frame``);
        empty for a photo."""
        if self.video_id is None:
            return {}
        return {"media": "video", "video_id": self.video_id, "start": self.start, "end": self.end,
                **({"frame": self.frame} if frame else {})}


    def words(self) -> dict[str, Any]:
        """A keyword or hybrid search's fields (``matched``, ``keyword_score``, ``fused_score``); else empty."""
        if self.matched is None:
            return {}
        return {"matched": self.matched, "keyword_score": self.keyword_score, "fused_score": self.fused_score}


def relevances(ranking: Ranking) -> list[float | None]:
    """Each hit's relevance, None throughout where the index has no reference set."""
    return list(ranking.relevance) if ranking.relevance is not None else [None] * len(ranking.hits)


def _words(ranking: Ranking, n: int) -> dict[str, Any]:
    """The ``n``-th hit's words, for a keyword or hybrid search's ranking (index/hybrid.py's TextRanking)."""
    if not isinstance(ranking, TextRanking) or ranking.matched is None:
        return {}
    return {"matched": ranking.matched[n],
            "keyword_score": ranking.keyword_scores[n] if ranking.keyword_scores is not None else None,
            "fused_score": ranking.fused[n] if ranking.fused is not None else None}


def _hit(i: int, score: float, relevance: float | None, row: ImageRow | None, words: dict[str, Any]) -> GalleryHit:
    if row is None:
        return GalleryHit(i, score, relevance, **words)
    return GalleryHit(i, score, relevance, path=row.path, folder=row.folder, taken=format_time(row.taken),
                    width=row.width, height=row.height, video_id=row.video_id, start=row.t_start, end=row.t_end,
                    frame=row.t_frame, **words)


def image_hits(gallery, ranking: Ranking) -> list[GalleryHit]:
    """The hits of an image search (``gallery``: an index.gallery.Gallery), best first, with their metadata."""
    rows = gallery.image_rows([i for i, _ in ranking.hits])
    return [_hit(i, s, r, rows.get(i), _words(ranking, n))
            for n, ((i, s), r) in enumerate(zip(ranking.hits, relevances(ranking)))]
