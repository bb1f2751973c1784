"""The concept head (training/models/concepts.py: ConSE eq. 1 with a typicality gate) and its fit
(training/fit_concepts.py): the fusion as written, the gate's direction, identity until fitted, the config rules,
save and reload, and the command that fits a trained model."""
import pytest
import torch
import torch.nn.functional as F

from service.cli import main as cli_main
from training.fit_concepts import fit, spherical_kmeans, with_concepts
from training.config import build_config
from training.data.vocab import Vocabulary
from training.inference.querybank import carried
from training.models.checkpoint import load_checkpoint, load_model, save_model, save_slim
from training.models.config_schema import ConfigError
from training.models.model import build_model

from conftest import tiny_config

NAMES = [f"thing{i}" for i in range(1000)]


def lite0_config(**concepts):
    return build_config({"image": {"backbone": "efficientnet_lite0", "image_size": 64, "resize": 64},
                         "text": {"encoder": "gru", "word_dim": 16, "hidden": 32}, "model": {"embed_dim": 32},
                         "concepts": {"enabled": True, "prototypes": 8, "bank_template": "a {}", **concepts}})


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return build_model(lite0_config(), Vocabulary.build(["a dog runs on grass", "a cat"])).eval()


def fitted(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    feats = torch.rand(60, model.feature_dim, generator=g)
    fit(model, feats, log=lambda *_: None, names=NAMES)
    return feats


def test_unfitted_head_is_the_identity(model):
    plain = build_model(lite0_config(enabled=False), model.vocab)
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("concepts.")})
    plain.eval()
    fresh = with_concepts(plain, {"prototypes": 8})
    feats = torch.rand(3, plain.feature_dim)
    with torch.no_grad():
        torch.testing.assert_close(fresh.embed_features(feats), plain.embed_features(feats))


def test_fused_embedding_is_conse_eq1_added_by_the_gate(model):
    feats = fitted(model)
    head = model.concepts
    x = feats[:4] * 3
    with torch.no_grad():
        probs = F.softmax(head.classifiers[0](x) / head.cfg.class_temperature, dim=-1)   # one backbone: its own
        top = probs.topk(head.cfg.top_k)
        c = (top.values[..., None] * head.class_embeddings[top.indices]).sum(1) / top.values.sum(-1, keepdim=True)
        r = (F.normalize(x, dim=-1) @ head.prototypes.t()).topk(head.cfg.neighbours).values.mean(-1)
        r0, tau = head.gate
        g = head.cfg.weight * torch.sigmoid((r0 - r) / tau)
        unit = F.normalize(model.image_proj(x), dim=-1)
        expected = F.normalize(unit + g[:, None] * c, dim=-1)
        torch.testing.assert_close(model.embed_features(x), expected)
    assert bool(head.fitted) and head.class_embeddings.norm(dim=-1).sub(1).abs().max() < 1e-5


def test_gate_opens_for_photos_unlike_the_training_photos(model):
    feats = fitted(model)
    head = model.concepts
    typical = head.prototypes[:3] * 5                      # on a prototype: r = 1
    unlike = torch.zeros(3, model.feature_dim)
    unlike[:, :7] = 1.0                                    # a direction no training photo has
    with torch.no_grad():
        g_typical, g_unlike = head.gate_weights(typical), head.gate_weights(unlike)
        r_held = head.typicality(feats[::6])
    assert (g_typical < 0.05 * head.cfg.weight).all()
    assert (g_unlike > 0.95 * head.cfg.weight).all()
    # r₀ is the configured quantile of the held-out photos' typicality
    assert float(head.gate[0]) == pytest.approx(float(torch.quantile(r_held, head.cfg.quantile)), abs=1e-5)


def test_spherical_kmeans_finds_separated_clusters():
    g = torch.Generator().manual_seed(1)
    centres = F.normalize(torch.randn(4, 16, generator=g), dim=-1)
    points = torch.cat([c + 0.01 * torch.randn(25, 16, generator=g) for c in centres])
    found = spherical_kmeans(points, 4, seed=0)
    assert (found @ centres.t()).max(0).values.min() > 0.99


def test_fit_refuses_too_few_photos_and_wrong_widths(model):
    with pytest.raises(ValueError, match="concepts.prototypes"):
        fit(model, torch.rand(9, model.feature_dim), log=lambda *_: None, names=NAMES)
    with pytest.raises(ValueError, match="backbone features"):
        fit(model, torch.rand(60, 7), log=lambda *_: None, names=NAMES)


def test_config_rules_name_what_is_wrong():
    with pytest.raises(ConfigError, match="concepts.wieght"):
        build_config({"concepts": {"wieght": 0.5}})
    with pytest.raises(ConfigError, match="concepts.enabled needs"):
        build_config({"image": {"backbone": "efficientnet_lite0"}, "decoder": {"enabled": True},
                      "concepts": {"enabled": True}})
    cfg = tiny_config(concepts={"enabled": True})                 # a small CNN has no ImageNet classifier
    with pytest.raises(ValueError, match="classifier"):
        build_model(cfg, Vocabulary.build(["a dog"]))


def test_fitted_head_survives_save_and_slim_reload(model, tmp_path):
    fitted(model, seed=3)
    feats = torch.rand(2, model.feature_dim)
    with torch.no_grad():
        want = model.embed_features(feats)
    full, slim = tmp_path / "full.pt", tmp_path / "slim.pt"
    save_model(model, full)
    save_slim(model, slim)
    kept = load_checkpoint(slim)["state_dict"]
    assert "concepts.class_embeddings" in kept and "concepts.classifiers.0.weight" not in kept   # from the package
    for path in (full, slim):
        with torch.no_grad():
            torch.testing.assert_close(load_model(path).embed_features(feats), want)


def test_train_fits_the_head_and_the_bank_names_the_classes(synth_small, tmp_path):
    from training.train import train

    cfg = build_config({"image": {"backbone": "efficientnet_lite0", "image_size": 64, "resize": 64},
                        "text": {"encoder": "gru", "word_dim": 16, "hidden": 32}, "model": {"embed_dim": 32},
                        "loss": {"name": "sum"}, "train": {"epochs": 1, "batch_size": 16, "workers": 0},
                        "concepts": {"enabled": True, "prototypes": 4, "bank_template": "a {}"},
                        "querybank": {"captions": 20, "images": 10}})
    summary = train(cfg, synth_small, tmp_path, progress=False, log=lambda *_: None)
    model = load_model(tmp_path / "model.pt")
    assert bool(model.concepts.fitted) and summary["concepts"]["prototypes"] == 4
    bank = carried(model)
    assert len(bank["captions"]) == 20 + 1000 and "a tabby" in bank["captions"]
    # the command refits a trained model (here with another weight), in place, keeping its bank's size
    assert cli_main(["concepts", "--model", str(tmp_path / "model.pt"), "--data", str(synth_small),
                     "--set", "concepts.weight=0.5", "--set", "concepts.prototypes=4"]) == 0
    again = load_model(tmp_path / "model.pt")
    assert again.cfg.concepts.weight == 0.5 and bool(again.concepts.fitted)
    assert len(carried(again)["captions"]) == 1020
    assert cli_main(["concepts", "--model", str(tmp_path / "model.pt"), "--data", str(synth_small),
                     "--set", "weight=1"]) == 2
