"""Gallery metadata in SQLite: image id → file path, capture time, size, folder and content hash; caption id →
text; video id → file path, duration, size and its own vector; and when each was added. A video's moments are
rows of the images table (their FAISS ids are image ids) with ``video_id``, ``t_start``, ``t_end`` and
``t_frame`` (its thumbnail's time) set.

One database file per index generation (see ``index.gallery``). Every change runs in one transaction, so a
process killed mid-change leaves the database as it was before the change. The service reads it from
several threads: one connection, guarded by a lock.

Indexes written before the photo columns existed (``taken``, ``width``, ``height``, ``folder``, ``sha256``,
``size``, ``mtime``; ``phash``) still load: opened for writing, the table gets the columns (NULL for the old rows);
opened read-only, the missing columns read as NULL and ``folder`` is derived from the path. The same holds for the
moment columns (``video_id``, ``t_start``, ``t_end``, ``t_frame``) and the ``videos`` table (read-only: no videos).

The keyword index (FTS5) and the words OCR read live in the same file, kept in step with the images and captions:
``index/keywords.py``.
"""
from __future__ import annotations

import os
import sqlite3
import threading
import time
import urllib.parse
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Sequence

from . import keywords

if TYPE_CHECKING:
    from .ocr import PhotoText

SCHEMA = """
CREATE TABLE IF NOT EXISTS images (
    id     INTEGER PRIMARY KEY,
    path   TEXT NOT NULL,
    added  REAL NOT NULL,
    taken  REAL,               -- capture time, Unix seconds (EXIF DateTimeOriginal, else the file's mtime)
    width  INTEGER,            -- upright size in pixels (EXIF orientation applied)
    height INTEGER,
    folder TEXT,               -- the absolute folder of the file
    sha256 TEXT,               -- of the file's bytes (index sync)
    size   INTEGER,            -- bytes
    mtime  REAL,               -- the file's mtime when it was embedded
    video_id INTEGER,          -- a video's moment: the video (videos.id); NULL for a photo
    t_start  REAL,             -- the moment's span in the video, seconds
    t_end    REAL,
    t_frame  REAL,             -- the time of its frame nearest the moment's vector (its thumbnail)
    phash    INTEGER           -- a photo's perceptual hash (index/phash.py); NULL for moments and older rows
);
CREATE TABLE IF NOT EXISTS videos (
    id       INTEGER PRIMARY KEY,
    path     TEXT NOT NULL,
    added    REAL NOT NULL,
    taken    REAL,             -- the container's creation_time, else the file's mtime
    width    INTEGER,          -- upright size (rotation applied)
    height   INTEGER,
    folder   TEXT,
    sha256   TEXT,
    size     INTEGER,
    mtime    REAL,
    duration REAL,             -- seconds decoded
    fps      REAL,
    vector   BLOB              -- float32: the mean of its frames' embeddings (W2VV §III-D)
);
CREATE TABLE IF NOT EXISTS captions (
    id       INTEGER PRIMARY KEY,
    text     TEXT NOT NULL,
    image_id INTEGER,          -- the gallery image the caption came with (data-set captions), else NULL
    added    REAL NOT NULL
);
"""


# the photo columns, in order, with their SQL types (added to an older table by ALTER TABLE)
PHOTO_COLUMNS = (("taken", "REAL"), ("width", "INTEGER"), ("height", "INTEGER"), ("folder", "TEXT"),
                 ("sha256", "TEXT"), ("size", "INTEGER"), ("mtime", "REAL"))
# a video moment's columns (NULL for photos), added to an older table alike
MOMENT_COLUMNS = (("video_id", "INTEGER"), ("t_start", "REAL"), ("t_end", "REAL"), ("t_frame", "REAL"))
# a photo's perceptual hash (index/phash.py, for index/duplicates.py), added to an older table alike
HASH_COLUMNS = (("phash", "INTEGER"),)
_IMAGE_COLUMNS = ("id", "path", "added") + tuple(name for name, _ in PHOTO_COLUMNS + MOMENT_COLUMNS + HASH_COLUMNS)
_VIDEO_COLUMNS = ("id", "path", "added", "taken", "width", "height", "folder", "sha256", "size", "mtime",
                  "duration", "fps")


@dataclass(frozen=True)
class ImageRow:
    id: int
    path: str
    added: float
    taken: float | None = None
    width: int | None = None
    height: int | None = None
    folder: str | None = None
    sha256: str | None = None
    size: int | None = None
    mtime: float | None = None
    video_id: int | None = None          # a video's moment: its video and span in seconds
    t_start: float | None = None
    t_end: float | None = None
    t_frame: float | None = None
    phash: int | None = None             # perceptual hash (index/phash.py); None for moments and older rows


@dataclass(frozen=True)
class VideoRow:
    id: int
    path: str
    added: float
    taken: float | None
    width: int | None
    height: int | None
    folder: str | None
    sha256: str | None
    size: int | None
    mtime: float | None
    duration: float | None
    fps: float | None


@dataclass(frozen=True)
class CaptionRow:
    id: int
    text: str
    image_id: int | None
    added: float


