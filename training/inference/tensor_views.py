"""Images to embed decoded and cut into views by torch, on the model's device: the other way to the PIL path of
``training/data/preprocess.py`` (``Preprocess.pixels``), for a CUDA host, where PIL's decode and resizes on the CPU
are what limits how many photos a second are embedded.

The setting (:func:`decode_choice`; ``--decode``, ``JOINTSPACE_DECODE``; names in ``names.DECODES``):

* ``auto`` (default): ``torch`` when the model runs on a CUDA device, ``pil`` on a CPU;
* ``pil``: every image decoded by Pillow and preprocessed by ``preprocess.pixels`` (a JPEG shrunk while decoding at
  a DCT scale, ``preprocess.decode_image``);
* ``torch``: a JPEG's bytes decoded by ``torchvision.io.decode_jpeg`` on the device (nvJPEG on CUDA, libjpeg-turbo on
  a CPU), a batch at once; turned upright by its EXIF orientation, then resized with antialiasing (bilinear, as
  ``Preprocess`` resizes; :func:`shrunk` first box-reduces a large photo by the factor of the PIL path's DCT scale,
  :data:`REDUCE_LIKE_PIL`, on as measured), cropped and mirrored in torch straight
  to each backbone's side and the model's uint8 layout (:func:`tensor_views`, the views ``pixels`` makes: one crop,
  five or ten, a stacked preprocessing's members in the top-left corner of the largest side, ``MirroredViews`` for
  ``--tta``).

The CPU keeps what is cheap and what the device does not read: the bytes, their hash, the header (the size is
checked by ``check_geometry`` before any pixel is decoded), the EXIF orientation. A file that is not a plain JPEG
(:func:`plain_jpeg`: baseline or extended sequential Huffman, 8 bits, grey or three components; not progressive,
CMYK, arithmetic-coded or lossless, nor PNG, WebP, HEIC, RAW, ...) is decoded by Pillow as before, per file.
How far the two paths' pixels and rankings lie apart: tests/test_tensor_views.py, benchmarks/decode_ranking.py
``--decode torch`` (docs/benchmarks.md#decoding).
"""
from __future__ import annotations

import io
import os
import struct
import warnings
from dataclasses import dataclass
from typing import Any, Sequence, cast

import torch
import torchvision.transforms.functional as TF
from PIL import Image

from training.data.preprocess import (REDUCING_GAP, MirroredViews, Preprocess, StackedPreprocess, check_geometry,
                                      dct_scale, embed_side, resized_size)

from .names import DECODE_ENV, DECODES, choice

_ORIENTATION = 0x0112


def decode_choice(device: torch.device | str, given: str | None = None) -> str:
    """``pil`` or ``torch``: the setting asked for (``given``, else ``$JOINTSPACE_DECODE``, else ``auto``) on
    ``device`` — ``auto`` is ``torch`` on a CUDA device and ``pil`` elsewhere. ValueError for an unknown name."""
    name = choice(given, os.environ.get(DECODE_ENV), DECODES, "image decoding", "--decode", DECODE_ENV)
    if name == "auto":
        return "torch" if torch.device(device).type == "cuda" else "pil"
    return name


# --- the CPU's part: which files the device decodes ------------------------------------------------------------
_SOF_PLAIN = (0xC0, 0xC1)      # baseline, extended sequential (Huffman): what nvJPEG's batched decoder reads
_SOF_OTHER = frozenset({0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})   # progressive, lossless,
#                                                                                            arithmetic, hierarchical


