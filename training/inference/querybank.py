"""The query bank a ``model.pt`` carries: typical queries of its training data, which ``jointspace index build``
uses by default to correct hubness at search time (QB-Norm, models/hubness.py; folded into the index by
index/querybank.py).

Stored under ``extra["querybank"]`` of the checkpoint (no tensor of the model changes, so its fingerprint does
not either)::

    {"captions": [str, ...],          # a seeded sample of the training captions, as text: embedded when an index
                                      # is built (index/querybank.py caches the vectors per model)
     "images": float16 (n, D),        # a seeded sample of the training images, as this model's embeddings
     "beta": 20.0,                    # the inverted softmax's inverse temperature (QB-Norm eq. 3)
     "source": "…"}                   # where they came from, in words

Text, because a caption is ~60 bytes and its vector 2 kB; the images as vectors, because the photos themselves
do not ship. ``jointspace train`` attaches a bank from the training split after training (training/querybank.py;
config section ``querybank``; ``querybank.enabled: false`` leaves it out).
"""
from __future__ import annotations

from pathlib import Path

import torch

from training.data.fileio import atomic_path
from training.models.protocol import EmbeddingModel

KEY = "querybank"


def carried(model: EmbeddingModel) -> dict | None:
    """The query bank ``model`` carries (its checkpoint's ``extra["querybank"]``), or None."""
    bank = (model.extra or {}).get(KEY)
    return bank if bank and (bank.get("captions") or _count(bank.get("images"))) else None


def _count(images) -> int:
    return 0 if images is None else int(len(images))


def describe(bank: dict) -> str:
    return (f"{len(bank.get('captions') or [])} captions and {_count(bank.get('images'))} images "
            f"({bank.get('source', 'source not recorded')})")


def attach(path: str | Path, bank: dict | None) -> None:
    """Writes ``bank`` into the checkpoint at ``path`` (``extra["querybank"]``; None removes it), atomically;
    every other entry, the fingerprint included, stays as it is."""
    from training.models.checkpoint import read_checkpoint

    payload = read_checkpoint(path)
    extra = dict(payload.get("extra") or {})
    if bank is None:
        extra.pop(KEY, None)
    else:
        extra[KEY] = bank
    payload["extra"] = extra
    with atomic_path(path) as tmp:
        torch.save(payload, tmp)
