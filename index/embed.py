"""Embed a photo collection and a caption corpus with a model's encoders, in batches, with progress.

Images are decoded and preprocessed (exactly as in training: ``model.preprocess``) by DataLoader workers; an
unreadable, corrupt or unsupported file is skipped and reported, never fatal. Each worker also reads what the
metadata stores of a photo (:class:`PhotoInfo`: capture time, upright size, folder, content hash). On CUDA the
forward passes run under bf16 autocast.
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
import torch
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from training.data.preprocess import HEIF_SUFFIXES, RAW_SUFFIXES, load_image
from training.embed import autocast

IMAGE_SUFFIXES = ({".jpg", ".jpeg", ".png", ".gif", ".bmp", ".webp", ".tif", ".tiff", ".avif"} | HEIF_SUFFIXES
                  | RAW_SUFFIXES)
# never indexed: thumbnail caches (freedesktop, Synology) and hidden files and folders (".*")
DEFAULT_EXCLUDES = (".thumbnails", "@eaDir", ".*")


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
    tz = dt.timezone.utc
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


class _Decoded(Dataset):
    def __init__(self, paths: Sequence[str | Path], preprocess):
        self.paths, self.preprocess = [str(p) for p in paths], preprocess

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        try:
            image, info = read_photo(self.paths[i])
            return i, (self.preprocess.pixels(image), info), None
        except Exception as err:  # noqa: BLE001 - any decoding failure means "skip this file"
            return i, None, f"{type(err).__name__}: {err}"


def _collate(items):
    ok = [(i, px) for i, px, _ in items if px is not None]
    bad = [(i, reason) for i, px, reason in items if px is None]
    pixels = torch.stack([px for _, (px, _) in ok]) if ok else None
    return [i for i, _ in ok], pixels, bad, [info for _, (_, info) in ok]


@torch.no_grad()
def embed_image_files(model, paths: Sequence[str | Path], batch_size: int = 64, device: str | torch.device = "cpu",
                      workers: int = 2, progress: bool = True) -> ImageEmbeddings:
    """Embeds every readable image of ``paths`` into the common space."""
    device = torch.device(device)
    model.eval()
    workers = min(workers, os.cpu_count() or 1) if len(paths) > batch_size else 0
    loader = DataLoader(_Decoded(paths, model.preprocess), batch_size=batch_size, num_workers=workers,
                        collate_fn=_collate)
    vectors, kept, skipped, infos = [], [], [], []
    for idx, pixels, bad, info in tqdm(loader, desc="embedding images", unit="batch", disable=not progress):
        skipped += [(str(paths[i]), reason) for i, reason in bad]
        if pixels is None:
            continue
        with autocast(device, device.type == "cuda"):
            emb = model.embed_images(model.preprocess.normalize(pixels.to(device)))
        vectors.append(emb.float().cpu().numpy())
        kept += idx
        infos += info
    dim = model.cfg["model"]["embed_dim"]
    out = np.concatenate(vectors) if vectors else np.zeros((0, dim), np.float32)
    return ImageEmbeddings(np.ascontiguousarray(out, dtype=np.float32), kept, skipped, infos)


@torch.no_grad()
def embed_texts(model, texts: Sequence[str], batch_size: int = 256, device: str | torch.device = "cpu",
                progress: bool = True) -> np.ndarray:
    """Sentences → ``(len(texts), D)`` float32 embeddings."""
    device = torch.device(device)
    model.eval()
    out = []
    for start in tqdm(range(0, len(texts), batch_size), desc="embedding captions", unit="batch",
                      disable=not progress or len(texts) <= batch_size):
        with autocast(device, device.type == "cuda"):
            out.append(model.embed_sentences(list(texts[start:start + batch_size]), batch_size=batch_size)
                       .float().cpu().numpy())
    dim = model.cfg["model"]["embed_dim"]
    return np.ascontiguousarray(np.concatenate(out) if out else np.zeros((0, dim), np.float32))
