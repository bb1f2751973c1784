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

import torch
from torch import nn

from .text_encoders import TEXT_ENCODERS

EPS = 1e-6


class CapsuleGRUs(nn.Module):
    """N_c independent GRUs run together (batched matmuls over the capsule axis), RCN eqs. 1–4, with the
    candidate activation ``tanh`` (embedding GRUs) or ``sigmoid`` (mask GRUs)."""

    def __init__(self, capsules: int, in_dim: int, hidden: int, activation: str = "tanh"):
        super().__init__()
        bound = hidden ** -0.5
        self.w_x = nn.Parameter(torch.empty(capsules, in_dim, 3 * hidden).uniform_(-bound, bound))
        self.w_h = nn.Parameter(torch.empty(capsules, hidden, 3 * hidden).uniform_(-bound, bound))
        self.b_x = nn.Parameter(torch.empty(capsules, 1, 3 * hidden).uniform_(-bound, bound))
        self.b_h = nn.Parameter(torch.empty(capsules, 1, 3 * hidden).uniform_(-bound, bound))
        self.hidden = hidden
        self.candidate = torch.sigmoid if activation == "sigmoid" else torch.tanh

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """``x``: (N_c, B, T, in) → the last valid hidden state of each capsule, (N_c, B, hidden)."""
        n_c, b, t_max, _ = x.shape
        gates_x = torch.einsum("cbti,cih->cbth", x, self.w_x) + self.b_x.unsqueeze(2)   # all steps at once
        h = x.new_zeros(n_c, b, self.hidden)
        for t in range(t_max):
            gx = gates_x[:, :, t]
            gh = torch.baddbmm(self.b_h, h, self.w_h)
            z = torch.sigmoid(gx[..., :self.hidden] + gh[..., :self.hidden])                            # eq. 1
            r = torch.sigmoid(gx[..., self.hidden:2 * self.hidden] + gh[..., self.hidden:2 * self.hidden])  # eq. 2
            cand = self.candidate(gx[..., 2 * self.hidden:] + r * gh[..., 2 * self.hidden:])            # eq. 3
            new = (1 - z) * h + z * cand                                                                # eq. 4
            valid = (t < lengths).view(1, b, 1)
            h = torch.where(valid, new, h)
        return h


def _safe(denominator: torch.Tensor) -> torch.Tensor:
    sign = torch.where(denominator >= 0, 1.0, -1.0)
    return sign * denominator.abs().clamp(min=EPS)


class RecurrentCapsuleNetwork(nn.Module):
    def __init__(self, vocab_size: int, cfg_text: dict):
        super().__init__()
        opts = cfg_text.get("options", {})
        self.cfg_text = cfg_text
        self.capsules = int(opts.get("capsules", 4))              # §IV-A: four capsules
        self.recursions = int(opts.get("recursions", 4))          # §IV-A: four recursions → v^(5)
        self.lam = float(opts.get("lambda", 0.05))                # §IV-A: λ = 0.05 (RCN-0.05)
        word_dim, hidden = cfg_text["word_dim"], cfg_text["hidden"]
        self.embed = nn.Embedding(vocab_size, word_dim, padding_idx=0)
        nn.init.uniform_(self.embed.weight, -0.1, 0.1)
        self.emb_grus = CapsuleGRUs(self.capsules, word_dim, hidden, "tanh")
        self.mask_grus = CapsuleGRUs(self.capsules, word_dim, word_dim, "sigmoid")
        self.dropout = nn.Dropout(cfg_text["dropout"])
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
        return v

    def regularizer(self) -> torch.Tensor | None:
        """λV (eq. 14–15) of the last forward's final masks, averaged over the batch."""
        if self._last_masks is None or self.lam == 0:
            return None
        m = self._last_masks.float()                                            # (N_c, B, V)
        mean = m.mean(0, keepdim=True)
        diversity = (m - mean).pow(2).sum(-1).sum(0) / (self.capsules * mean.squeeze(0).pow(2).sum(-1) + EPS)
        smallest = m.norm(dim=-1).min(0).values
        return self.lam * (1.0 / (diversity * smallest + EPS)).mean()


@TEXT_ENCODERS.register("rcn")
def _rcn(cfg_text: dict, vocab_size: int) -> nn.Module:
    return RecurrentCapsuleNetwork(vocab_size, cfg_text)
