"""Exact retrieval ranks and R@K from embeddings (STT §4.3) under any similarity (a cosine, or STT-ATT's
region–word attention): the core of evaluation (evaluate.py).

* image → text: an image query is a hit at K when *any* of its captions is in the top K; its rank is the
  rank of its best-ranked caption.
* text → image: a caption query's ground truth is its one image.

Ranks are 1-based and exact; a candidate scoring exactly equal to the ground truth does not push it down.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

KS = (1, 5, 10)


def ranks_from_scores(score_fn: Callable[[slice], torch.Tensor], n_images: int, cap_to_img: torch.Tensor,
                      block: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """``score_fn(rows)`` returns ``S[rows, :]`` (images × all captions). Returns 1-based ranks
    ``(i2t (n_images,), t2i (n_captions,))``."""
    n_caps = cap_to_img.shape[0]
    i2t = torch.empty(n_images, dtype=torch.long)
    gt_score = torch.empty(n_caps)
    row_blocks = [slice(s, min(s + block, n_images)) for s in range(0, n_images, block)]
    for rows in row_blocks:                     # pass 1: image queries, and each caption's true score
        s = score_fn(rows).float().cpu()
        own = cap_to_img.view(1, -1) == torch.arange(rows.start, rows.stop).view(-1, 1)   # (b, n_caps)
        best_own = s.masked_fill(~own, float("-inf")).max(1).values
        i2t[rows] = (s > best_own.view(-1, 1)).sum(1) + 1
        cols = ((cap_to_img >= rows.start) & (cap_to_img < rows.stop)).nonzero().view(-1)
        gt_score[cols] = s[cap_to_img[cols] - rows.start, cols]
    t2i = torch.ones(n_caps, dtype=torch.long)
    for rows in row_blocks:                     # pass 2: caption queries (blocks recomputed, memory bounded)
        t2i += (score_fn(rows).float().cpu() > gt_score.view(1, -1)).sum(0)
    return i2t, t2i


def summarize(ranks: torch.Tensor) -> dict:
    r = ranks.double()
    out = {f"r{k}": round(100.0 * (r <= k).double().mean().item(), 4) for k in KS}
    out["medr"] = float(np.floor(np.median(r.numpy() - 1)) + 1)
    out["meanr"] = round(r.mean().item(), 4)
    return out


def retrieval_metrics(image_emb: torch.Tensor, caption_emb: torch.Tensor, cap_to_img: torch.Tensor,
                      similarity) -> dict:
    """Metrics of one gallery; ``similarity(images, captions)`` → score matrix."""
    cap_to_img = cap_to_img.long().cpu()
    i2t, t2i = ranks_from_scores(lambda rows: similarity(image_emb[rows], caption_emb), image_emb.shape[0],
                                 cap_to_img)
    res: dict[str, Any] = {"i2t": summarize(i2t), "t2i": summarize(t2i)}
    res["rsum"] = round(sum(res[d][f"r{k}"] for d in ("i2t", "t2i") for k in KS), 4)
    res["mir"] = {"i2t": mean_inverted_rank(i2t), "t2i": mean_inverted_rank(t2i)}
    res["n_images"], res["n_captions"] = int(image_emb.shape[0]), int(caption_emb.shape[0])
    res["_ranks"] = {"i2t": i2t, "t2i": t2i}
    return res


def mean_inverted_rank(ranks: torch.Tensor) -> float:
    """W2VV §IV-D (TrecVid): the mean over queries of 1 / rank of the (first) relevant item; 1 is perfect."""
    return round((1.0 / ranks.double()).mean().item(), 6) if len(ranks) else 0.0
