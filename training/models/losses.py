"""Bidirectional margin ranking losses over a batch of matching (image, caption) pairs.

Input is the ``(B, B)`` similarity matrix ``S[i, j] = S(image_i, caption_j)`` whose diagonal holds the
matching pairs. Two directions are penalised:

* image-anchored (caption retrieval): ``[m − S(i, c) + S(i, c_k)]₊`` for every caption ``c_k`` in the batch;
* caption-anchored (image retrieval): ``[m − S(c, i) + S(c, i_k)]₊`` for every image ``i_k``;

and ``L = L_image_anchored + λ · L_caption_anchored`` (two-branch eq. 3). When the batch holds several
captions of one image, ``image_ids`` marks those off-diagonal pairs as positives so they are never used
as negatives. The losses differ in which negatives they keep (the mining strategy). Names map to
the classes in factory.py.

A :class:`CrossBatchMemory` (``loss.memory``) adds the embeddings of recent batches as further candidates,
so the hardest negative is mined from more than one batch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar

import torch


def positive_mask(sim: torch.Tensor, image_ids: torch.Tensor | None) -> torch.Tensor:
    """``(B, B)`` True where caption j describes image i: the diagonal, plus same-image pairs when known."""
    if image_ids is None:
        return torch.eye(sim.shape[0], dtype=torch.bool, device=sim.device)
    return image_ids.view(-1, 1) == image_ids.view(1, -1)


@dataclass
class MemoryScores:
    """The batch against the memory: ``images_vs_captions[i, m] = S(image_i, memory caption m)``,
    ``captions_vs_images[j, m] = S(memory image m, caption_j)``; ``image_ids[m]`` is memory entry m's image."""
    images_vs_captions: torch.Tensor
    captions_vs_images: torch.Tensor
    image_ids: torch.Tensor


class CrossBatchMemory:
    """XBM (Wang et al., CVPR 2020, "Cross-Batch Memory for Embedding Learning", Alg. 1): a queue of the last
    ``size`` (image, caption) embedding pairs, detached, whose entries serve as extra negatives of the next
    batches. Embeddings drift slowly once past the first epochs (XBM §3), so recent ones stand in for a larger
    batch at the cost of one ``(B, size)`` score matrix per direction, without a gradient through them."""

    def __init__(self, size: int):
        if size < 1:
            raise ValueError(f"loss.memory must be at least 1, got {size}")
        self.size = int(size)
        self.clear()

    def clear(self) -> None:
        self.images: torch.Tensor | None = None
        self.captions: torch.Tensor | None = None
        self.image_ids: torch.Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.image_ids is None else int(self.image_ids.shape[0])

    def scores(self, score: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], images: torch.Tensor,
               captions: torch.Tensor) -> MemoryScores | None:
        """The batch's embeddings scored against the memory with the model's ``score``; None while empty."""
        if self.images is None or self.captions is None or self.image_ids is None:
            return None
        return MemoryScores(score(images, self.captions.to(images.dtype)),
                            score(self.images.to(captions.dtype), captions).t(), self.image_ids)

    def add(self, images: torch.Tensor, captions: torch.Tensor, image_ids: torch.Tensor) -> None:
        """Enqueue a batch (newest last), dropping the oldest entries beyond ``size``."""
        new = (images.detach().float(), captions.detach().float(), image_ids.detach())
        if self.images is not None and self.captions is not None and self.image_ids is not None:
            new = (torch.cat([self.images, new[0]]), torch.cat([self.captions, new[1]]),
                   torch.cat([self.image_ids, new[2]]))
        self.images, self.captions, self.image_ids = (x[-self.size:] for x in new)


class Loss(torch.nn.Module):
    """A loss of the ``loss.name`` table (``factory.LOSSES``) and what the trainer asks of it. ``on_pairs``: it
    compares each caption's prediction with its own image's features, ``forward(predicted, target)`` (W2VV
    eqs. 8-9), instead of scoring a batch's similarity matrix, ``forward(sim, image_ids, memory)``;
    ``takes_memory``: that ``forward`` accepts the scores against a :class:`CrossBatchMemory` (``loss.memory``)."""
    on_pairs: ClassVar[bool] = False
    takes_memory: ClassVar[bool] = False


