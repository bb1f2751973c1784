"""Ranking losses against small hand-computed cases."""
import pytest
import torch

from training.models.config_schema import LossSection
from training.models.factory import LOSSES, build_loss, build_similarity

# S[i, j] = S(image_i, caption_j); diagonal = matching pairs
S = torch.tensor([[0.9, 0.5, 0.1],
                  [0.3, 0.6, 0.7],
                  [0.2, 0.8, 0.4]])
M = 0.2


def loss(name, sim=S, **kw):
    cfg = {"name": name, "margin": M, "lambda": kw.pop("lam", 1.0), "reduction": kw.pop("reduction", "sum"),
           "k": kw.pop("k", 10), "options": {}}
    return build_loss(LossSection.model_validate(cfg))(sim, **kw).item()


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


def test_infonce_is_a_softmax_over_each_anchors_positive_and_negatives():
    tau = 0.1
    def side(rows):   # each row: the anchor's positive first, then its negatives
        return sum(-torch.log_softmax(torch.tensor(r) / tau, 0)[0].item() for r in rows)
    images = [[0.9, 0.5, 0.1], [0.6, 0.3, 0.7], [0.4, 0.2, 0.8]]
    captions = [[0.9, 0.3, 0.2], [0.6, 0.5, 0.8], [0.4, 0.1, 0.7]]
    cfg = {"name": "infonce", "reduction": "sum", "lambda": 0.5, "options": {"temperature": tau}}
    got = build_loss(LossSection.model_validate(cfg))(S).item()
    assert got == pytest.approx(side(images) + 0.5 * side(captions), rel=1e-5)
    # a caption of the anchor's own image is neither the positive nor a negative
    sim = torch.tensor([[0.5, 0.9, 0.0], [0.5, 0.9, 0.0], [0.0, 0.0, 0.5]])
    with_ids = build_loss(LossSection.model_validate(cfg))(sim, torch.tensor([0, 0, 1])).item()
    assert with_ids < build_loss(LossSection.model_validate(cfg))(sim).item()
    # the sharper τ, the more the hardest negative dominates: a well-separated batch costs almost nothing
    easy = torch.eye(3)
    assert build_loss(LossSection.model_validate({**cfg, "options": {"temperature": 0.01}}))(easy).item() < 1e-6
    with pytest.raises(ValueError, match="temperatur"):
        LossSection.model_validate({**cfg, "options": {"temperatur": 0.1}})
    with pytest.raises(ValueError, match="temperature"):
        LossSection.model_validate({**cfg, "options": {"temperature": 0}})


def test_every_loss_is_differentiable_and_registered():
    assert set(LOSSES.names()) >= {"sum", "max_violation", "khardest", "hard", "semihard", "hard_semihard"}
    for name in LOSSES.names():
        sim = S.clone().requires_grad_(True)
        cfg = {"name": name, "margin": M, "lambda": 1.0, "reduction": "sum", "k": 2, "options": {}}
        loss_fn = build_loss(LossSection.model_validate(cfg))
        if loss_fn.on_pairs:    # W2VV's mse reads (prediction, target) pairs, not scores
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


# --- XBM: a cross-batch memory of recent embeddings as extra negatives ---------------------------------------------

def _unit(rows):
    return torch.nn.functional.normalize(torch.tensor(rows, dtype=torch.float32), dim=1)


def test_the_memory_keeps_the_newest_entries_detached():
    from training.models.losses import CrossBatchMemory

    memory = CrossBatchMemory(5)
    score = build_similarity("cosine")
    assert len(memory) == 0 and memory.scores(score, torch.eye(2), torch.eye(2)) is None
    for step in range(3):                          # batches of 2 (image, caption) pairs with image ids 2s, 2s + 1
        emb = torch.full((2, 3), float(step), requires_grad=True)
        memory.add(emb, emb * 2, torch.tensor([2 * step, 2 * step + 1]))
    assert len(memory) == 5
    assert memory.image_ids.tolist() == [1, 2, 3, 4, 5]               # the oldest entry (id 0) is gone
    assert memory.images[:, 0].tolist() == [0, 1, 1, 2, 2] and memory.captions[-1, 0] == 4
    assert not memory.images.requires_grad and not memory.captions.requires_grad
    memory.clear()
    assert len(memory) == 0


