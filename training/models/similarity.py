"""Similarity between image and caption embeddings in the common space (STT §3.1).

Every similarity takes image embeddings ``(N, D)`` and caption embeddings ``(M, D)`` and returns an
``(N, M)`` score matrix, higher = more similar. ``normalize`` maps raw projections into the space the
similarity expects. The names (``model.similarity``) map to these classes in factory.py.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


class Similarity:
    name = ""

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x, dim=-1)

    def __call__(self, images: torch.Tensor, captions: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class Cosine(Similarity):
    """STT eq. 8: S(i, c) = i · cᵀ on L2-normalised embeddings."""

    name = "cosine"

    def __call__(self, images: torch.Tensor, captions: torch.Tensor) -> torch.Tensor:
        return images @ captions.t()


class OrderViolation(Similarity):
    """STT eq. 9 (Vendrov et al.): S(i, c) = −‖max(0, c − i)‖² on absolute-valued unit embeddings.

    A caption is an abstraction of its image, so the caption should lie below the image on every
    coordinate; any coordinate where it does not is a violation.
    """

    name = "order"
    chunk = 256  # images per block: the (n, M, D) difference tensor is built block by block

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x, dim=-1).abs()

    def __call__(self, images: torch.Tensor, captions: torch.Tensor) -> torch.Tensor:
        blocks = []
        for start in range(0, images.shape[0], self.chunk):
            im = images[start:start + self.chunk]
            violation = (captions.unsqueeze(0) - im.unsqueeze(1)).clamp(min=0)
            blocks.append(-violation.pow(2).sum(-1))
        return torch.cat(blocks, 0) if blocks else images.new_zeros(0, captions.shape[0])
