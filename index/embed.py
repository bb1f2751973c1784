"""Embed a photo collection and a caption corpus with a model's encoders, in batches, with progress.

Images are decoded and preprocessed (exactly as in training: ``model.preprocess``) by DataLoader workers; an
unreadable or corrupt file is skipped and reported, never fatal. On CUDA the forward passes run under bf16
autocast.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from training.embed import autocast
from training.preprocess import open_image

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".gif", ".bmp", ".webp", ".tif", ".tiff"}


def find_images(root: str | Path) -> list[Path]:
    """Every image file (by suffix) under ``root``, recursively, in sorted order."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"no image directory at {root}")
    return sorted(p for p in root.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())


@dataclass
class ImageEmbeddings:
    vectors: np.ndarray                    # (m, D) float32, one row per readable image
    kept: list[int]                        # positions (in the input list) of those m images
    skipped: list[tuple[str, str]] = field(default_factory=list)   # (path, reason) of unreadable files


class _Decoded(Dataset):
    def __init__(self, paths: Sequence[str | Path], preprocess):
        self.paths, self.preprocess = [str(p) for p in paths], preprocess

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        try:
            return i, self.preprocess.pixels(open_image(self.paths[i])), None
        except Exception as err:  # noqa: BLE001 - any decoding failure means "skip this file"
            return i, None, f"{type(err).__name__}: {err}"


def _collate(items):
    ok = [(i, px) for i, px, _ in items if px is not None]
    bad = [(i, reason) for i, px, reason in items if px is None]
    pixels = torch.stack([px for _, px in ok]) if ok else None
    return [i for i, _ in ok], pixels, bad


@torch.no_grad()
def embed_image_files(model, paths: Sequence[str | Path], batch_size: int = 64, device: str | torch.device = "cpu",
                      workers: int = 2, progress: bool = True) -> ImageEmbeddings:
    """Embeds every readable image of ``paths`` into the common space."""
    device = torch.device(device)
    model.eval()
    workers = min(workers, os.cpu_count() or 1) if len(paths) > batch_size else 0
    loader = DataLoader(_Decoded(paths, model.preprocess), batch_size=batch_size, num_workers=workers,
                        collate_fn=_collate)
    vectors, kept, skipped = [], [], []
    for idx, pixels, bad in tqdm(loader, desc="embedding images", unit="batch", disable=not progress):
        skipped += [(str(paths[i]), reason) for i, reason in bad]
        if pixels is None:
            continue
        with autocast(device, device.type == "cuda"):
            emb = model.embed_images(model.preprocess.normalize(pixels.to(device)))
        vectors.append(emb.float().cpu().numpy())
        kept += idx
    dim = model.cfg["model"]["embed_dim"]
    out = np.concatenate(vectors) if vectors else np.zeros((0, dim), np.float32)
    return ImageEmbeddings(np.ascontiguousarray(out, dtype=np.float32), kept, skipped)


@torch.no_grad()
def embed_texts(model, texts: Sequence[str], batch_size: int = 256, device: str | torch.device = "cpu",
                progress: bool = True) -> np.ndarray:
    """Sentences → ``(len(texts), D)`` float32 embeddings."""
    device = torch.device(device)
    model.eval()
    out = []
    for start in tqdm(range(0, len(texts), batch_size), desc="embedding captions", unit="batch",
                      disable=not progress or len(texts) <= batch_size):
        with autocast(device, device.type == "cuda"):
            out.append(model.embed_sentences(list(texts[start:start + batch_size]), batch_size=batch_size)
                       .float().cpu().numpy())
    dim = model.cfg["model"]["embed_dim"]
    return np.ascontiguousarray(np.concatenate(out) if out else np.zeros((0, dim), np.float32))
