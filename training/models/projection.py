"""Projection of an encoder's output into the common space (normalisation is the similarity's job)."""
from __future__ import annotations

import torch
from torch import nn

from .config_schema import ModelSection


class Float32BatchNorm1d(nn.BatchNorm1d):
    """BatchNorm1d that normalises in float32 under autocast (mixed-precision practice for normalisation
    layers: batch statistics of bf16 activations lose precision); same parameters and state_dict keys."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.is_autocast_enabled(x.device.type):
            return super().forward(x)
        with torch.autocast(x.device.type, enabled=False):
            return super().forward(x.float())


def build_projection(cfg_model: ModelSection, in_dim: int, kind: str | None = None) -> nn.Module:
    """``kind`` defaults to ``model.projection`` (the text side may override it with ``model.text_projection``)."""
    kind, out_dim = kind or cfg_model.projection, cfg_model.embed_dim
    if kind == "linear":      # STT §3.1: a single fully connected layer
        return nn.Linear(in_dim, out_dim)
    if kind == "two_branch":  # two-branch §3.1: FC → ReLU → dropout → FC → BN (no ReLU after the last FC)
        hidden = cfg_model.projection_hidden
        return nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(inplace=True),
                             nn.Dropout(cfg_model.projection_dropout), nn.Linear(hidden, out_dim),
                             Float32BatchNorm1d(out_dim))
    if kind == "mlp":         # BiR §5.2: the trainable visual model, FC (1000) → ReLU → FC (n_emb)
        hidden = cfg_model.projection_hidden
        return nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(inplace=True),
                             nn.Dropout(cfg_model.projection_dropout), nn.Linear(hidden, out_dim))
    if kind == "none":        # W2VV §III: no projection, the encoder's output is the space itself
        if in_dim != out_dim:
            raise ValueError(f"model.projection 'none' keeps the {in_dim}-d input, but model.embed_dim is "
                             f"{out_dim}: set model.embed_dim (and the text encoder's output) to {in_dim}")
        return nn.Identity()
    raise KeyError(f"unknown model.projection '{kind}'; choose linear, two_branch, mlp or none")
