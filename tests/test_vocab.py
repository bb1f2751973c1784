"""Tests for training.data.vocab: tokenize, Vocabulary (build, encode, decode, serialisation) and pad_batch."""
from __future__ import annotations

import json

import pytest
import torch

from training.data.vocab import END_ID, PAD_ID, START_ID, UNK_ID, Vocabulary, pad_batch, tokenize

TEXTS = ["A dog runs.", "A dog jumps!", "The cat sleeps.", "a DOG, a cat."]


@pytest.mark.parametrize("text, tokens", [
    ("A dog runs.", ["a", "dog", "runs"]),
    ("  Two   dogs\tplay\n", ["two", "dogs", "play"]),
    ("A dog's ball", ["a", "dog's", "ball"]),
    ("A dog\u2019s ball", ["a", "dog's", "ball"]),                # typographic apostrophe
    ("the dogs' 'ball'", ["the", "dogs", "ball"]),               # outer apostrophes dropped
    ("rock'n'roll", ["rock'n'roll"]),
    ("T-shirt, 3.5 ft!", ["t", "shirt", "3", "5", "ft"]),
    ("Café CAFÉ", ["café", "café"]),
    ("Cafe\u0301", ["café"]),                                    # decomposed accent → NFKC composes it
    ("\uff21\uff22\uff23 123", ["abc", "123"]),                  # full-width letters
    ("snake_case <start>", ["snake", "case", "start"]),
    ("", []),
    ("... !!! ---", []),
])
def test_tokenize(text: str, tokens: list[str]) -> None:
    assert tokenize(text) == tokens


def test_build_order_and_specials() -> None:
    vocab = Vocabulary.build(TEXTS)
    assert vocab.idx2word[:4] == ["<pad>", "<start>", "<end>", "<unk>"]
    assert (PAD_ID, START_ID, END_ID, UNK_ID) == (0, 1, 2, 3)
    # counts: a=4, dog=3, cat=2, then jumps/runs/sleeps/the=1 alphabetically
    assert vocab.idx2word[4:] == ["a", "dog", "cat", "jumps", "runs", "sleeps", "the"]
    assert all(vocab.word2idx[w] == i for i, w in enumerate(vocab.idx2word))
    assert len(vocab) == 11 and "dog" in vocab and "horse" not in vocab
    assert Vocabulary.build(list(reversed(TEXTS))) == vocab            # order of texts does not matter


def test_min_count_and_max_size() -> None:
    assert Vocabulary.build(TEXTS, min_count=2).idx2word[4:] == ["a", "dog", "cat"]
    assert Vocabulary.build(TEXTS, min_count=5).idx2word[4:] == []
    assert Vocabulary.build(TEXTS, max_size=6).idx2word[4:] == ["a", "dog"]
    assert len(Vocabulary.build(TEXTS, max_size=4)) == 4
    with pytest.raises(ValueError):
        Vocabulary.build(TEXTS, max_size=3)
    with pytest.raises(ValueError):
        Vocabulary.build(TEXTS, min_count=0)


def test_encode() -> None:
    vocab = Vocabulary.build(TEXTS)
    a, dog, cat = vocab.word2idx["a"], vocab.word2idx["dog"], vocab.word2idx["cat"]
    assert vocab.encode("A dog and a horse!") == [a, dog, UNK_ID, a, UNK_ID]
    assert vocab.encode(["a", "cat"], add_start_end=True) == [START_ID, a, cat, END_ID]
    assert vocab.encode(["A"]) == [UNK_ID]                              # token lists are looked up as given
    assert vocab.encode("a dog a cat", max_len=2) == [a, dog]
    assert vocab.encode("a dog a cat", add_start_end=True, max_len=4) == [START_ID, a, dog, END_ID]
    assert vocab.encode("a dog", add_start_end=True, max_len=2) == [START_ID, END_ID]
    assert vocab.encode("") == [] and vocab.encode("", add_start_end=True) == [START_ID, END_ID]
    with pytest.raises(ValueError):
        vocab.encode("a dog", add_start_end=True, max_len=1)


def test_decode() -> None:
    vocab = Vocabulary.build(TEXTS)
    ids = vocab.encode("the dog sleeps zebra", add_start_end=True) + [vocab.word2idx["cat"], PAD_ID]
    assert vocab.decode(ids) == "the dog sleeps <unk>"                 # stops at <end>, keeps <unk>
    assert vocab.decode(ids, skip_special=False) == "<start> the dog sleeps <unk> <end>"
    assert vocab.decode(torch.tensor([START_ID, vocab.word2idx["a"], PAD_ID, PAD_ID])) == "a"
    assert vocab.decode([]) == ""
    with pytest.raises(ValueError):
        vocab.decode([len(vocab)])


def test_json_round_trip() -> None:
    vocab = Vocabulary.build(TEXTS + ["Ünïcödé dog's 42"], min_count=1)
    restored = Vocabulary.from_dict(json.loads(json.dumps(vocab.to_dict())))
    assert restored == vocab
    assert restored.idx2word == vocab.idx2word and restored.word2idx == vocab.word2idx
    for text in TEXTS + ["unseen words ünïcödé dog's 42", ""]:
        assert restored.encode(text, add_start_end=True) == vocab.encode(text, add_start_end=True)


def test_invalid_tables() -> None:
    with pytest.raises(ValueError, match="must start with"):
        Vocabulary(["a", "b"])
    with pytest.raises(ValueError, match="duplicate"):
        Vocabulary(["<pad>", "<start>", "<end>", "<unk>", "a", "a"])


def test_pad_batch() -> None:
    ids, lengths = pad_batch([[5, 6, 7], [8], []])
    assert ids.dtype == torch.long and lengths.dtype == torch.long
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0], [UNK_ID, 0, 0]]      # empty → a single <unk>
    assert lengths.tolist() == [3, 1, 1]
    ids, lengths = pad_batch([[], []], pad_id=9)
    assert ids.shape == (2, 1) and ids.tolist() == [[UNK_ID], [UNK_ID]] and lengths.tolist() == [1, 1]
    ids, _ = pad_batch([[1, 2], [3]], pad_id=-1)
    assert ids.tolist() == [[1, 2], [3, -1]]
    with pytest.raises(ValueError):
        pad_batch([])
