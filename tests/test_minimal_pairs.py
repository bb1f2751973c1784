"""Minimal pairs of the synthetic set against the two text encoders.

Partner captions use the same multiset of words, so an order-blind (bag-of-words) encoder embeds them
identically whatever its weights: its minimal-pair accuracy is exactly 50 %. A GRU reads word order, so its
embeddings of the two partners differ — the precondition for learning binding at all.
"""
import torch

from conftest import tiny_config
from training.data.datasets import load_dataset
from training.data.vocab import Vocabulary
from training.inference.embedding import embed_split
from training.evaluate import minimal_pair_accuracy, minimal_pairs_of
from training.models.model import build_model


def _model(ds, encoder, **text):
    cfg = tiny_config(text={"encoder": encoder, **text})
    torch.manual_seed(0)
    vocab = Vocabulary.build(c for r in ds.images for c in r.captions)
    return build_model(cfg, vocab).eval()


def test_bag_of_words_is_blind_to_minimal_pairs_and_a_gru_is_not(synth_small):
    ds = load_dataset(synth_small)
    pairs = minimal_pairs_of(ds)
    assert pairs, "the synthetic set must contain minimal pairs"
    for encoder, extra in (("bow", {}), ("gru", {}), ("gru", {"bidirectional": True, "options": {"pooling": "max"}})):
        model = _model(ds, encoder, **extra)
        img, cap, cap_to_img = embed_split(model, ds, progress=False, workers=0)
        acc = minimal_pair_accuracy(img, cap, cap_to_img, pairs, model.similarity)["accuracy"]
        # caption k of an image and caption k of its partner: same words, different order
        a, b = pairs[0]
        ca = cap[(cap_to_img == a).nonzero()[0]]
        cb = cap[(cap_to_img == b).nonzero()[0]]
        if encoder == "bow":
            assert acc == 0.5
            assert torch.allclose(ca, cb)
        else:
            assert not torch.allclose(ca, cb, atol=1e-4)
