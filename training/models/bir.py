"""Bidirectional retrieval with CNN features and MLPs (BiR, ch. 5–6): the n-gram and SSE text models and the
pairwise ranking loss with one random negative per positive pair.

* ``ngram`` — §5.2 items 1–2, §6.1: a bag of unigrams (5,000), or of 1…n-grams (50,000 most frequent),
  optionally with skip-grams (``tk3``), binary or tf-idf valued, articles a/an/the removed, through a first
  FC layer (optionally word-vector initialised on its unigram rows) and an optional ReLU.
* ``sse`` — §5.2 item 3: word lookup → K convolution kernels over a window → average over the sentence
  → non-linearity (the linear layer after it is the text projection).
* loss ``bir_pairwise`` — §5.1: error = max(0, Δ − S_pos + S_neg), one random negative per positive, drawn
  by the I2T (other sentence, same image) or T2I (other image, same sentence) methodology of §5.3.
"""
from __future__ import annotations

import math
from collections import Counter

import torch
from torch import nn

from training.data.vocab import SPECIALS, Vocabulary, tokenize
from .encoder_state import pack_json, resize_to_checkpoint, unpack_json
from .losses import MemoryScores, RankingLoss, positive_mask
from .options import NgramOptions, SSEOptions, options_as
from .sections import TextKeys
from .text_protocol import TextEncoderBase

ARTICLES = frozenset({"a", "an", "the"})   # §6.1: filtered out before building features
N_RESERVED = 4                             # feature ids 0..3 mirror the vocabulary's specials (0 = padding)


def ngram_features(tokens: list[str], n: int, skip: bool) -> list[str]:
    """All 1…n-grams of ``tokens`` (§5.2 item 2), plus 1-skip bigrams ``"w1 _ w3"`` when ``skip`` (tk3)."""
    out = []
    for size in range(1, n + 1):
        out += [" ".join(tokens[i:i + size]) for i in range(len(tokens) - size + 1)]
    if skip:
        out += [f"{tokens[i]} _ {tokens[i + 2]}" for i in range(len(tokens) - 2)]
    return out


class NGramEncoder(TextEncoderBase):
    """§5.2: the textual MLP's first layer over binary or tf-idf n-gram features (an EmbeddingBag computes
    W·x for the sparse feature vector x without building it)."""

    tokenizes = True            # encode_text: n-gram feature ids

    def __init__(self, cfg_text: TextKeys):
        super().__init__()
        opts = options_as(cfg_text.options, NgramOptions)
        self.cfg_text = cfg_text
        self.n, self.skip, self.values = int(opts.n), bool(opts.skip), opts.values
        self.max_features = int(opts.max_features or (50000 if self.n > 1 else 5000))
        self.drop_articles, self.activation = bool(opts.drop_articles), opts.activation
        self.out_dim = cfg_text.hidden
        self.layer = nn.EmbeddingBag(N_RESERVED, self.out_dim, mode="sum", padding_idx=0)
        self.bias = nn.Parameter(torch.zeros(self.out_dim))
        self.dropout = nn.Dropout(cfg_text.dropout)
        self.register_buffer("table", pack_json([]))           # the kept n-grams, id = N_RESERVED + position
        self.register_buffer("idf", torch.zeros(N_RESERVED))    # tf-idf: log(|D| / df) per feature id
        self._index: dict[str, int] | None = None
        resize_to_checkpoint(self)
        self.register_load_state_dict_post_hook(lambda module, _: setattr(module, "_index", None))

    def features(self, text: str) -> list[str]:
        tokens = [t for t in tokenize(text) if not (self.drop_articles and t in ARTICLES)]
        return ngram_features(tokens, self.n, self.skip)

    def fit(self, texts, vocab: Vocabulary, log=print) -> None:
        """§6.1: the ``max_features`` most frequent n-grams of the training captions, their idf."""
        counts: Counter[str] = Counter()
        df: Counter[str] = Counter()
        for text in texts:
            feats = self.features(text)
            counts.update(feats)
            df.update(set(feats))
        kept = sorted(counts, key=lambda f: (-counts[f], f))[:self.max_features]
        self.table = pack_json(kept)
        self._index = None
        idf = [0.0] * N_RESERVED + [math.log(len(texts) / df[f]) for f in kept]
        self.idf = torch.tensor(idf)
        self.layer = nn.EmbeddingBag(N_RESERVED + len(kept), self.out_dim, mode="sum", padding_idx=0)
        log(f"ngram features: kept {len(kept)} of {len(counts)} (n={self.n}, skip={self.skip}, {self.values})")
        if options_as(self.cfg_text.options, NgramOptions).word_vectors:
            self._init_unigrams(kept, texts, log)

    def _init_unigrams(self, kept: list[str], texts, log) -> None:
        """§5.2 item 1: the first layer's unigram rows start as the words' vectors (needs hidden = vector dim)."""
        from .wordvec import vectors_for_vocab

        unigrams = [(i, f) for i, f in enumerate(kept) if " " not in f]
        words = Vocabulary([*SPECIALS, *[f for _, f in unigrams]])
        opts = options_as(self.cfg_text.options, NgramOptions)
        matrix, found = vectors_for_vocab(words, str(opts.word_vectors), self.out_dim, texts,
                                          epochs=int(opts.word_vector_epochs))
        with torch.no_grad():
            for row, (i, _) in enumerate(unigrams, start=len(SPECIALS)):
                if found[row]:
                    self.layer.weight[N_RESERVED + i] = matrix[row]
        log(f"ngram first layer: {int(found.sum())}/{len(unigrams)} unigram rows from word vectors")

    def index(self) -> dict[str, int]:
        if self._index is None:
            self._index = {f: N_RESERVED + i for i, f in enumerate(unpack_json(self.table) or [])}
        return self._index

    def encode_text(self, text: str, vocab: Vocabulary, max_len: int | None = None) -> list[int]:
        index = self.index()
        return [index[f] for f in self.features(text) if f in index]

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        if self.values == "binary":     # feature present or not: keep the first occurrence only
            same = ids.unsqueeze(2) == ids.unsqueeze(1)
            weights = (~torch.tril(same, diagonal=-1).any(2)).float()
        else:                           # §6.1: tf-idf = count(w, d) / |d| × log(|D| / count(w, D))
            weights = self.idf[ids] / lengths.clamp(min=1).unsqueeze(1).float()
        weights = weights * (ids != 0)
        x = self.layer(ids, per_sample_weights=weights) + self.bias
        if self.activation == "relu":
            x = torch.relu(x)
        return self.dropout(x)


