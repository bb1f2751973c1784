"""The one registry: every name a config can use, mapped explicitly to what builds it.

``text.encoder`` → a text encoder builder ``(cfg_text, vocab_size) → nn.Module``; ``loss.name`` → a loss
class; ``image.backbone`` → an image backbone builder (backbones.py); ``model.similarity`` → a similarity
(similarity.py). The modules that define these know nothing of this table (nothing registers itself on
import), so the model library has no import cycle; a new encoder or loss is one line here.
"""
from __future__ import annotations

from torch import nn

from . import bir, losses, minilm, rcn, text_encoders, w2vv
from .backbones import BACKBONES, build_backbone
from .registry import Registry
from .similarity import SIMILARITIES, build_similarity

TEXT_ENCODERS: Registry = Registry("text encoder", {
    "gru": text_encoders.build_gru,                      # STT §3.1
    "bow": text_encoders.build_bow,                      # BiR §5.2 unigram bag of words
    "mean_wordvec": text_encoders.build_mean_wordvec,    # two-branch §3.1, W2VV eq. 2
    "ngram": bir.build_ngram,                            # BiR §5.2: n-gram / tf-idf features
    "sse": bir.build_sse,                                # BiR §5.2: sentence encoder of word vectors
    "rcn": rcn.build_rcn,                                # RCN §III: recurrent capsule network
    "w2vv": w2vv.build_w2vv,                             # W2VV §III: text → visual feature space
    "minilm": minilm.build_minilm,                       # all-MiniLM-L6-v2 (beyond the papers)
})

LOSSES: Registry = Registry("loss", {
    "sum": losses.SumOfHinges,                           # STT eq. 7
    "max_violation": losses.MaxViolation,                # RCN eqs. 11-13, VSE++
    "khardest": losses.KHardest,                         # two-branch §3.3
    "hard_semihard": losses.HardAndSemiHard,
    "hard": losses.HardOnly,
    "semihard": losses.SemiHardOnly,
    "bir_pairwise": bir.BiRPairwise,                     # BiR §5.1
    "mse": w2vv.PredictionMSE,                           # W2VV eqs. 8-9
})

__all__ = ["BACKBONES", "LOSSES", "SIMILARITIES", "TEXT_ENCODERS", "build_backbone", "build_loss",
           "build_similarity", "build_text_encoder"]


def build_text_encoder(cfg_text: dict, vocab_size: int) -> nn.Module:
    """``cfg_text`` is the config's ``text`` section."""
    return TEXT_ENCODERS.get(cfg_text["encoder"])(cfg_text, vocab_size)


def build_loss(cfg: dict) -> nn.Module:
    """``cfg`` is the config's ``loss`` section."""
    return LOSSES.get(cfg["name"])(margin=cfg["margin"], lam=cfg["lambda"], reduction=cfg["reduction"],
                                   k=cfg["k"], **cfg.get("options", {}))
