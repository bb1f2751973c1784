"""A training batch's images: from an ``ImageSource`` (training/data/sources.py) to backbone features or
embeddings, one random view per sample for a ``views`` source (view augmentation, ``image.train_crops``), and
every view of a source embedded (SCST's reference)."""
from __future__ import annotations

from typing import Callable, cast

import torch

from training.data.sources import ImageSource
from training.inference.embedding import device_of, inference_autocast


def random_view(batch: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """``(B, V, ...)`` → ``(B, ...)``: one uniformly drawn view per row (the global RNG unless ``generator``)."""
    pick = torch.randint(batch.shape[1], (batch.shape[0],), generator=generator,
                         device=batch.device if generator is None else generator.device).to(batch.device)
    return batch[torch.arange(batch.shape[0], device=batch.device), pick]


def batch_features(model, kind: str, batch: torch.Tensor) -> torch.Tensor:
    """A training batch from a source → backbone features (a random view of each image for ``views``)."""
    if kind == "features":
        return batch
    if kind == "views":
        return random_view(batch)
    return model.image_features(model.preprocess.normalize(batch))


def image_inputs_to_embedding(model, kind: str, batch: torch.Tensor) -> torch.Tensor:
    """A training batch from a source (features, views, or uint8 pixels) → embeddings."""
    if kind in ("features", "views"):
        return model.embed_features(batch_features(model, kind, batch))
    return model.embed_images(model.preprocess.normalize(batch))


@torch.no_grad()
def embed_views(model, source: ImageSource, batch_size: int = 128,
                embed: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """Every view of a ``views`` source (a ``features`` source: its one view) → embeddings ``(N, V, E)``, by
    ``embed`` (backbone features → embeddings; default ``model.embed_features``)."""
    device = device_of(model)
    embed = model.embed_features if embed is None else embed
    was_training = model.training
    model.eval()
    views = cast(torch.Tensor, source.data)
    views = views[:, None] if source.kind == "features" else views
    flat = views.flatten(0, 1)
    out = []
    for i in range(0, len(flat), batch_size):
        with inference_autocast(model, device):
            out.append(embed(flat[i:i + batch_size].to(device)).float())
    model.train(was_training)
    return torch.cat(out).view(views.shape[0], views.shape[1], -1)
