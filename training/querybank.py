"""The query bank ``jointspace train`` attaches to the checkpoint it keeps (config section ``querybank``): a seeded
sample of the training split's captions, as text, and of its images, embedded with the trained model. The format
the checkpoint carries it in: training/inference/querybank.py."""
from __future__ import annotations

import random
from pathlib import Path

import torch

import numpy as np

from training.data.sources import ImageSource, image_source
from training.inference.embed import embed_image_source, embed_texts
from training.inference.querybank import attach, describe, quantize_images
from training.models.config_schema import RunConfig


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
              workers: int = 2, progress: bool = False, source: str = "", features=None) -> dict:
    """A bank from ``dataset`` (a split): ``captions`` sampled captions as text (and, for a model loaded from its
    file, as that model's vectors: training/inference/querybank.py), ``images`` sampled images embedded with
    ``model`` (a frozen backbone's features come from the feature cache, or from ``features``: the
    backbone features of every image of the split, in its order)."""
    if model.cfg.model.similarity != "cosine":
        raise ValueError("a query bank corrects cosine scores; this model uses "
                         f"{model.cfg.model.similarity} similarity")
    texts, records = sample(dataset, captions, images, seed)
    head = getattr(model, "concepts", None)
    if head is not None and head.cfg.bank_template:    # a sentence per concept class (training/concepts.py)
        from training.models.concepts import class_names, class_sentences

        texts = texts + class_sentences(class_names()[:head.n_classes], head.cfg.bank_template)
    vectors = torch.zeros(0, model.cfg.model.embed_dim)
    if records and features is not None:
        drawn = sample_indices(len(dataset.images), images, seed + 1)       # the rows ``sample`` drew
        src = ImageSource("features", torch.from_numpy(np.array(features, dtype=np.float32)[drawn]))
        vectors = embed_image_source(model, src, workers=workers).cpu()
    elif records:
        src = image_source(model, [r.path for r in records], device=device, workers=workers, progress=progress)
        vectors = embed_image_source(model, src, workers=workers).cpu()
    rows, scales = quantize_images(vectors)
    n_caps = sum(len(r.captions) for r in dataset.images)
    classes = len(texts) - min(captions, n_caps)
    bank = {"captions": texts, "images": rows, "image_scales": scales, "beta": float(beta),
            "source": source or f"{dataset.name}: {len(texts) - classes} of {n_caps} captions"
                                + (f" and {classes} class sentences" if classes else "")
                                + f", {len(records)} of {len(dataset.images)} images (seed {seed})"}
    return with_caption_vectors(bank, model, progress)


def with_caption_vectors(bank: dict, model, progress: bool = False) -> dict:
    """``bank`` with its captions' vectors as ``model`` embeds them (int8 rows, training/inference/querybank.py),
    for a model loaded from its file (its fingerprint names them); unchanged for a model without one or a bank
    without captions."""
    if not bank.get("captions") or not getattr(model, "fingerprint", None):
        return bank
    rows, scales = quantize_images(embed_texts(model, list(bank["captions"]), progress=progress).float().cpu())
    return {**bank, "caption_vectors": rows, "caption_scales": scales, "vectors_of": model.fingerprint}


def attach_from_training(cfg: RunConfig, model_file: Path, train_set, device="cpu", progress: bool = False,
                         log=print) -> dict | None:
    """After ``jointspace train``: the ``querybank`` section's bank from the training split, attached to
    ``model_file`` (the kept checkpoint). None (and nothing written) when the section turns it off, the model
    is not a cosine one, or there is no checkpoint."""
    from training.models.checkpoint import load_model

    section = cfg.querybank
    if not section.enabled or not model_file.is_file():
        return None
    if cfg.model.similarity != "cosine":
        log(f"querybank: none attached ({cfg.model.similarity} similarity; QB-Norm corrects cosine scores)")
        return None
    if not section.captions and not section.images:
        return None
    model = load_model(model_file, device)
    bank = make_bank(model, train_set, section.captions, section.images, section.beta,
                     seed=cfg.train.seed, device=device, workers=cfg.train.workers, progress=progress)
    attach(model_file, bank)
    log(f"querybank: {describe(bank)} attached to {model_file}")
    return bank
