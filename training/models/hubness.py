"""Search-time hubness correction: querybank normalisation (QB-Norm, Bogolin et al., CVPR 2022) with the
inverted softmax, folded into one inner product.

In a high-dimensional space a few gallery items ("hubs") are near to many queries and crowd the top of every
result list. QB-Norm measures each item against a bank of typical queries (the training captions for an image
gallery, the training images for a caption gallery) and normalises its scores. With the inverted softmax
(QB-Norm §3, eq. 3, after Smith et al. 2017) the normalised score of query q and item j is

    IS(q, j) = exp(β s(q, j)) / Σ_{b ∈ bank} exp(β s(b, j)),

and log IS(q, j) / β = s(q, j) − o_j with o_j = (1/β) log Σ_b exp(β s(b, j)): a fixed offset per item, since
the bank does not depend on the query. Ranking by s − o_j is therefore exactly ranking by the inverted softmax,
and it stays one inner-product search: item vectors [v_j, −o_j] against query vectors [q, 1]. (QB-Norm's
*dynamic* variant, which applies the normalisation only to queries whose nearest item is a hub, needs a second
look at each query's results and is not this.)
"""
from __future__ import annotations

import math

import numpy as np
import torch

DEFAULT_BETA = 20.0          # QB-Norm §4: inverse temperature of the inverted softmax, 20 in their experiments


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


def fold_items(vectors: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Item vectors with the offset as one extra coordinate: ``[v, −o]`` ``(N, D + 1)``."""
    return np.ascontiguousarray(np.concatenate([vectors, -offsets.reshape(-1, 1)], axis=1), dtype=np.float32)


def fold_queries(vectors: np.ndarray) -> np.ndarray:
    """Query vectors with a constant 1 appended: ``[q, 1] · [v, −o] = q · v − o``."""
    return np.ascontiguousarray(np.concatenate([vectors, np.ones((len(vectors), 1), vectors.dtype)], axis=1),
                                dtype=np.float32)


# --- the dynamic inverted softmax -------------------------------------------------------------------------------
# Balance Act (Wang et al., 2023), §3: DIS applies the inverted softmax only to queries whose nearest gallery item
# is a hub of the bank, so a gallery unlike the bank (few of its items are the bank's neighbours) keeps raw scores.

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
