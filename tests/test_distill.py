"""Distillation (``loss.distill_from``, training/distill.py): the loss over a batch's similarities, the teachers'
tables as their ensemble's cosine, and a run that learns from trained teachers; what cannot be distilled is refused."""
import json

import pytest
import torch
import torch.nn.functional as F

from training.data.sources import ImageSource
from training.distill import Teachers, distillation_loss, teacher_captions, teacher_images
from training.models.config_schema import ConfigError

from conftest import STT_DECODER, tiny_config
# the frozen stand-in backbone registered for this module too (an autouse fixture, found by pytest here)
from test_views import _frozen_backbone, frozen_config  # noqa: F401

quiet = lambda *_: None  # noqa: E731


def _unit(*shape, seed=0):
    return F.normalize(torch.randn(*shape, generator=torch.Generator().manual_seed(seed)), dim=-1)


def test_the_loss_is_the_mean_of_both_directions_kl_scaled_by_tau():
    student, teacher = _unit(6, 8, seed=1) @ _unit(6, 8, seed=2).T, _unit(6, 8, seed=3) @ _unit(6, 8, seed=4).T
    tau = 0.1
    rows = F.kl_div(F.log_softmax(student / tau, 1), F.log_softmax(teacher / tau, 1), log_target=True,
                    reduction="sum")
    cols = F.kl_div(F.log_softmax(student.T / tau, 1), F.log_softmax(teacher.T / tau, 1), log_target=True,
                    reduction="sum")
    assert torch.isclose(distillation_loss(student, teacher, tau), tau * (rows + cols) / 2, atol=1e-5)
    assert torch.isclose(distillation_loss(student, teacher, tau, "mean"), tau * (rows + cols) / 12, atol=1e-6)
    assert distillation_loss(teacher, teacher, tau) == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError, match="one shape"):
        distillation_loss(student, teacher[:5], tau)


def test_its_gradient_on_a_cosine_is_q_minus_p_and_leaves_the_teacher_alone():
    teacher = torch.tensor([[0.9, 0.1], [0.1, 0.9]], requires_grad=True)
    student = torch.tensor([[0.5, 0.5], [0.5, 0.5]], requires_grad=True)
    distillation_loss(student, teacher, tau=0.1).backward()
    p = torch.softmax(teacher.detach() / 0.1, 1)
    # rows and columns each give (Q - P) / 2 here (the matrices are symmetric): Q is uniform
    assert torch.allclose(student.grad, torch.full((2, 2), 0.5) - p, atol=1e-5)
    assert student.grad[0, 0] < 0 < student.grad[0, 1]      # descent raises what the teacher ranks first
    assert teacher.grad is None


def test_the_teachers_tables_give_their_mean_cosine():
    img = [_unit(5, 4, seed=s) for s in (1, 2)]
    cap = [_unit(7, 4, seed=s) for s in (3, 4)]
    scale = 2 ** -0.5
    teachers = Teachers(torch.cat([t * scale for t in img], 1), torch.cat([t * scale for t in cap], 1))
    img_idx, cap_idx = torch.tensor([0, 3, 3]), torch.tensor([6, 0, 2])
    mean = (img[0][img_idx] @ cap[0][cap_idx].T + img[1][img_idx] @ cap[1][cap_idx].T) / 2
    assert torch.allclose(teachers.similarity(img_idx, cap_idx), mean, atol=1e-6)


def _trained(synth_small, out, **sections):
    from training.train import train

    train(frozen_config(**sections), synth_small, out, progress=False, log=quiet)
    return out / "model.pt"


@pytest.fixture(scope="module")
def teachers(synth_small, tmp_path_factory):
    """Two seeds of a frozen-backbone model with views: files a student can learn from."""
    root = tmp_path_factory.mktemp("teachers")
    return [_trained(synth_small, root / f"seed{s}", image={"train_views": "flip"}, train={"epochs": 2, "seed": s})
            for s in (0, 1)]


def test_a_teachers_images_are_its_views_averaged_before_its_head(teachers, synth_small, tmp_path):
    from training.models.checkpoint import load_model

    teacher = load_model(teachers[0])
    views = torch.randn(3, 2, teacher.cached_dim, generator=torch.Generator().manual_seed(0))
    table = teacher_images(teacher, ImageSource("views", views))
    with torch.no_grad():
        each = [F.normalize(teacher.project_features(views[:, v]), dim=-1) for v in range(2)]
    assert torch.allclose(table, F.normalize((each[0] + each[1]) / 2, dim=-1), atol=1e-5)
    one = teacher_images(teacher, ImageSource("features", views[:, 0]))
    assert torch.allclose(one, each[0], atol=1e-5)
    with pytest.raises(ConfigError, match="precomputed backbone features"):
        teacher_images(teacher, ImageSource("pixels", torch.zeros(2, 3, 32, 32, dtype=torch.uint8)))