def plain_jpeg(data: bytes) -> bool:
    """Whether ``data`` is a JPEG the device decodes: whole (it ends in the end-of-image marker: a truncated file is
    Pillow's, which refuses it), its first frame header (SOF) baseline or extended sequential Huffman, 8 bits a
    sample, with 1 (grey) or 3 components (YCbCr). Reads the markers up to that header only; False for anything
    else (another format, progressive, CMYK/YCCK, 12 bits, a damaged header, bytes after the image)."""
    if data[:2] != b"\xff\xd8" or data[-2:] != b"\xff\xd9":
        return False
    at = 2
    while at + 4 <= len(data):
        if data[at] != 0xFF:
            return False
        marker = data[at + 1]
        if marker == 0xFF:                      # fill byte
            at += 1
            continue
        if 0xD0 <= marker <= 0xD9 or marker == 0x01:
            at += 2
            continue
        (length,) = struct.unpack(">H", data[at + 2:at + 4])
        if marker in _SOF_PLAIN:
            if at + 10 > len(data):
                return False
            precision, components = data[at + 4], data[at + 9]
            return precision == 8 and components in (1, 3)
        if marker in _SOF_OTHER or marker == 0xDA:      # another coding, or scan data before any frame header
            return False
        at += 2 + length
    return False


@dataclass(frozen=True)
class EncodedJPEG:
    """A plain JPEG's bytes, left for the device to decode (:func:`decode_batch`), with what the CPU read of its
    header: the EXIF orientation (1-8) and the file's size as stored (width, height)."""
    data: torch.Tensor          # uint8 (n,), the file's bytes
    orientation: int
    size: tuple[int, int]

    @property
    def upright_size(self) -> tuple[int, int]:
        w, h = self.size
        return (h, w) if self.orientation in (5, 6, 7, 8) else (w, h)


def encoded_jpeg(data: bytes, min_side: int | None = None, max_pixels: int | None = None,
                 image: Image.Image | None = None) -> EncodedJPEG | None:
    """``data`` as an :class:`EncodedJPEG` when it is a :func:`plain_jpeg`, its size read from the header and checked
    (``check_geometry`` with ``min_side`` and ``max_pixels``: ``ImageGeometryError`` before any pixel is decoded);
    None for a file Pillow decodes instead. ``image``: the file already opened by Pillow (not loaded)."""
    if not plain_jpeg(data):
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        im = image if image is not None else Image.open(io.BytesIO(data))
    if im.format not in ("JPEG", "MPO"):
        return None
    check_geometry(im.size, min_side, max_pixels)
    orientation = im.getexif().get(_ORIENTATION, 1)
    orientation = orientation if isinstance(orientation, int) and 1 <= orientation <= 8 else 1
    return EncodedJPEG(torch.frombuffer(bytearray(data), dtype=torch.uint8), orientation, im.size)


# --- the device's part ---------------------------------------------------------------------------------------------
def upright(image: torch.Tensor, orientation: int) -> torch.Tensor:
    """``(C, H, W)`` as stored → turned upright by the EXIF ``orientation``, as ``ImageOps.exif_transpose`` turns
    a PIL image (2: mirrored, 3: 180°, 4: upside down, 5: transposed, 6: 90° clockwise, 7: transverse, 8: 90°
    counter-clockwise)."""
    if orientation == 2:
        return image.flip(-1)
    if orientation == 3:
        return image.flip(-1, -2)
    if orientation == 4:
        return image.flip(-2)
    if orientation == 5:
        return image.transpose(-1, -2)
    if orientation == 6:
        return torch.rot90(image, -1, (-2, -1))
    if orientation == 7:
        return image.transpose(-1, -2).flip(-1, -2)
    if orientation == 8:
        return torch.rot90(image, 1, (-2, -1))
    return image


def decode_batch(encoded: Sequence[EncodedJPEG], device: torch.device | str) -> list[torch.Tensor]:
    """Decodes JPEGs on ``device`` in one batched call (nvJPEG on CUDA) → upright RGB uint8 ``(3, H, W)`` each."""
    from torchvision.io import ImageReadMode, decode_jpeg

    if not encoded:
        return []
    device = torch.device(device)
    images = decode_jpeg([e.data for e in encoded], mode=ImageReadMode.RGB, device=device)
    return [upright(im, e.orientation) for im, e in zip(images, encoded)]


# on: a large photo is box-reduced first (mean |R-sum difference| to PIL 0.71 against 1.04 resized from the full
# decode, with the shipped model: benchmarks/decode_ranking.py --compare torch --both-resizes)
REDUCE_LIKE_PIL = True


