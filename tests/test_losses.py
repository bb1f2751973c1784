"""Ranking losses against small hand-computed cases."""
import pytest
import torch

from training.models.factory import LOSSES, build_loss, build_similarity

# S[i, j] = S(image_i, caption_j); diagonal = matching pairs
S = torch.tensor([[0.9, 0.5, 0.1],
                  [0.3, 0.6, 0.7],
                  [0.2, 0.8, 0.4]])
M = 0.2


def loss(name, sim=S, **kw):
    cfg = {"name": name, "margin": M, "lambda": kw.pop("lam", 1.0), "reduction": kw.pop("reduction", "sum"),
           "k": kw.pop("k", 10), "options": {}}
    return build_loss(cfg)(sim, **kw).item()


def hinge(pos, neg):
    return max(0.0, M - pos + neg)


def test_sum_of_hinges_eq7():
    image_anchored = sum(hinge(S[i, i], S[i, j]) for i in range(3) for j in range(3) if j != i)
    caption_anchored = sum(hinge(S[j, j], S[i, j]) for j in range(3) for i in range(3) if i != j)
    assert loss("sum") == pytest.approx(image_anchored + caption_anchored)
    # by hand: image rows (0 + 0) + (0 + 0.3) + (0 + 0.6); caption columns (0 + 0) + (0.1 + 0.4) + (0 + 0.5)
    assert loss("sum") == pytest.approx(0.9 + 1.0)


def test_max_violation_takes_hardest_negative_and_ignores_positive():
    # image 1: negatives 0.3, 0.7 -> hardest 0.7 -> 0.2 - 0.6 + 0.7 = 0.3 ; image 2: max(0.2, 0.8) -> 0.6
    # caption 1: images 0.5, 0.8 -> 0.8 -> 0.4 ; caption 2: images 0.1, 0.7 -> 0.7 -> 0.5
    assert loss("max_violation") == pytest.approx(0.3 + 0.6 + 0.4 + 0.5)
    # a huge positive score must never be taken as "the hardest negative"
    sim = torch.tensor([[5.0, 0.0], [0.0, 5.0]])
    assert loss("max_violation", sim) == 0.0


def test_max_violation_mean_and_lambda():
    assert loss("max_violation", reduction="mean") == pytest.approx((0.3 + 0.6) / 3 + (0.4 + 0.5) / 3)
    assert loss("max_violation", lam=0.1) == pytest.approx(0.3 + 0.6 + 0.1 * (0.4 + 0.5))


def test_k_hardest():
    assert loss("khardest", k=1) == pytest.approx(loss("max_violation"))
    assert loss("khardest", k=2) == pytest.approx(loss("sum"))   # 3x3 batch: 2 negatives per anchor


def test_hard_semihard_selection():
    # image-anchored costs: row0 none; row1 neg 0.3 (pos .6: semi-hard? .3 > .4? no -> easy), 0.7 (hard)
    # row2 (pos .4): 0.2 easy? .2 > .2? no; 0.8 hard.  caption-anchored (col j, pos S[j,j]):
    # col1 (pos .6): 0.5 semi-hard, 0.8 hard; col2 (pos .4): 0.1 easy, 0.7 hard
    hard = [hinge(0.6, 0.7), hinge(0.4, 0.8), hinge(0.6, 0.8), hinge(0.4, 0.7)]
    semi = [hinge(0.6, 0.5)]
    assert loss("hard", reduction="sum") == pytest.approx(sum(hard))
    assert loss("semihard", reduction="sum") == pytest.approx(sum(semi))
    assert loss("hard_semihard", reduction="sum") == pytest.approx(sum(hard) + sum(semi))
    # mean = over the selected triplets of each direction
    assert loss("hard", reduction="mean") == pytest.approx(sum(hard[:2]) / 2 + sum(hard[2:]) / 2)


def test_same_image_captions_are_not_negatives():
    # captions 0 and 1 both describe image 0 (batch rows 0 and 1 are the same image)
    sim = torch.tensor([[0.5, 0.9, 0.0],
                        [0.5, 0.9, 0.0],
                        [0.0, 0.0, 0.5]])
    ids = torch.tensor([0, 0, 1])
    assert loss("max_violation", sim, image_ids=ids) == 0.0
    assert loss("max_violation", sim) > 0.0        # without ids the duplicate looks like a hard negative


def test_every_loss_is_differentiable_and_registered():
    assert set(LOSSES.names()) >= {"sum", "max_violation", "khardest", "hard", "semihard", "hard_semihard"}
    for name in LOSSES.names():
        sim = S.clone().requires_grad_(True)
        cfg = {"name": name, "margin": M, "lambda": 1.0, "reduction": "sum", "k": 2, "options": {}}
        loss_fn = build_loss(cfg)
        if getattr(loss_fn, "on_pairs", False):    # W2VV's mse reads (prediction, target) pairs, not scores
            loss_fn(sim, S + 1).backward()
        else:
            loss_fn(sim).backward()
        assert sim.grad is not None


def test_cosine_and_order_similarity():
    im = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    cap = torch.tensor([[1.0, 0.0], [0.6, 0.8]])
    assert torch.allclose(build_similarity("cosine")(im, cap), torch.tensor([[1.0, 0.6], [0.0, 0.8]]))
    order = build_similarity("order")
    # STT eq. 9: -||max(0, c - i)||^2
    expected = torch.tensor([[-0.0, -(0.8 ** 2)], [-(1.0 ** 2), -(0.6 ** 2)]])
    assert torch.allclose(order(im, cap), expected)
    assert (order.normalize(torch.tensor([[-3.0, 4.0]])) >= 0).all()
