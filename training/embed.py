"""Encode a data split with a model: where image inputs come from, and batched embedding of both sides.

An :class:`ImageSource` is what an image index turns into for the model:

* ``features`` — precomputed features of a frozen pretrained backbone (``features.extract_features``);
* ``pixels``   — all images decoded once into a uint8 tensor (small sets, trainable backbones);
* ``files``    — decoded on the fly by DataLoader workers (large sets with a trainable backbone);
* ``views``    — view augmentation for training (``image.train_crops``): ``(N, 1 + crops, D)`` features, view 0
  the evaluation view and the others crops of the image; each training sample reads one random view
  (:func:`random_view`), while embedding the source (validation, SCST's reference) uses view 0.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence, cast

import numpy as np
import torch
from torch.utils.data import DataLoader

from training.data.features import ImageFiles, extract_features, load_pixels
from training.data.vocab import pad_batch
from training.models.attention import embed_words

PIXEL_CACHE_LIMIT = 2 * 1024 ** 3   # bytes of uint8 pixels kept in memory before falling back to files


@dataclass
class ImageSource:
    kind: str                                  # features | pixels | files | views
    data: torch.Tensor | ImageFiles

    def __len__(self) -> int:
        return len(self.data)


def image_source(model, paths: Sequence, trainable: bool = False, cache_dir=None, device="cpu", workers: int = 2,
                 progress: bool = True, amp: bool = False) -> ImageSource:
    if model.backbone_pretrained and not trainable:
        feats = extract_features(model, paths, cache_dir=cache_dir, device=device, workers=workers,
                                 progress=progress, amp=amp)
        return ImageSource("features", torch.from_numpy(np.array(feats, dtype=np.float32)))  # in RAM, writable
    pre = model.preprocess
    if len(paths) * pre.crops * 3 * pre.image_size ** 2 <= PIXEL_CACHE_LIMIT:
        return ImageSource("pixels", load_pixels(paths, pre, workers=workers, progress=progress))
    return ImageSource("files", ImageFiles(paths, pre))


def view_source(model, paths: Sequence, base: ImageSource, crops: int, resize: int, cache_dir=None, device="cpu",
                workers: int = 2, progress: bool = True, amp: bool = False) -> ImageSource:
    """``base`` (pooled features of the evaluation view) plus the features of ``crops`` crops of each image
    resized to ``resize`` (the corners and centre, and their flips for 10): a ``views`` source."""
    if base.kind != "features":
        raise ValueError(f"view augmentation needs precomputed features of a frozen backbone, not {base.kind!r}")
    pre = replace(model.preprocess, crops=crops, resize=resize)
    views = extract_features(model, paths, cache_dir=cache_dir, device=device, workers=workers, progress=progress,
                             amp=amp, preprocess=pre, per_view=True)
    base_features = cast(torch.Tensor, base.data)
    return ImageSource("views", torch.cat([base_features[:, None], torch.from_numpy(np.array(views, np.float32))], 1))


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


def autocast(device: torch.device, amp: bool):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp and device.type == "cuda")


@torch.no_grad()
def embed_image_source(model, source: ImageSource, batch_size: int = 128, device="cpu", amp: bool = False,
                       workers: int = 2) -> torch.Tensor:
    device = torch.device(device)
    was_training = model.training
    model.eval()
    out = []
    kind = "features" if source.kind == "views" else source.kind
    if source.kind == "files":
        loader = DataLoader(cast(ImageFiles, source.data), batch_size=batch_size, num_workers=workers,
                            generator=torch.Generator())      # leaves the global RNG alone (features.image_loader)
        batches = (pixels for _, pixels in loader)
    else:
        data = cast(torch.Tensor, source.data)
        data = data[:, 0] if source.kind == "views" else data     # views: the evaluation view
        batches = (data[i:i + batch_size] for i in range(0, len(source), batch_size))
    for batch in batches:
        with autocast(device, amp):
            out.append(image_inputs_to_embedding(model, kind, batch.to(device)).float())
    model.train(was_training)
    return torch.cat(out)


@torch.no_grad()
def embed_views(model, source: ImageSource, batch_size: int = 128, device="cpu", amp: bool = False) -> torch.Tensor:
    """Every view of a ``views`` source → embeddings ``(N, V, E)``."""
    device = torch.device(device)
    was_training = model.training
    model.eval()
    views = cast(torch.Tensor, source.data)
    flat = views.flatten(0, 1)
    out = []
    for i in range(0, len(flat), batch_size):
        with autocast(device, amp):
            out.append(model.embed_features(flat[i:i + batch_size].to(device)).float())
    model.train(was_training)
    return torch.cat(out).view(views.shape[0], views.shape[1], -1)


@torch.no_grad()
def embed_caption_ids(model, id_lists: Sequence[Sequence[int]], batch_size: int = 512, device="cpu",
                      amp: bool = False) -> torch.Tensor:
    device = torch.device(device)
    was_training = model.training
    model.eval()
    out = []
    for start in range(0, len(id_lists), batch_size):
        ids, lengths = pad_batch([list(x) for x in id_lists[start:start + batch_size]])
        with autocast(device, amp):
            out.append(model.embed_texts(ids.to(device), lengths.to(device)).float())
    model.train(was_training)
    return torch.cat(out)


def embed_split(model, dataset, device="cpu", cache_dir=None, workers: int = 2, progress: bool = True,
                amp: bool = False, source: ImageSource | None = None):
    """Embeds every image and caption of ``dataset`` (a CaptionDataset).
    Returns ``(image_emb (N, E), caption_emb (M, E), cap_to_img (M,))``."""
    if source is None:
        source = image_source(model, [r.path for r in dataset.images], cache_dir=cache_dir, device=device,
                              workers=workers, progress=progress, amp=amp)
    img_emb = embed_image_source(model, source, device=device, amp=amp, workers=workers)
    cap_ids = [model.encode_text_ids([c])[0] for r in dataset.images for c in r.captions]
    cap_to_img = torch.tensor([r.image_id for r in dataset.images for _ in r.captions], dtype=torch.long)
    cap_emb = embed_caption_ids(model, cap_ids, device=device, amp=amp)
    return img_emb.cpu(), cap_emb.cpu(), cap_to_img


@torch.no_grad()
def fine_embed_split(model, dataset, source, device="cpu", batch_size: int = 128):
    """Region embeddings ``(N, k, E)`` of a split's images (from ``source``, an ImageSource of grid features
    or pixels), word embeddings ``(M, T, E)`` and mask ``(M, T)`` of its captions, and ``cap_to_img``."""
    device = torch.device(device)
    was_training = model.training
    model.eval()
    if source.kind == "files":
        loader = torch.utils.data.DataLoader(source.data, batch_size=batch_size, generator=torch.Generator())
        batches = (pixels for _, pixels in loader)
    else:
        batches = (source.data[i:i + batch_size] for i in range(0, len(source), batch_size))
    regions = []
    for batch in batches:
        batch = batch.to(device)
        feats = batch if source.kind == "features" else model.image_features(model.preprocess.normalize(batch))
        regions.append(model.embed_regions(feats).float().cpu())
    ids_all = [model.encode_text_ids([c])[0] for r in dataset.images for c in r.captions]
    ids, lengths = pad_batch(ids_all)
    words, masks = [], []
    for start in range(0, len(ids_all), batch_size):
        w, m = embed_words(model, ids[start:start + batch_size].to(device), lengths[start:start + batch_size])
        words.append(w.float().cpu())
        masks.append(m.cpu())
    cap_to_img = torch.tensor([r.image_id for r in dataset.images for _ in r.captions], dtype=torch.long)
    model.train(was_training)
    return torch.cat(regions), torch.cat(words), torch.cat(masks), cap_to_img
