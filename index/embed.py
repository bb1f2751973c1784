"""Embed a photo collection and a caption corpus with a model's encoders, in batches, with progress.

The embedding itself is training/inference/embedding.py's, the one inference path (and autocast policy) of the project:
images are decoded and preprocessed (``model.preprocess``) by DataLoader workers; an unreadable, corrupt or
unsupported file is skipped and reported, never fatal. A worker reads a file's bytes once: the content hash and the
decoding share them; the photo is decoded as every image to embed (``training.data.preprocess.embed_side``). Each
worker also reads what the metadata stores of a photo (:class:`PhotoInfo`: capture time, upright size in the file,
folder, content hash, perceptual hash). Which files are photos: ``index/scan.py``.
"""
from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from PIL import Image

from training.data.preprocess import ImagePreprocess, decode_image
from training.inference.embedding import FileEmbeddings, ImageDecoding, device_of
from training.inference.embedding import embed_image_files as files_to_embeddings
from training.inference.embedding import embed_texts as texts_to_embeddings
from training.inference.embedding import view_preprocess
from training.inference.tensor_views import EncodedJPEG, decode_choice, encoded_jpeg
from training.models.protocol import EmbeddingModel

from .ocr import PhotoText, grey_thumbnail, text_likelihood
from .people import text_queries
from .phash import perceptual_hash


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
    phash: int | None = None    # perceptual hash of the decoded photo (index/phash.py), for index/duplicates.py
    text_likelihood: float | None = None   # the OCR gate's score of the decoded photo (index/ocr.py): not stored; OCR
                                           # reads it instead of decoding the photo again
    text: PhotoText | None = None          # what OCR read in it while the indexer embedded (index/gallery.py), if it did


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


INFO_SIDE = 128     # under decode torch: the small decode the hashes and the OCR gate read (short side ≥ 2 × this)


def read_photo(path: str | Path, min_side: int | None = None, indexed_sha256: str | None = None,
               encoded: bool = False):
    """``(upright RGB image, PhotoInfo)`` of an image file, reading its bytes once (decoded and hashed from the same
    bytes). ``min_side``: the image may be shrunk while decoding down to this shorter side; the info keeps the
    file's own upright size. ``(None, None)`` without decoding when the bytes hash to ``indexed_sha256``.
    ``encoded`` (``--decode torch``): a plain JPEG comes back as its bytes (``EncodedJPEG``, its header checked),
    for the model's device to decode, and the info's perceptual hash and OCR gate are read from a small decode
    (:data:`INFO_SIDE`, a JPEG at a DCT scale: a fraction of a full decode's work)."""
    path = Path(path)
    data = path.read_bytes()
    stat = path.stat()
    digest = hashlib.sha256(data).hexdigest()
    if digest == indexed_sha256:
        return None, None
    jpeg = encoded_jpeg(data, min_side) if encoded else None
    decoded = decode_image(data, path.suffix, min_side if jpeg is None else INFO_SIDE)
    taken = exif_time(decoded.exif)
    width, height = decoded.size
    info = PhotoInfo(taken=stat.st_mtime if taken is None else taken, width=width, height=height,
                     folder=str(path.resolve().parent), sha256=digest, size=len(data),
                     mtime=stat.st_mtime, phash=perceptual_hash(decoded.image),
                     text_likelihood=text_likelihood(grey_thumbnail(decoded.image)))
    image: Image.Image | EncodedJPEG = decoded.image if jpeg is None else jpeg
    return image, info


class _Photos:
    """:func:`read_photo` knowing the content hash the index holds for some files and whether plain JPEGs are left
    encoded for the device (a picklable reader)."""

    def __init__(self, sha256: dict[str, str], encoded: bool):
        self.sha256, self.encoded = sha256, encoded

    def __call__(self, path: str | Path, min_side: int | None = None):
        return read_photo(path, min_side, self.sha256.get(str(path)), self.encoded)


@dataclass(frozen=True)
class PhotoDecoding:
    """How :func:`decode_photos` runs: ``ahead``, well ahead of the model
    (:class:`~training.inference.embedding.ImageDecoding`); ``decode``, where plain JPEGs are decoded
    (``tensor_views.decode_choice``: ``pil`` in the workers, ``torch`` on the model's device; None:
    ``$JOINTSPACE_DECODE``, else by the device: ``--decode``)."""
    ahead: bool = False
    decode: str | None = None


DEFAULT_DECODING = PhotoDecoding()


def decode_photos(preprocess: ImagePreprocess, paths: Sequence[str | Path], batch_size: int = 64,
                  workers: int | None = None, device: str | torch.device = "cpu",
                  indexed: dict[str, str] | None = None, tta: str = "none",
                  how: PhotoDecoding = DEFAULT_DECODING) -> ImageDecoding:
    """Starts decoding the photos of ``paths`` as :func:`embed_photos` embeds them with a model whose
    preprocessing is ``preprocess`` (e.g. read from its file before the model is loaded,
    ``checkpoint.stored_preprocess``), to be passed to it as ``decoding``; ``how``: ahead of the model, and where
    (:class:`PhotoDecoding`). The other arguments are :func:`embed_photos`'s."""
    views = view_preprocess(preprocess, tta)
    per_image = max(1, views.crops // preprocess.crops)
    choice = decode_choice(device, how.decode)
    read = _Photos(indexed or {}, choice == "torch") if indexed or choice == "torch" else read_photo
    return ImageDecoding(paths, views, read, batch_size=max(1, batch_size // per_image), workers=workers,
                         device=device, ahead=how.ahead, decode=choice)


def embed_photos(model: EmbeddingModel, paths: Sequence[str | Path], batch_size: int = 64, workers: int | None = None,
                      progress: bool = True, indexed: dict[str, str] | None = None, tta: str = "none",
                      decoding: ImageDecoding | None = None) -> FileEmbeddings:
    """Embeds every readable image of ``paths`` into the common space (``training.inference.embedding.embed_image_files``,
    on the model's device; ``workers`` None: decoding processes by core count), keeping what the metadata stores of
    each (:func:`read_photo`, in ``info``). ``indexed``: path (as given) → the sha256 the index holds for it; a file
    whose bytes still hash to it is not decoded (listed in ``passed``), the hash and the decoding reading the bytes
    once.
    ``tta``: gallery-side test-time augmentation (:func:`view_preprocess`); a query is always embedded from the
    model's one view. ``batch_size`` counts views: a forward pass takes ``batch_size`` of them whatever ``tta``
    (16 images of 4 views under ``flip-crop`` at 64), so augmentation costs time, not memory. ``decoding``: these
    photos' decoding, already started (:func:`decode_photos` with the same arguments)."""
    if decoding is None:
        decoding = decode_photos(model.preprocess, paths, batch_size, workers, device_of(model), indexed, tta)
    return files_to_embeddings(model, paths, progress=progress, decoding=decoding)


def embed_text_queries(model: EmbeddingModel, texts: Sequence[str], progress: bool = True) -> np.ndarray:
    """Text queries as the image search reads them: :func:`embed_sentences` with each text's person flag last
    (``(n, D + 1)``, index/people.py)."""
    return text_queries(embed_sentences(model, texts, progress=progress), texts)


def embed_sentences(model: EmbeddingModel, texts: Sequence[str], batch_size: int = 256, progress: bool = True) -> np.ndarray:
    """Sentences → ``(len(texts), D)`` float32 embeddings (``training.inference.embedding.embed_texts``)."""
    model.eval()
    vectors = texts_to_embeddings(model, texts, batch_size=batch_size, progress=progress)
    return np.ascontiguousarray(vectors.cpu().numpy(), dtype=np.float32)
