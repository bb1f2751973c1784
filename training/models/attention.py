"""STT-ATT (STT §3.3): the region–word attention similarity of eqs. 13–17, and the fine-grained embeddings
it compares (image regions, caption words).

For an image with region embeddings ``v_1 … v_k`` and a caption with word embeddings ``e_1 … e_n``:

* ``s_ij = cos(v_i, e_j)``                                  (eq. 13)
* ``α_ij = softmax_j(λ · s_ij)``, ``a_i = Σ_j α_ij e_j``     (eqs. 14, 15) — each region attends over the words
* ``S(I, T) = 1/k · Σ_i cos(v_i, a_i)``                     (eqs. 16, 17)

With unit-norm ``v_i`` and ``e_j``, ``v_i · a_i = Σ_j α_ij s_ij`` and ``‖a_i‖² = α_iᵀ G α_i`` with ``G`` the
caption's word Gram matrix, so the attended vectors are never built: memory is ``O(N·M·k·n)``, not
``O(N·M·k·E)``. Regions are grid cells of the CNN map (see ``regions.py``); words are the text GRU's
per-step outputs through the text projection.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from .text_encoders import GRUEncoder


class RegionWordAttention(torch.nn.Module):
    """``S(I, T)`` of eqs. 13–17 between every image and every caption: ``(N, k, E) × (M, n, E) → (N, M)``."""

    def __init__(self, temperature: float = 9.0, max_elements: int = 1 << 25):
        super().__init__()
        self.temperature = float(temperature)    # λ of eq. 15 (a softmax temperature; SCAN uses 9)
        self.max_elements = max_elements         # bounds the (images, M, k, n) blocks

    def forward(self, regions: torch.Tensor, words: torch.Tensor, word_mask: torch.Tensor) -> torch.Tensor:
        v = F.normalize(regions.float(), dim=-1)
        e = F.normalize(words.float(), dim=-1) * word_mask.unsqueeze(-1)         # padding words are zero
        gram = e @ e.transpose(1, 2)                                             # (M, n, n)
        out = []
        block = max(1, self.max_elements // max(1, e.shape[0] * v.shape[1] * e.shape[1]))
        for start in range(0, v.shape[0], block):
            s = torch.einsum("ike,mne->imkn", v[start:start + block], e)          # eq. 13
            logits = (self.temperature * s).masked_fill(~word_mask[None, :, None, :], float("-inf"))
            alpha = logits.softmax(-1)                                           # eq. 15
            dot = (alpha * s).sum(-1)                                            # v_i · a_i, eq. 14
            norm2 = (alpha * torch.einsum("imkn,mnp->imkp", alpha, gram)).sum(-1)  # ‖a_i‖²
            out.append((dot / norm2.clamp(min=1e-12).sqrt()).mean(-1))           # eqs. 17, 16
        return torch.cat(out) if out else v.new_zeros(0, e.shape[0])


def word_states(encoder: torch.nn.Module, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Per-word outputs ``(B, T, H)`` of a recurrent text encoder (zero on padding)."""
    if not isinstance(encoder, GRUEncoder):
        raise ValueError(f"STT-ATT needs a recurrent text encoder (text.encoder: gru), not {type(encoder).__name__}")
    x = encoder.dropout(encoder.embed(ids))
    packed = pack_padded_sequence(x, lengths.clamp(min=1).cpu(), batch_first=True, enforce_sorted=False)
    out, _ = encoder.rnn(packed)
    out, _ = pad_packed_sequence(out, batch_first=True, total_length=ids.shape[1])
    if encoder.bidirectional:
        half = out.shape[-1] // 2
        out = (out[..., :half] + out[..., half:]) / 2
    return out


def embed_words(model, ids: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Word embeddings ``(B, T, E)`` in the common space (unit norm, zero on padding) and the mask ``(B, T)``."""
    mask = torch.arange(ids.shape[1], device=ids.device).view(1, -1) < lengths.to(ids.device).view(-1, 1)
    words = F.normalize(model.text_proj(word_states(model.text_encoder, ids, lengths)), dim=-1)
    return words * mask.unsqueeze(-1), mask
