"""Image preprocessing: decode → resize → crop(s) → tensor → normalise.

The spec is a plain dict stored inside ``model.pt``, so the service preprocesses exactly as training did.
Multi-crop (RCN §IV-A, STT §4.2 features): 1 = centre crop, 5 = four corners + centre, 10 = those 5 and
their horizontal flips; the backbone features of the crops are averaged.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torchvision.transforms.functional as TF
from PIL import Image

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

    def __call__(self, image: Image.Image) -> torch.Tensor:
        return self.normalize(self.pixels(image))


def open_image(path: str | Path) -> Image.Image:
    """Decode fully (so truncated files fail here, not later) and return an RGB image."""
    with Image.open(path) as im:
        im.load()
        return im.convert("RGB")
