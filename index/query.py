"""What a search may ask besides its query vector: filters on the photos (folder, capture time), a score threshold,
pagination; and the text query with words to take away. Shared by the CLI (``jointspace index search``) and the
HTTP service, so both read and refuse the same things with the same messages.

Times: a date (``2024-06-01``: that day's 00:00 UTC — the reading of a capture time from EXIF without
OffsetTimeOriginal, ``index/embed.py``) or an RFC 3339 date-time with its offset (``2024-06-01T14:30:00Z``,
``2024-06-01T14:30:00+02:00``): the OpenAPI formats ``date`` and ``date-time``, exactly. ``taken_after`` is
inclusive, ``taken_before`` exclusive.
"""
from __future__ import annotations

import datetime as dt
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np

SCORE_RANGES = {"cosine": (-1.0, 1.0), "order": (None, 0.0)}     # what each similarity's scores can be
_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_DATE_TIME = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]+)?"
                        r"(?:([Zz])|([+-])([0-9]{2}):([0-9]{2}))")
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


class UnknownFolderError(ValueError):
    """A folder filter that names no folder of the gallery. ``str()`` names the gallery's root folder (for the
    CLI); ``public`` does not (for HTTP clients, who need not know the server's paths)."""

    def __init__(self, folder: str, root: str):
        self.public = f"no indexed images in folder {folder!r} (GET /v1/folders lists the gallery's folders)"
        super().__init__(f"no indexed images in folder {folder!r} (folders are relative to {root})")


def parse_time(value: str, name: str = "time") -> float:
    """An ISO 8601 / RFC 3339 date (``2024-06-01``, that day's 00:00 UTC) or RFC 3339 date-time with its offset
    (``2024-06-01T14:30:00Z``, ``2024-06-01T14:30:00.5+02:00``) → Unix seconds; ValueError saying why not."""
    text = value if isinstance(value, str) else ""
    try:
        if m := _DATE.fullmatch(text):
            when = dt.datetime.combine(dt.date.fromisoformat(text), dt.time(), dt.timezone.utc)
        elif m := _DATE_TIME.fullmatch(text):
            y, mo, d, h, mi, sec, frac, z, sign, oh, om = m.groups()
            if int(h) > 23 or int(mi) > 59 or int(sec) > 60 or (oh and (int(oh) > 23 or int(om) > 59)):
                raise ValueError
            offset = dt.timedelta(0) if z else (1 if sign == "+" else -1) * dt.timedelta(hours=int(oh),
                                                                                          minutes=int(om))
            naive = dt.datetime(int(y), int(mo), int(d), int(h), int(mi))
            seconds = (naive - dt.datetime(1970, 1, 1)).total_seconds() + int(sec) + float("0" + (frac or ""))
            return seconds - offset.total_seconds()       # a leap second (:60) counts as the next second
        else:
            raise ValueError
    except ValueError:
        raise ValueError(f"{name} must be a date (2024-06-01) or a date-time with its offset "
                         f"(2024-06-01T14:30:00Z, 2024-06-01T14:30:00+02:00), not {value!r}") from None
    return (when - _EPOCH).total_seconds()


@lru_cache(maxsize=65_536)
def format_time(seconds: float | None) -> str | None:
    """Unix seconds → ISO 8601 UTC date-time (``2024-06-01T14:30:00Z``); the capture times formatted last are kept
    (every hit of a search shows its own, each time it is shown)."""
    if seconds is None or seconds != seconds:
        return None
    try:
        when = _EPOCH + dt.timedelta(seconds=seconds)
    except (OverflowError, ValueError):       # beyond what datetime holds (years 1 to 9999): no time to show
        return None
    return when.replace(microsecond=0).isoformat().replace("+00:00", "Z")


def check_min_score(similarity: str, min_score: float | None) -> float | None:
    """``min_score`` within what the model's similarity can score (cosine: −1 to 1; order: at most 0)."""
    if min_score is None:
        return None
    lo, hi = SCORE_RANGES.get(similarity, (None, None))
    if min_score != min_score or (lo is not None and min_score < lo) or (hi is not None and min_score > hi):
        what = f"from {lo:g} to {hi:g}" if lo is not None else f"at most {hi:g}"
        raise ValueError(f"min_score must be {what} (the range of this model's {similarity} similarity), "
                         f"not {min_score:g}")
    return float(min_score)


MEDIA = (None, "photo", "video")     # what a search may be limited to (None: photos and video moments)


