"""Uploaded and gallery images: content sniffing, size, pixel and geometry limits, decoding, thumbnails.

The content type is sniffed from the file's first bytes (``training.data.media``), never taken from the upload's
headers or name. The image's size is read from its header and checked before any pixel is decoded
(``training.data.preprocess.check_geometry``: the pixel limit, the aspect ratio, the size once resized for the
model). A thumbnail's photo is shrunk while it is decoded, down to twice the thumbnail's size: a JPEG at a DCT
scale, then an integer reduction (``training.data.preprocess.draft`` and ``reduce_to``); an upload is decoded as
every image to embed (``preprocess.embed_side``). A decoder's failure is told in the words of
``training.data.media.decoder_error``, never in the library's own.
These functions are blocking (decoding is CPU work); the app runs them in its thread pools, off the event loop
(Pillow releases the GIL while decoding). :func:`thumbnail_cost` estimates, from the header alone, the memory a
thumbnail takes to make (service/decoding.py admits it by that).
"""
from __future__ import annotations

import io
import logging
import warnings
from contextlib import nullcontext
from pathlib import Path

import torch
from PIL import Image, ImageOps, UnidentifiedImageError

from training.data.decode_cost import DecodeBusy, DecodeTooLarge, MemoryBudget, decode_bytes
from training.data.media import decoder_error, file_head, sniff_image
from training.data.preprocess import (RAW_SUFFIXES, ImageGeometryError, check_geometry, check_scans, dct_scale,
                                      decode_image, draft, embed_side, reduce_to, register_heif)
from training.inference.tensor_views import decode_choice, torch_pixels

log = logging.getLogger("jointspace.images")

SUPPORTED = "JPEG, PNG, GIF, WebP, BMP, TIFF, HEIC/HEIF, AVIF"


