"""Uploaded and gallery images: content sniffing, size and pixel limits, decoding, thumbnails.

The content type is sniffed from the file's first bytes, never taken from the upload's headers or name. A thumbnail's
photo is shrunk while it is decoded, down to twice the thumbnail's size: a JPEG at a DCT scale, then an integer
reduction (``training.data.preprocess.draft`` and ``reduce_to``); an upload is decoded as every image to embed
(``preprocess.embed_side``). The pixel limit is checked on the file's own size first.
These functions are blocking (decoding is CPU work); the app runs them in its decode thread pool, off the
event loop (Pillow releases the GIL while decoding).
"""
from __future__ import annotations

import io
import re
import warnings
from pathlib import Path

import torch
from PIL import Image, ImageOps, UnidentifiedImageError

from training.data.preprocess import RAW_SUFFIXES, draft, embed_side, load_image, reduce_to, register_heif

SIGNATURES = (
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"BM", "image/bmp"),
    (b"II*\x00", "image/tiff"),
    (b"MM\x00*", "image/tiff"),
)
SUPPORTED = "JPEG, PNG, GIF, WebP, BMP, TIFF, HEIC/HEIF, AVIF"
# ISO base media files (HEIF, AVIF): the 'ftyp' box's major brand, else a compatible brand, says which
_AVIF_BRANDS = {b"avif", b"avis"}
_HEIF_BRANDS = {b"heic", b"heix", b"hevc", b"hevx", b"heim", b"heis", b"hevm", b"hevs", b"mif1", b"msf1"}


class ImageError(Exception):
    """An image that cannot be used; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail


def sniff(head: bytes) -> str | None:
    """The image media type announced by the magic bytes at the start of ``head``, else None."""
    if len(head) >= 12 and head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    if len(head) >= 12 and head[4:8] == b"ftyp":
        size = int.from_bytes(head[:4], "big")
        brands = [head[8:12]] + [head[i:i + 4] for i in range(16, min(size, len(head)) - 3, 4)]
        if any(b in _AVIF_BRANDS for b in brands):
            return "image/avif"
        if any(b in _HEIF_BRANDS for b in brands):
            return "image/heic" if brands[0] in {b"heic", b"heix", b"heim", b"heis"} else "image/heif"
        return None
    return next((media for magic, media in SIGNATURES if head.startswith(magic)), None)


def open_checked(source: bytes | str | Path, max_pixels: int, min_side: int | None = None) -> Image.Image:
    """Sniffs, checks the pixel count from the header, then decodes fully; returns an upright RGB image (EXIF
    orientation applied). A gallery file (a path) may also be camera RAW, read with rawpy when it is installed.
    ``min_side``: the image may be shrunk while decoding, never to a shorter side below this.

    Raises :class:`ImageError` 415 (not an image), 413 (too many pixels), 400 (corrupt or truncated)."""
    if isinstance(source, (str, Path)):
        if Path(source).suffix.lower() in RAW_SUFFIXES:
            raw = _open_raw_file(Path(source), max_pixels)
            return raw if min_side is None else reduce_to(raw, min_side)
        data = Path(source).read_bytes()
    else:
        data = source
    if sniff(data[:64]) is None:
        raise ImageError(415, f"the upload is not an image this service reads ({SUPPORTED}); "
                              f"the content is checked, not the file name or content type")
    register_heif()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            im = Image.open(io.BytesIO(data))
            width, height = im.size
            if width * height > max_pixels:
                raise ImageError(413, f"image is {width}×{height} = {width * height:,} pixels; the limit is "
                                      f"{max_pixels:,}")
            if min_side is not None:
                draft(im, min_side)
            im.load()
            upright = ImageOps.exif_transpose(im).convert("RGB")
            return upright if min_side is None else reduce_to(upright, min_side)
    except ImageError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        raise ImageError(413, f"image has too many pixels: {public_reason(err)}") from None
    except UnidentifiedImageError:
        raise ImageError(400, f"corrupt image: its first bytes say {sniff(data[:64])}, but no decoder can read "
                              f"it") from None
    except Exception as err:  # noqa: BLE001 - any decoder error (Pillow, libheif, struct, ...) is the file's fault
        raise ImageError(400, f"corrupt or truncated image: {public_reason(err)}") from None


_REPR = re.compile(r"<[^<>]*>")                              # <_io.BytesIO object at 0x7f...>, <PIL...>
_ADDRESS = re.compile(r"\b0x[0-9a-fA-F]{6,}\b")
_PATH = re.compile(r"(?:[A-Za-z]:)?[\\/][^\s'\",:;)]*[\\/][^\s'\",:;)]*")    # anything with two path separators


def public_reason(err: BaseException) -> str:
    """A decoder's error message fit to show a client: no object reprs, memory addresses or file paths (the
    service does not tell clients about its insides), at most 200 characters; the error's type name when nothing
    is left."""
    text = _PATH.sub("…", _ADDRESS.sub("…", _REPR.sub("…", str(err)))).strip(" :")
    if not text or text == "…":
        text = type(err).__name__
    return text[:200]


def _open_raw_file(path: Path, max_pixels: int) -> Image.Image:
    try:
        image = load_image(path)[0]
    except ValueError as err:            # rawpy not installed (UnsupportedImageError)
        raise ImageError(415, public_reason(err)) from None
    except Exception as err:  # noqa: BLE001 - LibRaw's errors: unreadable RAW
        raise ImageError(400, f"unreadable camera RAW file: {type(err).__name__}: {public_reason(err)}") from None
    if image.width * image.height > max_pixels:
        raise ImageError(413, f"image is {image.width}×{image.height} pixels; the limit is {max_pixels:,}")
    return image


def upload_to_pixels(data: bytes | str | Path, max_pixels: int, preprocess) -> torch.Tensor:
    """An uploaded file (or an image file's path) → uint8 ``(crops, 3, S, S)`` pixels: decoded as every image to
    embed is (``preprocess.embed_side``), then preprocessed as in training."""
    return preprocess.pixels(open_checked(data, max_pixels, embed_side(preprocess)))


def thumbnail(path: str | Path, size: int, max_pixels: int) -> tuple[bytes, str]:
    """A JPEG whose longer side is at most ``size`` pixels (never enlarged); decoded down to a shorter side of
    ``size`` at least, so the thumbnail is resized from an image at least its size."""
    image = open_checked(path, max_pixels, size)
    image.thumbnail((size, size), Image.Resampling.LANCZOS)
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=85)
    return out.getvalue(), "image/jpeg"


def media_type_of(path: str | Path) -> str:
    with open(path, "rb") as fh:
        return sniff(fh.read(64)) or "application/octet-stream"
