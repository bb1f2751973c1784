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
do not ship. ``jointspace train`` attaches a bank from the training split after training (config section
``querybank``; ``querybank.enabled: false`` leaves it out).
"""
from __future__ import annotations

import random
from pathlib import Path

import torch

from training.data.fileio import atomic_path

KEY = "querybank"


def carried(model) -> dict | None:
    """The query bank ``model`` carries (its checkpoint's ``extra["querybank"]``), or None."""
    bank = (getattr(model, "extra", None) or {}).get(KEY)
    return bank if bank and (bank.get("captions") or _count(bank.get("images"))) else None


def _count(images) -> int:
    return 0 if images is None else int(len(images))


def describe(bank: dict) -> str:
    return (f"{len(bank.get('captions') or [])} captions and {_count(bank.get('images'))} images "
            f"({bank.get('source', 'source not recorded')})")


def sample_indices(total: int, n: int, seed: int) -> list[int]:
    """``n`` of ``range(total)`` (all when fewer), drawn with ``seed``, in order."""
    return sorted(random.Random(seed).sample(range(total), min(n, total)))


def sample(dataset, captions: int, images: int, seed: int = 0) -> tuple[list[str], list]:
    """A seeded sample of a split: ``captions`` of its captions (all when fewer; drawn with ``seed``) and
    ``images`` of its image records (all when fewer; drawn with ``seed + 1``), each in the split's order."""
    texts = [c for r in dataset.images for c in r.captions]
    return ([texts[i] for i in sample_indices(len(texts), captions, seed)],
            [dataset.images[i] for i in sample_indices(len(dataset.images), images, seed + 1)])


def make_bank(model, dataset, captions: int, images: int, beta: float, seed: int = 0, device="cpu",
              workers: int = 2, progress: bool = False, source: str = "") -> dict:
    """A bank from ``dataset`` (a split): ``captions`` sampled captions as text, ``images`` sampled images
    embedded with ``model`` (a frozen backbone's features come from the feature cache)."""
    from training.embed import embed_image_source, image_source

    if model.cfg["model"]["similarity"] != "cosine":
        raise ValueError("a query bank corrects cosine scores; this model uses "
                         f"{model.cfg['model']['similarity']} similarity")
    texts, records = sample(dataset, captions, images, seed)
    vectors = torch.zeros(0, model.cfg["model"]["embed_dim"], dtype=torch.float16)
    if records:
        src = image_source(model, [r.path for r in records], device=device, workers=workers, progress=progress)
        vectors = embed_image_source(model, src, workers=workers).cpu().half()
    n_caps = sum(len(r.captions) for r in dataset.images)
    return {"captions": texts, "images": vectors, "beta": float(beta),
            "source": source or f"{dataset.name}: {len(texts)} of {n_caps} captions, {len(records)} of "
                                f"{len(dataset.images)} images (seed {seed})"}


def attach(path: str | Path, bank: dict | None) -> None:
    """Writes ``bank`` into the checkpoint at ``path`` (``extra["querybank"]``; None removes it), atomically;
    every other entry, the fingerprint included, stays as it is."""
    from training.models.model import load_checkpoint

    payload = load_checkpoint(path)
    extra = dict(payload.get("extra") or {})
    if bank is None:
        extra.pop(KEY, None)
    else:
        extra[KEY] = bank
    payload["extra"] = extra
    with atomic_path(path) as tmp:
        torch.save(payload, tmp)


def attach_from_training(cfg: dict, model_file: Path, train_set, device="cpu", progress: bool = False,
                         log=print) -> dict | None:
    """After ``jointspace train``: the ``querybank`` section's bank from the training split, attached to
    ``model_file`` (the kept checkpoint). None (and nothing written) when the section turns it off, the model
    is not a cosine one, or there is no checkpoint."""
    from training.models.model import load_model

    section = cfg.get(KEY) or {}
    if not section.get("enabled", True) or not model_file.is_file():
        return None
    if cfg["model"]["similarity"] != "cosine":
        log(f"querybank: none attached ({cfg['model']['similarity']} similarity; QB-Norm corrects cosine scores)")
        return None
    if not section.get("captions", 0) and not section.get("images", 0):
        return None
    model = load_model(model_file, device)
    bank = make_bank(model, train_set, section["captions"], section["images"], section["beta"],
                     seed=cfg["train"]["seed"], device=device, workers=cfg["train"]["workers"], progress=progress)
    attach(model_file, bank)
    log(f"querybank: {describe(bank)} attached to {model_file}")
    return bank
