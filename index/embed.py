"""Embed a photo collection and a caption corpus with a model's encoders, in batches, with progress.

The embedding itself is training/embed.py's, the one inference path (and autocast policy) of the project:
images are decoded and preprocessed (exactly as in training: ``model.preprocess``) by DataLoader workers; an
unreadable, corrupt or unsupported file is skipped and reported, never fatal. Each worker also reads what the
metadata stores of a photo (:class:`PhotoInfo`: capture time, upright size, folder, content hash).
"""
from __future__ import annotations

import datetime as dt
import fnmatch
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from training.data.preprocess import HEIF_SUFFIXES, RAW_SUFFIXES, MirroredViews, load_image
from training.embed import embed_image_files as files_to_embeddings
from training.embed import embed_texts as texts_to_embeddings

IMAGE_SUFFIXES = ({".jpg", ".jpeg", ".png", ".gif", ".bmp", ".webp", ".tif", ".tiff", ".avif"} | HEIF_SUFFIXES
                  | RAW_SUFFIXES)
# never indexed: thumbnail caches (freedesktop, Synology) and hidden files and folders (".*")
DEFAULT_EXCLUDES = (".thumbnails", "@eaDir", ".*")
# gallery-side test-time augmentation (index build --tta): none, or each view and its mirror image averaged
TTA = ("none", "flip")


def excluded(relative: str | Path, patterns: Iterable[str]) -> bool:
    """Whether a path (relative to the folder being indexed) matches an exclude pattern: a glob matched against
    the whole relative path (``2019/*``, ``*.png``; ``*`` also crosses ``/``) or against any one of its folder
    or file names (``drafts``, ``@eaDir``, ``.*``)."""
    rel = Path(relative).as_posix()
    parts = Path(relative).parts
    return any(fnmatch.fnmatchcase(rel, pat) or any(fnmatch.fnmatchcase(part, pat) for part in parts)
               for pat in patterns)


def find_images(root: str | Path, exclude: Sequence[str] = (), default_excludes: bool = True) -> list[Path]:
    """Every image file (by suffix) under ``root``, recursively, in sorted order, without the files that
    ``exclude`` (and, unless ``default_excludes`` is False, :data:`DEFAULT_EXCLUDES`) rule out."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"no image directory at {root}")
    patterns = [*(DEFAULT_EXCLUDES if default_excludes else ()), *exclude]
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath).relative_to(root)
        dirnames[:] = sorted(d for d in dirnames if not excluded(here / d, patterns))   # prune excluded folders
        for name in filenames:
            path = Path(dirpath) / name
            if path.suffix.lower() in IMAGE_SUFFIXES and not excluded(here / name, patterns) and path.is_file():
                found.append(path)
    return sorted(found)


@dataclass(frozen=True)
class PhotoInfo:
    """What the metadata keeps of a photo besides its vector."""
    taken: float            # capture time, Unix seconds: EXIF DateTimeOriginal, else the file's mtime
    width: int              # upright size (EXIF orientation applied)
    height: int
    folder: str             # the absolute folder the file is in
    sha256: str             # of the file's bytes: what `index sync` compares
    size: int               # bytes
    mtime: float


_EXIF_IFD, _DATETIME_ORIGINAL, _OFFSET_TIME_ORIGINAL = 0x8769, 0x9003, 0x9011


def exif_time(exif) -> float | None:
    """EXIF DateTimeOriginal (``YYYY:MM:DD HH:MM:SS``) as Unix seconds; with OffsetTimeOriginal (``+02:00``) in
    that offset, without one read as UTC (cameras record their clock's local time and usually no zone). None when
    absent or unreadable."""
    if not exif:
        return None
    try:
        ifd = exif.get_ifd(_EXIF_IFD)
    except Exception:  # noqa: BLE001 - a broken EXIF block is no capture time
        ifd = {}
    value, offset = _ascii(ifd.get(_DATETIME_ORIGINAL)), _ascii(ifd.get(_OFFSET_TIME_ORIGINAL))
    if value is None:
        return None
    try:
        when = dt.datetime.strptime(value[:19], "%Y:%m:%d %H:%M:%S")
    except ValueError:
        return None
    tz: dt.tzinfo = dt.timezone.utc
    if offset:
        try:
            tz = dt.datetime.strptime(offset, "%z").tzinfo or tz
        except ValueError:
            pass
    try:
        return when.replace(tzinfo=tz).timestamp()
    except (OverflowError, ValueError):
        return None


def _ascii(value) -> str | None:
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    return value.strip("\x00 ") if isinstance(value, str) else None


def read_photo(path: str | Path):
    """``(upright RGB image, PhotoInfo)`` of an image file, reading its bytes once."""
    path = Path(path)
    data = path.read_bytes()
    stat = path.stat()
    image, exif = load_image(data, path.suffix)
    taken = exif_time(exif)
    info = PhotoInfo(taken=stat.st_mtime if taken is None else taken, width=image.width, height=image.height,
                     folder=str(path.resolve().parent), sha256=hashlib.sha256(data).hexdigest(), size=len(data),
                     mtime=stat.st_mtime)
    return image, info


@dataclass
class ImageEmbeddings:
    vectors: np.ndarray                    # (m, D) float32, one row per readable image
    kept: list[int]                        # positions (in the input list) of those m images
    skipped: list[tuple[str, str]] = field(default_factory=list)   # (path, reason) of unreadable files
    info: list[PhotoInfo] = field(default_factory=list)            # one per kept image


def view_preprocess(model, tta: str = "none"):
    """The preprocessing of gallery images under test-time augmentation ``tta`` (:data:`TTA`): ``none`` the
    model's own, ``flip`` each view and its mirror image, features averaged (``MirroredViews``)."""
    if tta not in TTA:
        raise ValueError(f"unknown test-time augmentation {tta!r} (known: {', '.join(TTA)})")
    return MirroredViews(model.preprocess) if tta == "flip" else model.preprocess


def embed_image_files(model, paths: Sequence[str | Path], batch_size: int = 64, workers: int = 2,
                      progress: bool = True, tta: str = "none") -> ImageEmbeddings:
    """Embeds every readable image of ``paths`` into the common space (``training.embed.embed_image_files``, on
    the model's device), keeping what the metadata stores of each (:func:`read_photo`). ``tta``: gallery-side
    test-time augmentation (:func:`view_preprocess`); a query is always embedded from the model's one view."""
    emb = files_to_embeddings(model, paths, batch_size=batch_size, workers=workers, progress=progress,
                              read=read_photo, preprocess=view_preprocess(model, tta))
    return ImageEmbeddings(emb.vectors, emb.kept, emb.skipped, emb.extras)


def embed_texts(model, texts: Sequence[str], batch_size: int = 256, progress: bool = True) -> np.ndarray:
    """Sentences → ``(len(texts), D)`` float32 embeddings (``training.embed.embed_texts``)."""
    model.eval()
    vectors = texts_to_embeddings(model, texts, batch_size=batch_size, progress=progress)
    return np.ascontiguousarray(vectors.cpu().numpy(), dtype=np.float32)