class ImageError(Exception):
    """An image that cannot be used; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail


def open_checked(source: bytes | str | Path, max_pixels: int, min_side: int | None = None,
                 resize_side: int | None = None, budget: MemoryBudget | None = None) -> Image.Image:
    """Sniffs, checks the size in the header (pixels, aspect ratio and — with ``resize_side``, the side the
    preprocessing resizes the shorter side to — the size once resized), then decodes fully; returns an upright RGB
    image (EXIF orientation applied). A gallery file (a path) may also be camera RAW, read with rawpy when it is
    installed. ``min_side``: the image may be shrunk while decoding, never to a shorter side below this.
    ``budget``: the decoding holds its estimated memory (``training.data.decode_cost``) of it while it runs.

    Raises :class:`ImageError` 415 (not an image), 413 (too many pixels, too elongated, too large once resized, a
    JPEG of too many scans, more memory to decode than the whole ``budget``), 400 (corrupt or truncated);
    :class:`DecodeBusy` when the budget cannot hold it now."""
    if isinstance(source, (str, Path)):
        if Path(source).suffix.lower() in RAW_SUFFIXES:
            return _open_raw_file(Path(source), max_pixels, min_side)
        data = Path(source).read_bytes()
    else:
        data = source
    if sniff_image(data[:64]) is None:
        raise ImageError(415, f"the upload is not an image this service reads ({SUPPORTED}); "
                              f"the content is checked, not the file name or content type")
    register_heif()
    try:
        with warnings.catch_warnings():
            # the size is checked below, against this service's own limit; Pillow's warning would say less
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            im = Image.open(io.BytesIO(data))
            check_geometry(im.size, resize_side, max_pixels)
            check_scans(im, data)
            with budget.hold(decode_bytes(im, min_side)) if budget is not None else nullcontext():
                if min_side is not None:
                    draft(im, min_side)
                im.load()
                upright = ImageOps.exif_transpose(im).convert("RGB")
                return upright if min_side is None else reduce_to(upright, min_side)
    except ImageGeometryError as err:
        raise ImageError(413, str(err)) from None
    except DecodeTooLarge as err:
        raise ImageError(413, f"{err} (JOINTSPACE_DECODE_MEMORY_BYTES)") from None
    except DecodeBusy:
        raise
    except Image.DecompressionBombError:            # Pillow's own bound (twice its warning's), met while opening
        raise ImageError(413, f"image has more pixels than its decoder accepts; the limit is {max_pixels:,}") \
            from None
    except UnidentifiedImageError:
        raise ImageError(400, f"corrupt image: its first bytes say {sniff_image(data[:64])}, but no decoder can read "
                              f"it") from None
    except Exception as err:  # noqa: BLE001 - any decoder error (Pillow, libheif, struct, ...) is the file's fault
        raise ImageError(400, f"corrupt or truncated image: {decoder_error(err)}") from None


def _open_raw_file(path: Path, max_pixels: int, min_side: int | None) -> Image.Image:
    try:
        return decode_image(path, min_side=min_side, max_pixels=max_pixels).image
    except ImageGeometryError as err:
        raise ImageError(413, str(err)) from None
    except ValueError as err:            # rawpy not installed (UnsupportedImageError): our own words
        raise ImageError(415, str(err)) from None
    except Exception as err:  # noqa: BLE001 - LibRaw's errors: unreadable RAW
        raise ImageError(400, f"unreadable camera RAW file: {decoder_error(err)}") from None


def upload_to_pixels(data: bytes | str | Path, max_pixels: int, preprocess,
                     device: torch.device | None = None, decode: str | None = None,
                     budget: MemoryBudget | None = None) -> torch.Tensor:
    """An uploaded file (or an image file's path) → uint8 ``(crops, 3, S, S)`` pixels on the CPU: its size checked
    for the preprocessing's resize, decoded as every image to embed is (``preprocess.embed_side``) under ``budget``
    (the host memory of Pillow's decoding), then preprocessed as in training. With the model's ``device``: a plain
    JPEG (baseline, so never a scan bomb: tensor_views.plain_jpeg) decoded and cut into views there when the decode
    setting (``decode``, the service's ``JOINTSPACE_DECODE``) says so (``tensor_views.torch_pixels``: on CUDA by
    default)."""
    if device is not None and decode_choice(device, decode) == "torch":
        raw = Path(data).read_bytes() if isinstance(data, (str, Path)) else data
        try:
            pixels = torch_pixels(preprocess, raw, device, max_pixels, "torch")
        except ImageGeometryError as err:
            raise ImageError(413, str(err)) from None
        except RuntimeError as err:                    # the device's decoder refused it: Pillow tells why
            log.info("torch decode failed (%s); decoding with Pillow", decoder_error(err))
            pixels = None
        if pixels is not None:
            return pixels.cpu()
    return preprocess.pixels(open_checked(data, max_pixels, embed_side(preprocess), preprocess.min_side, budget))


# bytes a decoded pixel may take while a thumbnail is made: Pillow keeps RGB in 4 bytes, and the decoded image,
# its upright copy and its RGB conversion may all be alive at once
THUMBNAIL_BYTES_PER_PIXEL = 12


def thumbnail_cost(size: tuple[int, int], jpeg: bool, thumbnail_size: int) -> int:
    """The memory (bytes) making a ``thumbnail_size`` thumbnail of an image of ``size`` takes, from its header
    alone: a JPEG is decoded at the DCT scale :func:`thumbnail` will use, anything else at full size."""
    scale = dct_scale(size, thumbnail_size) if jpeg else 1
    width, height = size
    return -(-width // scale) * -(-height // scale) * THUMBNAIL_BYTES_PER_PIXEL


def thumbnail(path: str | Path, size: int, max_pixels: int) -> tuple[bytes, str]:
    """A JPEG whose longer side is at most ``size`` pixels (never enlarged); decoded down to a shorter side of
    ``size`` at least, so the thumbnail is resized from an image at least its size."""
    image = open_checked(path, max_pixels, size)
    image.thumbnail((size, size), Image.Resampling.LANCZOS)
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=85)
    return out.getvalue(), "image/jpeg"


def media_type_of(path: str | Path) -> str:
    return sniff_image(file_head(path)) or "application/octet-stream"
