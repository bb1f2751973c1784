"""Hubness correction in one place: querybank normalisation (QB-Norm, Bogolin et al., CVPR 2022) with the
inverted softmax, folded into one inner product, and its dynamic variant; the query bank a ``model.pt`` carries;
and making one from a data split. Its callers are thin: ``jointspace train`` and ``jointspace querybank`` attach a
bank (training/train.py, training/cli.py), evaluation scores with it (training/evaluate.py), and the index folds it
into its vectors and stores it beside its generations (index/qbnorm.py).

**The correction.** In a high-dimensional space a few gallery items ("hubs") are near to many queries and crowd the
top of every result list. QB-Norm measures each item against a bank of typical queries (the training captions for
an image gallery, the training images for a caption gallery) and normalises its scores. With the inverted softmax
(QB-Norm §3, eq. 3, after Smith et al. 2017) the normalised score of query q and item j is

    IS(q, j) = exp(β s(q, j)) / Σ_{b ∈ bank} exp(β s(b, j)),

and log IS(q, j) / β = s(q, j) − o_j with o_j = (1/β) log Σ_b exp(β s(b, j)): a fixed offset per item, since
the bank does not depend on the query. Ranking by s − o_j is therefore exactly ranking by the inverted softmax,
and it stays one inner-product search: item vectors [v_j, −o_j] against query vectors [q, 1]. The dynamic
variant below (normalise only the queries whose nearest item is a hub of the bank) needs a second look at each
query's results; it ranked as the fixed offsets do on Flickr8k dev, ImageNet and the demo gallery
(docs/index.md), so the index folds the fixed offsets.

**The bank a model carries**: typical queries of its training data, which ``jointspace index build`` uses by
default to correct hubness at search time (folded into the index by index/qbnorm.py).

Stored under ``extra["querybank"]`` of the checkpoint (no tensor of the model changes, so its fingerprint does
not either)::

    {"captions": [str, ...],          # a seeded sample of the training captions, as text: embedded when an index
                                      # is built (index/qbnorm.py caches the vectors per model)
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
(training/train.py; config section ``querybank``; ``querybank.enabled: false`` leaves it out);
``jointspace querybank`` attaches one to a trained model.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from training.data.features import Compute
from training.data.fileio import atomic_path
from training.data.sources import ImageSource, image_source
from training.inference.embedding import embed_image_source, embed_texts
from training.models.protocol import EmbeddingModel
from .folding import DEFAULT_BETA

# --- the correction (folded into one inner product by folding.py) ---------------------------------------------------


@torch.no_grad()
def item_offsets(bank: torch.Tensor, items: torch.Tensor, beta: float = DEFAULT_BETA,
                 block: int = 4096) -> torch.Tensor:
    """o_j = (1/β) log Σ_b exp(β bank_b · item_j) − (1/β) log |bank|  ``(N,)``, in blocks of the bank.

    The constant −log|bank|/β (the same for every item) keeps offsets near the scores' scale; it changes no
    ranking."""
    if bank.shape[0] == 0:
        raise ValueError("querybank normalisation needs a non-empty query bank")
    if not beta > 0:
        raise ValueError(f"the inverted softmax's beta must be > 0, got {beta}")
    items = items.float()
    total = torch.full((items.shape[0],), float("-inf"))
    for start in range(0, bank.shape[0], block):
        s = beta * (bank[start:start + block].float() @ items.t())            # (b, N)
        total = torch.logaddexp(total, torch.logsumexp(s, dim=0))
    return (total - math.log(bank.shape[0])) / beta


# --- the dynamic inverted softmax -------------------------------------------------------------------------------
# Balance Act (Wang et al., 2023), §3: DIS applies the inverted softmax only to queries whose nearest gallery item
# is a hub of the bank in this gallery (the nearest item of some bank query); every other query keeps raw scores.

@torch.no_grad()
def activation_set(bank: torch.Tensor, items: torch.Tensor, k: int = 1, block: int = 4096) -> torch.Tensor:
    """Balance Act's activation set: which gallery items are among the ``k`` nearest items of some bank query
    (a bool mask ``(N,)``), in blocks of the bank."""
    if bank.shape[0] == 0:
        raise ValueError("the dynamic inverted softmax needs a non-empty query bank")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    items = items.float()
    hubs = torch.zeros(items.shape[0], dtype=torch.bool)
    for start in range(0, bank.shape[0], block):
        top = (bank[start:start + block].float() @ items.t()).topk(min(k, items.shape[0]), dim=1).indices
        hubs[top.flatten()] = True
    return hubs


def dynamic_scores(raw: torch.Tensor, offsets: torch.Tensor, hubs: torch.Tensor) -> torch.Tensor:
    """Balance Act's DIS, §3: a query's scores ``(Q, N)`` are normalised (``s − o``, eq. 3 above) when its raw
    nearest item is in the activation set ``hubs``, and stay raw otherwise."""
    use = hubs[raw.argmax(1)]
    return torch.where(use[:, None], raw - offsets[None], raw)


# --- the bank a model carries -----------------------------------------------------------------------------------------

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
    if rows is None or bank.get("vectors_of") != model.fingerprint:
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


# --- making a bank from a split ---------------------------------------------------------------------------------------

def sample_indices(total: int, n: int, seed: int) -> list[int]:
    """``n`` of ``range(total)`` (all when fewer), drawn with ``seed``, in order."""
    return sorted(random.Random(seed).sample(range(total), min(n, total)))


def sample(dataset, captions: int, images: int, seed: int = 0) -> tuple[list[str], list]:
    """A seeded sample of a split: ``captions`` of its captions (all when fewer; drawn with ``seed``) and
    ``images`` of its image records (all when fewer; drawn with ``seed + 1``), each in the split's order."""
    texts = [c for r in dataset.images for c in r.captions]
    return ([texts[i] for i in sample_indices(len(texts), captions, seed)],
            [dataset.images[i] for i in sample_indices(len(dataset.images), images, seed + 1)])


