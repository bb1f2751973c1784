"""The gallery's keyword index: an SQLite FTS5 table in the generation's metadata database, one row per image (rowid =
image id), ranked by BM25, with four columns:

- ``name``: the file's name, split into words at ``_ - .``, spaces and letter/digit boundaries, so that
  ``IMG_2041.jpg`` is ``img 2041 jpg`` and both ``IMG_2041`` and ``2041`` find it (a video's moments: the video's
  name);
- ``folder``: the names of the file's folder and of its two parent folders, split alike;
- ``ocr``: the words Tesseract read in the photo with at least the index's minimum confidence (index/ocr.py);
- ``caption``: the captions that came with the image (a captioned data set's; ``captions.image_id``).

Kept consistent with the ``images`` and ``captions`` tables in the same transactions: :class:`~index.metadata.
Metadata` writes an image's row when it adds the image, and SQL triggers delete it with the image (every removal
path: ``remove``, ``sync``, a removed video's moments) and rewrite its caption column when a caption linked to it is
added or removed. A database written before the table existed gets it, filled from its images and captions, the
first time it is opened for writing (any update); opened read-only, it has no keyword hits.

Queries are split into words alike, minus a few English function words (:data:`STOP_WORDS`); a photo matches when
it holds any of them, and BM25 (weights :data:`WEIGHTS` per column) ranks the matches.
"""
from __future__ import annotations

import os
import re
import sqlite3
from typing import TYPE_CHECKING, Iterable, Sequence

if TYPE_CHECKING:
    from .ocr import PhotoText

# BM25 column weights (name, folder, ocr, caption): a word in a file's name counts as one read in it; folder names
# are shared by many photos, so they count half
COLUMNS = ("name", "folder", "ocr", "caption")
WEIGHTS = (1.0, 0.5, 1.0, 1.0)
MAX_HITS = 1000           # keyword hits a search considers at most (a filter applies to them)
STOP_WORDS = frozenset("a an and are as at be by for from in into is it its of on or the to with".split())

SCHEMA = """
CREATE VIRTUAL TABLE IF NOT EXISTS keywords USING fts5(name, folder, ocr, caption,
                                                        tokenize = 'unicode61 remove_diacritics 2');
CREATE TABLE IF NOT EXISTS ocr_photos (
    image_id   INTEGER PRIMARY KEY,  -- a photo the gate looked at
    likelihood REAL NOT NULL,        -- the gate's text likelihood (index/ocr.py)
    read       INTEGER NOT NULL      -- 1: Tesseract read it (its words in ocr_words); 0: the gate passed it over
);
CREATE TABLE IF NOT EXISTS ocr_words (
    image_id   INTEGER NOT NULL,
    position   INTEGER NOT NULL,     -- reading order
    word       TEXT NOT NULL,
    confidence REAL NOT NULL,        -- Tesseract's, 0-100
    PRIMARY KEY (image_id, position)
);
CREATE TRIGGER IF NOT EXISTS keywords_image_gone AFTER DELETE ON images BEGIN
    DELETE FROM keywords WHERE rowid = old.id;
    DELETE FROM ocr_words WHERE image_id = old.id;
    DELETE FROM ocr_photos WHERE image_id = old.id;
END;
CREATE TRIGGER IF NOT EXISTS keywords_caption_added AFTER INSERT ON captions WHEN new.image_id IS NOT NULL BEGIN
    UPDATE keywords SET caption = (SELECT group_concat(text, ' ') FROM captions WHERE image_id = new.image_id)
        WHERE rowid = new.image_id;
END;
CREATE TRIGGER IF NOT EXISTS keywords_caption_gone AFTER DELETE ON captions WHEN old.image_id IS NOT NULL BEGIN
    UPDATE keywords SET caption = (SELECT group_concat(text, ' ') FROM captions WHERE image_id = old.image_id)
        WHERE rowid = old.image_id;
END;
CREATE TRIGGER IF NOT EXISTS keywords_caption_moved AFTER UPDATE OF image_id ON captions BEGIN
    UPDATE keywords SET caption = (SELECT group_concat(text, ' ') FROM captions WHERE image_id = old.image_id)
        WHERE rowid = old.image_id;
    UPDATE keywords SET caption = (SELECT group_concat(text, ' ') FROM captions WHERE image_id = new.image_id)
        WHERE rowid = new.image_id;
END;
"""

_WORD = re.compile(r"[^\W\d_]+|\d+")        # runs of letters, runs of digits


def words(text: str) -> list[str]:
    """Lower-case words of ``text``: runs of letters and runs of digits (``IMG_2041.jpg`` → img, 2041, jpg)."""
    return [w.lower() for w in _WORD.findall(text or "")]


def query_words(text: str) -> list[str]:
    """A query's words, without :data:`STOP_WORDS` and repeats, in order."""
    seen: dict[str, None] = {}
    for w in words(text):
        if w not in STOP_WORDS:
            seen.setdefault(w, None)
    return list(seen)


