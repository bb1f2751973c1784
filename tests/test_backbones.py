"""Image feature extractors: offline EfficientNet-Lite0, torchvision weights from a local file, multi-crop,
and the on-disk feature cache (never stale)."""
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import tiny_config
from training.config import build_config
from training.data.features import Compute, extract_features
from training.data.preprocess import Preprocess
from training.data.vocab import Vocabulary
from training.models.backbones import efficientnet_lite_weights_file
from training.models.factory import BACKBONES, build_backbone
from training.models.model import build_model

IN_PROCESS = Compute(workers=0, progress=False)     # decoded in this process, no progress bars


@pytest.mark.parametrize("variant,tensors,size", [("efficientnet_lite0", 296, 224), ("efficientnet_lite1", 386, 240),
                                                   ("efficientnet_lite2", 386, 260)])
def test_efficientnet_lite_offline_weights_map_onto_timm(variant, tensors, size):
    cfg = build_config({"image": {"backbone": variant, "image_size": size, "resize": size}}).image
    bb = build_backbone(cfg)
    source = torch.load(efficientnet_lite_weights_file(variant), map_location="cpu", weights_only=True)
    assert len(source) == tensors
    loaded = bb.module.state_dict()
    # first and last conv tensors are the package's, i.e. the mapping really loaded them
    assert torch.equal(loaded["conv_stem.weight"], source["_conv_stem.weight"])
    assert torch.equal(loaded["conv_head.weight"], source["_conv_head.weight"])
    assert bb.dim == 1280 and bb.preprocess.mean == (0.5, 0.5, 0.5) and bb.pretrained
    bb.module.eval()
    with torch.no_grad():
        out = bb.module(torch.zeros(2, 3, size, size).contiguous(memory_format=torch.channels_last))
    assert out.shape == (2, 1280) and torch.isfinite(out).all()


def test_efficientnet_lite_weights_of_another_variant_are_refused(tmp_path):
    wrong = tmp_path / "lite0.pth"
    torch.save(torch.load(efficientnet_lite_weights_file("efficientnet_lite0"), weights_only=True), wrong)
    cfg = build_config({"image": {"backbone": "efficientnet_lite2", "image_size": 260, "resize": 260,
                                  "weights": str(wrong)}}).image
    with pytest.raises(ValueError, match="efficientnet_lite2 weights have 296 tensors, the model 386"):
        build_backbone(cfg)


def test_torchvision_backbone_from_local_weights_file(tmp_path):
    import torchvision
    net = torchvision.models.resnet18(weights=None)
    torch.nn.init.constant_(net.conv1.weight, 0.01)
    path = tmp_path / "resnet18.pth"
    torch.save(net.state_dict(), path)
    cfg = build_config({"image": {"backbone": "resnet18", "weights": str(path)}}).image
    bb = build_backbone(cfg)
    assert bb.dim == 512 and torch.equal(bb.module.conv1.weight, net.conv1.weight)
    with torch.no_grad():
        assert bb.module.eval()(torch.randn(1, 3, 64, 64)).shape == (1, 512)


def test_missing_torchvision_weights_give_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))     # empty cache, and no network here
    cfg = build_config({"image": {"backbone": "resnet18"}}).image
    with pytest.raises(RuntimeError, match="image.weights"):
        build_backbone(cfg)


def test_registry_lists_paper_backbones():
    assert {"resnet152", "resnet50", "vgg19", "efficientnet_lite0", "efficientnet_lite1", "efficientnet_lite2", "smallcnn"} <= set(BACKBONES.names())


@pytest.mark.parametrize("crops", [1, 5, 10])
def test_multicrop_shapes(crops):
    pre = Preprocess(image_size=32, resize=40, crops=crops)
    px = pre.pixels(Image.new("RGB", (80, 60), (200, 10, 10)))
    assert px.shape == (crops, 3, 32, 32) and px.dtype == torch.uint8
    x = pre(Image.new("RGB", (80, 60), (200, 10, 10)))
    assert x.dtype == torch.float32 and x.shape == px.shape


def _images(folder, n):
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        p = folder / f"{i}.png"
        Image.new("RGB", (40, 40), (i * 20 % 255, 100, 50)).save(p)
        paths.append(p)
    return paths


def test_feature_cache_is_reused_and_never_stale(tmp_path):
    cfg = tiny_config()
    assert cfg.image.backbone == "smallcnn"
    model = build_model(cfg, Vocabulary.build(["a"])).eval()
    paths = _images(tmp_path / "img", 5)
    cache = tmp_path / "cache"
    first = np.array(extract_features(model, paths, cache_dir=cache, compute=IN_PROCESS))
    files = sorted(os.listdir(cache))
    assert len(files) == 2 and any(f.endswith(".json") for f in files)     # array + manifest
    again = extract_features(model, paths, cache_dir=cache, compute=IN_PROCESS)
    assert isinstance(again, np.memmap) and np.array_equal(first, again)
    assert sorted(os.listdir(cache)) == files                               # reused, nothing new written

    moved = tmp_path / "elsewhere"                                          # the same images copied elsewhere,
    moved.mkdir()                                                           # with new mtimes (a re-mount)...
    copies = [Path(shutil.copy(p, moved / p.name)) for p in paths]
    for c in copies:
        os.utime(c, ns=(10**18, 10**18))
    assert np.array_equal(extract_features(model, copies, cache_dir=cache, compute=IN_PROCESS), first)
    assert sorted(os.listdir(cache)) == files                               # ...still find their features
    reordered = np.array(extract_features(model, copies[::-1], cache_dir=cache, compute=IN_PROCESS))
    assert np.allclose(reordered, first[::-1], atol=1e-6)                   # rows follow the order of paths

    stat = os.stat(paths[2])
    Image.new("RGB", (40, 40), (0, 0, 255)).save(paths[2])                 # an image changes, even with its
    os.utime(paths[2], ns=(stat.st_atime_ns, stat.st_mtime_ns))             # old mtime kept...
    changed = np.array(extract_features(model, paths, cache_dir=cache, compute=IN_PROCESS))
    assert not np.array_equal(changed[2], first[2]) and np.allclose(changed[0], first[0], atol=1e-6)
    torch.nn.init.zeros_(model.backbone.fc[1].weight)                       # ...or the backbone changes
    torch.nn.init.zeros_(model.backbone.fc[1].bias)
    zeroed = extract_features(model, paths, cache_dir=cache, compute=IN_PROCESS)
    assert np.allclose(zeroed, 0)
    assert not any(f.endswith(".tmp") for f in os.listdir(cache))


def test_unreadable_image_names_the_file(tmp_path):
    cfg = tiny_config()
    model = build_model(cfg, Vocabulary.build(["a"])).eval()
    paths = _images(tmp_path / "img", 2)
    paths[1].write_bytes(b"not an image")
    with pytest.raises(RuntimeError, match="1.png"):
        extract_features(model, paths, cache_dir=tmp_path / "c", compute=IN_PROCESS)