def _brute_max_violation(images, captions, ids, mem_images, mem_captions, mem_ids):
    """Each anchor's hardest negative among the batch and the memory, by loops (pairs of one image skipped)."""
    cands_c = [(c, i) for c, i in zip(captions, ids.tolist())] + [(c, i) for c, i in zip(mem_captions, mem_ids.tolist())]
    cands_i = [(v, i) for v, i in zip(images, ids.tolist())] + [(v, i) for v, i in zip(mem_images, mem_ids.tolist())]
    total = 0.0
    for a, own in enumerate(ids.tolist()):
        pos = float(images[a] @ captions[a])
        total += max(0.0, M - pos + max(float(images[a] @ c) for c, i in cands_c if i != own))
        total += max(0.0, M - pos + max(float(v @ captions[a]) for v, i in cands_i if i != own))
    return total


def test_max_violation_mines_the_memory_and_masks_its_positives():
    from training.models.losses import CrossBatchMemory

    score = build_similarity("cosine")
    images, captions = _unit([[1, 0, 0], [0, 1, 0], [0, 0, 1]]), _unit([[1, 0.2, 0], [0, 1, 0.2], [0.3, 0, 1]])
    ids = torch.tensor([0, 1, 2])
    fn = build_loss(LossSection(name="max_violation", margin=M, k=10))
    plain = fn(score(images, captions), ids).item()

    memory = CrossBatchMemory(8)          # close to image 0 and caption 0: hard negatives of both
    mem_images, mem_captions = _unit([[1, 0.1, 0], [0, 0.2, 1]]), _unit([[0.95, 0.1, 0], [0.1, 1, 0]])
    memory.add(mem_images, mem_captions, torch.tensor([7, 8]))
    with_memory = fn(score(images, captions), ids, memory=memory.scores(score, images, captions)).item()
    assert with_memory > plain
    assert with_memory == pytest.approx(_brute_max_violation(images, captions, ids, mem_images, mem_captions,
                                                             torch.tensor([7, 8])), abs=1e-6)

    same = CrossBatchMemory(8)          # the same vectors filed under the batch's own images: positives
    same.add(mem_images, mem_captions, torch.tensor([0, 2]))
    assert fn(score(images, captions), ids, memory=same.scores(score, images, captions)).item() == pytest.approx(
        _brute_max_violation(images, captions, ids, mem_images, mem_captions, torch.tensor([0, 2])), abs=1e-6)
    assert fn(score(images, captions), ids, memory=same.scores(score, images, captions)).item() < with_memory


def test_the_gradient_of_a_memory_loss_reaches_only_the_batch():
    from training.models.losses import CrossBatchMemory

    score = build_similarity("cosine")
    memory = CrossBatchMemory(4)
    old = torch.nn.functional.normalize(torch.randn(4, 3, generator=torch.Generator().manual_seed(1)), dim=1)
    old.requires_grad_(True)
    memory.add(old, old, torch.tensor([5, 6, 7, 8]))
    images = torch.nn.functional.normalize(torch.randn(3, 3, generator=torch.Generator().manual_seed(2)), dim=1)
    images.requires_grad_(True)
    fn = build_loss(LossSection(name="khardest", margin=1.0, k=2))
    total = fn(score(images, images), torch.tensor([0, 1, 2]), memory=memory.scores(score, images, images))
    total.backward()
    assert images.grad is not None and images.grad.abs().sum() > 0 and old.grad is None


def test_loss_memory_is_refused_where_it_does_not_apply():
    from conftest import STT_DECODER, tiny_config
    from training.config import build_config

    with pytest.raises(ValueError, match="loss.memory: loss 'bir_pairwise'"):
        build_config(tiny_config(loss={"name": "bir_pairwise", "memory": 64}))
    with pytest.raises(ValueError, match="loss.memory applies to the retrieval trainer"):
        build_config(tiny_config(loss={"memory": 64}, decoder=STT_DECODER))
    with pytest.raises(ValueError, match="memory"):
        build_config(tiny_config(loss={"memory": -1}))
