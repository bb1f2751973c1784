"""Bidirectional margin ranking losses over a batch of matching (image, caption) pairs.

Input is the ``(B, B)`` similarity matrix ``S[i, j] = S(image_i, caption_j)`` whose diagonal holds the
matching pairs. Two directions are penalised:

* image-anchored (caption retrieval): ``[m − S(i, c) + S(i, c_k)]₊`` for every caption ``c_k`` in the batch;
* caption-anchored (image retrieval): ``[m − S(c, i) + S(c, i_k)]₊`` for every image ``i_k``;

and ``L = L_image_anchored + λ · L_caption_anchored`` (two-branch eq. 3). When the batch holds several
captions of one image, ``image_ids`` marks those off-diagonal pairs as positives so they are never used
as negatives. The losses differ in which negatives they keep (the mining strategy). Names map to
the classes in factory.py.
"""
from __future__ import annotations

import torch


def positive_mask(sim: torch.Tensor, image_ids: torch.Tensor | None) -> torch.Tensor:
    """``(B, B)`` True where caption j describes image i: the diagonal, plus same-image pairs when known."""
    if image_ids is None:
        return torch.eye(sim.shape[0], dtype=torch.bool, device=sim.device)
    return image_ids.view(-1, 1) == image_ids.view(1, -1)


class RankingLoss(torch.nn.Module):
    def __init__(self, margin: float = 0.2, lam: float = 1.0, reduction: str = "sum", k: int = 10, **options):
        super().__init__()
        if options:
            raise ValueError(f"{type(self).__name__} takes no options {sorted(options)}")
        self.margin, self.lam, self.reduction, self.k = float(margin), float(lam), reduction, int(k)

    def forward(self, sim: torch.Tensor, image_ids: torch.Tensor | None = None) -> torch.Tensor:
        sim = sim.float()
        positive = positive_mask(sim, image_ids)
        pos = sim.diag()
        # rows: image anchors against every caption; columns: caption anchors against every image
        by_image = self.reduce(sim, pos.view(-1, 1), positive)
        by_caption = self.reduce(sim.t(), pos.view(-1, 1), positive.t())
        return by_image + self.lam * by_caption

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
