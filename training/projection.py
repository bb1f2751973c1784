"""Projection of an encoder's output into the common space (normalisation is the similarity's job)."""
from __future__ import annotations

from torch import nn


def build_projection(cfg_model: dict, in_dim: int) -> nn.Module:
    kind, out_dim = cfg_model["projection"], cfg_model["embed_dim"]
    if kind == "linear":      # STT §3.1: a single fully connected layer
        return nn.Linear(in_dim, out_dim)
    if kind == "two_branch":  # two-branch §3.1: FC → ReLU → dropout → FC → BN (no ReLU after the last FC)
        hidden = cfg_model["projection_hidden"]
        return nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(inplace=True),
                             nn.Dropout(cfg_model["projection_dropout"]), nn.Linear(hidden, out_dim),
                             nn.BatchNorm1d(out_dim))
    raise KeyError(f"unknown model.projection '{kind}'; choose linear or two_branch")