class Metadata:
    """A SQLite metadata file. ``readonly`` opens it with ``mode=ro`` (the service never writes)."""

    def __init__(self, path: str | Path, readonly: bool = False):
        self.path = Path(path)
        if readonly:
            if not self.path.exists():
                raise FileNotFoundError(f"no metadata database at {self.path}")
            # a URI, so the path is percent-encoded: '#', '?' and '%' in a folder name are part of the path
            uri = f"file:{urllib.parse.quote(str(self.path.absolute()))}?mode=ro"
            self._conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
        else:
            self._conn = sqlite3.connect(self.path, check_same_thread=False)
            self._conn.execute("PRAGMA journal_mode=DELETE")
            self._conn.execute("PRAGMA synchronous=FULL")
            with self._conn:
                self._conn.executescript(SCHEMA)
                have = {r[1] for r in self._conn.execute("PRAGMA table_info(images)")}
                for name, sql_type in PHOTO_COLUMNS + MOMENT_COLUMNS + HASH_COLUMNS:   # migrate a table written before these
                    if name not in have:
                        self._conn.execute(f"ALTER TABLE images ADD COLUMN {name} {sql_type}")
                keywords.ensure_tables(self._conn)          # the keyword index (index/keywords.py)
        have = {r[1] for r in self._conn.execute("PRAGMA table_info(images)")}
        self._select_images = "SELECT " + ", ".join(c if c in have else f"NULL AS {c}" for c in _IMAGE_COLUMNS) \
            + " FROM images"
        tables = {r[0] for r in self._conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        self._has_videos = "videos" in tables
        self._lock = threading.Lock()

    def close(self) -> None:
        self._conn.close()

    def copy_to(self, path: str | Path) -> "Metadata":
        """A consistent copy (SQLite online backup) at ``path``, opened for writing."""
        dst = sqlite3.connect(path)
        with self._lock:
            self._conn.backup(dst)
        dst.close()
        return Metadata(path)

    # --- writes (each one transaction) ----------------------------------------------------------------
    def add_images(self, rows: Iterable[tuple], added: float | None = None) -> None:
        """Rows ``(id, path)`` or ``(id, path, info)`` with ``info`` an ``index.embed.PhotoInfo``."""
        added = time.time() if added is None else added
        values = []
        for row in rows:
            info = row[2] if len(row) > 2 else None
            photo = (None,) * len(PHOTO_COLUMNS) if info is None else (
                info.taken, info.width, info.height, info.folder, info.sha256, info.size, info.mtime)
            moment = tuple(getattr(info, name, None) for name in ("video_id", "start", "end", "frame"))
            values.append((int(row[0]), str(row[1]), added, *photo, *moment, getattr(info, "phash", None)))
        with self._lock, self._conn:
            self._conn.executemany(f"INSERT INTO images ({', '.join(_IMAGE_COLUMNS)}) VALUES "
                                   f"({', '.join('?' * len(_IMAGE_COLUMNS))})", values)
            keywords.add_rows(self._conn, [(v[0], v[1], v[6]) for v in values])

    def add_captions(self, rows: Iterable[tuple[int, str, int | None]], added: float | None = None) -> None:
        added = time.time() if added is None else added
        with self._lock, self._conn:
            self._conn.executemany("INSERT INTO captions (id, text, image_id, added) VALUES (?, ?, ?, ?)",
                                   [(int(i), t, None if g is None else int(g), added) for i, t, g in rows])

    def remove_images(self, ids: Sequence[int]) -> int:
        with self._lock, self._conn:
            cur = self._conn.executemany("DELETE FROM images WHERE id = ?", [(int(i),) for i in ids])
            self._conn.executemany("UPDATE captions SET image_id = NULL WHERE image_id = ?",
                                   [(int(i),) for i in ids])
            return cur.rowcount

    def add_texts(self, texts: Iterable[tuple[int, "PhotoText"]], min_confidence: float) -> None:
        """What OCR read in photos, ``(image id, index.ocr.PhotoText)``: stored, and indexed as words
        (index/keywords.py)."""
        with self._lock, self._conn:
            keywords.add_texts(self._conn, texts, min_confidence)

    def add_videos(self, rows: Iterable[tuple], added: float | None = None) -> None:
        """Rows ``(id, path, info, vector)``: ``info`` an ``index.video_embed.VideoInfo``, ``vector`` its float32
        embedding."""
        added = time.time() if added is None else added
        values = [(int(i), str(path), added, info.taken, info.width, info.height, info.folder, info.sha256,
                   info.size, info.mtime, info.duration, info.fps, np_bytes(vector)) for i, path, info, vector in rows]
        with self._lock, self._conn:
            self._conn.executemany(f"INSERT INTO videos ({', '.join(_VIDEO_COLUMNS)}, vector) VALUES "
                                   f"({', '.join('?' * (len(_VIDEO_COLUMNS) + 1))})", values)

    def remove_videos(self, ids: Sequence[int]) -> list[int]:
        """Removes videos and their moments' rows; returns the image ids of those moments."""
        ids = [int(i) for i in ids]
        with self._lock, self._conn:
            moments = [r[0] for start in range(0, len(ids), 900) for r in self._conn.execute(
                f"SELECT id FROM images WHERE video_id IN ({','.join('?' * len(ids[start:start + 900]))})",
                ids[start:start + 900])]
            self._conn.executemany("DELETE FROM images WHERE id = ?", [(i,) for i in moments])
            self._conn.executemany("DELETE FROM videos WHERE id = ?", [(i,) for i in ids])
        return sorted(moments)

    def remove_captions(self, ids: Sequence[int]) -> int:
        with self._lock, self._conn:
            return self._conn.executemany("DELETE FROM captions WHERE id = ?", [(int(i),) for i in ids]).rowcount

    # --- reads --------------------------------------------------------------------------------------------
    def image(self, image_id: int) -> ImageRow | None:
        with self._lock:
            row = self._conn.execute(self._select_images + " WHERE id = ?", (int(image_id),)).fetchone()
        return _image_row(*row) if row else None

    def images(self, ids: Sequence[int]) -> dict[int, ImageRow]:
        return self._many(self._select_images + " WHERE id IN ({})", ids, _image_row)

    def all_images(self) -> list[ImageRow]:
        """Every image row, by id."""
        with self._lock:
            return [_image_row(*r) for r in self._conn.execute(self._select_images + " ORDER BY id")]

    def video(self, video_id: int) -> VideoRow | None:
        if not self._has_videos:
            return None
        with self._lock:
            row = self._conn.execute(f"SELECT {', '.join(_VIDEO_COLUMNS)} FROM videos WHERE id = ?",
                                     (int(video_id),)).fetchone()
        return VideoRow(*row) if row else None

    def all_videos(self) -> list[VideoRow]:
        """Every video row, by id (none in an index written before videos)."""
        if not self._has_videos:
            return []
        with self._lock:
            return [VideoRow(*r) for r in self._conn.execute(f"SELECT {', '.join(_VIDEO_COLUMNS)} FROM videos "
                                                              "ORDER BY id")]

    def video_vectors(self) -> tuple[list[int], list[bytes]]:
        """The videos' ids and their vectors' float32 bytes, by id."""
        if not self._has_videos:
            return [], []
        with self._lock:
            rows = self._conn.execute("SELECT id, vector FROM videos ORDER BY id").fetchall()
        return [r[0] for r in rows], [r[1] for r in rows]

    def captions(self, ids: Sequence[int]) -> dict[int, CaptionRow]:
        return self._many("SELECT id, text, image_id, added FROM captions WHERE id IN ({})", ids, CaptionRow)

    def image_ids(self) -> list[int]:
        with self._lock:
            return [r[0] for r in self._conn.execute("SELECT id FROM images ORDER BY id")]

    def caption_ids(self) -> list[int]:
        with self._lock:
            return [r[0] for r in self._conn.execute("SELECT id FROM captions ORDER BY id")]

    def counts(self) -> dict[str, int]:
        with self._lock:
            n_img = self._conn.execute("SELECT COUNT(*) FROM images").fetchone()[0]
            n_cap = self._conn.execute("SELECT COUNT(*) FROM captions").fetchone()[0]
            n_vid = self._conn.execute("SELECT COUNT(*) FROM videos").fetchone()[0] if self._has_videos else 0
            n_mom = self._conn.execute("SELECT COUNT(*) FROM images WHERE video_id IS NOT NULL").fetchone()[0] \
                if self._has_videos else 0
        return {"images": n_img, "captions": n_cap, "videos": n_vid, "moments": n_mom}

    def keyword_search(self, terms: Sequence[str], limit: int) -> list[tuple[int, float]]:
        """Images holding any of the words ``terms``, best BM25 first (index/keywords.py)."""
        with self._lock:
            return keywords.search(self._conn, terms, limit)

    def keyword_matches(self, terms: Sequence[str], ids: Sequence[int]) -> dict[int, list[str]]:
        """Which of ``terms`` each of the images ``ids`` holds (index/keywords.py)."""
        with self._lock:
            return keywords.matched(self._conn, terms, ids)

    def ocr_words(self, image_id: int) -> list[tuple[str, float]] | None:
        """The words OCR read in a photo with their confidences; None when it never looked at the photo."""
        with self._lock:
            return keywords.ocr_words(self._conn, image_id)

    def _many(self, sql: str, ids: Sequence[int], row_type) -> dict:
        out = {}
        ids = [int(i) for i in ids]
        with self._lock:
            for start in range(0, len(ids), 900):        # SQLite's bound-parameter limit
                chunk = ids[start:start + 900]
                for row in self._conn.execute(sql.format(",".join("?" * len(chunk))), chunk):
                    out[row[0]] = row_type(*row)
        return out


def np_bytes(vector) -> bytes:
    """A vector's float32 bytes (what the ``videos.vector`` column holds)."""
    import numpy as np

    return np.ascontiguousarray(vector, dtype=np.float32).tobytes()


def _image_row(*row) -> ImageRow:
    r = ImageRow(*row)
    if r.folder is None:                   # a row written before the folder column: the path's folder
        r = replace(r, folder=os.path.dirname(r.path))
    return r
