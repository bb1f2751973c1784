"""Recurrent Capsule Network sentence encoder (RCN, Francis, Huet & Merialdo, §III-B/D).

Each of N_c capsules holds two GRUs: a *mask* GRU whose candidate state uses a sigmoid instead of tanh
(so masks are positive) and an *embedding* GRU. At recursion t every capsule reads the sentence's word
vectors multiplied by its mask from step t−1 (all ones at t = 0):

    v_i^(t)  = GRU_emb_i(m_i^(t−1) ∘ x)                           (eq. 5)
    m̃_i^(t) = GRU_mask_i(m_i^(t−1) ∘ x)                          (eq. 6)
    m_i^(t)  = Σ_j α_ij^(t) m̃_j^(t)                               (eq. 7)
    v^(t)    = Σ_i Σ_j β_ij^(t) v_i^(t)                           (eq. 8)
    α_ij = ⟨v_i|v_j⟩ / Σ_k ⟨v_i|v_k⟩,  β_ij = ⟨v_i|v_j⟩ / Σ_k Σ_l ⟨v_k|v_l⟩   (eqs. 9–10, routing by agreement)

After ``recursions`` re-applications the sentence embedding is v^(recursions+1) (§IV-A: 4 capsules, 4
recursions → v^(5)). One capsule and no recursion is a plain GRU (the paper's GRU baseline). The mask
diversity regulariser (eq. 14) V = ( Σ_i ‖m_i − m̄‖² / (N_c ‖m̄‖²) · min_i ‖m_i‖ )⁻¹ on the last masks is
returned by ``regularizer()`` as λV, which training adds to the ranking loss (eq. 15).

Choices the paper leaves open: the mask GRU's hidden size equals the word dimension V, since its output
multiplies V-d word vectors; the normalising sums of eqs. 9–10 can be near zero (dot products may be
negative), so they are kept at least 1e-6 in magnitude with their sign.
"""
from __future__ import annotations

import warnings
from typing import cast

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

from .options import RCNOptions, options_as
from .sections import TextKeys
from .text_protocol import TextEncoderBase


EPS = 1e-6
# CapsuleGRUs hands the fused GRU weights mapped from its own parameters on every call, so on CUDA they are
# never the one flat cuDNN buffer this warning is about; compacting them is part of the mapping's cost
warnings.filterwarnings("ignore", message="RNN module weights are not part of single contiguous chunk")


class CapsuleGRUs(nn.Module):
    """N_c independent GRUs, RCN eqs. 1–4, with the candidate activation ``tanh`` (embedding GRUs) or
    ``sigmoid`` (mask GRUs), run by torch's fused GRU kernel (cuDNN on CUDA) one capsule at a time.

    The parameters are kept in the equations' layout (gates z, r, h̃; ``x @ w``) and mapped on each call:
    torch orders the gates r, z, n and writes h' = (1 − z) n + z h, so eq. 4's z is torch's 1 − z = σ(−·).
    A sigmoid candidate is a tanh one in the coordinates g = 2h − 1, since σ(a) = (1 + tanh(a/2)) / 2:
    g' = (1 − z) g + z tanh(a/2), with h = (g + 1)/2 substituted into every gate (``_kernel_weights``)."""

    def __init__(self, capsules: int, in_dim: int, hidden: int, activation: str = "tanh"):
        super().__init__()
        bound = hidden ** -0.5
        self.w_x = nn.Parameter(torch.empty(capsules, in_dim, 3 * hidden).uniform_(-bound, bound))
        self.w_h = nn.Parameter(torch.empty(capsules, hidden, 3 * hidden).uniform_(-bound, bound))
        self.b_x = nn.Parameter(torch.empty(capsules, 1, 3 * hidden).uniform_(-bound, bound))
        self.b_h = nn.Parameter(torch.empty(capsules, 1, 3 * hidden).uniform_(-bound, bound))
        self.hidden = hidden
        self.sigmoid = activation == "sigmoid"

    def _kernel_weights(self, c: int) -> list[torch.Tensor]:
        """Capsule ``c``'s eqs. 1–4 as torch GRU weights (w_ih, w_hh, b_ih, b_hh; rows r, z, n; ``W @ x``)."""
        h = self.hidden
        w_x, w_h, b_x, b_h = self.w_x[c], self.w_h[c], self.b_x[c, 0], self.b_h[c, 0]
        z, r, n = slice(0, h), slice(h, 2 * h), slice(2 * h, 3 * h)
        if self.sigmoid:            # g = 2h − 1: h @ W + b = g @ W/2 + (1 @ W/2 + b); the candidate's a/2
            col = w_h.sum(0)
            w_h = torch.cat([w_h[:, z] / 2, w_h[:, r] / 2, w_h[:, n] / 4], 1)
            b_h = torch.cat([b_h[z] + col[z] / 2, b_h[r] + col[r] / 2, b_h[n] / 2 + col[n] / 4])
            w_x = torch.cat([w_x[:, z], w_x[:, r], w_x[:, n] / 2], 1)
            b_x = torch.cat([b_x[z], b_x[r], b_x[n] / 2])
        order = lambda t, dim: torch.cat([t.narrow(dim, h, h), -t.narrow(dim, 0, h),  # noqa: E731
                                          t.narrow(dim, 2 * h, h)], dim)                 # (z, r, n) → (r, 1−z, n)
        return [order(w_x, 1).t().contiguous(), order(w_h, 1).t().contiguous(), order(b_x, 0), order(b_h, 0)]

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """``x``: (N_c, B, T, in) → the last valid hidden state of each capsule, (N_c, B, hidden)."""
        n_c, b = x.shape[:2]
        steps = lengths.clamp(min=1).cpu()
        start = -1.0 if self.sigmoid else 0.0            # h⁽⁰⁾ = 0, i.e. g⁽⁰⁾ = −1 for the mask GRUs
        last = []
        for c in range(n_c):
            packed = pack_padded_sequence(x[c], steps, batch_first=True, enforce_sorted=False)
            # aten's GRU over a packed batch (what nn.GRU calls; stateless, so safe from several threads);
            # h⁽⁰⁾ is the same for every sentence, so only the final states need unsorting
            _, h = torch.gru(packed.data, packed.batch_sizes, x.new_full((1, b, self.hidden), start),
                             self._kernel_weights(c), True, 1, 0.0, self.training, False)
            last.append(h[0, packed.unsorted_indices])
        h = torch.stack(last)
        if self.sigmoid:
            h = (h + 1) / 2
        return torch.where((lengths == 0).view(1, b, 1).to(h.device), torch.zeros_like(h), h)


