"""Caption tokeniser, word vocabulary and batch padding.

Tokenisation (``tokenize``): Unicode NFKC normalisation, typographic apostrophes (’ ‘ ʼ `) made ``'``,
lower case, then every maximal run of letters and digits is a token, and runs joined by a single inner
apostrophe stay one token. Everything else — whitespace, punctuation, hyphens, underscores — separates tokens
and is dropped::

    "A dog's T-shirt, 3.5 ft!"  →  ["a", "dog's", "t", "shirt", "3", "5", "ft"]
    "the dogs' 'ball'"          →  ["the", "dogs", "ball"]

The vocabulary's ids 0..3 are always ``<pad> <start> <end> <unk>``; the words follow, most frequent first and
alphabetically among equal counts, so the same texts always give the same ids.
"""
from __future__ import annotations

import re
import unicodedata
from collections import Counter
from typing import Any, Iterable, Sequence

import numpy as np
import torch

PAD, START, END, UNK = "<pad>", "<start>", "<end>", "<unk>"
PAD_ID, START_ID, END_ID, UNK_ID = 0, 1, 2, 3
SPECIALS = (PAD, START, END, UNK)

_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'", "`": "'"})
_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)*")     # letters/digits, inner apostrophes allowed


def tokenize(text: str) -> list[str]:
    """Lower-cased word tokens of ``text``, punctuation dropped (rules in the module docstring)."""
    return _WORD.findall(unicodedata.normalize("NFKC", text).translate(_APOSTROPHES).lower())


class Vocabulary:
    """A word ↔ id table; ``idx2word[i]`` is the word of id ``i``, ``word2idx`` the inverse."""

    def __init__(self, idx2word: Sequence[str]):
        """``idx2word`` is the whole table, starting with the four special tokens."""
        if tuple(idx2word[:len(SPECIALS)]) != SPECIALS:
            raise ValueError(f"a vocabulary must start with {', '.join(SPECIALS)}")
        self.idx2word: list[str] = list(idx2word)
        self.word2idx: dict[str, int] = {word: i for i, word in enumerate(self.idx2word)}
        if len(self.word2idx) != len(self.idx2word):
            duplicates = sorted(w for w, n in Counter(self.idx2word).items() if n > 1)
            raise ValueError(f"duplicate words in vocabulary: {duplicates[:5]}")

    @classmethod
    def build(cls, texts: Iterable[str], min_count: int = 1, max_size: int | None = None) -> Vocabulary:
        """The words of ``texts`` seen at least ``min_count`` times, most frequent first.

        ``max_size`` caps the whole vocabulary, the four special tokens included (so it must be at least 4);
        the least frequent words are the ones left out.
        """
        if min_count < 1:
            raise ValueError(f"min_count must be at least 1, got {min_count}")
        if max_size is not None and max_size < len(SPECIALS):
            raise ValueError(f"max_size counts the {len(SPECIALS)} special tokens, so must be >= "
                             f"{len(SPECIALS)}; got {max_size}")
        counts = Counter(token for text in texts for token in tokenize(text))
        words = sorted((w for w, n in counts.items() if n >= min_count), key=lambda w: (-counts[w], w))
        if max_size is not None:
            words = words[:max_size - len(SPECIALS)]
        return cls([*SPECIALS, *words])

    def __len__(self) -> int:
        return len(self.idx2word)

    def __contains__(self, word: object) -> bool:
        return word in self.word2idx

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocabulary) and self.idx2word == other.idx2word

    def __repr__(self) -> str:
        return f"Vocabulary({len(self)} entries)"

    def encode(self, text_or_tokens: str | Sequence[str], add_start_end: bool = False,
               max_len: int | None = None) -> list[int]:
        """Ids of a text (tokenised first) or of a token list (looked up as given); unknown words → ``<unk>``.

        ``max_len`` caps the result's length, ``<start>``/``<end>`` included: the words are cut, ``<end>`` is
        kept.
        """
        tokens = tokenize(text_or_tokens) if isinstance(text_or_tokens, str) else text_or_tokens
        ids = [self.word2idx.get(token, UNK_ID) for token in tokens]
        if max_len is not None:
            room = max_len - 2 if add_start_end else max_len
            if room < 0:
                raise ValueError(f"max_len={max_len} leaves no room for <start> and <end>")
            ids = ids[:room]
        return [START_ID, *ids, END_ID] if add_start_end else ids

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """The words of ``ids`` joined by spaces, up to the first ``<end>``.

        ``skip_special`` drops ``<pad>`` and ``<start>`` (and leaves the ``<end>`` out); ``<unk>`` is always
        kept, as it stands for a real word. Accepts any iterable of ints, a 1-D tensor included.
        """
        words = []
        for i in map(int, ids):
            if not 0 <= i < len(self):
                raise ValueError(f"id {i} is outside this vocabulary (size {len(self)})")
            if i == END_ID:
                if not skip_special:
                    words.append(END)
                break
            if not (skip_special and i in (PAD_ID, START_ID)):
                words.append(self.idx2word[i])
        return " ".join(words)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable form; ``Vocabulary.from_dict`` gives back an equal vocabulary."""
        return {"idx2word": list(self.idx2word)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Vocabulary:
        return cls(d["idx2word"])


def pad_batch(seqs: list[list[int]], pad_id: int = PAD_ID) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, lengths)``: a ``(B, T)`` LongTensor right-padded with ``pad_id``, T the longest length, and
    the ``(B,)`` LongTensor of lengths.

    An empty sequence becomes a single ``<unk>`` of length 1, so every length is at least 1 (packed RNN
    sequences and mean pooling need one token) and the caption still encodes as "unknown content".
    """
    if not seqs:
        raise ValueError("pad_batch needs at least one sequence")
    counts = np.fromiter((max(len(s), 1) for s in seqs), dtype=np.int64, count=len(seqs))
    flat = np.fromiter((t for s in seqs for t in (s if len(s) else (UNK_ID,))), dtype=np.int64, count=int(counts.sum()))
    out = np.full((len(seqs), int(counts.max())), pad_id, dtype=np.int64)
    out[np.arange(out.shape[1]) < counts[:, None]] = flat          # row-major: each row's ids, then its padding
    ids, lengths = torch.from_numpy(out), torch.from_numpy(counts)
    return ids, lengths
