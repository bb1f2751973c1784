"""Text in photos, read at index time: a cheap gate that tells which photos likely hold text, and Tesseract (Debian's
``tesseract-ocr``, the program run directly: the photo piped in, its words out as TSV) run on those only. The
words read, each with Tesseract's confidence, are stored per photo in the gallery's metadata and indexed as words
(index/keywords.py); the indexer reads a photo while it embeds the others (:class:`TextReading`).

The gate (:func:`text_likelihood`) looks at a small grey thumbnail: text is many thin, high-contrast strokes, so it
measures which share of the thumbnail's strong edges come in close opposite pairs (the two sides of a stroke). Its
threshold :data:`GATE` was set on generated text
photos against real photos (benchmarks/ocr_keyword.py: recall and precision in docs/index.md). A photo the gate
passes costs one Tesseract run (a second or so on a CPU core for a 12 MP photo, which is read at most
:data:`OCR_SIDE` pixels on its long side); one it rejects costs the thumbnail only.

The engine is a program, not a Python package: :func:`check_engine` says what is missing (the program, or a
language's data) with the command that installs it, before any photo is embedded.
"""
from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
from PIL import Image, ImageOps

GATE = 0.45             # text_likelihood at or above this: OCR runs (benchmarks/ocr_keyword.py measures it)
THUMB = 256             # the gate's thumbnail, long side in pixels
STEP = 0.2              # a strong step: this much brightness change (0-1) between horizontal neighbours
MIN_EDGES = 0.001       # a thumbnail with fewer strong steps than this share of its pixels holds no text
OCR_SIDE = 2000         # photos are read by Tesseract at most this many pixels on the long side
MIN_CONFIDENCE = 50.0   # words Tesseract reads with a lower confidence (0-100) are stored but not indexed
DEFAULT_LANG = "eng"
TESSERACT = "tesseract"  # the program
READ_TIMEOUT = 300       # seconds one photo's Tesseract run may take (it is stopped and the photo reads as no text)
_LANG = re.compile(r"[A-Za-z0-9_]+(\+[A-Za-z0-9_]+)*")


class OcrUnavailableError(RuntimeError):
    """Tesseract, or the data of a language asked for, is not installed."""


@dataclass(frozen=True)
class OcrConfig:
    """How photos are read: Tesseract's language(s) (``eng``, ``eng+deu``: installed language data), the gate's
    threshold (0: read every photo) and the confidence under which a word is not indexed."""
    lang: str = DEFAULT_LANG
    gate: float = GATE
    min_confidence: float = MIN_CONFIDENCE

    def manifest(self) -> dict:
        return {"lang": self.lang, "gate": self.gate, "min_confidence": self.min_confidence}

    @classmethod
    def from_manifest(cls, entry: dict | None) -> "OcrConfig | None":
        """The configuration an index was built with (its manifest's ``ocr``); None: built without OCR."""
        if not entry:
            return None
        return cls(lang=str(entry.get("lang", DEFAULT_LANG)), gate=float(entry.get("gate", GATE)),
                   min_confidence=float(entry.get("min_confidence", MIN_CONFIDENCE)))


@dataclass(frozen=True)
class Word:
    text: str
    confidence: float       # Tesseract's, 0-100


@dataclass(frozen=True)
class PhotoText:
    """What was read from one photo: the gate's score, whether OCR ran, and the words with their confidences."""
    likelihood: float
    read: bool
    words: tuple[Word, ...] = ()


def install_hint(lang: str = DEFAULT_LANG) -> str:
    packages = " ".join(["tesseract-ocr", *(f"tesseract-ocr-{code.lower()}" for code in lang.split("+"))])
    return f"sudo apt-get install {packages} (Debian/Ubuntu; `make ocr` does it where it runs as root)"


