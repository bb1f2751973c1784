"""Pooling a set of feature vectors (an image's grid cells, a sentence's token states) into one vector.

* ``mean`` — the average over the valid elements (global average pooling; sentence-transformers' pooling).
* ``gpo``  — the Generalized Pooling Operator of VSE∞ (Chen et al., CVPR 2021, §3.2, eqs. 3-5): per
  dimension, the N values are sorted in descending order and summed with weights θ_k (eq. 3) that a small
  generator computes from the position k alone — sine/cosine position encodings (eq. 5) read by a
  bidirectional GRU, then a linear score and a softmax with temperature 0.1 over the N positions (eq. 4).
  Max pooling (θ = [1, 0, …]) and mean pooling (θ = 1/N) are special cases; the weights depend on N, so the
  same module pools 49 grid cells or a 7-token sentence.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

POOLINGS = ("mean", "gpo")
TABLE_STEPS = 64            # GPO.table's least size: lengths 1..64 (a caption's word pieces, a 7×7 grid)


def valid_mask(lengths: torch.Tensor, steps: int) -> torch.Tensor:
    """``(B, T)`` True for the first ``lengths[b]`` positions of each row."""
    return torch.arange(steps, device=lengths.device).unsqueeze(0) < lengths.unsqueeze(1)


def mean_pool(features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``(B, T, D)`` averaged over the positions where ``mask`` ``(B, T)`` is True."""
    m = mask.to(features.dtype).unsqueeze(-1)
    return (features * m).sum(1) / m.sum(1).clamp(min=1.0)


def position_encoding(steps: int, dim: int, device=None) -> torch.Tensor:
    """VSE∞ eq. 5 (Transformer sinusoids): ``(steps, dim)`` for positions 0..steps-1."""
    pos = torch.arange(steps, dtype=torch.float32, device=device).unsqueeze(1)
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32, device=device) * (-math.log(10000.0) / dim))
    pe = torch.zeros(steps, dim, device=device)
    pe[:, 0::2] = torch.sin(pos * freq)
    pe[:, 1::2] = torch.cos(pos * freq)
    return pe


class GPO(nn.Module):
    """VSE∞ §3.2: f = Σ_k θ_k · max_k(features) per dimension, θ generated from positions (eqs. 3-5)."""

    def __init__(self, pe_dim: int = 32, hidden: int = 32, temperature: float = 0.1):
        super().__init__()
        self.pe_dim, self.temperature = pe_dim, temperature
        self.gru = nn.GRU(pe_dim, hidden, batch_first=True, bidirectional=True)
        self.score = nn.Linear(hidden, 1, bias=False)
        self._table: tuple[tuple, torch.Tensor] | None = None      # (weight versions, θ by length): table()

    def _generate(self, distinct: torch.Tensor, steps: int) -> torch.Tensor:
        """θ ``(len(distinct), steps)`` for the lengths ``distinct`` (on the CPU, or on the device at the cost of a
        host sync): eq. 5's encodings through the GRU, eq. 4's scores and softmax, zero beyond each length."""
        device = self.score.weight.device
        pe = position_encoding(steps, self.pe_dim, device).expand(len(distinct), steps, self.pe_dim)
        packed = pack_padded_sequence(pe, distinct.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = pad_packed_sequence(self.gru(packed)[0], batch_first=True, total_length=steps)
        half = out.shape[-1] // 2
        scores = self.score((out[..., :half] + out[..., half:]) / 2).squeeze(-1)     # the two directions averaged
        scores = scores.masked_fill(~valid_mask(distinct.to(device), steps), float("-inf"))
        return torch.softmax(scores.float() / self.temperature, dim=1)

    def table(self, steps: int) -> torch.Tensor:
        """θ of eq. 4 for every length 1..S (S ≥ ``steps``) as a ``(S, S)`` table, row n-1 for length n: computed
        once (the generator reads positions alone) and again only when the weights change (their versions),
        grown when a longer input comes. Used when nothing trains: a lookup ``table[lengths - 1]`` replaces
        the generator, with no host sync."""
        params = (self.score.weight, *self.gru.parameters())
        key = tuple((p.data_ptr(), p._version) for p in params)
        cached = self._table
        if cached is None or cached[0] != key or cached[1].shape[0] < steps or cached[1].device != params[0].device:
            size = max(steps, TABLE_STEPS, 0 if cached is None else cached[1].shape[0])
            with torch.no_grad(), torch.autocast(params[0].device.type, enabled=False):
                table = self._generate(torch.arange(1, size + 1), size)
            self._table = cached = (key, table)
        return cached[1]

    def weights(self, lengths: torch.Tensor, steps: int) -> torch.Tensor:
        """θ ``(B, T)``: eq. 4, zero beyond each row's length. θ depends on the length alone: in training the
        generator runs once per distinct length (once for a batch of 7×7 grids), and so it does in an ONNX export;
        otherwise the rows come from :meth:`table`, gathered on the device."""
        lengths = lengths.clamp(min=1)
        # an exported graph (the text tower on ONNX Runtime) must not hold a table sized by its example's length
        if self.training or torch.is_grad_enabled() or torch.onnx.is_in_onnx_export():
            distinct, row_of = lengths.unique(return_inverse=True)
            return self._generate(distinct, steps).to(lengths.device)[row_of]
        return self.table(steps).to(lengths.device)[lengths - 1, :steps]

    def forward(self, features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``features (B, T, D)``, ``mask (B, T)`` True where valid (any positions) → ``(B, D)``."""
        lengths = mask.sum(1)
        low = torch.finfo(features.dtype).min
        ranked = features.masked_fill(~mask.unsqueeze(-1), low).sort(dim=1, descending=True).values   # eq. 3
        ranked = ranked.masked_fill(~valid_mask(lengths, mask.shape[1]).unsqueeze(-1), 0.0)
        theta = self.weights(lengths, mask.shape[1]).to(features.dtype)
        return (ranked * theta.unsqueeze(-1)).sum(1)


class Pool(nn.Module):
    """``mean`` or ``gpo`` by name, with one call signature: ``(features (B, T, D), mask (B, T)) → (B, D)``."""

    def __init__(self, kind: str):
        super().__init__()
        if kind not in POOLINGS:
            raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got {kind!r}")
        self.kind = kind
        self.gpo = GPO() if kind == "gpo" else None

    def forward(self, features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return mean_pool(features, mask) if self.gpo is None else self.gpo(features, mask)