def name_text(path: str) -> str:
    return " ".join(words(os.path.basename(path)))


def folder_text(folder: str | None) -> str:
    parts = [p for p in (folder or "").replace("\\", "/").split("/") if p][-3:]
    return " ".join(w for p in parts for w in words(p))


def ensure_tables(conn: sqlite3.Connection) -> None:
    """Creates the keyword tables and triggers (inside the caller's transaction); a database that had images but no
    keyword table gets its rows from the images and captions tables."""
    existed = conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'keywords'").fetchone() is not None
    conn.executescript(SCHEMA)
    if existed:
        return
    rows = conn.execute("SELECT id, path, folder FROM images").fetchall()
    add_rows(conn, rows)
    conn.execute("UPDATE keywords SET caption = (SELECT group_concat(text, ' ') FROM captions "
                 "WHERE captions.image_id = keywords.rowid)")


def add_rows(conn: sqlite3.Connection, rows: Iterable[tuple[int, str, str | None]]) -> None:
    """Keyword rows for images ``(id, path, folder)`` (their names and folders; OCR text comes with
    :func:`add_texts`)."""
    conn.executemany("INSERT INTO keywords (rowid, name, folder, ocr, caption) VALUES (?, ?, ?, '', '')",
                     [(int(i), name_text(p), folder_text(f if f is not None else os.path.dirname(p)))
                      for i, p, f in rows])


def add_texts(conn: sqlite3.Connection, texts: Iterable[tuple[int, "PhotoText"]], min_confidence: float) -> None:
    """Stores what index/ocr.py read from photos ``(image id, PhotoText)``: the gate's verdict, every word with its
    confidence, and the words read with at least ``min_confidence`` in the keyword row's ``ocr`` column."""
    for image_id, text in texts:
        image_id = int(image_id)
        conn.execute("INSERT OR REPLACE INTO ocr_photos (image_id, likelihood, read) VALUES (?, ?, ?)",
                     (image_id, float(text.likelihood), int(bool(text.read))))
        conn.execute("DELETE FROM ocr_words WHERE image_id = ?", (image_id,))
        conn.executemany("INSERT INTO ocr_words (image_id, position, word, confidence) VALUES (?, ?, ?, ?)",
                         [(image_id, n, w.text, float(w.confidence)) for n, w in enumerate(text.words)])
        indexed = " ".join(t for w in text.words if w.confidence >= min_confidence for t in words(w.text))
        conn.execute("UPDATE keywords SET ocr = ? WHERE rowid = ?", (indexed, image_id))


def has_table(conn: sqlite3.Connection) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'keywords'").fetchone() is not None


def match_expression(terms: Sequence[str]) -> str:
    """An FTS5 query matching any of ``terms`` (each quoted: a term is one word of letters or of digits)."""
    return " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)


def search(conn: sqlite3.Connection, terms: Sequence[str], limit: int = MAX_HITS) -> list[tuple[int, float]]:
    """The images holding any of ``terms``, best BM25 first: ``(image id, score)``, score > 0 (FTS5's bm25, negated:
    higher is better)."""
    if not terms or not has_table(conn):
        return []
    weights = ", ".join(str(w) for w in WEIGHTS)
    rows = conn.execute(f"SELECT rowid, bm25(keywords, {weights}) AS rank FROM keywords WHERE keywords MATCH ? "
                        f"ORDER BY rank, rowid LIMIT ?", (match_expression(terms), int(limit))).fetchall()
    return [(int(i), -float(r)) for i, r in rows]


def matched(conn: sqlite3.Connection, terms: Sequence[str], ids: Sequence[int]) -> dict[int, list[str]]:
    """Which of ``terms`` each image's keyword row holds (in the terms' order), for the images ``ids``."""
    out: dict[int, list[str]] = {}
    if not terms or not ids or not has_table(conn):
        return out
    ids = [int(i) for i in ids]
    for start in range(0, len(ids), 900):
        chunk = ids[start:start + 900]
        for row in conn.execute(f"SELECT rowid, {', '.join(COLUMNS)} FROM keywords WHERE rowid IN "
                                f"({','.join('?' * len(chunk))})", chunk):
            held = {w for column in row[1:] for w in (column or "").split()}
            out[int(row[0])] = [t for t in terms if t in held]
    return out


def ocr_words(conn: sqlite3.Connection, image_id: int) -> list[tuple[str, float]] | None:
    """The words read in a photo with their confidences, in reading order; None when OCR never looked at it."""
    if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'ocr_photos'").fetchone() is None:
        return None
    if conn.execute("SELECT 1 FROM ocr_photos WHERE image_id = ?", (int(image_id),)).fetchone() is None:
        return None
    return [(w, c) for w, c in conn.execute("SELECT word, confidence FROM ocr_words WHERE image_id = ? "
                                            "ORDER BY position", (int(image_id),))]
