"""Image preprocessing: decode → resize → crop(s) → tensor → normalise.

The spec is a plain dict stored inside ``model.pt``, so the service preprocesses exactly as training did.
Multi-crop (RCN §IV-A, STT §4.2 features): 1 = centre crop, 5 = four corners + centre, 10 = those 5 and
their horizontal flips; the backbone features of the crops are averaged.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Sequence

import torch
import torchvision.transforms.functional as TF
from PIL import Image, ImageOps

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
    def from_dict(cls, d: dict) -> "Preprocess":
        return cls(image_size=int(d["image_size"]), resize=int(d["resize"]), mean=tuple(d["mean"]),
                   std=tuple(d["std"]), crops=int(d["crops"]))

    def pixels(self, image: Image.Image) -> torch.Tensor:
        """uint8 ``(crops, 3, S, S)``: resized and cropped but not normalised (compact to cache)."""
        image = image.convert("RGB")
        if self.crops == 1:
            side = self.resize if self.resize != self.image_size else self.image_size
            image = TF.resize(image, side, antialias=True)
            views = [TF.center_crop(image, self.image_size)]
        else:
            image = TF.resize(image, self.resize, antialias=True)
            views = list(TF.five_crop(image, self.image_size))
            if self.crops == 10:
                views += [TF.hflip(v) for v in views]
        return torch.stack([TF.pil_to_tensor(v) for v in views])

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

    def views(self, crops: int, resize: int) -> "Preprocess":
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
    def channels(self) -> int:
        return 3 * len(self.members)

    def to_dict(self) -> dict:
        return {"stacked": [m.to_dict() for m in self.members]}

    def views(self, crops: int, resize: int) -> "StackedPreprocess":
        """Each member's ``crops`` crops, cut with the same geometry: ``resize`` is the largest member's side,
        the others' are scaled by their input size."""
        return StackedPreprocess(tuple(m.views(crops, round(resize * m.image_size / self.image_size))
                                       for m in self.members))

    def pixels(self, image: Image.Image) -> torch.Tensor:
        side = self.image_size
        out = torch.zeros(self.crops, self.channels, side, side, dtype=torch.uint8)
        for i, m in enumerate(self.members):
            out[:, 3 * i:3 * i + 3, :m.image_size, :m.image_size] = m.pixels(image)
        return out

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


@dataclass(frozen=True)
class MirroredViews:
    """Test-time augmentation of a gallery image (``index build --tta flip``): the views of ``base`` and the
    same views of the horizontally mirrored image, ``2 × crops`` views in all; the model averages the views'
    backbone features as it averages multiple crops (``JointEmbedding.image_features``). Normalisation is the
    base's, so a query embedded with ``base`` lands in the same space."""
    base: ImagePreprocess

    @property
    def image_size(self) -> int:
        return self.base.image_size

    @property
    def crops(self) -> int:
        return 2 * self.base.crops

    @property
    def channels(self) -> int:
        return self.base.channels

    def pixels(self, image: Image.Image) -> torch.Tensor:
        # mirror the image, not the tensor: a stacked preprocess keeps each member's view in the top-left corner
        return torch.cat([self.base.pixels(image), self.base.pixels(ImageOps.mirror(image.convert("RGB")))])

    def normalize(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.base.normalize(pixels)

    def __call__(self, image: Image.Image) -> torch.Tensor:
        return self.normalize(self.pixels(image))


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


def _open_raw(source) -> Image.Image:
    try:
        import rawpy
    except ImportError:
        raise UnsupportedImageError("camera RAW files need rawpy: pip install 'jointspace[raw]'") from None
    with rawpy.imread(source) as raw:          # a path or a file object
        rgb = raw.postprocess(use_camera_wb=True, output_bps=8)   # demosaiced, rotated as the camera recorded
    return Image.fromarray(rgb)


def load_image(source: str | Path | bytes, suffix: str | None = None) -> tuple[Image.Image, "Image.Exif | None"]:
    """Decodes a file (a path, or its bytes with the file's ``suffix``) fully — so a truncated file fails here,
    not later — and returns ``(RGB image turned upright, EXIF)``. The EXIF orientation tag is applied (a photo
    taken with the phone on its side comes out as it was seen); the EXIF returned is the file's (None for RAW)."""
    import io

    if isinstance(source, (bytes, bytearray)):
        suffix, stream = (suffix or "").lower(), io.BytesIO(source)
    else:
        suffix, stream = Path(source).suffix.lower(), source
    if suffix in RAW_SUFFIXES:
        return _open_raw(stream if not isinstance(stream, (str, Path)) else str(stream)), None
    register_heif()
    with Image.open(stream) as im:
        im.load()
        exif = im.getexif()
        upright = ImageOps.exif_transpose(im)
        return upright.convert("RGB"), exif


def open_image(path: str | Path) -> Image.Image:
    """Decode fully (so truncated files fail here, not later) and return an upright RGB image (EXIF orientation
    applied; HEIC/HEIF, AVIF and — with rawpy — camera RAW included)."""
    return load_image(path)[0]