def capsule_grus_stepwise(caps: CapsuleGRUs, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """RCN eqs. 1–4 written out step by step (z, r, h̃; ``x @ W``) for every capsule at once: the reference the
    fused ``CapsuleGRUs.forward`` is tested and benchmarked against (``benchmarks/rcn_speed.py``)."""
    hid = caps.hidden
    act = torch.sigmoid if caps.sigmoid else torch.tanh
    gates_x = torch.einsum("cbti,cih->cbth", x, caps.w_x) + caps.b_x.unsqueeze(2)
    h = x.new_zeros(x.shape[0], x.shape[1], hid)
    for t in range(x.shape[2]):
        gx, gh = gates_x[:, :, t], torch.baddbmm(caps.b_h, h, caps.w_h)
        z = torch.sigmoid(gx[..., :hid] + gh[..., :hid])                                  # eq. 1
        r = torch.sigmoid(gx[..., hid:2 * hid] + gh[..., hid:2 * hid])                    # eq. 2
        cand = act(gx[..., 2 * hid:] + r * gh[..., 2 * hid:])                             # eq. 3
        valid = (t < lengths).view(1, -1, 1).to(h.device)
        h = torch.where(valid, (1 - z) * h + z * cand, h)                                 # eq. 4
    return h


def _safe(denominator: torch.Tensor) -> torch.Tensor:
    sign = torch.where(denominator >= 0, 1.0, -1.0)
    return sign * denominator.abs().clamp(min=EPS)


class RecurrentCapsuleNetwork(TextEncoderBase):
    def __init__(self, vocab_size: int, cfg_text: TextKeys):
        super().__init__()
        opts = options_as(cfg_text.options, RCNOptions)    # defaults §IV-A: 4 capsules, 4 recursions, λ 0.05
        self.cfg_text = cfg_text
        self.capsules = int(opts.capsules)
        self.recursions = int(opts.recursions)                 # r recursions → v^(r+1)
        self.lam = float(opts.lambda_)                          # eq. 15
        word_dim, hidden = cfg_text.word_dim, cfg_text.hidden
        self.embed = nn.Embedding(vocab_size, word_dim, padding_idx=0)
        nn.init.uniform_(self.embed.weight, -0.1, 0.1)
        self.emb_grus = CapsuleGRUs(self.capsules, word_dim, hidden, "tanh")
        self.mask_grus = CapsuleGRUs(self.capsules, word_dim, word_dim, "sigmoid")
        self.dropout = nn.Dropout(cfg_text.dropout)
        self.out_dim = hidden
        self._last_masks: torch.Tensor | None = None

    def fit(self, texts, vocab, log=print) -> None:
        from .wordvec import init_embedding   # §IV-A: W_w initialised with word2vec

        init_embedding(self.embed.weight, vocab, self.cfg_text, texts, log=log)

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        x = self.dropout(self.embed(ids))                                       # (B, T, V)
        b = x.shape[0]
        masks = x.new_ones(self.capsules, b, x.shape[-1])                       # m^(0) = 1
        v = None
        for step in range(self.recursions + 1):
            inputs = masks.unsqueeze(2) * x.unsqueeze(0)                        # m_i ∘ x, (N_c, B, T, V)
            v_i = self.emb_grus(inputs, lengths)                                # eq. 5, (N_c, B, H)
            agreement = torch.einsum("ibh,jbh->bij", v_i, v_i)                  # ⟨v_i|v_j⟩, (B, N_c, N_c)
            beta = agreement / _safe(agreement.sum((1, 2), keepdim=True))       # eq. 10
            v = torch.einsum("bij,ibh->bh", beta, v_i)                          # eq. 8
            if step < self.recursions:
                m_tilde = self.mask_grus(inputs, lengths)                       # eq. 6, (N_c, B, V)
                alpha = agreement / _safe(agreement.sum(2, keepdim=True))       # eq. 9
                masks = torch.einsum("bij,jbv->ibv", alpha, m_tilde)            # eq. 7
        self._last_masks = masks if self.recursions > 0 and self.capsules > 1 else None
        return cast(torch.Tensor, v)        # the loop runs at least once

    def regularizer(self) -> torch.Tensor | None:
        """λV (eq. 14–15) of the last forward's final masks, averaged over the batch."""
        if self._last_masks is None or self.lam == 0:
            return None
        m = self._last_masks.float()                                            # (N_c, B, V)
        mean = m.mean(0, keepdim=True)
        diversity = (m - mean).pow(2).sum(-1).sum(0) / (self.capsules * mean.squeeze(0).pow(2).sum(-1) + EPS)
        smallest = m.norm(dim=-1).min(0).values
        return self.lam * (1.0 / (diversity * smallest + EPS)).mean()


def build_rcn(cfg_text: TextKeys, vocab_size: int) -> TextEncoderBase:
    return RecurrentCapsuleNetwork(vocab_size, cfg_text)
