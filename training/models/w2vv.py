"""Word2VisualVec (W2VV, Dong, Li & Snoek, §III): predict a CNN's visual feature vector from a sentence and
retrieve in the visual feature space itself.

* text encoder ``w2vv`` — multi-scale sentence vectorisation s(q) = [s_bow(q), s_word2vec(q), h_|q|]
  (eqs. 1–4: word counts ‖ mean word vectors ‖ a GRU's last state) → an MLP with ReLU layers whose output
  r(q) has the visual feature's dimension (eqs. 5–7). The config uses ``model.projection: none`` so that
  neither side is projected: images are their backbone features, sentences their predicted features.
* loss ``mse`` — eqs. 8–9: the squared error between r(q) and φ(x) of each training pair. It reads the
  (prediction, visual feature) pairs, not a score matrix: training calls it with the un-normalised outputs
  (``on_pairs = True``); retrieval then uses the cosine similarity (§III-C).
"""
from __future__ import annotations

import torch
from torch import nn

from .losses import Loss
from .options import W2VVOptions, options_as
from .sections import TextKeys
from .text_encoders import GRUEncoder, MeanWordVectors
from .text_protocol import TextEncoderBase


class Word2VisualVec(TextEncoderBase):
    def __init__(self, vocab_size: int, cfg_text: TextKeys):
        super().__init__()
        opts = options_as(cfg_text.options, W2VVOptions)
        if not opts.out_dim:
            raise ValueError("the w2vv encoder needs text.options.out_dim = the visual feature dimension "
                             "(e.g. 1280 for efficientnet_lite0, 2048 for resnet152)")
        self.cfg_text = cfg_text
        self.vocab_size = vocab_size
        self.use_bow, self.use_wordvec, self.use_gru = bool(opts.bow), bool(opts.wordvec), bool(opts.gru)
        dims = 0
        if self.use_bow:
            dims += vocab_size                                             # eq. 1: one count per word
        if self.use_wordvec:                                               # eq. 2: fixed word vectors, mean
            self.wordvec = MeanWordVectors(vocab_size, cfg_text.word_dim, cfg_text, trainable=False)
            dims += cfg_text.word_dim
        if self.use_gru:                                                   # eq. 3: the GRU's last state
            self.gru = GRUEncoder(vocab_size, cfg_text.word_dim, cfg_text.hidden)
            self.gru.cfg_text = cfg_text
            dims += cfg_text.hidden
        if dims == 0:
            raise ValueError("w2vv needs at least one of text.options.bow / wordvec / gru")
        hidden, layers = int(opts.mlp_hidden), int(opts.layers)     # §IV-A: 2048, 3 (W2VVOptions)
        sizes = [dims] + [hidden] * (layers - 2) + [int(opts.out_dim)]
        mlp: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            mlp += [nn.Linear(a, b), nn.ReLU()]                           # eqs. 5–7: σ = ReLU on every layer
            if i < len(sizes) - 2:
                mlp.append(nn.Dropout(cfg_text.dropout))               # §III-B: dropout on hidden layers
        self.mlp = nn.Sequential(*mlp)
        self.out_dim = sizes[-1]

    def fit(self, texts, vocab, log=print) -> None:
        """§III-A: the same word vectors feed the mean (fixed) and initialise the GRU's W_e."""
        if self.use_wordvec:
            self.wordvec.fit(texts, vocab, log)
            if self.use_gru:
                with torch.no_grad():
                    self.gru.embed.weight.copy_(self.wordvec.embed.weight)
        elif self.use_gru:
            self.gru.fit(texts, vocab, log)

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        parts = []
        if self.use_bow:
            counts = torch.zeros(ids.shape[0], self.vocab_size, device=ids.device)
            counts.scatter_add_(1, ids, (ids != 0).float())              # c(w, q)
            parts.append(counts)
        if self.use_wordvec:
            parts.append(self.wordvec(ids, lengths))
        if self.use_gru:
            parts.append(self.gru(ids, lengths))
        return self.mlp(torch.cat(parts, 1))                             # eq. 4 then eqs. 5–7


def build_w2vv(cfg_text: TextKeys, vocab_size: int) -> TextEncoderBase:
    return Word2VisualVec(vocab_size, cfg_text)


class PredictionMSE(Loss):
    """W2VV eqs. 8–9: l_mse(x, q) = (r(q) − φ(x))², averaged over the batch and the feature dimensions (as
    Keras' ``mse``, which the authors' code used). The ranking arguments of the config are ignored."""

    on_pairs = True

    def __init__(self, margin: float = 0.0, lam: float = 1.0, reduction: str = "mean", k: int = 0, **options):
        super().__init__()
        if options:
            raise ValueError(f"mse takes no options {sorted(options)}")

    def forward(self, predicted: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return (predicted.float() - target.float()).pow(2).mean()