def test_the_caption_table_is_cached_by_teacher_and_captions(teachers, tmp_path, monkeypatch):
    import training.distill as distill
    from training.inference.embedding import embed_texts
    from training.models.checkpoint import load_model

    teacher = load_model(teachers[0])
    captions = ["a dog runs on the grass", "two people on a beach"]
    first = teacher_captions(teacher, captions, tmp_path)
    direct = F.normalize(embed_texts(teacher, captions), dim=-1)
    assert torch.allclose(first, direct, atol=2e-3)                     # stored as float16
    assert len(list((tmp_path / distill.TEXT_CACHE).glob("*.pt"))) == 1

    def refuse(*_a, **_k):
        raise AssertionError("embedded again")
    monkeypatch.setattr(distill, "embed_texts", refuse)
    assert torch.equal(teacher_captions(teacher, captions, tmp_path), first)
    with pytest.raises(AssertionError, match="embedded again"):        # other captions: another key
        teacher_captions(teacher, captions[:1], tmp_path)


def test_a_student_learns_from_its_teachers(teachers, synth_small, tmp_path):
    from training.train import Trainer

    sections = dict(image={"train_views": "flip"}, train={"epochs": 2, "seed": 2})
    student = Trainer(frozen_config(**sections, loss={"name": "sum", "margin": 0.2,
                                                      "distill_from": [str(p) for p in teachers]}),
                      synth_small, tmp_path / "student", progress=False, log=quiet)
    student.run()
    log = [json.loads(line) for line in (tmp_path / "student" / "log.jsonl").read_text().splitlines()]
    assert all(r["distill_loss"] > 0 for r in log)
    assert student.teachers is not None
    n_images, n_captions = student.train_set.n_images, sum(len(r.captions) for r in student.train_set.images)
    assert student.teachers.images.shape[0] == n_images and student.teachers.captions.shape[0] == n_captions
    # a batch's targets are the two teachers' mean cosine: the tables' rows are unit vectors scaled by 1/sqrt(2)
    assert torch.allclose(student.teachers.images.norm(dim=1), torch.ones(n_images), atol=1e-4)

    # the same run without teachers has no such term, and a zero weight trains as without it
    plain = Trainer(frozen_config(**sections), synth_small, tmp_path / "plain", progress=False, log=quiet)
    plain.run()
    plain_log = [json.loads(line) for line in (tmp_path / "plain" / "log.jsonl").read_text().splitlines()]
    assert all("distill_loss" not in r for r in plain_log)
    zero = Trainer(frozen_config(**sections, loss={"name": "sum", "margin": 0.2, "distill_weight": 0.0,
                                                   "distill_from": [str(teachers[0])]}),
                   synth_small, tmp_path / "zero", progress=False, log=quiet)
    zero.run()
    zero_log = [json.loads(line) for line in (tmp_path / "zero" / "log.jsonl").read_text().splitlines()]
    assert [r["loss"] for r in zero_log] == [r["loss"] for r in plain_log]
    assert [r["val"]["rsum"] for r in log] != [r["val"]["rsum"] for r in plain_log]


def test_what_cannot_be_distilled_is_refused(teachers, synth_small, tmp_path, tiny_model_path):
    from training.train import Trainer

    def student(cfg):
        return Trainer(cfg, synth_small, tmp_path / "s", progress=False, log=quiet)

    with pytest.raises(ConfigError, match="distil_from"):
        frozen_config(loss={"distil_from": [str(teachers[0])]})
    from training.models.checkpoint import load_model, save_model
    from training.models.ensemble import EnsembleEmbedding

    pair = EnsembleEmbedding([load_model(p) for p in teachers], [1.0, 1.0], [str(p) for p in teachers])
    save_model(pair, tmp_path / "pair.pt")
    with pytest.raises(ConfigError, match="is an ensemble; name its member files"):
        student(frozen_config(loss={"distill_from": [str(tmp_path / "pair.pt")]})).run()
    with pytest.raises(ConfigError, match="no model file"):
        student(frozen_config(loss={"distill_from": [str(tmp_path / "missing.pt")]})).run()
    # a teacher that reads other features (a trainable small CNN on pixels) than the student's cache
    with pytest.raises(ConfigError, match="image.backbone"):
        student(frozen_config(loss={"distill_from": [str(tiny_model_path)]})).run()
    # a student trained on pixels has no feature cache the teachers could read
    with pytest.raises(ConfigError, match="precomputed backbone features"):
        student(tiny_config(loss={"distill_from": [str(teachers[0])]})).run()
    with pytest.raises(ValueError, match="computes its own batch loss"):
        from training.stt import STTTrainer
        STTTrainer(frozen_config(decoder=STT_DECODER, loss={"distill_from": [str(teachers[0])]}), synth_small,
                   tmp_path / "stt", progress=False, log=quiet)
    with pytest.raises(ValueError, match="compares each pair"):
        student(frozen_config(loss={"name": "mse", "distill_from": [str(teachers[0])]}))
