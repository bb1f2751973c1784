"""Where a data split's image inputs come from: an :class:`ImageSource` is what a list of image files turns into
for a model (training, evaluation, query banks).

* ``features`` — precomputed features of a frozen pretrained backbone (``features.extract_features``, cached);
* ``pixels``   — all images decoded once into a uint8 tensor (small sets, trainable backbones);
* ``files``    — decoded on the fly by DataLoader workers (large sets with a trainable backbone);
* ``views``    — view augmentation for training (``image.train_crops``): ``(N, 1 + crops, D)`` features, view 0
  the evaluation view and the others crops of the image; each training sample reads one random view
  (``training.batches.random_view``), while embedding the source (validation, SCST's reference) uses view 0.

A source is embedded by ``training.inference.embedding.embed_image_source``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, cast

import numpy as np
import torch

from .features import DEFAULT_COMPUTE, Compute, ImageFiles, extract_features, load_pixels

PIXEL_CACHE_LIMIT = 2 * 1024 ** 3   # bytes of uint8 pixels kept in memory before falling back to files


@dataclass
class ImageSource:
    kind: str                                  # features | pixels | files | views
    data: torch.Tensor | ImageFiles

    def __len__(self) -> int:
        return len(self.data)


def image_source(model, paths: Sequence, trainable: bool = False, cache_dir=None,
                 compute: Compute = DEFAULT_COMPUTE) -> ImageSource:
    """The source of ``paths`` for ``model``: the cached features of a frozen pretrained backbone (unless
    ``trainable``), extracted as ``compute`` says, else the decoded pixels when they fit in
    :data:`PIXEL_CACHE_LIMIT`, else the files."""
    if model.backbone_pretrained and not trainable:
        feats = extract_features(model, paths, cache_dir=cache_dir, compute=compute)
        return ImageSource("features", torch.from_numpy(np.array(feats, dtype=np.float32)))  # in RAM, writable
    pre = model.preprocess
    if len(paths) * pre.crops * pre.channels * pre.image_size ** 2 <= PIXEL_CACHE_LIMIT:
        return ImageSource("pixels", load_pixels(paths, pre, workers=compute.workers, progress=compute.progress))
    return ImageSource("files", ImageFiles(paths, pre))


def view_source(model, paths: Sequence, base: ImageSource, views, cache_dir=None,
                compute: Compute = DEFAULT_COMPUTE, with_base: bool = True) -> ImageSource:
    """A ``views`` source: the features of each view of ``views`` (a preprocessing of several views a photo:
    ``image.train_crops``' corner and centre crops, or ``image.train_views``' ``MirroredViews``), extracted as
    ``compute`` says, after ``base`` (pooled features of the evaluation view) unless not ``with_base`` (the views
    hold it already)."""
    if base.kind != "features":
        raise ValueError(f"view augmentation needs precomputed features of a frozen backbone, not {base.kind!r}")
    per_view = extract_features(model, paths, cache_dir=cache_dir, compute=compute, preprocess=views,
                                per_view=True)
    views_features = torch.from_numpy(np.array(per_view, np.float32))
    if not with_base:
        return ImageSource("views", views_features)
    return ImageSource("views", torch.cat([cast(torch.Tensor, base.data)[:, None], views_features], 1))
