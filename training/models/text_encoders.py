"""Sentence encoders by name. Each maps padded word ids ``(B, T)`` and lengths ``(B,)`` to ``(B, out_dim)``.

* ``gru`` — word embeddings → 1-layer GRU → last hidden state (STT §3.1 and §4.2: 300-d words, 1024 hidden);
  ``text.options.pooling: mean|max`` pools the states of every step instead (InferSent-style).
* ``bow`` — bag of words → MLP: word order is invisible to it, which the minimal-pair test exploits.
* ``mean_wordvec`` — the mean of the words' vectors (two-branch §3.1, W2VV eq. 2).
* ``ngram`` / ``sse`` (bir.py), ``rcn`` (rcn.py), ``w2vv`` (w2vv.py), ``minilm`` (minilm.py).

Names map to builders and options in factory.py; a name's pretrained weights, where it has some, are facts of its
registry entry there (:class:`registry.Pretrained`: the package, the parameters it fills, how a slim ``model.pt``
reloads them).

Every encoder is a :class:`text_protocol.TextEncoderBase`, which satisfies :class:`text_protocol.TextEncoder`
(factory.py has mypy check each): besides ``forward`` and
``out_dim`` an encoder has the hooks below; the base class's defaults do nothing (or read ``vocab``), and an
encoder overrides those it needs. Training calls them by name, never by looking them up:

* ``fit(texts, vocab, log)`` — learn data-dependent state from the training captions before training
  (an n-gram table, idf weights, word vectors, pretrained weights). Only training calls it; whatever it
  learns must live in the state dict, so ``load_model`` rebuilds the encoder from ``model.pt`` alone
  (see encoder_state.py).
* ``encode_text(text, vocab, max_len) -> list[int]`` — the ids the encoder reads: ``vocab``'s word ids by
  default; an encoder that tokenises raw text itself (n-gram feature ids, WordPiece ids) overrides it and sets
  ``tokenizes``. ``JointEmbedding.encode_text_ids`` defers to it, so batching, inference
  (``training.inference.embedding.embed_texts``) and save/load are unchanged.
* ``cache_inputs(id_lists, cache_dir, dtype, progress, log)`` — before training, compute (or read from a cache)
  what a frozen bottom of the encoder gives for the training sentences (MiniLM's partial fine-tuning).
* ``regularizer() -> tensor | None`` — a term the training loss adds, computed in the last forward (RCN
  eq. 15: λV).
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from .options import BowOptions, GRUOptions, MeanWordvecOptions, options_as
from .sections import TextKeys
from .text_protocol import TextEncoderBase


class GRUEncoder(TextEncoderBase):
    """STT §3.1: a recurrent sentence encoder; its final hidden state represents the sentence."""

    def __init__(self, vocab_size: int, word_dim: int = 300, hidden: int = 1024, layers: int = 1,
                 bidirectional: bool = False, dropout: float = 0.0, pooling: str = "last"):
        super().__init__()
        if pooling not in ("last", "mean", "max"):
            raise ValueError(f"text.options.pooling must be last, mean or max, got {pooling!r}")
        self.pooling = pooling
        self.embed = nn.Embedding(vocab_size, word_dim, padding_idx=0)
        self.rnn = nn.GRU(word_dim, hidden, num_layers=layers, batch_first=True, bidirectional=bidirectional,
                          dropout=dropout if layers > 1 else 0.0)
        self.dropout = nn.Dropout(dropout)
        self.bidirectional = bidirectional
        self.out_dim = hidden
        nn.init.uniform_(self.embed.weight, -0.1, 0.1)

    cfg_text: TextKeys | None = None

    def fit(self, texts, vocab, log=print) -> None:
        """Word-vector initialisation of the embedding (RCN §IV-A, W2VV §III-A), when configured."""
        if self.cfg_text is not None:
            from .wordvec import init_embedding

            init_embedding(self.embed.weight, vocab, self.cfg_text, texts, log=log)

    packed: bool | None = None      # forward's way: None: packed on a CPU, with gradients and when bidirectional

    def _padded(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """A one-way GRU over the padded batch, no packing: its state at a sentence's last word (and at every word
        before) is the packed run's, since no step sees a later one; packing needs the lengths on the host, which
        on a GPU waits for the device."""
        out, _ = self.rnn(x)                                              # (B, T, hidden)
        last = lengths.clamp(min=1) - 1
        if self.pooling == "last":
            return out[torch.arange(len(out), device=out.device), last]
        valid = (torch.arange(out.shape[1], device=out.device).view(1, -1) <= last.view(-1, 1)).unsqueeze(-1)
        if self.pooling == "max":
            return out.masked_fill(~valid, float("-inf")).max(1).values
        return (out * valid).sum(1) / valid.sum(1)

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        x = self.dropout(self.embed(ids))
        packed_way = self.packed if self.packed is not None else (
            ids.device.type == "cpu" or torch.is_grad_enabled() or self.bidirectional)
        if not packed_way and not self.bidirectional:
            return self._padded(x, lengths.to(x.device))
        packed = pack_padded_sequence(x, lengths.clamp(min=1).cpu(), batch_first=True, enforce_sorted=False)
        out, h = self.rnn(packed)                     # h: (layers * directions, B, hidden)
        if self.pooling == "last":
            return (h[-2] + h[-1]) / 2 if self.bidirectional else h[-1]   # directions' last states averaged
        # pool every time step's state (InferSent-style): each local phrase ("red circle") reaches the output
        # directly instead of surviving to the last step
        out, _ = pad_packed_sequence(out, batch_first=True)              # (B, T, hidden * directions)
        if self.bidirectional:
            out = (out[..., :self.out_dim] + out[..., self.out_dim:]) / 2
        valid = (torch.arange(out.shape[1], device=out.device).view(1, -1) <
                 lengths.clamp(min=1).to(out.device).view(-1, 1)).unsqueeze(-1)
        if self.pooling == "max":
            return out.masked_fill(~valid, float("-inf")).max(1).values
        return (out * valid).sum(1) / valid.sum(1)


def build_gru(cfg_text: TextKeys, vocab_size: int) -> TextEncoderBase:
    encoder = GRUEncoder(vocab_size, cfg_text.word_dim, cfg_text.hidden, cfg_text.layers,
                         cfg_text.bidirectional, cfg_text.dropout, options_as(cfg_text.options, GRUOptions).pooling)
    encoder.cfg_text = cfg_text
    return encoder


class BagOfWordsEncoder(TextEncoderBase):
    """Word counts (or presence, ``binary``) → FC → ReLU: an order-blind baseline (BiR §5.2 unigram BoW)."""

    def __init__(self, vocab_size: int, hidden: int = 1024, binary: bool = False, dropout: float = 0.0):
        super().__init__()
        # EmbeddingBag(sum) over word ids == a linear layer applied to the count vector, without building it
        self.fc = nn.EmbeddingBag(vocab_size, hidden, mode="sum", padding_idx=0)
        self.bias = nn.Parameter(torch.zeros(hidden))
        self.dropout = nn.Dropout(dropout)
        self.binary = binary
        self.out_dim = hidden

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        if self.binary:  # keep the first occurrence of each word in a sentence
            same = ids.unsqueeze(2) == ids.unsqueeze(1)                     # (B, T, T)
            dup = torch.tril(same, diagonal=-1).any(2)
            ids = ids.masked_fill(dup, 0)
        return self.dropout(torch.relu(self.fc(ids) + self.bias))


def build_bow(cfg_text: TextKeys, vocab_size: int) -> TextEncoderBase:
    return BagOfWordsEncoder(vocab_size, cfg_text.hidden, options_as(cfg_text.options, BowOptions).binary,
                             cfg_text.dropout)


class MeanWordVectors(TextEncoderBase):
    """Two-branch §3.1 / W2VV eq. 2: s(q) = 1/|q| Σ_{w∈q} v(w), over the words that have a vector.

    ``fit`` loads ``text.options.word_vectors`` (``cfg_text``); with ``trainable`` false (the papers: fixed
    GloVe / word2vec features) the vectors stay as loaded."""

    counted: torch.Tensor   # buffer (registered below)

    def __init__(self, vocab_size: int, word_dim: int, cfg_text: TextKeys, trainable: bool):
        super().__init__()
        self.cfg_text = cfg_text
        self.embed = nn.Embedding(vocab_size, word_dim, padding_idx=0)
        nn.init.uniform_(self.embed.weight, -0.1, 0.1)
        # 1 for words that count in the mean; words the vectors lack are left out when fixed vectors are used
        self.register_buffer("counted", torch.ones(vocab_size))
        self.counted[:4] = 0
        self.embed.weight.requires_grad_(trainable)
        self.out_dim = word_dim

    def fit(self, texts, vocab, log=print) -> None:
        from .wordvec import init_embedding

        found = init_embedding(self.embed.weight, vocab, self.cfg_text, texts, log=log)
        if found is not None and not self.embed.weight.requires_grad:
            self.counted.copy_(found.float())

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        weights = self.counted[ids] * (ids != 0)                            # (B, T)
        total = (self.embed(ids) * weights.unsqueeze(-1)).sum(1)
        return total / weights.sum(1, keepdim=True).clamp(min=1.0)


def build_mean_wordvec(cfg_text: TextKeys, vocab_size: int) -> TextEncoderBase:
    return MeanWordVectors(vocab_size, cfg_text.word_dim, cfg_text,
                           options_as(cfg_text.options, MeanWordvecOptions).trainable)