def build_ngram(cfg_text: TextKeys, vocab_size: int) -> TextEncoderBase:
    return NGramEncoder(cfg_text)


class SSEEncoder(TextEncoderBase):
    """§5.2 item 3 (Bespalov et al. 2011): lookup table (M-d words) → K kernels convolved over a window of
    words (phrase embeddings) → average over the sentence → ReLU."""

    def __init__(self, vocab_size: int, cfg_text: TextKeys):
        super().__init__()
        opts = options_as(cfg_text.options, SSEOptions)
        self.cfg_text = cfg_text
        window = int(opts.window)                            # §6.5: context window of 5 (SSEOptions)
        self.embed = nn.Embedding(vocab_size, cfg_text.word_dim, padding_idx=0)
        nn.init.uniform_(self.embed.weight, -0.1, 0.1)
        self.conv = nn.Conv1d(cfg_text.word_dim, cfg_text.hidden, window, padding=window // 2)
        self.dropout = nn.Dropout(cfg_text.dropout)
        self.out_dim = cfg_text.hidden

    def fit(self, texts, vocab, log=print) -> None:
        from .wordvec import init_embedding   # §6.5: word2vec initialisation roughly doubled SSE's accuracy

        init_embedding(self.embed.weight, vocab, self.cfg_text, texts, log=log)

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        phrases = self.conv(self.dropout(self.embed(ids)).transpose(1, 2))   # (B, K, T)
        valid = (ids != 0).unsqueeze(1).float()
        mean = (phrases * valid).sum(2) / valid.sum(2).clamp(min=1.0)
        return torch.relu(mean)


def build_sse(cfg_text: TextKeys, vocab_size: int) -> TextEncoderBase:
    return SSEEncoder(vocab_size, cfg_text)


class BiRPairwise(RankingLoss):
    """§5.1: error_i = max(0, Δ − S_i,pos + S_i,neg) with one random negative pair per positive pair, the
    negative drawn from the batch by the §5.3 methodology: ``i2t`` replaces the sentence (same image),
    ``t2i`` replaces the image (same sentence), ``both`` sums the two."""

    takes_memory = False     # one random negative from the batch (§5.3), by definition

    def __init__(self, margin: float = 0.15, lam: float = 1.0, reduction: str = "sum", k: int = 10,
                 methodology: str = "i2t"):
        super().__init__(margin, lam, reduction, k)
        if methodology not in ("i2t", "t2i", "both"):
            raise ValueError(f"bir_pairwise methodology must be i2t, t2i or both, got {methodology!r}")
        self.methodology = methodology

    def forward(self, sim: torch.Tensor, image_ids: torch.Tensor | None = None,
                memory: MemoryScores | None = None) -> torch.Tensor:
        if memory is not None:
            raise ValueError("bir_pairwise draws its negative from the batch (§5.3): no cross-batch memory")
        sim = sim.float()
        positive = positive_mask(sim, image_ids)
        total = sim.new_zeros(())
        if self.methodology in ("i2t", "both"):    # img_1 = img_2, txt_1 ≠ txt_2: row i, a random column
            total = total + self.reduce(sim, sim.diag().view(-1, 1), positive)
        if self.methodology in ("t2i", "both"):    # txt_1 = txt_2, img_1 ≠ img_2: column i, a random row
            total = total + self.lam * self.reduce(sim.t(), sim.diag().view(-1, 1), positive.t())
        return total

    def reduce(self, scores, pos, positive):
        candidates = (~positive).float()
        has_negative = candidates.sum(1) > 0
        if not has_negative.any():
            return scores.new_zeros(())
        rows = has_negative.nonzero().view(-1)
        pick = torch.multinomial(candidates[rows], 1).view(-1)      # one uniformly random negative
        errors = (self.margin - pos.view(-1)[rows] + scores[rows, pick]).clamp(min=0)
        return self.over_anchors(errors)
