"""What the image backbones already know, in the common space: their ImageNet classifiers as a concept vector
(ConSE, Norouzi et al., ICLR 2014), added to a photo's embedding by a gate that opens as the photo leaves the
world of the training photos.

ConSE eq. 1: the concept vector of image x is the probability-weighted mean of the sentence embeddings of its T
most probable ImageNet classes,

    c(x) = 1/Z · Σ_{t=1..T} p(y_t | x) · s(y_t),    Z = Σ_{t=1..T} p(y_t | x),

where p is the mean of the backbones' own softmax classifiers (the heads the weight packages ship; their logits
divided by a temperature T, which spreads c over more classes when T > 1) and s(y) is the
model's own text embedding of sentences naming class y ("a photo of a tabby cat."), fitted once after training
(training/fit_concepts.py). The gate (ours) weighs it by how unlike the training photos x is:

    r(x) = mean cosine of x's backbone features to its m nearest of K k-means prototypes of the training photos,
    g(x) = w · σ((r₀ − r(x)) / τ),

r₀ a low quantile of r over held-out training photos and τ a fraction of r's spread there. A Flickr8k-like photo
(r ≫ r₀) keeps the embedding the ranking loss trained; a photo of a rocket or a cup of coffee gets the words its
backbone has for it. The image embedding is normalise(normalise(W f + b) + g(x) · c(x)); queries are unchanged.
An unfitted head is the identity.
"""
from __future__ import annotations

from typing import Sequence, cast

import torch
import torch.nn.functional as F
from torch import nn

from .config_schema import ConceptsSection


def class_names() -> list[str]:
    """ImageNet-1k's classes in the classifiers' order, each by its first name ("tabby", "space shuttle")."""
    from timm.data import ImageNetInfo

    info = ImageNetInfo()
    return [info.index_to_description(i).split(",")[0].strip() for i in range(1000)]


def class_sentences(names: Sequence[str], template: str) -> list[str]:
    return [template.format(name) for name in names]


class ConceptHead(nn.Module):
    """The backbones' classifiers (frozen, as their packages ship them) and the fitted concept embeddings, prototypes
    and gate. ``part_dims``: the width of each backbone's pooled features in the concatenated feature vector, in the
    order of ``classifiers``."""

    class_embeddings: torch.Tensor   # s(y) (C, E), unit rows
    prototypes: torch.Tensor         # (K, ΣD), unit rows
    gate: torch.Tensor               # r₀, τ
    fitted: torch.Tensor             # bool

    def __init__(self, cfg: ConceptsSection, classifiers: list[nn.Linear], part_dims: list[int], embed_dim: int):
        super().__init__()
        if not classifiers or len(classifiers) != len(part_dims):
            raise ValueError("concepts.enabled needs every image backbone's ImageNet classifier "
                             "(efficientnet_lite0/1/2 backbones)")
        classes = {head.out_features for head in classifiers}
        if len(classes) != 1:
            raise ValueError(f"the backbones' classifiers disagree on the number of classes: {sorted(classes)}")
        self.cfg = cfg
        self.part_dims = list(part_dims)
        self.classifiers = nn.ModuleList(classifiers).requires_grad_(False)
        n_classes, feature_dim = classes.pop(), sum(part_dims)
        self.register_buffer("class_embeddings", torch.zeros(n_classes, embed_dim))
        self.register_buffer("prototypes", torch.zeros(cfg.prototypes, feature_dim))
        self.register_buffer("gate", torch.tensor([0.0, 1.0]))
        self.register_buffer("fitted", torch.tensor(False))

    @property
    def n_classes(self) -> int:
        return self.class_embeddings.shape[0]

    def probabilities(self, features: torch.Tensor) -> torch.Tensor:
        """Pooled backbone features ``(B, ΣD)`` → class probabilities ``(B, C)``: the mean of the backbones'
        softmax classifiers at ``class_temperature``."""
        parts = features.float().split(self.part_dims, dim=-1)
        t = self.cfg.class_temperature
        return torch.stack([F.softmax(F.linear(part, head.weight.float(), head.bias.float()) / t, dim=-1)
                            for head, part in zip(self.heads, parts)]).mean(0)

    @property
    def heads(self) -> list[nn.Linear]:
        return [cast(nn.Linear, head) for head in self.classifiers]

    def concept_vectors(self, features: torch.Tensor) -> torch.Tensor:
        """ConSE eq. 1: c(x) ``(B, E)``."""
        top = self.probabilities(features).topk(min(self.cfg.top_k, self.n_classes), dim=-1)
        weights = top.values / top.values.sum(-1, keepdim=True)
        return (weights.unsqueeze(-1) * self.class_embeddings.float()[top.indices]).sum(1)

    def typicality(self, features: torch.Tensor) -> torch.Tensor:
        """r(x) ``(B,)``: the mean cosine to the nearest prototypes of the training photos."""
        sims = F.normalize(features.float(), dim=-1) @ self.prototypes.float().t()
        return sims.topk(min(self.cfg.neighbours, sims.shape[-1]), dim=-1).values.mean(-1)

    def gate_weights(self, features: torch.Tensor) -> torch.Tensor:
        """g(x) = w · σ((r₀ − r(x)) / τ) ``(B,)``."""
        r0, tau = self.gate.float()
        return self.cfg.weight * torch.sigmoid((r0 - self.typicality(features)) / tau)

    def forward(self, features: torch.Tensor, projected: torch.Tensor) -> torch.Tensor:
        """Pooled backbone features ``(B, ΣD)`` and their projection ``(B, E)`` → normalise(W f + b) + g(x) · c(x),
        not yet normalised (the similarity does that); the unit projection alone while the head is unfitted."""
        unit = F.normalize(projected, dim=-1)
        if not bool(self.fitted):
            return unit
        fused = unit.float() + self.gate_weights(features).unsqueeze(-1) * self.concept_vectors(features)
        return fused.to(projected.dtype)
