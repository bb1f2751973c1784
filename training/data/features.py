"""Decode images in worker processes, and precompute frozen-backbone features once, cached on disk.

The features are the backbone's pooled vector, or for STT-ATT models its flattened grid of regions. Images are
decoded as every inference path decodes them (``preprocess.open_image`` with ``preprocess.embed_side``), so
evaluation, the index and the service see the same pixels.

The cache is a memory-mapped ``.npy`` per (backbone weights, preprocessing, exact file list) plus a JSON
manifest. The cache key hashes all of these, the files by their content in order (not by path or
modification time), so a changed image, backbone or crop setting never reuses stale features, while the
same images copied, moved or re-mounted (new mtimes) still find theirs. Files are written under temporary
names and renamed into place (manifest last), so a killed extraction leaves no half-written cache.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from .fileio import atomic_path, write_json
from PIL import Image

from .preprocess import REDUCING_GAP, ImagePreprocess, embed_side, open_image, register_heif
from .user_cache import cache_folder


class ImageFiles(Dataset):
    """``(index, uint8 pixels (crops, 3, S, S))`` for each file; decoding runs in DataLoader workers."""

    def __init__(self, paths: Sequence[str | Path], preprocess: ImagePreprocess):
        self.paths = [str(p) for p in paths]
        self.preprocess = preprocess

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        try:
            return i, self.preprocess.pixels(open_image(self.paths[i], embed_side(self.preprocess)))
        except Exception as err:  # report which file, not a worker traceback
            raise RuntimeError(f"cannot read image {self.paths[i]}: {err}") from err


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity: a container's or ``taskset``'s share)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:          # no sched_getaffinity (macOS)
        return os.cpu_count() or 1


def loader_options(items: int, batch_size: int, workers: int | None = None,
                   device: str | torch.device = "cpu") -> dict:
    """The DataLoader settings for decoding ``items`` images for a model on ``device``.

    ``workers``: decoding processes; None chooses by the usable cores — on CUDA all but the one that drives the
    GPU, on a CPU half of them (the model's forward pass needs the others); a given number is capped at the
    cores; a single batch is decoded in this process. Prefetch: two batches per worker, at least four in flight.
    On CUDA the batches come in pinned memory, so the copy to the GPU is asynchronous (``non_blocking``)."""
    cuda = torch.device(device).type == "cuda"
    cores = usable_cores()
    if workers is None:
        workers = cores - 1 if cuda else cores // 2
    workers = max(0, min(workers, cores)) if items > batch_size else 0
    options: dict = {"num_workers": workers, "pin_memory": cuda}
    if workers:
        options["prefetch_factor"] = max(2, -(-4 // workers))
    return options


def image_loader(paths, preprocess: ImagePreprocess, batch_size: int = 64, workers: int | None = 2,
                 device: str | torch.device = "cpu") -> DataLoader:
    # its own generator: iterating a loader draws a seed, which must not come from the global RNG (a warm or
    # a cold feature cache would otherwise give the training that follows different random numbers)
    return DataLoader(ImageFiles(paths, preprocess), batch_size=batch_size, shuffle=False, persistent_workers=False,
                      generator=torch.Generator(), **loader_options(len(paths), batch_size, workers, device))


def load_pixels(paths, preprocess: ImagePreprocess, workers: int | None = 2, progress: bool = True,
                desc: str = "decoding images") -> torch.Tensor:
    """All images as one uint8 tensor ``(N, crops, 3, S, S)`` (small data sets / trainable backbones)."""
    crops, side = preprocess.crops, preprocess.image_size
    out = torch.empty(len(paths), crops, preprocess.channels, side, side, dtype=torch.uint8)
    for idx, pixels in tqdm(image_loader(paths, preprocess, workers=workers), desc=desc, disable=not progress,
                            unit="batch"):
        out[idx] = pixels
    return out


def default_cache_dir() -> Path:
    return cache_folder("features")


def _weights_digest(module: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for key, tensor in module.state_dict().items():
        h.update(key.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def file_digest(path: str | Path) -> bytes:
    """BLAKE2b digest of a file's bytes: Flickr8k's 6,000 training JPEGs take 1 to 5 s here."""
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.digest()


def shrinks(path: str | Path, min_side: int) -> bool:
    """Whether decoding the file with ``min_side`` may give a smaller image than the file's (its shorter side is at
    least ``2 · REDUCING_GAP · min_side``: the least a DCT scale or a reduction needs); True for a file whose header
    Pillow cannot read (camera RAW)."""
    register_heif()
    try:
        with Image.open(path) as im:
            return min(im.size) >= 2 * REDUCING_GAP * min_side
    except Exception:  # noqa: BLE001 - unreadable here: assume it may be shrunk
        return True


def cache_manifest(backbone_name: str, backbone: torch.nn.Module, preprocess: ImagePreprocess, paths,
                   per_view: bool = False, regions: Sequence[int] | None = None) -> dict:
    """What a feature cache is keyed by: the backbone (its name and weights), the preprocessing, the files (in
    order, by content), the decode, ``per_view``, and ``regions``: the layout of STT-ATT grid features (number,
    width, grid side: a model's ``region_layout``), None for pooled features."""
    files = hashlib.blake2b(digest_size=32)
    for p in paths:                    # rows follow the order of paths, so the order is part of the key
        files.update(file_digest(p))
    manifest = {"backbone": backbone_name, "weights": _weights_digest(backbone), "preprocess": preprocess.to_dict(),
                "files_blake2b": files.hexdigest(), "n": len(paths)}
    if embed_side(preprocess) is not None and any(shrinks(p, preprocess.min_side) for p in paths):
        manifest["decode"] = "shrunk to min_side"   # not the full-size decode of features cached before it was
    if per_view:        # one feature per crop (view augmentation), not their average
        manifest["per_view"] = True
    if regions is not None:    # STT-ATT grid features (regions.GridRegions), not pooled ones
        manifest["regions"] = list(regions)
    return manifest


@dataclass(frozen=True)
class Compute:
    """Where and how a pass over image files runs: the ``device``, ``workers`` decoding processes (DataLoader
    workers; 0: in this process, None: by the usable cores), progress bars, and bfloat16 autocast on CUDA
    (``amp``)."""
    device: str | torch.device = "cpu"
    workers: int | None = 2
    progress: bool = True
    amp: bool = False
    # given the model, what runs its frozen backbones over uint8 views (N, C, S, S) → (N, D), or None: the model's
    # own forward pass (training/inference/backend.py ``extraction_tower``); asked only when features are extracted
    tower: Callable[[Any], Callable[[torch.Tensor], torch.Tensor] | None] | None = None


DEFAULT_COMPUTE = Compute()


@torch.no_grad()
def extract_features(model, paths: Sequence[str | Path], cache_dir: str | Path | None = None,
                     batch_size: int = 64, compute: Compute = DEFAULT_COMPUTE,
                     preprocess: ImagePreprocess | None = None, per_view: bool = False) -> np.ndarray:
    """Backbone features ``(N, D)`` of ``model`` (a JointEmbedding or an EnsembleEmbedding: both have the
    ``image_split``, None for a whole backbone, the ``region_layout``, None for pooled features, and the
    ``cached_dim`` read here) for ``paths``, from the cache when valid.

    ``compute``: where and how the images are decoded and run through the backbone; ``preprocess`` replaces the
    model's own (e.g. other crops); ``per_view`` keeps each crop's feature, ``(N, crops, D)``, instead of their
    average."""
    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    pre = preprocess or model.preprocess
    manifest = cache_manifest(model.backbone_name, model.backbone, pre, paths, per_view=per_view,
                              regions=model.region_layout)
    split = model.image_split
    if split is not None:       # the activations entering the trained top units (image.train_blocks)
        manifest["bottom"] = {"cut": split.cut, "shape": list(model.bottom_shape)}
    key = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:32]
    array_path, manifest_path = cache_dir / f"{key}.npy", cache_dir / f"{key}.json"
    dim = model.cached_dim
    shape = (len(paths), pre.crops, dim) if per_view else (len(paths), dim)
    if manifest_path.exists() and array_path.exists():
        stored = json.loads(manifest_path.read_text())
        feats = np.load(array_path, mmap_mode="r")
        if stored == manifest and feats.shape == shape:
            return feats
    cache_dir.mkdir(parents=True, exist_ok=True)
    was_training = model.backbone.training
    model.backbone.eval()
    device = torch.device(compute.device)
    run = compute.tower(model) if compute.tower is not None and split is None and model.region_layout is None \
        else None
    with atomic_path(array_path) as tmp:
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=shape)
        loader = image_loader(paths, pre, batch_size=max(1, batch_size // pre.crops) if per_view else batch_size,
                              workers=compute.workers, device=device)
        desc = f"{model.backbone_name} features" + (f" ({pre.crops} views)" if per_view else "")
        for idx, pixels in tqdm(loader, desc=desc, disable=not compute.progress, unit="batch"):
            if run is not None:     # one view a row through the backend; a photo's views averaged as the model does
                views = run(pixels.flatten(0, 1)).view(pixels.shape[0], pixels.shape[1], dim)
                out[idx.numpy()] = (views if per_view else views.mean(1)).numpy()
                continue
            images = pre.normalize(pixels.to(device, non_blocking=True))
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=compute.amp and device.type == "cuda"):
                out[idx.numpy()] = model.image_features(images, pool=not per_view).float().cpu().numpy()
        out.flush()
        del out
    write_json(manifest_path, manifest)
    model.backbone.train(was_training)
    return np.load(array_path, mmap_mode="r")
