"""Image preprocessing: decode → resize → crop(s) → tensor → normalise.

The spec is a plain dict stored inside ``model.pt``, so the service preprocesses exactly as training did.
Multi-crop (RCN §IV-A, STT §4.2 features): 1 = centre crop, 5 = four corners + centre, 10 = those 5 and
their horizontal flips; the backbone features of the crops are averaged.

Decoding with ``min_side`` (:func:`decode_image`; every path that embeds images: the feature cache and
evaluation, index build/add/sync, uploads, query images) shrinks a large
photo while decoding it: a JPEG is decoded at the smallest DCT scale (libjpeg's 1/2, 1/4, 1/8, Pillow's
``Image.draft``) whose shorter side is still at least twice the largest side any member's resize needs
(:attr:`Preprocess.min_side`), and an image still at least four times that is then reduced by an integer factor
(``Image.reduce``): the final resize always shrinks 2× or more, as Pillow's ``thumbnail`` does. Images to embed
are shrunk so while :data:`SHRINK_TO_EMBED` is on (:func:`embed_side`; thumbnails always are): what it does to
ranking is measured by benchmarks/decode_ranking.py (docs/benchmarks.md#decoding). The EXIF
orientation is applied afterwards, so a rotated photo is shrunk by its shorter side like any other. Each member
then resizes that one decoded image.
Without ``min_side`` an image is decoded at full size.

Geometry (:func:`check_geometry`): an image's size, read from its header, is checked before any pixel work —
decoding, the resize: its aspect ratio at most :data:`MAX_ASPECT`, and the image its shorter side is resized to
for the model at most :data:`MAX_RESIZED_PIXELS`. The resize scales the *shorter* side, so without these a
205-byte 20000 × 2 PNG would become 2.6 M × 260 pixels (2 GB); every resize of :class:`Preprocess` checks the
same again, so none can grow an image past them (nor overflow).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Sequence, cast

import torch
import torchvision.transforms.functional as TF
from PIL import Image, ImageOps

from .jpeg_scans import MAX_SCANS, count_scans

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class Preprocess:
    image_size: int = 224
    resize: int = 256
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    crops: int = 1

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict) -> Preprocess:
        return cls(image_size=int(d["image_size"]), resize=int(d["resize"]), mean=tuple(d["mean"]),
                   std=tuple(d["std"]), crops=int(d["crops"]))

    @property
    def min_side(self) -> int:
        """The shorter side an image needs before :meth:`pixels` resizes it: a decoder may shrink it to this, never
        below, and the resize and crops see the same geometry."""
        return max(self.resize, self.image_size)

    def pixels(self, image: Image.Image) -> torch.Tensor:
        """uint8 ``(crops, 3, S, S)``: resized and cropped but not normalised (compact to cache)."""
        return self._views(_rgb(image))

    def _views(self, image: Image.Image) -> torch.Tensor:
        return self._cut(self._resized(image))

    def _resized(self, image: Image.Image) -> Image.Image:
        """The image with its shorter side resized to what the crops are cut from."""
        check_geometry(image.size, self.min_side)         # before the resize: it cannot grow past the limits
        return TF.resize(image, self.resize, antialias=True)

    def _cut(self, resized: Image.Image) -> torch.Tensor:
        """The crops of a :meth:`_resized` image, uint8 ``(crops, 3, S, S)``."""
        if self.crops == 1:
            views = [TF.center_crop(resized, self.image_size)]
        else:
            views = list(TF.five_crop(resized, self.image_size))
            if self.crops == 10:
                views += [TF.hflip(v) for v in views]
        return torch.stack([TF.pil_to_tensor(v) for v in views])

    def mirrored_views(self, image: Image.Image) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`pixels` of the image and of its mirror image, resized once: the resize and the mirror commute
        (Pillow's filters are symmetric; tests/test_mirrored_views.py checks it bit for bit), so the mirror image's
        crops are cut from the resized image mirrored."""
        resized = self._resized(_rgb(image))
        return self._cut(resized), self._cut(ImageOps.mirror(resized))

    def normalize(self, pixels: torch.Tensor) -> torch.Tensor:
        """uint8 ``(..., 3, S, S)`` → float, normalised with the backbone's mean/std."""
        x = pixels.float().div_(255.0)
        mean = torch.tensor(self.mean, device=x.device).view(3, 1, 1)
        std = torch.tensor(self.std, device=x.device).view(3, 1, 1)
        return (x - mean) / std

    @property
    def channels(self) -> int:
        """Channels of a view in ``pixels`` (3: RGB)."""
        return 3

    def views(self, crops: int, resize: int) -> Preprocess:
        """``crops`` crops of the image resized to ``resize`` (view augmentation, ``image.train_crops``)."""
        return replace(self, crops=crops, resize=resize)

    def __call__(self, image: Image.Image) -> torch.Tensor:
        return self.normalize(self.pixels(image))