@dataclass(frozen=True)
class ImageFilter:
    """Which gallery images a search may return: under ``folder`` (a path relative to the gallery's root folder,
    or absolute), taken in ``[taken_after, taken_before)`` (Unix seconds) and of one ``media`` type (``photo``, or
    ``video``: the moments of videos; None: both). A range with ``taken_before`` not later than ``taken_after``
    holds no instant: a valid filter that lets no image through."""
    folder: str | None = None
    taken_after: float | None = None
    taken_before: float | None = None
    media: str | None = None

    def __post_init__(self):
        if self.folder is not None and not str(self.folder).strip():
            raise ValueError("folder must not be empty")
        if self.media not in MEDIA:
            raise ValueError(f"media must be one of {', '.join(m for m in MEDIA if m)}, not {self.media!r}")

    @classmethod
    def parse(cls, folder: str | None = None, taken_after: str | None = None,
              taken_before: str | None = None, media: str | None = None) -> "ImageFilter":
        return cls(folder, None if taken_after is None else parse_time(taken_after, "taken_after"),
                   None if taken_before is None else parse_time(taken_before, "taken_before"), media)

    @property
    def active(self) -> bool:
        return (self.folder is not None or self.taken_after is not None or self.taken_before is not None
                or self.media is not None)


def inside(path: str, root: str) -> str:
    """``path`` relative to the folder ``root`` ('.' for the root itself), or as it is (absolute) when it lies
    outside the root: never a climb of ``../..``."""
    path, root = os.path.normpath(path), os.path.normpath(root)
    if os.path.isabs(path) and path != root and not path.startswith(root.rstrip(os.sep) + os.sep):
        return path
    return os.path.relpath(path, root)


class PhotoTable:
    """The gallery's images as arrays (id, capture time, folder, whether a video's moment) for filtering: read
    once per generation."""

    def __init__(self, rows, root: str | None = None):
        self.ids = np.asarray([r.id for r in rows], dtype=np.int64)
        self.moment = np.asarray([getattr(r, "video_id", None) is not None for r in rows], dtype=bool)
        self.taken = np.asarray([np.nan if r.taken is None else r.taken for r in rows], dtype=np.float64)
        self.folders = sorted({os.path.normpath(r.folder) for r in rows})
        index = {f: i for i, f in enumerate(self.folders)}
        self.folder_of = np.asarray([index[os.path.normpath(r.folder)] for r in rows], dtype=np.int64)
        self.root = os.path.normpath(root) if root else (os.path.commonpath(self.folders) if self.folders else "/")
        self._relative: dict[str, str] = {}

    def relative(self, folder: str) -> str:
        """:func:`inside` the root, kept per folder (every hit of a search shows its folder)."""
        out = self._relative.get(folder)
        if out is None:
            out = self._relative[folder] = inside(folder, self.root)
        return out

    def folder_counts(self) -> list[tuple[str, int]]:
        """Every folder with images (relative to the root) and how many images it holds directly."""
        counts = np.bincount(self.folder_of, minlength=len(self.folders))
        return [(self.relative(f), int(n)) for f, n in zip(self.folders, counts)]

    def resolve(self, folder: str) -> str:
        folder = folder.strip()
        path = folder if os.path.isabs(folder) else os.path.join(self.root, folder)
        return os.path.normpath(path)

    def allowed(self, flt: ImageFilter) -> np.ndarray | None:
        """The ids the filter lets through, sorted (None: no filter). UnknownFolderError for a folder without
        images."""
        if not flt.active:
            return None
        keep = np.ones(len(self.ids), dtype=bool)
        if flt.folder is not None:
            target = self.resolve(flt.folder)
            inside = [i for i, f in enumerate(self.folders) if f == target or f.startswith(target.rstrip(os.sep)
                                                                                          + os.sep)]
            if not inside:
                raise UnknownFolderError(flt.folder, self.root)
            keep &= np.isin(self.folder_of, inside)
        with np.errstate(invalid="ignore"):
            if flt.taken_after is not None:
                keep &= self.taken >= flt.taken_after          # NaN (no capture time) never passes
            if flt.taken_before is not None:
                keep &= self.taken < flt.taken_before
        if flt.media is not None:
            keep &= self.moment if flt.media == "video" else ~self.moment
        return np.sort(self.ids[keep])


def page(hits: Sequence[tuple[int, float]], k: int, offset: int = 0,
         min_score: float | None = None) -> list[tuple[int, float]]:
    """Best-first hits → the ``k`` from ``offset`` on, without those scoring under ``min_score``."""
    if min_score is not None:
        hits = [h for h in hits if h[1] >= min_score]
    return list(hits[offset:offset + k])
