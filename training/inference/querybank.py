"""The query bank a ``model.pt`` carries: typical queries of its training data, which ``jointspace index build``
uses by default to correct hubness at search time (QB-Norm, models/hubness.py; folded into the index by
index/querybank.py).

Stored under ``extra["querybank"]`` of the checkpoint (no tensor of the model changes, so its fingerprint does
not either)::

    {"captions": [str, ...],          # a seeded sample of the training captions, as text: embedded when an index
                                      # is built (index/querybank.py caches the vectors per model)
     "caption_vectors": int8 (m, D),  # those captions embedded by this model, quantised as the images are,
     "caption_scales": float32 (m,),  # so that a first index build need not embed them (caption_vectors)
     "vectors_of": "…",               # the fingerprint of the model that embedded them
     "images": int8 (n, D),           # a seeded sample of the training images, as this model's embeddings,
     "image_scales": float32 (n,),    # each row quantised by its largest magnitude / 127 (image_vectors)
     "beta": 20.0,                    # the inverted softmax's inverse temperature (QB-Norm eq. 3)
     "source": "…"}                   # where they came from, in words

The captions as text, so that a bank stays readable and can be embedded again; their vectors beside them, quantised
to one byte a dimension (10,000 captions of a 1,024-d model: 10 MB), because embedding them is most of a first
``index build``'s time on a small gallery. The images as vectors only, because the photos themselves do not ship
(6,000 images: 6 MB). Quantised rows rank as float16 ones do: on Flickr8k dev the corrected rankings are equal
(docs/results.md). Caption vectors are used only by the model whose fingerprint they carry; a file without them
(older files, or a bank attached to another model) has its captions embedded and cached when an index is built.
Files written before the quantisation hold float16 ``images`` and no ``image_scales``; both read the same way
(:func:`image_vectors`). ``jointspace train`` attaches a bank from the training split after training
(training/querybank.py; config section ``querybank``; ``querybank.enabled: false`` leaves it out);
``jointspace querybank`` attaches one to a trained model.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
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


def quantize_images(vectors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Image vectors ``(n, D)`` → int8 rows and float32 scales ``(n,)``: each row divided by its largest
    magnitude / 127 and rounded (``image_vectors`` multiplies back; error at most half a step per component)."""
    vectors = vectors.detach().float().cpu()
    scales = (vectors.abs().amax(dim=1) / 127.0).clamp_min(1e-12)
    return (vectors / scales[:, None]).round().clamp(-127, 127).to(torch.int8), scales


def image_vectors(bank: dict) -> np.ndarray | None:
    """The bank's image vectors as float32 ``(n, D)`` (dequantised; float16 as older files store them), or None."""
    images = bank.get("images")
    if images is None or len(images) == 0:
        return None
    rows = torch.as_tensor(images).float()
    scales = bank.get("image_scales")
    if scales is not None:
        rows = rows * torch.as_tensor(scales).float()[:, None]
    return rows.numpy()


def caption_vectors(bank: dict, model: EmbeddingModel) -> np.ndarray | None:
    """The bank's caption vectors as float32 ``(m, D)``, when it carries them for this very model (its
    fingerprint), one per caption; else None (the captions are then embedded)."""
    rows = bank.get("caption_vectors")
    if rows is None or bank.get("vectors_of") != getattr(model, "fingerprint", None):
        return None
    if len(rows) != len(bank.get("captions") or []) or rows.shape[1] != model.cfg.model.embed_dim:
        return None
    return (torch.as_tensor(rows).float() * torch.as_tensor(bank["caption_scales"]).float()[:, None]).numpy()


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