@dataclass(frozen=True)
class BankDraw:
    """What :func:`make_bank` draws from a split: ``captions`` sampled captions, ``images`` sampled images (with
    ``seed``), and the bank's ``beta``."""
    captions: int
    images: int
    beta: float
    seed: int = 0


BANK_COMPUTE = Compute(progress=False)      # make_bank's: two decoding workers on the CPU, no progress bars


def make_bank(model, dataset, draw: BankDraw, compute: Compute = BANK_COMPUTE, source: str = "",
              features=None) -> dict:
    """A bank from ``dataset`` (a split): ``draw.captions`` sampled captions as text (and, for a model loaded from
    its file, as that model's vectors: training/inference/querybank.py), ``draw.images`` sampled images embedded
    with ``model`` (a frozen backbone's features come from the feature cache, or from ``features``: the
    backbone features of every image of the split, in its order), decoded where and how ``compute`` says."""
    captions, images, beta, seed = draw.captions, draw.images, draw.beta, draw.seed
    workers, progress = compute.workers, compute.progress
    if model.cfg.model.similarity != "cosine":
        raise ValueError("a query bank corrects cosine scores; this model uses "
                         f"{model.cfg.model.similarity} similarity")
    texts, records = sample(dataset, captions, images, seed)
    head = model.concepts
    if head is not None and head.cfg.bank_template:    # a sentence per concept class (training/fit_concepts.py)
        from training.models.concepts import class_names, class_sentences, naming_sources

        first = naming_sources(head.cfg.class_names)[0]                 # one sentence a class: its first naming
        texts = texts + class_sentences(class_names(first)[:head.n_classes], head.cfg.bank_template)
    vectors = torch.zeros(0, model.cfg.model.embed_dim)
    if records and features is not None:
        drawn = sample_indices(len(dataset.images), images, seed + 1)       # the rows ``sample`` drew
        src = ImageSource("features", torch.from_numpy(np.array(features, dtype=np.float32)[drawn]))
        vectors = embed_image_source(model, src, workers=workers).cpu()
    elif records:
        src = image_source(model, [r.path for r in records], compute=compute)
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
    if not bank.get("captions") or not model.fingerprint:
        return bank
    rows, scales = quantize_images(embed_texts(model, list(bank["captions"]), progress=progress).float().cpu())
    return {**bank, "caption_vectors": rows, "caption_scales": scales, "vectors_of": model.fingerprint}