@dataclass(frozen=True)
class StackedPreprocess:
    """The preprocessing of an ensemble whose members read different pixels (e.g. 224 and 260 px): each member's
    own :class:`Preprocess` of the same decoded image, stacked along the channel axis, each view in the top-left
    corner of the largest member's size. One image still gives one uint8 tensor ``(crops, 3k, S, S)``, so the
    loaders, the feature cache and the service pass it on unchanged; :meth:`split` gives each member exactly the
    pixels its own preprocessing makes."""
    members: tuple[Preprocess, ...]

    def __post_init__(self):
        if len({m.crops for m in self.members}) > 1:
            raise ValueError(f"members must take the same number of crops per image, got "
                             f"{[m.crops for m in self.members]}")

    @property
    def image_size(self) -> int:
        return max(m.image_size for m in self.members)

    @property
    def crops(self) -> int:
        return self.members[0].crops

    @property
    def min_side(self) -> int:
        """The largest :attr:`Preprocess.min_side` of the members: one decoded image serves all of them."""
        return max(m.min_side for m in self.members)

    @property
    def channels(self) -> int:
        return 3 * len(self.members)

    def to_dict(self) -> dict:
        return {"stacked": [m.to_dict() for m in self.members]}

    def views(self, crops: int, resize: int) -> StackedPreprocess:
        """Each member's ``crops`` crops, cut with the same geometry: ``resize`` is the largest member's side,
        the others' are scaled by their input size."""
        return StackedPreprocess(tuple(m.views(crops, round(resize * m.image_size / self.image_size))
                                       for m in self.members))

    def pixels(self, image: Image.Image) -> torch.Tensor:
        """The image converted to RGB once; each member resizes and crops that one image."""
        side = self.image_size
        image = _rgb(image)
        out = torch.zeros(self.crops, self.channels, side, side, dtype=torch.uint8)
        for i, m in enumerate(self.members):
            out[:, 3 * i:3 * i + 3, :m.image_size, :m.image_size] = m._views(image)
        return out

    def mirrored_views(self, image: Image.Image) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`pixels` of the image and of its mirror image, each member resizing once
        (:meth:`Preprocess.mirrored_views`)."""
        side = self.image_size
        image = _rgb(image)
        out = torch.zeros(2, self.crops, self.channels, side, side, dtype=torch.uint8)
        for i, m in enumerate(self.members):
            for j, views in enumerate(m.mirrored_views(image)):
                out[j, :, 3 * i:3 * i + 3, :m.image_size, :m.image_size] = views
        return out[0], out[1]

    def split(self, stacked: torch.Tensor, groups: Sequence[int] | None = None) -> list[torch.Tensor]:
        """``(..., 3k, S, S)`` → each member's ``(..., 3, S_i, S_i)`` (uint8 pixels or normalised images).
        ``groups`` takes consecutive members together (an ensemble member reading several backbones): ``[2, 1]``
        gives the first two members' channels at the larger of their sizes, then the third's."""
        parts, start = [], 0
        for count in groups or [1] * len(self.members):
            side = max(m.image_size for m in self.members[start:start + count])
            parts.append(stacked[..., 3 * start:3 * (start + count), :side, :side])
            start += count
        return parts

    def normalize(self, pixels: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(pixels.shape, dtype=torch.float32, device=pixels.device)
        for i, (m, part) in enumerate(zip(self.members, self.split(pixels))):
            out[..., 3 * i:3 * i + 3, :m.image_size, :m.image_size] = m.normalize(part)
        return out

    def __call__(self, image: Image.Image) -> torch.Tensor:
        return self.normalize(self.pixels(image))


ImagePreprocess = Preprocess | StackedPreprocess    # what a model's ``preprocess`` is


def preprocess_from_dict(d: dict) -> ImagePreprocess:
    """A preprocessing from its ``to_dict()`` (e.g. ``model.pt``'s ``backbone.preprocess``)."""
    if "stacked" in d:
        return StackedPreprocess(tuple(Preprocess.from_dict(m) for m in d["stacked"]))
    return Preprocess.from_dict(d)


def _rgb(image: Image.Image) -> Image.Image:
    return image if image.mode == "RGB" else image.convert("RGB")


ZOOM = 8 / 7       # ImageNet's evaluation crop: the image resized to 8/7 of the input side, the centre cut (0.875)


def zoomed(base: ImagePreprocess, factor: float = ZOOM) -> ImagePreprocess:
    """``base``'s views of the image resized ``factor`` times larger before the crop: a closer view of the centre
    (each member of a stacked preprocessing by the same factor)."""
    if isinstance(base, StackedPreprocess):
        return StackedPreprocess(tuple(cast(Preprocess, zoomed(m, factor)) for m in base.members))
    return base.views(base.crops, round(max(base.resize, base.image_size) * factor))


@dataclass(frozen=True)
class MirroredViews:
    """Test-time augmentation of a gallery image (``index build --tta flip`` / ``flip-crop``): the views of
    ``base`` and the same views of the horizontally mirrored image, ``2 × crops`` views in all; with ``zoom`` also
    those of the image enlarged ``zoom`` times and cut to the centre (:func:`zoomed`), and their mirror images,
    ``4 × crops``. The model averages the views' backbone features as it averages multiple crops
    (``JointEmbedding.image_features``). Normalisation is the base's, so a query embedded with ``base`` lands in
    the same space."""
    base: ImagePreprocess
    zoom: float | None = None

    @cached_property
    def _bases(self) -> tuple[ImagePreprocess, ...]:
        """The preprocessings whose views (and their mirror images) are taken, derived once."""
        return (self.base,) if self.zoom is None else (self.base, zoomed(self.base, self.zoom))

    @property
    def image_size(self) -> int:
        return self.base.image_size

    @property
    def crops(self) -> int:
        return 2 * len(self._bases) * self.base.crops

    @property
    def channels(self) -> int:
        return self.base.channels

    def to_dict(self) -> dict:
        """What a feature cache of these views is keyed by (training/data/features.py ``cache_manifest``)."""
        return {"mirrored": self.base.to_dict(), "zoom": self.zoom}

    @property
    def min_side(self) -> int:
        return max(b.min_side for b in self._bases)

    def pixels(self, image: Image.Image) -> torch.Tensor:
        # each base resizes the image once for its views and their mirror images (mirrored_views); the mirror is
        # taken of the resized image, not of the tensor: a stacked preprocess keeps each member's view in the
        # top-left corner, and a centre crop is not always centred to the pixel
        image = _rgb(image)
        return torch.cat([v for b in self._bases for v in b.mirrored_views(image)])

    def normalize(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.base.normalize(pixels)

    def __call__(self, image: Image.Image) -> torch.Tensor:
        return self.normalize(self.pixels(image))


# --- geometry: what an image's size may cost, checked before any pixel work -------------------------------------
MAX_ASPECT = 50                 # longer side : shorter side (a long screenshot, a 360° panorama stay below it)
MAX_RESIZED_PIXELS = 16_000_000  # pixels once the shorter side is resized for the model (50:1 at a 565-px side)


class ImageGeometryError(ValueError):
    """An image ruled out by what its header says, before any pixel is decoded: ``limit`` names the limit it
    breaks — ``pixels`` (width × height), ``aspect`` (:data:`MAX_ASPECT`), ``resized``
    (:data:`MAX_RESIZED_PIXELS`) or ``scans`` (a JPEG's scans, :func:`check_scans`)."""

    def __init__(self, message: str, limit: str):
        super().__init__(message)
        self.limit = limit


def resized_size(size: tuple[int, int], side: int) -> tuple[int, int]:
    """``size`` with its shorter side scaled to ``side`` (torchvision's ``resize`` with one int: the longer side
    truncated)."""
    width, height = size
    if width <= height:
        return side, int(side * height / width)
    return int(side * width / height), side


def check_geometry(size: tuple[int, int], side: int | None = None, max_pixels: int | None = None) -> None:
    """Refuses, from ``size`` alone, an image that would cost more than the limits: no area, more than
    ``max_pixels`` pixels, an aspect ratio above :data:`MAX_ASPECT`, or — resized so its shorter side is ``side``
    (the preprocessing's :attr:`Preprocess.min_side`) — more than :data:`MAX_RESIZED_PIXELS` pixels.
    :class:`ImageGeometryError` naming the limit."""
    width, height = size
    if width < 1 or height < 1:
        raise ImageGeometryError(f"image is {width}×{height} pixels: it has no area", "pixels")
    if max_pixels is not None and width * height > max_pixels:
        raise ImageGeometryError(f"image is {width}×{height} = {width * height:,} pixels; the limit is "
                                 f"{max_pixels:,}", "pixels")
    long, short = max(width, height), min(width, height)
    if long > MAX_ASPECT * short:
        raise ImageGeometryError(f"image is {width}×{height} pixels: its aspect ratio {long / short:,.0f}:1 is above "
                                 f"the limit of {MAX_ASPECT}:1", "aspect")
    if side is not None:
        w, h = resized_size(size, side)
        if w * h > MAX_RESIZED_PIXELS:
            raise ImageGeometryError(f"image is {width}×{height} pixels: resized to a shorter side of {side} for the "
                                     f"model it would be {w}×{h} = {w * h:,} pixels; the limit is "
                                     f"{MAX_RESIZED_PIXELS:,}", "resized")


def check_scans(image: Image.Image, data: bytes | None = None) -> None:
    """Refuses a JPEG (``image`` opened, not loaded) of more than :data:`~training.data.jpeg_scans.MAX_SCANS`
    scans — a progressive scan bomb, decoded in time proportional to its scans — from its bytes ``data`` (read from
    ``image.filename`` when not given), before it is decoded: :class:`ImageGeometryError` (``scans``)."""
    if image.format not in ("JPEG", "MPO"):
        return
    if data is None:
        filename = getattr(image, "filename", "")          # an ImageFile opened from a path has it
        data = Path(filename).read_bytes() if filename else b""
    scans = count_scans(data, MAX_SCANS)
    if scans > MAX_SCANS:
        raise ImageGeometryError(f"the JPEG has more than {MAX_SCANS} scans, each a pass over the whole image (a "
                                 f"progressive JPEG has about 10); the limit is {MAX_SCANS}", "scans")


# --- decoding: every format the gallery indexes -----------------------------------------------------------------
# Pillow reads JPEG, PNG, GIF, BMP, TIFF, WebP and (Pillow ≥ 11.3) AVIF itself; HEIC/HEIF come from pillow-heif (a
# dependency), camera RAW files from rawpy (the optional extra ``jointspace[raw]``).
HEIF_SUFFIXES = frozenset({".heic", ".heif"})
RAW_SUFFIXES = frozenset({".dng", ".cr2", ".cr3", ".nef", ".nrw", ".arw", ".srf", ".sr2", ".orf", ".rw2", ".raf",
                          ".pef", ".srw", ".raw", ".rwl", ".3fr", ".erf", ".kdc", ".mrw", ".x3f"})
_heif_registered: bool | None = None


def register_heif() -> bool:
    """Registers pillow-heif's HEIC/HEIF opener with Pillow (once); False when pillow-heif is not installed."""
    global _heif_registered
    if _heif_registered is None:
        try:
            import pillow_heif
        except ImportError:
            _heif_registered = False
        else:
            pillow_heif.register_heif_opener()
            _heif_registered = True
    return _heif_registered


class UnsupportedImageError(ValueError):
    """A file of a format this installation cannot decode (e.g. camera RAW without rawpy)."""


def _open_raw(source, side: int | None = None, max_pixels: int | None = None) -> Image.Image:
    """A camera RAW file demosaiced, its size checked (:func:`check_geometry`) before it is."""
    try:
        import rawpy
    except ImportError:
        raise UnsupportedImageError("camera RAW files need rawpy: pip install 'jointspace[raw]'") from None
    with rawpy.imread(source) as raw:          # a path or a file object
        check_geometry((raw.sizes.width, raw.sizes.height), side, max_pixels)
        rgb = raw.postprocess(use_camera_wb=True, output_bps=8)   # demosaiced, rotated as the camera recorded
    return Image.fromarray(rgb)


# --- shrinking while decoding --------------------------------------------------------------------------------------
DCT_SCALES = (8, 4, 2)     # libjpeg decodes a JPEG at 1/8, 1/4 or 1/2 of its size (DCT scaling)
REDUCING_GAP = 2           # a DCT scale or Image.reduce only while the resize that follows still shrinks this much
_ORIENTATION = 0x0112      # EXIF orientations 5-8 turn the image by 90°
SHRINK_TO_EMBED = True     # on: mean dev R-sum loss 0.49 ≤ 0.5 over three sides (benchmarks/decode_ranking.py)


def embed_side(preprocess) -> int | None:
    """The ``min_side`` to decode an image to embed with: ``preprocess.min_side`` while :data:`SHRINK_TO_EMBED`
    is on, else None (full size)."""
    return preprocess.min_side if SHRINK_TO_EMBED else None


def dct_scale(size: tuple[int, int], min_side: int) -> int:
    """The largest of 8, 4, 2 whose 1/scale keeps the shorter side of ``size`` at least ``REDUCING_GAP ·
    min_side``, else 1: what :func:`draft` decodes a JPEG of that size at. The shorter side decides, so a photo
    turned by EXIF (width and height swapped) gets the same scale."""
    short = min(size)
    return next((s for s in DCT_SCALES if short // s >= REDUCING_GAP * min_side), 1)


def draft(image: Image.Image, min_side: int) -> int:
    """Before ``image`` (opened, not loaded) is decoded: a JPEG is set to decode at :func:`dct_scale`, the
    smallest size whose shorter side is still ``≥ REDUCING_GAP · min_side`` (sides rounded up). Returns the scale
    (1: decoded at full size, e.g. not a JPEG)."""
    scale = dct_scale(image.size, min_side)
    if scale == 1 or image.format not in ("JPEG", "MPO"):
        return 1
    # Pillow picks the largest scale ≤ min(w // side, h // side) = short // side: the same as dct_scale; it
    # returns the box the decoded image covers (None: not drafted, e.g. a file of several tiles)
    width, side = image.size[0], REDUCING_GAP * min_side
    done = image.draft("RGB", (side, side))
    return round(width / done[1][2]) if done else 1


def reduce_to(image: Image.Image, min_side: int) -> Image.Image:
    """``image`` shrunk by the largest integer factor that keeps its shorter side ``≥ REDUCING_GAP · min_side``
    (a box filter, Pillow's ``reduce``), or ``image`` itself."""
    factor = min(image.size) // (REDUCING_GAP * min_side)
    return image.reduce(factor) if factor >= 2 else image


@dataclass(frozen=True)
class Decoded:
    image: Image.Image                 # upright RGB (shrunk when decode_image was given a min_side)
    exif: Image.Exif | None            # the file's EXIF (None for RAW)
    size: tuple[int, int]              # upright (width, height) of the image in the file


def decode_image(source: str | Path | bytes, suffix: str | None = None, min_side: int | None = None,
                 max_pixels: int | None = None) -> Decoded:
    """Decodes a file (a path, or its bytes with the file's ``suffix``) fully — so a truncated file fails here,
    not later — and returns the RGB image turned upright (the EXIF orientation tag applied: a photo taken with the
    phone on its side comes out as it was seen), the file's EXIF and the upright size in the file.

    ``min_side``: the shorter side the caller needs (``preprocess.min_side``): the image may come back smaller,
    never with a shorter side below ``REDUCING_GAP`` times that (nor larger than the file's): a JPEG is decoded at a
    DCT scale (:func:`draft`), then an image still at least twice that is reduced (:func:`reduce_to`).
    The size in the header is checked first (:func:`check_geometry` with ``min_side`` and ``max_pixels``):
    :class:`ImageGeometryError` before any pixel is decoded."""
    import io

    stream: io.BytesIO | str | Path
    if isinstance(source, (bytes, bytearray)):
        suffix, stream = (suffix or "").lower(), io.BytesIO(source)
    else:
        suffix, stream = Path(source).suffix.lower(), source
    if suffix in RAW_SUFFIXES:
        raw = _open_raw(stream if not isinstance(stream, (str, Path)) else str(stream), min_side, max_pixels)
        return Decoded(raw if min_side is None else reduce_to(raw, min_side), None, raw.size)
    register_heif()
    with Image.open(stream) as im:
        width, height = im.size
        check_geometry((width, height), min_side, max_pixels)
        check_scans(im, source if isinstance(source, (bytes, bytearray)) else None)
        if min_side is not None:
            draft(im, min_side)
        im.load()
        exif = im.getexif()
        upright = ImageOps.exif_transpose(im)
    size = (height, width) if exif.get(_ORIENTATION) in (5, 6, 7, 8) else (width, height)
    upright = _rgb(upright)
    return Decoded(upright if min_side is None else reduce_to(upright, min_side), exif, size)


def load_image(source: str | Path | bytes, suffix: str | None = None, min_side: int | None = None
               ) -> tuple[Image.Image, Image.Exif | None]:
    """``(RGB image turned upright, EXIF)`` of a file (:func:`decode_image`; a truncated file fails here). The
    EXIF returned is the file's (None for RAW)."""
    decoded = decode_image(source, suffix, min_side)
    return decoded.image, decoded.exif


def open_image(path: str | Path, min_side: int | None = None) -> Image.Image:
    """Decode fully (so truncated files fail here, not later) and return an upright RGB image (EXIF orientation
    applied; HEIC/HEIF, AVIF and — with rawpy — camera RAW included); ``min_side``: see :func:`decode_image`."""
    return decode_image(path, min_side=min_side).image
