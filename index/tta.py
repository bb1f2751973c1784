"""The gallery side's test-time augmentations (``index build --tta``), by name; torch-free, so that the command
line's parser offers them without importing the model code.

* ``none`` — each photo as the model's preprocessing gives it;
* ``flip`` — each view and its mirror image, averaged;
* ``flip-crop`` — those and a closer centre crop of the image (ImageNet's 0.875) and its mirror image, averaged.

The manifest records the index's augmentation, so that ``add`` and ``sync`` embed new photos alike
(training/inference/embedding.py ``view_preprocess``; the names are training/inference/names.py's)."""
from __future__ import annotations

from training.inference.names import TTA

__all__ = ["TTA", "DEFAULT_TTA"]
DEFAULT_TTA = "flip-crop"        # the shipped model's dev ranking as served, by --tta: docs/results.md
