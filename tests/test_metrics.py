"""Retrieval metrics on constructed similarity matrices with known ranks."""
import json

import pytest
import torch

from training.evaluate import full_evaluation, minimal_pair_accuracy, plot_recall, public, retrieval_metrics
from training.models.factory import build_similarity

cosine = build_similarity("cosine")


def test_known_ranks_both_directions():
    # 3 images, 2 captions each (captions 2i, 2i+1 belong to image i)
    cap_to_img = torch.tensor([0, 0, 1, 1, 2, 2])
    sim = torch.tensor([
        # c0   c1   c2   c3   c4   c5
        [0.9, 0.1, 0.8, 0.0, 0.0, 0.0],   # image 0: own best 0.9 -> rank 1
        [0.7, 0.0, 0.2, 0.6, 0.9, 0.8],   # image 1: own best 0.6 -> beaten by .7 .9 .8 -> rank 4
        [0.0, 0.5, 0.3, 0.1, 0.1, 0.4],   # image 2: own best 0.4 -> beaten by .5 -> rank 2
    ])
    res = retrieval_metrics(sim, torch.eye(6), cap_to_img, lambda a, b: a @ b.t())
    assert res["_ranks"]["i2t"].tolist() == [1, 4, 2]
    # caption queries: column j, ground truth row cap_to_img[j]
    # c0: gt .9 -> 1 ; c1: gt .1 -> beaten by .5 -> 2 ; c2: gt .2 -> beaten by .8, .3 -> 3
    # c3: gt .6 -> 1 ; c4: gt .1 -> beaten by .9 -> 2 ; c5: gt .4 -> beaten by .8 -> 2
    assert res["_ranks"]["t2i"].tolist() == [1, 2, 3, 1, 2, 2]
    assert res["i2t"]["r1"] == pytest.approx(100 / 3, abs=1e-3)
    assert res["i2t"]["r5"] == 100.0
    assert res["t2i"]["r1"] == pytest.approx(100 * 2 / 6, abs=1e-3)
    assert res["t2i"]["medr"] == 2.0
    assert res["t2i"]["meanr"] == pytest.approx(11 / 6, abs=1e-3)
    assert res["i2t"]["meanr"] == pytest.approx(7 / 3, abs=1e-3)
    assert res["rsum"] == pytest.approx(res["i2t"]["r1"] + res["i2t"]["r5"] + res["i2t"]["r10"]
                                        + res["t2i"]["r1"] + res["t2i"]["r5"] + res["t2i"]["r10"])
    json.dumps(public(res))   # serialisable


def test_blocked_computation_matches_dense():
    g = torch.Generator().manual_seed(0)
    img = torch.nn.functional.normalize(torch.randn(37, 8, generator=g), dim=1)
    cap = torch.nn.functional.normalize(torch.randn(37 * 5, 8, generator=g), dim=1)
    cap_to_img = torch.arange(37).repeat_interleave(5)
    from training.evaluate import ranks_from_scores
    dense = ranks_from_scores(lambda rows: cosine(img[rows], cap), 37, cap_to_img, block=10_000)
    blocked = ranks_from_scores(lambda rows: cosine(img[rows], cap), 37, cap_to_img, block=4)
    assert torch.equal(dense[0], blocked[0]) and torch.equal(dense[1], blocked[1])
    # brute force reference
    s = cosine(img, cap)
    for j in range(cap.shape[0]):
        assert blocked[1][j] == 1 + int((s[:, j] > s[cap_to_img[j], j]).sum())


def test_perfect_and_chance():
    img = torch.eye(10)
    cap = torch.eye(10).repeat_interleave(5, 0)
    cap_to_img = torch.arange(10).repeat_interleave(5)
    res = retrieval_metrics(img, cap, cap_to_img, cosine)
    assert res["i2t"]["r1"] == res["t2i"]["r1"] == 100.0 and res["rsum"] == 600.0
    assert res["i2t"]["medr"] == 1.0 and res["n_images"] == 10 and res["n_captions"] == 50


def test_coco_protocols_with_5000_images():
    n = 5000
    img = torch.eye(n)[:, :64] * 0 + torch.nn.functional.one_hot(torch.arange(n) % 64, 64).float()
    cap = img.repeat_interleave(5, 0)
    cap_to_img = torch.arange(n).repeat_interleave(5)
    res = full_evaluation(img, cap, cap_to_img, cosine)
    assert "coco_1k" in res and "coco_5k" in res
    # ties (images sharing a code) never push the ground truth down, so everything is rank 1
    assert res["coco_1k"]["i2t"]["r1"] == 100.0 and res["coco_5k"]["rsum"] == res["rsum"]


def test_minimal_pair_accuracy():
    img = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5], [0.5, 0.5]])
    cap = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.3, 0.3], [0.3, 0.3]])
    cap_to_img = torch.tensor([0, 1, 2, 3])
    acc = minimal_pair_accuracy(img, cap, cap_to_img, [(0, 1)], cosine)
    assert acc == {"accuracy": 1.0, "n": 2}
    tie = minimal_pair_accuracy(img, cap, cap_to_img, [(2, 3)], cosine)
    assert tie["accuracy"] == 0.5          # indistinguishable images: half credit, chance level


def test_plot_is_written(tmp_path):
    img = torch.eye(4)
    res = retrieval_metrics(img, img, torch.arange(4), cosine)
    plot_recall(res, tmp_path / "r.png", max_k=5)
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
