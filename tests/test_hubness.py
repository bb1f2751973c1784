"""Querybank normalisation (QB-Norm with the inverted softmax) folded into one inner product."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from training.evaluate import querybank_metrics, retrieval_metrics
from training.inference.folding import fold_items, fold_queries
from training.inference.querybank import activation_set, dynamic_scores, item_offsets
from training.models.factory import build_similarity


def test_offsets_rank_exactly_as_the_inverted_softmax_and_fold_into_one_dot_product():
    g = torch.Generator().manual_seed(0)
    bank = F.normalize(torch.randn(300, 16, generator=g), dim=-1)
    items = F.normalize(torch.randn(50, 16, generator=g), dim=-1)
    queries = F.normalize(torch.randn(7, 16, generator=g), dim=-1)
    beta = 20.0
    off = item_offsets(bank, items, beta, block=64)                     # blocks of the bank give the same sums
    torch.testing.assert_close(off, item_offsets(bank, items, beta), atol=1e-5, rtol=0)
    inverted_softmax = torch.exp(beta * queries @ items.t()) / torch.exp(beta * bank @ items.t()).sum(0)
    folded = fold_queries(queries.numpy()) @ fold_items(items.numpy(), off.numpy()).T
    assert np.array_equal(np.argsort(-folded, 1), torch.argsort(-inverted_softmax, 1).numpy())
    np.testing.assert_allclose(folded, (queries @ items.t() - off).numpy(), atol=1e-5)


def test_a_hub_is_pushed_down_and_bad_input_is_refused():
    hub = torch.tensor([[1.0, 0.0]])
    other = F.normalize(torch.tensor([[0.6, 0.8]]), dim=-1)
    bank = F.normalize(torch.tensor([[1.0, 0.1], [0.9, -0.1], [1.0, 0.0]]), dim=-1)   # the bank sits near the hub
    off = item_offsets(bank, torch.cat([hub, other]), 20.0)
    assert off[0] > off[1]
    with pytest.raises(ValueError, match="non-empty"):
        item_offsets(torch.zeros(0, 2), hub)
    with pytest.raises(ValueError, match="beta"):
        item_offsets(bank, hub, 0.0)


def test_querybank_metrics_equal_plain_metrics_with_a_uniform_bank_effect():
    g = torch.Generator().manual_seed(1)
    img = F.normalize(torch.randn(20, 8, generator=g), dim=-1)
    cap = F.normalize(img.repeat_interleave(2, 0) + 0.3 * torch.randn(40, 8, generator=g), dim=-1)
    cap_to_img = torch.arange(20).repeat_interleave(2)
    plain = retrieval_metrics(img, cap, cap_to_img, build_similarity("cosine"))
    # a huge temperature makes every offset the bank's maximum over items: still item-dependent, so instead use
    # an orthogonal bank (every score 0): all offsets equal, rankings unchanged
    bank = torch.zeros(5, 8)
    qb = querybank_metrics(img, cap, cap_to_img, bank, bank, 20.0)
    assert qb["rsum"] == pytest.approx(plain["rsum"]) and qb["bank"] == {"images": 5, "captions": 5}


def test_activation_set_marks_the_items_that_are_some_bank_querys_nearest():
    items = torch.eye(4)
    bank = torch.tensor([[1.0, 0.1, 0, 0], [0.9, 0, 0.2, 0], [0, 0, 1.0, 0.3]])
    assert activation_set(bank, items, k=1).tolist() == [True, False, True, False]
    assert activation_set(bank, items, k=2).tolist() == [True, True, True, True]
    with pytest.raises(ValueError, match="non-empty"):
        activation_set(torch.zeros(0, 4), items)


def test_dynamic_inverted_softmax_corrects_only_queries_that_land_on_a_hub():
    """Item 0 is the bank's hub (every bank query's nearest): a query whose raw nearest item is 0 is normalised,
    so the hub loses its lead; a query whose nearest item is no hub keeps its raw ranking, although the static
    correction would reorder it too (item 2's offset is larger than item 3's)."""
    items = torch.nn.functional.normalize(torch.tensor([[1.0, 0, 0, 0], [0.8, 0.6, 0, 0], [0, 0, 1, 0],
                                                        [0, 0, 0.6, 0.8]]), dim=1)
    bank = torch.nn.functional.normalize(torch.tensor([[1.0, 0.2, 0.3, 0], [1.0, 0.3, 0.2, 0]]), dim=1)
    hubs = activation_set(bank, items)
    assert hubs.tolist() == [True, False, False, False]
    offsets = item_offsets(bank, items, beta=20.0)
    queries = torch.nn.functional.normalize(torch.tensor([[0.95, 0.3, 0, 0], [0, 0, 0.95, 0.45]]), dim=1)
    raw = queries @ items.t()
    assert raw[0].argmax() == 0 and raw[1].argmax() == 2
    static = raw - offsets[None]
    assert static[0].argmax() == 1 and static[1].argmax() == 3          # the static bank reorders both
    dynamic = dynamic_scores(raw, offsets, hubs)
    assert torch.equal(dynamic[0], static[0]) and dynamic[0].argmax() == 1
    assert torch.equal(dynamic[1], raw[1]) and dynamic[1].argmax() == 2
    assert torch.equal(dynamic_scores(raw, offsets, torch.ones(4, dtype=torch.bool)), static)
    assert torch.equal(dynamic_scores(raw, offsets, torch.zeros(4, dtype=torch.bool)), raw)