class RankingLoss(Loss):
    takes_memory = True      # forward accepts the scores against a CrossBatchMemory

    def __init__(self, margin: float = 0.2, lam: float = 1.0, reduction: str = "sum", k: int = 10, **options):
        super().__init__()
        if options:
            raise ValueError(f"{type(self).__name__} takes no options {sorted(options)}")
        self.margin, self.lam, self.reduction, self.k = float(margin), float(lam), reduction, int(k)

    def forward(self, sim: torch.Tensor, image_ids: torch.Tensor | None = None,
                memory: MemoryScores | None = None) -> torch.Tensor:
        sim = sim.float()
        positive = positive_mask(sim, image_ids)
        pos = sim.diag()
        # rows: image anchors against every caption; columns: caption anchors against every image
        by_image, by_caption = (sim, positive), (sim.t(), positive.t())
        if memory is not None:      # XBM: the memory's captions and images join the candidates of each anchor
            if image_ids is None:
                raise ValueError("a cross-batch memory needs the batch's image ids (its own positives are masked)")
            same = image_ids.view(-1, 1) == memory.image_ids.view(1, -1)
            by_image = (torch.cat([sim, memory.images_vs_captions.float()], 1), torch.cat([positive, same], 1))
            by_caption = (torch.cat([sim.t(), memory.captions_vs_images.float()], 1),
                          torch.cat([positive.t(), same], 1))
        return (self.reduce(by_image[0], pos.view(-1, 1), by_image[1])
                + self.lam * self.reduce(by_caption[0], pos.view(-1, 1), by_caption[1]))

    def reduce(self, scores: torch.Tensor, pos: torch.Tensor, positive: torch.Tensor) -> torch.Tensor:
        """``scores[a, j]``: anchor a against candidate j; ``pos[a]``: anchor a's positive score."""
        raise NotImplementedError

    def hinge(self, scores: torch.Tensor, pos: torch.Tensor, positive: torch.Tensor) -> torch.Tensor:
        return (self.margin - pos + scores).clamp(min=0).masked_fill(positive, 0.0)

    def over_anchors(self, per_anchor: torch.Tensor) -> torch.Tensor:
        return per_anchor.sum() if self.reduction == "sum" else per_anchor.mean()


class SumOfHinges(RankingLoss):
    """STT eq. 7: every negative in the batch contributes its hinge."""

    def reduce(self, scores, pos, positive):
        return self.over_anchors(self.hinge(scores, pos, positive).sum(1))


class MaxViolation(RankingLoss):
    """RCN eqs. 11-13 / VSE++: only the hardest negative of each anchor; the positive is never a candidate."""

    def reduce(self, scores, pos, positive):
        hardest = scores.masked_fill(positive, float("-inf")).max(1).values
        return self.over_anchors((self.margin - pos.view(-1) + hardest).clamp(min=0))


class KHardest(RankingLoss):
    """Two-branch §3.3: the K hardest negatives of each anchor."""

    def reduce(self, scores, pos, positive):
        k = min(self.k, scores.shape[1] - 1)
        if k < 1:
            return scores.new_zeros(())
        costs = self.hinge(scores, pos, positive).masked_fill(positive, -1.0)
        return self.over_anchors(costs.topk(k, dim=1).values.clamp(min=0).sum(1))


class InfoNCE(RankingLoss):
    """Ours, after CLIP (Radford et al. 2021, §2.3) and InfoNCE (van den Oord et al. 2018, eq. 4): each anchor's
    positive against every negative of the batch, a softmax over scores / τ; captions of the anchor's own image
    are neither positives nor negatives. ``margin`` does not apply."""

    def __init__(self, margin: float = 0.2, lam: float = 1.0, reduction: str = "sum", k: int = 10,
                 temperature: float = 0.05):
        super().__init__(margin, lam, reduction, k)
        if temperature <= 0:
            raise ValueError(f"infonce temperature must be positive, got {temperature}")
        self.temperature = float(temperature)

    def reduce(self, scores, pos, positive):
        negatives = scores.masked_fill(positive, float("-inf"))
        logits = torch.cat([pos, negatives], 1) / self.temperature
        return self.over_anchors(-torch.log_softmax(logits, 1)[:, 0])


class _Selected(RankingLoss):
    """Two-branch §3.3: keep only triplets in one region of Fig. 2, averaged over the kept triplets."""

    def select(self, scores, pos):
        raise NotImplementedError

    def reduce(self, scores, pos, positive):
        keep = self.select(scores, pos) & ~positive
        costs = self.hinge(scores, pos, positive)[keep]
        if self.reduction == "sum":
            return costs.sum()
        return costs.sum() / keep.sum().clamp(min=1)


class HardAndSemiHard(_Selected):
    """All hard and semi-hard negatives: every triplet with a non-zero loss."""

    def select(self, scores, pos):
        return scores > pos - self.margin


class HardOnly(_Selected):
    """Hard negatives: closer to the anchor than the positive, S(a, n) > S(a, p)."""

    def select(self, scores, pos):
        return scores > pos


class SemiHardOnly(_Selected):
    """Semi-hard negatives: S(a, p) − m < S(a, n) ≤ S(a, p), inside the margin but not closer than the positive."""

    def select(self, scores, pos):
        return (scores > pos - self.margin) & (scores <= pos)
