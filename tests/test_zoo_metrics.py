"""BiR's R@K variants and rPrecision(5) (§6.2) and W2VV's mean inverted rank on constructed matrices."""
import json

import pytest
import torch

from training.evaluate import bir_metrics, caption_positions, mean_inverted_rank, retrieval_metrics

DOT = staticmethod(lambda a, b: a @ b.t())

# 3 images, 2 captions each in order: c0 c1 → image 0, c2 c3 → image 1, c4 c5 → image 2
CAP_TO_IMG = torch.tensor([0, 0, 1, 1, 2, 2])
SIM = torch.tensor([
    # c0   c1   c2   c3   c4   c5
    [0.9, 0.1, 0.8, 0.0, 0.0, 0.0],
    [0.7, 0.0, 0.2, 0.6, 0.9, 0.8],
    [0.0, 0.5, 0.3, 0.1, 0.1, 0.4],
])


def dot(a, b):
    return a @ b.t()


def test_mean_inverted_rank():
    res = retrieval_metrics(SIM, torch.eye(6), CAP_TO_IMG, dot)
    # i2t ranks [1, 4, 2], t2i ranks [1, 2, 3, 1, 2, 2]
    assert res["mir"]["i2t"] == pytest.approx((1 + 1 / 4 + 1 / 2) / 3, abs=1e-6)
    assert res["mir"]["t2i"] == pytest.approx((1 + 1 / 2 + 1 / 3 + 1 + 1 / 2 + 1 / 2) / 6, abs=1e-6)
    assert mean_inverted_rank(torch.tensor([1, 1, 1])) == 1.0


def test_caption_positions_follow_each_images_order():
    assert caption_positions(torch.tensor([0, 1, 0, 1, 1, 2])).tolist() == [0, 0, 1, 1, 2, 0]


def test_rk_variants_and_rprecision_known_answers():
    out = bir_metrics(SIM, torch.eye(6), CAP_TO_IMG, dot)
    v = out["rk_variants"]
    # 1st_txt gallery {c0, c2, c4}: image ranks [1, 3, 2]; caption ranks c0 1, c2 3, c4 2
    assert v["i2t"]["1st_txt"] == pytest.approx({"r1": 100 / 3, "r2": 200 / 3, "r5": 100.0, "r10": 100.0}, abs=1e-3)
    assert v["t2i"]["1st_txt"] == pytest.approx({"r1": 100 / 3, "r2": 200 / 3, "r5": 100.0, "r10": 100.0}, abs=1e-3)
    # second-caption gallery {c1, c3, c5}: image ranks [1, 2, 2]; caption ranks [2, 1, 2]; avg_txt averages both
    assert v["i2t"]["avg_txt"]["r1"] == pytest.approx(100 / 3, abs=1e-3)
    assert v["i2t"]["avg_txt"]["r2"] == pytest.approx((200 / 3 + 100) / 2, abs=1e-3)
    assert v["t2i"]["avg_txt"]["r2"] == pytest.approx((200 / 3 + 100) / 2, abs=1e-3)
    # any_txt: all 6 captions, hit when any own caption is in the top K: ranks [1, 4, 2]
    assert v["i2t"]["any_txt"] == pytest.approx({"r1": 100 / 3, "r2": 200 / 3, "r5": 100.0, "r10": 100.0}, abs=1e-3)
    assert "any_txt" not in v["t2i"]
    # top 5 of 6 captions hold both own captions for every image: 2/5 relevant
    assert out["rprecision5"] == pytest.approx(40.0)
    json.dumps(out)


def test_one_caption_per_image_makes_every_variant_equal():
    g = torch.Generator().manual_seed(0)
    sim = torch.randn(20, 20, generator=g)
    out = bir_metrics(sim, torch.eye(20), torch.arange(20), dot)["rk_variants"]["i2t"]
    assert out["1st_txt"] == out["rnd_txt"] == out["avg_txt"] == out["any_txt"]


def test_random_variant_is_seeded_and_uses_one_own_caption():
    g = torch.Generator().manual_seed(1)
    sim = torch.randn(30, 150, generator=g)
    cap_to_img = torch.arange(30).repeat_interleave(5)
    a = bir_metrics(sim, torch.eye(150), cap_to_img, dot, seed=3)["rk_variants"]
    b = bir_metrics(sim, torch.eye(150), cap_to_img, dot, seed=3)["rk_variants"]
    assert a == b
    # perfect model: every variant is 100 %
    perfect = (cap_to_img.view(1, -1) == torch.arange(30).view(-1, 1)).float()
    out = bir_metrics(perfect, torch.eye(150), cap_to_img, dot)
    for direction in out["rk_variants"].values():
        for metrics in direction.values():
            assert metrics["r1"] == 100.0
    assert out["rprecision5"] == 100.0
