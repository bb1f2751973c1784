"""Retrieval evaluation (STT §4.3): R@K, median and mean rank in both directions, R-sum; W2VV's mean inverted
rank (``mir``) and BiR's R@K variants and rPrecision(5) (``rk_variants``, ``rprecision5``, §6.2).

* image → text: an image query is a hit at K when *any* of its captions is in the top K; its rank is the
  rank of its best-ranked caption.
* text → image: a caption query's ground truth is its one image.

Ranks are 1-based and exact, computed with vectorised torch on the full similarity matrix (in row blocks);
a candidate scoring exactly equal to the ground truth does not push it down (ties are resolved in favour of
the ground truth). With 5000 test images the COCO protocols are added: 5 folds of 1000 images averaged
(``coco_1k``) and the full set (``coco_5k``).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import torch

from training.models.protocol import EmbeddingModel, has_attention, has_decoder

from .ranking import KS, mean_inverted_rank, ranks_from_scores, retrieval_metrics, summarize

if TYPE_CHECKING:
    from training.data.datasets import CaptionDataset
    from training.models.model import JointEmbedding

__all__ = ["KS", "mean_inverted_rank", "ranks_from_scores", "retrieval_metrics", "summarize"]

BIR_KS = (1, 2, 5, 10)      # BiR tables 6.3-6.10 report k = 1, 2, 5, 10


def caption_positions(cap_to_img: torch.Tensor) -> torch.Tensor:
    """For each caption, its position among its image's captions (0 = the image's first caption)."""
    seen: dict[int, int] = {}
    out = []
    for img in cap_to_img.tolist():
        out.append(seen.get(img, 0))
        seen[img] = out[-1] + 1
    return torch.tensor(out, dtype=torch.long)


def bir_metrics(image_emb: torch.Tensor, caption_emb: torch.Tensor, cap_to_img: torch.Tensor, similarity,
                seed: int = 0) -> dict:
    """BiR §6.2: the R@K variants and rPrecision(5).

    ``1st_txt``, ``rnd_txt`` and ``avg_txt`` rank a gallery holding one sentence per image: its first
    sentence, one drawn at random (``seed``), or each position in turn with the recalls averaged over the
    positions. ``any_txt`` (image annotation only) ranks all sentences and counts a hit when any of the
    image's sentences is in the top K, i.e. the usual i2t recall. rPrecision(5): the percentage of the
    image's own sentences among the top 5 of all sentences (image annotation; §6.2).
    """
    cap_to_img = cap_to_img.long().cpu()
    pos = caption_positions(cap_to_img)
    n_images = image_emb.shape[0]
    g = torch.Generator().manual_seed(seed)

    def one_per_image(choice: torch.Tensor) -> dict:
        """``choice[img]``: the caption index kept for image img (-1: none). R@K of that 1-to-1 gallery."""
        imgs = (choice >= 0).nonzero().view(-1)
        caps = choice[imgs]
        sub_cap_to_img = torch.arange(len(imgs))
        i2t, t2i = ranks_from_scores(lambda rows: similarity(image_emb[imgs[rows]], caption_emb[caps]),
                                     len(imgs), sub_cap_to_img)
        return {d: {f"r{k}": 100.0 * (r <= k).double().mean().item() for k in BIR_KS}
                for d, r in (("i2t", i2t), ("t2i", t2i))}

    def choice_at(position: int) -> torch.Tensor:
        choice = torch.full((n_images,), -1, dtype=torch.long)
        sel = (pos == position).nonzero().view(-1)
        choice[cap_to_img[sel]] = sel
        return choice

    first = one_per_image(choice_at(0))
    random_pick = torch.full((n_images,), -1, dtype=torch.long)
    for img in range(n_images):
        own = (cap_to_img == img).nonzero().view(-1)
        if len(own):
            random_pick[img] = own[torch.randint(len(own), (1,), generator=g)].item()
    rnd = one_per_image(random_pick)
    per_position = [one_per_image(choice_at(p)) for p in range(int(pos.max()) + 1)] if len(pos) else []
    avg = {d: {f"r{k}": float(np.mean([p[d][f"r{k}"] for p in per_position])) for k in BIR_KS}
           for d in ("i2t", "t2i")} if per_position else {}

    # any_txt and rPrecision(5) on the full gallery of sentences
    hits = torch.zeros(n_images)
    any_best = torch.empty(n_images, dtype=torch.long)
    for start in range(0, n_images, 1024):
        rows = slice(start, min(start + 1024, n_images))
        s = similarity(image_emb[rows], caption_emb).float().cpu()
        own = cap_to_img.view(1, -1) == torch.arange(rows.start, rows.stop).view(-1, 1)
        top = s.topk(min(5, s.shape[1]), dim=1).indices
        hits[rows] = own.gather(1, top).float().sum(1)
        best_own = s.masked_fill(~own, float("-inf")).max(1).values
        any_best[rows] = (s > best_own.view(-1, 1)).sum(1) + 1
    r = lambda x: round(x, 4)  # noqa: E731
    variants = {"i2t": {"1st_txt": first["i2t"], "rnd_txt": rnd["i2t"], "avg_txt": avg.get("i2t", {}),
                        "any_txt": {f"r{k}": 100.0 * (any_best <= k).double().mean().item() for k in BIR_KS}},
                "t2i": {"1st_txt": first["t2i"], "rnd_txt": rnd["t2i"], "avg_txt": avg.get("t2i", {})}}
    variants = {d: {v: {k: r(x) for k, x in m.items()} for v, m in vs.items()} for d, vs in variants.items()}
    return {"rk_variants": variants, "rprecision5": r(100.0 * (hits / 5).mean().item()) if n_images else 0.0}


def full_evaluation(image_emb: torch.Tensor, caption_emb: torch.Tensor, cap_to_img: torch.Tensor,
                    similarity) -> dict:
    """Metrics on the whole split, plus the COCO 1K-fold and 5K protocols when it has 5000 images."""
    res = retrieval_metrics(image_emb, caption_emb, cap_to_img, similarity)
    n = image_emb.shape[0]
    if n == 5000:
        folds = []
        for f in range(5):
            lo, hi = f * 1000, (f + 1) * 1000
            sel = (cap_to_img >= lo) & (cap_to_img < hi)
            fold = retrieval_metrics(image_emb[lo:hi], caption_emb[sel], cap_to_img[sel] - lo, similarity)
            folds.append(fold)
        avg: dict[str, dict[str, float] | float] = {
            d: {m: round(float(np.mean([f[d][m] for f in folds])), 4) for m in folds[0][d]} for d in ("i2t", "t2i")}
        avg["rsum"] = round(float(np.mean([f["rsum"] for f in folds])), 4)
        res["coco_1k"] = avg
        res["coco_5k"] = {k: res[k] for k in ("i2t", "t2i", "rsum")}
    return res


def querybank_metrics(image_emb: torch.Tensor, caption_emb: torch.Tensor, cap_to_img: torch.Tensor,
                      bank_images: torch.Tensor, bank_captions: torch.Tensor, beta: float) -> dict:
    """Retrieval metrics with querybank normalisation (training/inference/querybank.py): text→image ranks by
    s − o_image (offsets from a bank of captions), image→text by s − o_caption (offsets from a bank of images).
    Cosine models."""
    from training.inference.querybank import item_offsets

    cap_to_img = cap_to_img.long().cpu()
    image_emb, caption_emb = image_emb.float(), caption_emb.float()
    off_img = item_offsets(bank_captions, image_emb, beta)
    off_cap = item_offsets(bank_images, caption_emb, beta)
    i2t, _ = ranks_from_scores(lambda rows: image_emb[rows] @ caption_emb.t() - off_cap.view(1, -1),
                               image_emb.shape[0], cap_to_img)
    _, t2i = ranks_from_scores(lambda rows: image_emb[rows] @ caption_emb.t() - off_img[rows].view(-1, 1),
                               image_emb.shape[0], cap_to_img)
    res: dict[str, Any] = {"i2t": summarize(i2t), "t2i": summarize(t2i), "beta": beta,
                           "bank": {"images": int(bank_images.shape[0]), "captions": int(bank_captions.shape[0])}}
    res["rsum"] = round(sum(res[d][f"r{k}"] for d in ("i2t", "t2i") for k in KS), 4)
    return res


def recall_curve(ranks: torch.Tensor, max_k: int) -> list[float]:
    r = ranks.numpy()
    return [float(100.0 * (r <= k).mean()) for k in range(1, max_k + 1)]


def minimal_pair_accuracy(image_emb: torch.Tensor, caption_emb: torch.Tensor, cap_to_img: torch.Tensor,
                          pairs: Sequence[tuple[int, int]], similarity) -> dict:
    """For each minimal pair (a, b) and each caption c of a: is S(a, c) > S(b, c)? (and symmetrically for b).
    A tie counts one half, so an order-blind model that cannot tell the pair apart scores 0.5."""
    if not pairs:
        return {"accuracy": None, "n": 0}
    correct, total = 0.0, 0
    for a, b in pairs:
        for own, other in ((a, b), (b, a)):
            caps = (cap_to_img == own).nonzero().view(-1)
            if len(caps) == 0:
                continue
            s = similarity(image_emb[[own, other]], caption_emb[caps])      # (2, n)
            correct += float((s[0] > s[1]).sum() + 0.5 * (s[0] == s[1]).sum())
            total += len(caps)
    return {"accuracy": round(correct / max(total, 1), 4), "n": total}


def plot_recall(result: dict, path: str | Path, max_k: int = 50, title: str = "") -> None:
    """Recall@K curves for both directions → PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from training.data.fileio import atomic_path

    ranks = result["_ranks"]
    ks = np.arange(1, max_k + 1)
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    for direction, label in (("i2t", "image → text"), ("t2i", "text → image")):
        ax.plot(ks, recall_curve(ranks[direction], max_k), label=f"{label} (R@1 {result[direction]['r1']:.1f})")
    ax.set_xlabel("K")
    ax.set_ylabel("Recall@K (%)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(title or f"{result['n_images']} images, {result['n_captions']} captions, R-sum {result['rsum']:.1f}")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)


def public(result: dict) -> dict:
    """The JSON-serialisable part of a result (drops rank tensors)."""
    return {k: v for k, v in result.items() if not k.startswith("_")}


def minimal_pairs_of(dataset) -> list[tuple[int, int]]:
    """Minimal pairs recorded by the synthetic generator (``extra["minimal_pair"]`` holds the partner's
    ``imgid``), as pairs of this dataset's image ids, each pair once."""
    by_imgid = {r.extra["imgid"]: r.image_id for r in dataset.images if "imgid" in r.extra}
    pairs = set()
    for r in dataset.images:
        partner = r.extra.get("minimal_pair")
        if partner is not None and partner in by_imgid and "imgid" in r.extra:
            a, b = r.image_id, by_imgid[partner]
            pairs.add((min(a, b), max(a, b)))
    return sorted(pairs)


@dataclass(frozen=True)
class EvalOptions:
    """What :func:`evaluate_model` scores beside retrieval. A model with a decoder also gets ``captioning`` and
    ``paraphrasing`` scores (STT §4.5): ``generation`` turns them off, ``meteor`` the METEOR column, ``decode``
    overrides the model's decoding settings (e.g. ``{"beam_size": 5}``). ``querybank`` (a CaptionDataset, e.g.
    the train split) adds the metrics under querybank normalisation with inverse temperature ``qb_beta``."""
    generation: bool = True
    meteor: bool = True
    decode: dict | None = None
    querybank: CaptionDataset | None = None
    qb_beta: float = 20.0


DEFAULT_EVAL = EvalOptions()


def evaluate_model(model: EmbeddingModel, dataset, device="cpu", cache_dir=None, workers: int = 2,
                   progress: bool = True, amp: bool = False, options: EvalOptions = DEFAULT_EVAL) -> dict:
    """Embeds a split with ``model`` and returns every metric (rank tensors under ``_ranks``).

    A model with a decoder also gets ``captioning`` and ``paraphrasing`` scores (the scored sentences under
    ``_generations``), a query bank the metrics under ``qbnorm``, as ``options`` say (:class:`EvalOptions`); an
    STT-ATT model is ranked with its attention similarity (eqs. 13-17), the pooled vectors' metrics under
    ``pooled``."""
    from training.data.features import Compute
    from training.data.sources import image_source
    from training.inference.embedding import embed_split

    source = image_source(model, [r.path for r in dataset.images], cache_dir=cache_dir,
                          compute=Compute(device=device, workers=workers, progress=progress, amp=amp))
    img, cap, cap_to_img = embed_split(model, dataset, device=device, workers=workers, amp=amp, source=source)
    result = full_evaluation(img, cap, cap_to_img, model.similarity)
    result.update(bir_metrics(img, cap, cap_to_img, model.similarity))
    if has_attention(model):
        # STT-ATT: every metric again with the attention similarity (eqs. 13-17); the pooled vectors' under
        # "pooled". Each caption's word mask rides along as one more channel of its word embeddings, so the
        # metrics that take caption subsets (BiR's variants, COCO folds) keep words and masks together.
        from training.inference.embedding import fine_embed_split
        from training.models.model import JointEmbedding

        assert isinstance(model, JointEmbedding)     # an ensemble's attention is always None
        attention = model.attention
        assert attention is not None                 # has_attention
        pooled = {k: result[k] for k in ("i2t", "t2i", "rsum")}
        regions, words, mask, cap_to_img = fine_embed_split(model, dataset, source, device=device)
        packed = torch.cat([words, mask.unsqueeze(-1).to(words.dtype)], dim=-1)

        def attend(imgs: torch.Tensor, caps: torch.Tensor) -> torch.Tensor:
            return attention(imgs, caps[..., :-1], caps[..., -1] > 0.5)

        result = {**full_evaluation(regions, packed, cap_to_img, attend),
                  **bir_metrics(regions, packed, cap_to_img, attend), "pooled": pooled}
    if options.generation and has_decoder(model):
        from .caption_eval import generation_metrics

        result.update(generation_metrics(model, dataset, img, cap, cap_to_img, meteor=options.meteor,
                                         progress=progress, **(options.decode or {})))
    # QB-Norm (training/inference/querybank.py): the bank split's images and captions as query banks
    if options.querybank is not None:
        if model.cfg.model.similarity != "cosine":
            raise ValueError("querybank normalisation applies to cosine-similarity models")
        bank_img, bank_cap, _ = embed_split(model, options.querybank, device=device, workers=workers,
                                            progress=progress, amp=amp)
        result["qbnorm"] = querybank_metrics(img, cap, cap_to_img, bank_img, bank_cap, options.qb_beta)
    pairs = minimal_pairs_of(dataset)
    if pairs:
        result["minimal_pairs"] = minimal_pair_accuracy(img, cap, cap_to_img, pairs, model.similarity)
    return result


def format_table(result: dict) -> str:
    lines = [f"{'':14}{'R@1':>8}{'R@5':>8}{'R@10':>8}{'medr':>7}{'meanr':>9}"]
    for d, label in (("i2t", "image→text"), ("t2i", "text→image")):
        m = result[d]
        lines.append(f"{label:14}{m['r1']:8.1f}{m['r5']:8.1f}{m['r10']:8.1f}{m['medr']:7.0f}{m['meanr']:9.1f}")
    lines.append(f"R-sum {result['rsum']:.1f}   ({result['n_images']} images, {result['n_captions']} captions)")
    if "mir" in result:
        lines.append(f"MIR image→text {result['mir']['i2t']:.4f}   text→image {result['mir']['t2i']:.4f}")
    if "rprecision5" in result:
        avg = result["rk_variants"]["i2t"]["avg_txt"]
        lines.append(f"BiR: rPrecision(5) {result['rprecision5']:.2f}   image→text R@1/5/10 avg_txt "
                     f"{avg.get('r1', 0):.1f}/{avg.get('r5', 0):.1f}/{avg.get('r10', 0):.1f}")
    if result.get("minimal_pairs", {}).get("n"):
        mp = result["minimal_pairs"]
        lines.append(f"minimal pairs: {100 * mp['accuracy']:.1f}% correct of {mp['n']} captions (chance 50%)")
    if "qbnorm" in result:
        q = result["qbnorm"]
        lines.append(f"querybank-normalised (beta {q['beta']:g}): image→text R@1/5/10 "
                     f"{q['i2t']['r1']:.1f}/{q['i2t']['r5']:.1f}/{q['i2t']['r10']:.1f}, text→image "
                     f"{q['t2i']['r1']:.1f}/{q['t2i']['r5']:.1f}/{q['t2i']['r10']:.1f}, R-sum {q['rsum']:.1f}")
    if "pooled" in result:
        lines.append(f"(attention similarity; pooled vectors: R-sum {result['pooled']['rsum']:.1f})")
    if "captioning" in result:
        from .caption_eval import format_generation

        lines.append(format_generation(result))
    return "\n".join(lines)


def attention_retrieval(model: JointEmbedding, dataset, source, device="cpu") -> dict:
    """Retrieval metrics of a split scored with the attention similarity (eqs. 13–17)."""
    from training.inference.embedding import fine_embed_split

    attention = model.attention
    assert attention is not None, "attention_retrieval needs an STT-ATT model (attention.enabled)"

    regions, words, mask, cap_to_img = fine_embed_split(model, dataset, source, device=device)
    return retrieval_metrics(regions, words, cap_to_img, lambda imgs, caps: attention(imgs, caps, mask))