def check_engine(lang: str = DEFAULT_LANG) -> None:
    """Raises :class:`OcrUnavailableError` naming what is missing: the ``tesseract`` program, the Python binding, or
    the data of a language of ``lang``; ValueError for a malformed ``lang``."""
    if not _LANG.fullmatch(lang):
        raise ValueError(f"--ocr-lang must be Tesseract language codes joined by '+' (eng, eng+deu), not {lang!r}")
    program = shutil.which(TESSERACT)
    if program is None:
        raise OcrUnavailableError(f"OCR needs the tesseract program, which is not installed: {install_hint(lang)}; "
                                  f"or index without OCR (--no-ocr)")
    try:
        listed = subprocess.run([program, "--list-langs"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                timeout=60, check=False)
    except (OSError, subprocess.SubprocessError) as err:
        raise OcrUnavailableError(f"tesseract does not run: {err}") from None
    if listed.returncode not in (0, 1):
        raise OcrUnavailableError(f"tesseract does not run: `tesseract --list-langs` exited {listed.returncode}")
    # the lines after the heading ("List of available languages in ...: N")
    have = {line.strip() for line in listed.stdout.decode(errors="replace").splitlines()[1:]
            if _LANG.fullmatch(line.strip())}
    missing = [code for code in lang.split("+") if code not in have]
    if missing:
        raise OcrUnavailableError(f"Tesseract has no data for the language(s) {', '.join(missing)} (installed: "
                                  f"{', '.join(sorted(have - {'osd'})) or 'none'}): {install_hint('+'.join(missing))}")


def grey_thumbnail(image: Image.Image, side: int = THUMB) -> np.ndarray:
    """The photo, upright, grey, at most ``side`` pixels on its long side, as float32 in [0, 1]. A JPEG not yet
    loaded is decoded at a reduced scale (``draft``): a fraction of a full decode."""
    if image.format == "JPEG":                         # a no-op once loaded
        image.draft("L", (side, side))
    image = ImageOps.exif_transpose(image) or image
    image = image.convert("L")
    image.thumbnail((side, side), Image.Resampling.BILINEAR)
    return np.asarray(image, dtype=np.float32) / 255.0


def text_likelihood(grey: np.ndarray) -> float:
    """How much a grey thumbnail's strong edges look like text strokes: the share of its strong horizontal steps
    (brightness change over :data:`STEP` between neighbours) that pair with an opposite step 1 to 4 pixels away —
    the two sides of a thin stroke, as the letters of printed text are at thumbnail size — among all its strong
    steps. Ordinary photos' strong edges are mostly single (an outline, a horizon, a shadow) and score low; 0 for
    an image with (almost) no strong edge."""
    if grey.ndim != 2 or min(grey.shape) < 8:
        return 0.0
    dx = np.diff(grey, axis=1)
    rise, fall = dx > STEP, dx < -STEP
    edges = rise | fall
    n_edges = int(edges.sum())
    if n_edges < MIN_EDGES * edges.size:
        return 0.0
    pair = np.zeros_like(rise)
    for gap in range(1, 5):
        pair[:, :-gap] |= (rise[:, :-gap] & fall[:, gap:]) | (fall[:, :-gap] & rise[:, gap:])
    return float(pair.sum()) / n_edges


def likelihood_of(path: str | Path) -> float:
    with Image.open(path) as image:
        return text_likelihood(grey_thumbnail(image))


def read_words(image: Image.Image, lang: str = DEFAULT_LANG) -> tuple[Word, ...]:
    """Tesseract's words of a photo with their confidences (page segmentation: automatic, sparse text): the photo,
    upright, grey and at most :data:`OCR_SIDE` pixels on its long side, piped to the program as a PGM (no file,
    nothing to encode), its TSV read back. RuntimeError when Tesseract fails or takes over :data:`READ_TIMEOUT`
    seconds."""
    image = ImageOps.exif_transpose(image) or image
    image = image.convert("L")
    if max(image.size) > OCR_SIDE:
        image.thumbnail((OCR_SIDE, OCR_SIDE), Image.Resampling.LANCZOS)
    pgm = io.BytesIO()
    image.save(pgm, "PPM")
    program = shutil.which(TESSERACT)
    if program is None:
        raise RuntimeError(f"the {TESSERACT} program is not installed")
    try:
        done = subprocess.run([program, "stdin", "stdout", "-l", lang, "--psm", "11", "tsv"], input=pgm.getvalue(),
                              capture_output=True, timeout=READ_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"tesseract took over {READ_TIMEOUT} s") from None
    if done.returncode != 0:
        lines = done.stderr.decode(errors="replace").strip().splitlines()
        raise RuntimeError(f"tesseract exited {done.returncode}: {lines[-1] if lines else ''}")
    return tsv_words(done.stdout.decode("utf-8", errors="replace"))


def tsv_words(tsv: str) -> tuple[Word, ...]:
    """The words of Tesseract's TSV output (a header row naming the columns, ``conf`` and ``text`` last, one row
    per page, block, paragraph, line and word): the rows with text and a confidence of at least 0, the confidence
    whole (Tesseract's fraction dropped)."""
    rows = tsv.splitlines()
    if not rows:
        return ()
    header = rows[0].split("\t")
    conf, text = header.index("conf"), header.index("text")
    words = []
    for row in rows[1:]:
        cells = row.split("\t", len(header) - 1)
        if len(cells) <= max(conf, text):
            continue
        word = cells[text].strip()
        try:
            confidence = float(int(float(cells[conf])))
        except ValueError:
            continue
        if word and confidence >= 0:
            words.append(Word(word, confidence))
    return tuple(words)


def ocr_photo(path: str | Path, config: OcrConfig, likelihood: float | None = None) -> PhotoText:
    """The gate, then (when it passes) Tesseract, on one photo file. ``likelihood``: the gate's score, when the
    indexer already took it from the photo it decoded to embed (index/embed.py), so a photo the gate rejects is
    not opened again. An unreadable file reads as no text (its embedding, which runs first, reports it)."""
    try:
        if likelihood is None:
            likelihood = likelihood_of(path)
        if likelihood < config.gate:
            return PhotoText(likelihood, False)
        with Image.open(path) as image:
            return PhotoText(likelihood, True, read_words(image, config.lang))
    except (OSError, ValueError, RuntimeError, Image.DecompressionBombError):   # RuntimeError: TesseractError
        return PhotoText(0.0, False)


class TextReading:
    """:func:`ocr_photo` over photos as the indexer hands them over, on ``workers`` threads (default: the CPU
    count, at most 8), while it goes on embedding the others: Tesseract's runs share the cores with the embedding
    instead of following it. Made by :func:`start_reading`."""

    def __init__(self, config: OcrConfig, workers: int | None = None):
        self.config = config
        self._pool = ThreadPoolExecutor(max_workers=workers or min(8, os.cpu_count() or 1),
                                        thread_name_prefix="ocr")
        self._reads: dict[str, Future[PhotoText]] = {}

    def add(self, path: str | Path, likelihood: float | None = None) -> None:
        """Reads the photo at ``path`` (``likelihood``: the gate's score, when known)."""
        self._reads[str(path)] = self._pool.submit(ocr_photo, path, self.config, likelihood)

    def texts(self) -> dict[str, PhotoText]:
        """``{path: PhotoText}`` of every photo added, once all are read."""
        try:
            return {path: read.result() for path, read in self._reads.items()}
        finally:
            self._pool.shutdown()

    def close(self) -> None:
        """Stops reading (photos not started are not read)."""
        self._pool.shutdown(wait=True, cancel_futures=True)


def ocr_photos(paths: Sequence[str | Path], config: OcrConfig, workers: int | None = None,
                likelihoods: Sequence[float | None] | None = None) -> list[PhotoText]:
    """:func:`ocr_photo` over files, in order, on a :class:`TextReading`'s threads. ``likelihoods``: the gate's
    score of each, where already known."""
    known = list(likelihoods) if likelihoods is not None else [None] * len(paths)
    if len(known) != len(paths):
        raise ValueError(f"{len(paths)} photos but {len(known)} gate scores")
    reading = TextReading(config, workers)
    for path, likelihood in zip(paths, known):
        reading.add(path, likelihood)
    texts = reading.texts()
    return [texts[str(path)] for path in paths]


def start_reading(config: OcrConfig | None, workers: int | None = None) -> TextReading | None:
    """A :class:`TextReading` for an index that reads its photos (``config``), or None for one that does not, or
    when the engine is missing (an index built with OCR, updated on a machine without Tesseract: a warning, and the
    photos are indexed by their names and folders only, as :func:`read_rows` does)."""
    if config is None:
        return None
    try:
        check_engine(config.lang)
    except OcrUnavailableError as err:
        _unavailable(err)
        return None
    return TextReading(config, workers)


_WARNED: set[str] = set()


def _unavailable(err: OcrUnavailableError) -> None:
    """The warning that photos are indexed without their text, once per process and reason."""
    if str(err) not in _WARNED:
        _WARNED.add(str(err))
        warnings.warn(f"photos indexed without reading their text: {err}", stacklevel=3)


def read_rows(rows: Sequence[tuple], config: OcrConfig | None, workers: int | None = None) -> dict[str, PhotoText]:
    """What an update reads in its photos: metadata rows ``(path, info or None)`` → ``{path: PhotoText}`` for the
    photos (not video moments); a photo whose info carries what was read while it was embedded (``PhotoInfo.text``)
    is not read again. Empty without ``config`` (an index built without OCR); when the engine is missing (an index
    built with OCR, updated on a machine without Tesseract), a warning (:func:`start_reading`'s, once) and empty:
    the photos are indexed by their names and folders only."""
    if config is None:
        return {}
    rows_info = [(str(row[0]), row[1] if len(row) > 1 else None) for row in rows]
    photos = [(path, info) for path, info in rows_info if getattr(info, "video_id", None) is None]
    done: dict[str, PhotoText] = {path: text for path, info in photos
                                  if (text := getattr(info, "text", None)) is not None}
    rest = [(path, info) for path, info in photos if path not in done]
    if not rest:
        return done
    try:
        check_engine(config.lang)
    except OcrUnavailableError as err:
        _unavailable(err)
        return done
    paths = [path for path, _ in rest]
    known = [getattr(info, "text_likelihood", None) for _, info in rest]   # taken while embedding (index/embed.py)
    return {**done, **dict(zip(paths, ocr_photos(paths, config, workers, known)))}


def store(meta, rows: Iterable[tuple], texts: dict[str, PhotoText], config: OcrConfig | None) -> None:
    """Writes ``texts`` (from :func:`read_rows`) for the rows ``(id, path, ...)`` just added to ``meta``."""
    if config is None or not texts:
        return
    meta.add_texts([(int(row[0]), texts[str(row[1])]) for row in rows if str(row[1]) in texts],
                   config.min_confidence)