def shrunk(image: torch.Tensor, min_side: int | None) -> torch.Tensor:
    """uint8 ``(..., 3, H, W)`` (one image, or a batch of one size) reduced as the PIL path shrinks a JPEG while
    decoding it (``preprocess.decode_image`` with ``min_side``: a DCT scale, ``dct_scale``, then ``reduce_to``'s
    integer factor), by box averages of the same factor; float32 when reduced (the resize that follows rounds once),
    else the image itself (also when :data:`REDUCE_LIKE_PIL` is off: the antialiased resize then takes the full
    decode)."""
    if min_side is None or not REDUCE_LIKE_PIL:
        return image
    height, width = image.shape[-2:]
    scale = dct_scale((width, height), min_side)
    reduce = min(-(-height // scale), -(-width // scale)) // (REDUCING_GAP * min_side)
    factor = scale * (reduce if reduce >= 2 else 1)
    if factor == 1:
        return image
    batch = image.reshape(-1, *image.shape[-3:]).float()
    return torch.nn.functional.avg_pool2d(batch, factor, factor, ceil_mode=True).reshape(
        *image.shape[:-2], -(-height // factor), -(-width // factor))


def _resized(image: torch.Tensor, side: int, min_side: int) -> torch.Tensor:
    """``(N, 3, H, W)`` (uint8, or float32 from :func:`shrunk`) with its shorter side resized to ``side`` (the
    longer truncated, as ``Preprocess`` resizes), bilinear with antialiasing in float32, rounded to uint8."""
    height, width = image.shape[-2:]
    check_geometry((width, height), min_side)
    w, h = resized_size((width, height), side)
    if (h, w) == (height, width):
        return image if image.dtype == torch.uint8 else image.round().clamp_(0, 255).to(torch.uint8)
    out = torch.nn.functional.interpolate(image.float(), size=(h, w), mode="bilinear", antialias=True,
                                          align_corners=False)
    return out.round_().clamp_(0, 255).to(torch.uint8)


def _cut(pre: Preprocess, resized: torch.Tensor) -> torch.Tensor:
    """:meth:`Preprocess._cut` of a batch ``(N, 3, H, W)``: uint8 ``(N, crops, 3, S, S)``."""
    if pre.crops == 1:
        views = [TF.center_crop(resized, [pre.image_size])]
    else:
        views = list(TF.five_crop(resized, [pre.image_size]))
        if pre.crops == 10:
            views += [TF.hflip(v) for v in views]
    return torch.stack(views, dim=1)


def _member_views(pre: Preprocess, images: torch.Tensor, mirrored: bool) -> list[torch.Tensor]:
    resized = _resized(images, pre.resize, pre.min_side)
    return [_cut(pre, resized), _cut(pre, resized.flip(-1))] if mirrored else [_cut(pre, resized)]


def _views(pre: Any, images: torch.Tensor, mirrored: bool) -> list[torch.Tensor]:
    """The views ``(N, crops, C, S, S)`` of ``pre`` (a ``Preprocess`` or ``StackedPreprocess``) of a batch of images
    of one size ``(N, 3, H, W)``, and with ``mirrored`` those of their mirror images (``mirrored_views``: the
    resized image mirrored)."""
    if isinstance(pre, Preprocess):
        return _member_views(pre, images, mirrored)
    if not isinstance(pre, StackedPreprocess):
        raise TypeError(f"no torch views for a {type(pre).__name__}")
    side = pre.image_size
    out = torch.zeros(2 if mirrored else 1, len(images), pre.crops, pre.channels, side, side, dtype=torch.uint8,
                      device=images.device)
    for i, m in enumerate(pre.members):
        for j, views in enumerate(_member_views(m, images, mirrored)):
            out[j, :, :, 3 * i:3 * i + 3, :m.image_size, :m.image_size] = views
    return list(out)


def batch_views(preprocess: Any, images: torch.Tensor) -> torch.Tensor:
    """:func:`tensor_views` of a batch of upright RGB uint8 images of one size ``(N, 3, H, W)`` at once (each step
    one kernel for the batch, not one an image): uint8 ``(N, crops, C, S, S)``, each row equal to the image's own
    :func:`tensor_views`."""
    images = shrunk(images, embed_side(preprocess))
    if isinstance(preprocess, MirroredViews):
        return torch.cat([v for b in preprocess._bases for v in _views(b, images, mirrored=True)], dim=1)
    return _views(preprocess, images, mirrored=False)[0]


def tensor_views(preprocess: Any, image: torch.Tensor) -> torch.Tensor:
    """``preprocess.pixels`` of an upright RGB uint8 image ``(3, H, W)`` in torch, on the image's device: uint8
    ``(crops, C, S, S)`` (``Preprocess``, ``StackedPreprocess`` or ``MirroredViews`` of either), the image first
    shrunk as the PIL path decodes an image to embed (:func:`shrunk`, ``embed_side``)."""
    return batch_views(preprocess, image[None])[0]


# how many decoded pixels (N·H·W) :func:`encoded_pixels` cuts into views at once: the float32 copies of a chunk
# (its box reduction, its resize) stay near 12 bytes a pixel × this, 400 MB
CHUNK_PIXELS = 32_000_000


def views_of(preprocess: Any, images: Sequence[torch.Tensor]) -> torch.Tensor:
    """:func:`tensor_views` of each upright RGB uint8 image ``(3, H, W)`` of ``images`` (on one device) → uint8
    ``(N, crops, C, S, S)`` in their order, the images of one size cut together (:func:`batch_views`, in chunks of
    at most :data:`CHUNK_PIXELS` pixels): on a GPU a batch of a camera's photos is a few kernels, not a few an
    image."""
    if not images:
        side = preprocess.image_size
        return torch.zeros((0, preprocess.crops, preprocess.channels, side, side), dtype=torch.uint8)
    by_size: dict[tuple[int, ...], list[int]] = {}
    for i, im in enumerate(images):
        by_size.setdefault(tuple(im.shape), []).append(i)
    out: torch.Tensor | None = None
    for shape, where in by_size.items():
        step = max(1, CHUNK_PIXELS // (shape[-1] * shape[-2]))
        for start in range(0, len(where), step):
            part = where[start:start + step]
            views = batch_views(preprocess, torch.stack([images[i] for i in part]))
            if out is None:                 # every row written once, in place: no second stack
                out = views.new_empty((len(images), *views.shape[1:]))
            out[part] = views
    return cast(torch.Tensor, out)


def encoded_pixels(preprocess: Any, encoded: Sequence[EncodedJPEG], device: torch.device | str) -> torch.Tensor:
    """JPEGs decoded on ``device`` (:func:`decode_batch`) and cut into ``preprocess``'s views (:func:`views_of`) →
    uint8 ``(N, crops, C, S, S)`` on ``device``."""
    return views_of(preprocess, decode_batch(encoded, device))


def image_tensor(image: Image.Image, device: torch.device | str) -> torch.Tensor:
    """A PIL image (e.g. a video frame) → RGB uint8 ``(3, H, W)`` on ``device``, for :func:`tensor_views`."""
    rgb = image if image.mode == "RGB" else image.convert("RGB")
    return TF.pil_to_tensor(rgb).to(device, non_blocking=True)


def torch_pixels(preprocess: Any, data: bytes, device: torch.device | str, max_pixels: int | None = None,
                 decode: str | None = None) -> torch.Tensor | None:
    """One image's ``preprocess.pixels`` ``(crops, C, S, S)`` made on ``device`` when the setting is ``torch`` there
    (:func:`decode_choice`) and ``data`` is a plain JPEG — its header checked first (``ImageGeometryError``); None
    when it is Pillow's to decode (the caller's own path). What an upload, a query image and a Ray actor's file
    take on a CUDA host."""
    if decode_choice(device, decode) != "torch":
        return None
    encoded = encoded_jpeg(data, preprocess.min_side, max_pixels)
    return None if encoded is None else encoded_pixels(preprocess, [encoded], device)[0]
