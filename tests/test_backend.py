"""The image tower's inference backend (training/inference/backend.py): features equal to eager PyTorch's (float32
closely, bf16 loosely) and everything above the backbones fed exactly the backend's features; the fallback to
eager on any failure, in one log line; the cache keyed by the tower's fingerprint; the flag and the environment
variable; and the indexer, query by example, video frames and the service's image routes running on it."""
from __future__ import annotations

import copy
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from index.gallery import Gallery
from index.video_writer import write_video
from service.cli import build_parser
from service.cli import main as cli_main
from training.config import build_config
from training.data.preprocess import ZOOM, MirroredViews
from training.data.vocab import Vocabulary
from training.inference import backend as backend_mod
from training.inference.backend import (BACKENDS, Backend, attached, backend_choice, backend_of, eager_reason,
                                        use_backend)
from training.inference.embedding import embed_pixels, pixel_features
from training.models.checkpoint import load_model, save_model
from training.models.ensemble import EnsembleEmbedding
from training.models.model import build_model

from conftest import tiny_config
from server_process import wait_ready

FLOAT32 = ("openvino", "onnxruntime")


def lite0_model(seed: int = 0):
    """EfficientNet-Lite0 (its shipped ImageNet weights) at 64 px under a small text tower: a frozen pretrained
    backbone, what a backend runs, converted in seconds."""
    torch.manual_seed(seed)
    cfg = build_config({"image": {"backbone": "efficientnet_lite0", "image_size": 64, "resize": 72},
                        "text": {"encoder": "gru", "word_dim": 16, "hidden": 32}, "model": {"embed_dim": 32}})
    return build_model(cfg, Vocabulary.build(["a red circle", "a blue square"])).eval()


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("backends")


@pytest.fixture(scope="module")
def model():
    return lite0_model()


@pytest.fixture(scope="module")
def pixels():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 256, (5, 1, 3, 64, 64), dtype=torch.uint8, generator=g)


def _cosines(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.cosine_similarity(a.float(), b.float(), dim=-1)


# --- the features ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", FLOAT32)
def test_float32_backends_give_eager_features(model, pixels, cache, name):
    use_backend(model, "eager")
    features, embeddings = pixel_features(model, pixels), embed_pixels(model, pixels)
    try:
        assert use_backend(model, name, cache) == name and attached(model) == name
        torch.testing.assert_close(pixel_features(model, pixels), features, atol=1e-3, rtol=1e-3)
        torch.testing.assert_close(embed_pixels(model, pixels), embeddings, atol=1e-4, rtol=1e-4)
    finally:
        use_backend(model, "eager")


def test_native_bf16_reads_openvino_and_says_no_without_it(monkeypatch, model, tmp_path):
    native = backend_mod.native_bf16()
    assert native == ("BF16" in backend_mod.openvino().Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
    if not native:      # the bf16 backend refuses, and the tower falls back to eager (one log line)
        assert use_backend(model, "openvino-bf16", tmp_path) == "eager"
    monkeypatch.setattr(backend_mod, "_CORE", None)

    def missing():
        raise ImportError("No module named 'openvino'")
    monkeypatch.setattr(backend_mod, "openvino", missing)
    assert backend_mod.native_bf16() is False


@pytest.mark.skipif(not backend_mod.native_bf16(), reason="this CPU has no native bf16 (OpenVINO's BF16 capability)")
def test_bf16_backend_gives_close_features(model, pixels, cache):
    use_backend(model, "eager")
    features, embeddings = pixel_features(model, pixels), embed_pixels(model, pixels)
    try:
        assert use_backend(model, "openvino-bf16", cache) == "openvino-bf16"
        got = pixel_features(model, pixels)
        assert not torch.equal(got, features)                       # bf16 really: not the float32 numbers
        assert _cosines(got, features).min() > 0.99
        assert _cosines(embed_pixels(model, pixels), embeddings).min() > 0.99
    finally:
        use_backend(model, "eager")


def test_everything_above_the_backbones_reads_exactly_the_backends_features(model, pixels, cache):
    """The projection (and a concept head, and the normalisation) run in PyTorch over the very numbers the backend
    computed; the views of a photo are averaged as the model averages them."""
    assert use_backend(model, "openvino", cache) == "openvino"
    try:
        backend = backend_of(model)
        assert backend is not None
        features = backend.features(pixels)
        assert torch.equal(pixel_features(model, pixels), features)
        assert torch.equal(embed_pixels(model, pixels), model.embed_features(features).float())
        views = torch.stack([MirroredViews(model.preprocess, zoom=ZOOM).pixels(Image.fromarray(
            np.random.default_rng(i).integers(0, 256, (90, 120, 3), dtype=np.uint8))) for i in range(3)])
        assert views.shape[1] == 4
        per_view = backend.features(views.flatten(0, 1))
        assert torch.allclose(pixel_features(model, views), per_view.view(3, 4, -1).mean(1))
        use_backend(model, "eager")
        torch.testing.assert_close(pixel_features(model, views), per_view.view(3, 4, -1).mean(1), atol=1e-3,
                                   rtol=1e-3)
    finally:
        use_backend(model, "eager")


def test_the_graph_normalises_the_pixels_as_the_preprocessing_does():
    """The tower takes uint8 pixels and normalises them in the graph (pixel_affine): for one backbone per channel;
    for stacked backbones of other sizes per pixel too, each member's padding left at 0 as StackedPreprocess
    leaves it."""
    from training.data.preprocess import Preprocess, StackedPreprocess

    g = torch.Generator().manual_seed(3)
    for pre in (Preprocess(image_size=24, resize=24),
                StackedPreprocess((Preprocess(image_size=20, resize=20, mean=(0.5,) * 3, std=(0.5,) * 3),
                                   Preprocess(image_size=16, resize=16)))):
        scale, shift = backend_mod.pixel_affine(pre)
        assert scale.shape[1:] == ((1, 1) if isinstance(pre, Preprocess) else (pre.image_size,) * 2)
        x = torch.randint(0, 256, (3, pre.channels, pre.image_size, pre.image_size), dtype=torch.uint8, generator=g)
        torch.testing.assert_close(x.float() * scale + shift, pre.normalize(x), atol=1e-6, rtol=0)
    if isinstance(pre, StackedPreprocess):
        assert bool((scale[3:, 16:, :] == 0).all() and (shift[3:, 16:, :] == 0).all())

    class Squared(Preprocess):
        def normalize(self, pixels):
            return pixels.float() ** 2
    with pytest.raises(ValueError, match="not elementwise affine"):
        backend_mod.pixel_affine(Squared(image_size=8, resize=8))


def test_a_backend_takes_pixels_not_normalised_images(model, pixels, cache):
    assert use_backend(model, "openvino", cache) == "openvino"
    try:
        with pytest.raises(TypeError, match="uint8 pixels"):
            backend_of(model).features(model.preprocess.normalize(pixels))
    finally:
        use_backend(model, "eager")


@pytest.mark.parametrize("prepare", ["latency", "throughput"])
def test_one_row_and_a_batch_give_the_same_features_either_way_prepared(model, pixels, cache, prepare):
    """OpenVINO runs one row on all its threads and a batch one row per CPU stream; whichever is compiled at load,
    the other compiles on its first use, and a row's features do not depend on the batch it came in."""
    assert use_backend(model, "openvino", cache, prepare=prepare) == "openvino"
    try:
        backend = backend_of(model)
        batch = backend.features(pixels)
        alone = torch.cat([backend.features(pixels[i:i + 1]) for i in range(len(pixels))])
        torch.testing.assert_close(alone, batch, atol=1e-5, rtol=1e-5)
        assert batch.shape == (len(pixels), model.feature_dim)
    finally:
        use_backend(model, "eager")
    with pytest.raises(ValueError, match="prepare must be one of latency, throughput"):
        use_backend(model, "openvino", cache, prepare="fast")


def test_compiled_graphs_are_kept_and_a_damaged_one_is_compiled_again(model, pixels, tmp_path):
    expected = pixel_features(model, pixels)
    assert use_backend(model, "openvino", tmp_path) == "openvino"
    try:
        pixel_features(model, pixels)                                # the batch way compiled too
        compiled = sorted((backend_of(model).path / "compiled").iterdir())
        assert compiled                                              # OpenVINO's cache beside the graph
        for blob in compiled:                                        # a process died while writing them
            blob.write_bytes(blob.read_bytes()[:100])
        assert use_backend(model, "openvino", tmp_path) == "openvino"
        torch.testing.assert_close(pixel_features(model, pixels), expected, atol=1e-3, rtol=1e-3)
        torch.testing.assert_close(pixel_features(model, pixels[:1]), expected[:1], atol=1e-3, rtol=1e-3)
    finally:
        use_backend(model, "eager")


def test_the_load_after_a_conversion_reads_the_graph_its_check_compiled(model, pixels, tmp_path):
    """The conversion's check compiles both ways of running the graph into the converted folder's cache: the load
    that follows, and the next process's, read them back instead of compiling them again."""
    for prepare, hint in (("throughput", "THROUGHPUT"), ("latency", "LATENCY")):
        root = tmp_path / prepare
        try:
            assert use_backend(model, "openvino", root, prepare=prepare) == "openvino"
            assert backend_of(model).converted                       # converted by this very call…
            assert backend_of(model).run.from_cache == {hint: True}  # …and its graph read back, not compiled again
            assert list((backend_of(model).path / "compiled").glob("*.blob"))
        finally:
            use_backend(model, "eager")


def test_an_ensemble_runs_its_members_backbones_as_one_tower(model, pixels, cache):
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin.image_proj.apply(lambda m: m.weight.mul_(-1) if isinstance(m, torch.nn.Linear) else None)
    ensemble = EnsembleEmbedding([model, twin], [1.0, 0.5], ["a", "b"]).eval()
    expected = embed_pixels(ensemble, pixels)
    assert use_backend(ensemble, "openvino", cache) == "openvino"
    torch.testing.assert_close(embed_pixels(ensemble, pixels), expected, atol=1e-4, rtol=1e-4)


# --- choosing, falling back -----------------------------------------------------------------------------------

def _backend_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "jointspace.backend" and r.levelno >= logging.WARNING]


@pytest.mark.parametrize("name", ["auto", "openvino", "onnxruntime"])
def test_a_failed_conversion_falls_back_to_eager_in_one_log_line(model, pixels, tmp_path, monkeypatch, caplog,
                                                                 name):
    def broken(*_args, **_kwargs):
        raise RuntimeError("the converter broke")

    monkeypatch.setattr(backend_mod, "_convert", broken)
    expected = embed_pixels(model, pixels)
    with caplog.at_level(logging.INFO, logger="jointspace.backend"):
        assert use_backend(model, name, tmp_path) == "eager"
    lines = _backend_lines(caplog)
    assert len(lines) == 1 and "the converter broke" in lines[0] and "eager PyTorch" in lines[0], lines
    assert attached(model) == "eager" and torch.equal(embed_pixels(model, pixels), expected)
    assert not list(tmp_path.iterdir())                              # nothing half-written is left behind


def test_auto_takes_the_next_backend_when_one_does_not_load(model, pixels, tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(__import__("sys").modules, "openvino", None)        # `import openvino` fails
    with caplog.at_level(logging.INFO, logger="jointspace.backend"):
        assert use_backend(model, "auto", tmp_path) == "onnxruntime"
    try:
        assert not _backend_lines(caplog)
        assert any("openvino" in r.getMessage() and "onnxruntime" in r.getMessage() for r in caplog.records)
    finally:
        use_backend(model, "eager")


def test_a_conversion_that_disagrees_with_eager_is_not_kept(model, tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(backend_mod.AGREEMENT, "onnxruntime", 1.5)          # no conversion can agree this well
    with caplog.at_level(logging.INFO, logger="jointspace.backend"):
        assert use_backend(model, "onnxruntime", tmp_path) == "eager"
    assert "disagrees with eager PyTorch" in _backend_lines(caplog)[0] and not list(tmp_path.iterdir())


def test_models_a_backend_does_not_run_stay_eager(model, tmp_path, caplog):
    trained_backbone = build_model(tiny_config(), Vocabulary.build(["a red circle"])).eval()     # smallcnn
    assert "trains" in eager_reason(trained_backbone)
    with caplog.at_level(logging.INFO, logger="jointspace.backend"):
        assert use_backend(trained_backbone, "auto", tmp_path) == "eager"
        assert not _backend_lines(caplog)                            # auto: eager is the choice, not a failure
        assert use_backend(trained_backbone, "openvino", tmp_path) == "eager"
    assert len(_backend_lines(caplog)) == 1 and "trains" in _backend_lines(caplog)[0]
    assert "runs on meta" in eager_reason(copy.deepcopy(model).to("meta"))      # CUDA alike: not a CPU
    attention = copy.deepcopy(model)
    attention.attention = torch.nn.Identity()
    assert "attention" in eager_reason(attention)
    assert eager_reason(model) is None and not list(tmp_path.iterdir())


# --- the cache ------------------------------------------------------------------------------------------------

def test_the_cache_is_keyed_by_the_towers_fingerprint(model, tmp_path):
    assert use_backend(model, "openvino", tmp_path) == "openvino"
    first = backend_of(model)
    assert first is not None and first.converted and first.path.parent == tmp_path
    assert use_backend(model, "openvino-bf16" if backend_mod.native_bf16() else "openvino", tmp_path) != "eager"
    again = backend_of(model)
    assert again is not None and not again.converted and again.path == first.path     # one IR, either precision

    retrained = copy.deepcopy(model)                                 # the layers above the backbone changed
    with torch.no_grad():
        retrained.image_proj.apply(lambda m: m.weight.add_(1) if isinstance(m, torch.nn.Linear) else None)
    assert use_backend(retrained, "openvino", tmp_path) == "openvino"
    assert not backend_of(retrained).converted and backend_of(retrained).path == first.path

    changed = copy.deepcopy(model)                                   # another backbone: converted again
    with torch.no_grad():
        next(changed.backbone.parameters()).mul_(0.5)
    assert use_backend(changed, "openvino", tmp_path) == "openvino"
    assert backend_of(changed).converted and backend_of(changed).path != first.path
    assert sorted(p.name.split("-")[0] for p in tmp_path.iterdir()) == ["openvino", "openvino"]
    for m in (model, retrained, changed):
        use_backend(m, "eager")


def test_the_cache_lives_under_jointspace_cache(model, tmp_path, monkeypatch):
    monkeypatch.setenv("JOINTSPACE_CACHE", str(tmp_path))
    assert backend_mod.graph_cache() == tmp_path / "backends"
    try:
        assert use_backend(model, "onnxruntime") == "onnxruntime"
        assert backend_of(model).path.parent == tmp_path / "backends"
        assert (backend_of(model).path / "tower.onnx").is_file()
    finally:
        use_backend(model, "eager")


# --- feature extraction over a data set (the feature cache) ----------------------------------------------------

def test_feature_extraction_runs_on_a_float32_backend_with_eagers_features(model, tmp_path, monkeypatch):
    from training.data.features import Compute, extract_features
    from training.inference.backend import extraction_tower

    monkeypatch.setenv("JOINTSPACE_CACHE", str(tmp_path / "cache"))
    rng = np.random.default_rng(0)
    paths = []
    for i in range(5):
        paths.append(tmp_path / f"{i}.png")
        Image.fromarray(rng.integers(0, 255, (80, 96, 3), dtype=np.uint8)).save(paths[-1])
    trained = copy.deepcopy(model).train()
    trained.backbone.eval()                                   # mixed modes, as a trainer holds them
    modes = [m.training for m in trained.modules()]
    views = MirroredViews(trained.preprocess, zoom=ZOOM)
    for per_view, pre in ((False, None), (True, views)):
        on_backend = extract_features(trained, paths, cache_dir=tmp_path / f"b{per_view}", preprocess=pre,
                                      per_view=per_view, compute=Compute(progress=False, tower=extraction_tower))
        eager = extract_features(trained, paths, cache_dir=tmp_path / f"e{per_view}", preprocess=pre,
                                 per_view=per_view, compute=Compute(progress=False))
        assert on_backend.shape == eager.shape == ((5, 4, 1280) if per_view else (5, 1280))
        assert np.abs(np.array(on_backend) - np.array(eager)).max() <= 1e-4 * np.abs(np.array(eager)).max()
    assert [m.training for m in trained.modules()] == modes   # the conversion traced it in eval mode: restored
    assert attached(trained) == "eager"                       # nothing attached to the model
    assert (tmp_path / "cache" / "backends").is_dir()         # the graph cached where the index's are
    assert extraction_tower(trained) is not None
    monkeypatch.setenv("JOINTSPACE_BACKEND", "eager")
    assert extraction_tower(trained) is None                  # eager when asked
    monkeypatch.delenv("JOINTSPACE_BACKEND")
    assert extraction_tower(build_model(tiny_config(), Vocabulary.build(["a red circle"]))) is None  # trains


# --- the flag and the environment variable -------------------------------------------------------------------

def test_the_name_comes_from_the_flag_else_the_environment(monkeypatch):
    monkeypatch.delenv("JOINTSPACE_BACKEND", raising=False)
    assert backend_choice(None) == "auto"
    monkeypatch.setenv("JOINTSPACE_BACKEND", "onnxruntime")
    assert backend_choice(None) == "onnxruntime" and backend_choice("eager") == "eager"
    monkeypatch.setenv("JOINTSPACE_BACKEND", "tensorrt")
    with pytest.raises(ValueError, match=r"unknown inference backend 'tensorrt' \(JOINTSPACE_BACKEND\); known: "
                                         r"auto, eager, openvino, openvino-bf16, onnxruntime"):
        backend_choice(None)


def test_the_commands_take_backend(monkeypatch, capsys):
    from service.settings import Settings

    parser = build_parser()
    for argv in (["index", "build", "--images", "x", "--out", "y"], ["index", "add", "--index", "x"],
                 ["index", "sync", "--images", "x", "--index", "y"], ["index", "search", "--index", "x", "--text", "a"],
                 ["serve", "--index", "x"]):
        assert parser.parse_args([*argv, "--backend", "openvino-bf16"]).backend == "openvino-bf16"
        assert parser.parse_args(argv).backend is None
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args([*argv, "--backend", "tensorrt"])
        assert exit_info.value.code == 2 and "invalid choice: 'tensorrt'" in capsys.readouterr().err
    monkeypatch.setenv("JOINTSPACE_BACKEND", "onnxruntime")
    assert Settings().backend == "onnxruntime"
    monkeypatch.setenv("JOINTSPACE_BACKEND", "tensorrt")
    with pytest.raises(ValueError, match="backend"):
        Settings()


def test_an_unknown_backend_in_the_environment_is_refused_before_the_model_loads(tmp_path, monkeypatch, capsys):
    import training.models.checkpoint as checkpoint

    (tmp_path / "model.pt").write_bytes(b"never read")
    monkeypatch.setenv("JOINTSPACE_BACKEND", "tensorrt")
    monkeypatch.setattr(checkpoint, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    assert cli_main(["index", "build", "--model", str(tmp_path / "model.pt"), "--images", str(tmp_path),
                     "--out", str(tmp_path / "index")]) == 2
    err = capsys.readouterr().err
    assert "jointspace index build: error: unknown inference backend 'tensorrt' (JOINTSPACE_BACKEND)" in err


# --- the indexer, query by example, video frames and the service run on it --------------------------------------

@pytest.fixture(scope="module")
def lite0_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("lite0") / "model.pt"
    save_model(lite0_model(), path)
    return path


@pytest.fixture(scope="module")
def gallery_folder(synth_small, tmp_path_factory):
    folder = tmp_path_factory.mktemp("backend_gallery") / "media"
    folder.mkdir()
    for p in sorted((synth_small / "images").glob("*.jpg"))[:6]:
        shutil.copy(p, folder / p.name)
    rng = np.random.default_rng(0)
    write_video(folder / "clip.mp4", [rng.integers(0, 256, (64, 64, 3), dtype=np.uint8) for _ in range(8)], fps=4)
    return folder


@pytest.fixture
def counted(monkeypatch):
    """How many batches of images went through a backend (any), by backend name."""
    calls: dict[str, int] = {}
    features = Backend.features

    def spy(self, images):
        calls[self.name] = calls.get(self.name, 0) + 1
        return features(self, images)
    monkeypatch.setattr(Backend, "features", spy)
    return calls


def _vectors(index: Path) -> np.ndarray:
    gallery = Gallery.load(index)
    try:
        return np.stack([gallery.image_vector(r.id) for r in gallery.meta.all_images()])
    finally:
        gallery.close()


def test_the_indexer_and_query_by_example_run_on_the_backend(lite0_path, gallery_folder, tmp_path, counted, capsys):
    common = ["--model", str(lite0_path), "--images", str(gallery_folder), "--quiet", "--workers", "0",
              "--no-querybank"]
    assert cli_main(["index", "build", *common, "--out", str(tmp_path / "eager"), "--backend", "eager"]) == 0
    assert not counted
    assert cli_main(["index", "build", *common, "--out", str(tmp_path / "openvino"), "--backend", "openvino"]) == 0
    assert counted.get("openvino", 0) >= 2                           # the photos' batches and the video's frames
    assert "6 images, 1 videos" in capsys.readouterr().out
    eager, converted = _vectors(tmp_path / "eager"), _vectors(tmp_path / "openvino")
    assert eager.shape == converted.shape and np.abs(eager - converted).max() < 1e-4

    before = counted["openvino"]
    photo = next(gallery_folder.glob("*.jpg"))
    assert cli_main(["index", "search", "--index", str(tmp_path / "openvino"), "--model", str(lite0_path),
                     "--image", str(photo), "--backend", "openvino", "--json"]) == 0
    assert counted["openvino"] == before + 1
    clip = shutil.copy(gallery_folder / "clip.mp4", tmp_path / "another_clip.mp4")      # the folder's is indexed
    assert cli_main(["index", "add", "--index", str(tmp_path / "openvino"), "--model", str(lite0_path),
                     str(clip), "--quiet", "--workers", "0", "--backend", "onnxruntime"]) == 0
    assert counted.get("onnxruntime", 0) >= 1


def test_the_services_image_routes_run_on_the_backend(lite0_path, gallery_folder, tmp_path, counted, monkeypatch):
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import Settings

    index = tmp_path / "index"
    assert cli_main(["index", "build", "--model", str(lite0_path), "--images", str(gallery_folder), "--out",
                     str(index), "--quiet", "--workers", "0", "--no-querybank", "--backend", "eager"]) == 0
    monkeypatch.setenv("JOINTSPACE_BACKEND", "openvino")
    settings = Settings(model=str(lite0_path), index=str(index), reload_interval_s=0)
    with TestClient(create_app(settings)) as client:
        wait_ready(client)
        assert client.get("/readyz").status_code == 200
        warmed = counted.get("openvino", 0)
        assert warmed >= 1                                           # the warm-up ran on it too
        photo = next(gallery_folder.glob("*.jpg"))
        upload = {"image": (photo.name, photo.read_bytes(), "image/jpeg")}
        assert client.post("/v1/search/captions", files=upload).status_code == 200          # the image route
        assert counted["openvino"] == warmed + 1
        assert client.post("/v1/search/images", files=upload, data={"add": "red"}).status_code == 200   # by example
        assert counted["openvino"] == warmed + 2


def test_a_cache_that_cannot_be_written_converts_for_the_process_alone(model, pixels, tmp_path, monkeypatch):
    monkeypatch.setattr(backend_mod, "_writable", lambda root: False)
    expected = pixel_features(model, pixels)
    try:
        assert use_backend(model, "onnxruntime", tmp_path / "read-only") == "onnxruntime"
        assert backend_of(model).converted and not backend_of(model).path.exists()     # nothing kept anywhere
        torch.testing.assert_close(pixel_features(model, pixels), expected, atol=1e-3, rtol=1e-3)
    finally:
        use_backend(model, "eager")
    assert not (tmp_path / "read-only").exists()


def test_bulk_batches_are_sized_for_the_cores(monkeypatch):
    from training.inference import embedding as embed

    assert embed.default_batch_size("cuda") == 64
    for cores, views in ((1, 8), (2, 16), (4, 32), (16, 64)):
        monkeypatch.setattr(embed, "usable_cores", lambda cores=cores: cores)
        assert embed.default_batch_size("cpu") == views
    parser = build_parser()
    assert parser.parse_args(["index", "build", "--images", "x", "--out", "y"]).batch_size is None     # by device
    assert parser.parse_args(["index", "add", "--index", "x", "--batch-size", "8"]).batch_size == 8


def test_openvino_is_used_without_its_usage_telemetry(tmp_path):
    """OpenVINO's converter would report its import and each conversion to Intel (and write under ~/intel): the
    backend imports it with its no-op telemetry stub instead."""
    import os
    import subprocess
    import sys

    script = ("import sys, torch\n"
              "from training.inference.backend import openvino\n"
              "ov = openvino()\n"
              "ov.convert_model(torch.jit.trace(torch.nn.Linear(3, 2).eval(), torch.zeros(1, 3)),"
              " example_input=torch.zeros(1, 3))\n"
              "assert sys.modules.get('openvino_telemetry') is None\n")
    env = {**os.environ, "HOME": str(tmp_path), "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=300)
    assert not (tmp_path / "intel").exists()


# --- one interface, a class per backend; the CUDA tower's logic, run on the CPU --------------------------------

def test_every_backend_is_a_class_of_one_interface_registered_by_name():
    from training.inference import names

    assert set(backend_mod.REGISTRY) == set(BACKENDS) - {"auto"} and BACKENDS == names.BACKENDS
    for name, cls in backend_mod.REGISTRY.items():
        assert issubclass(cls, Backend) and cls.name == name and backend_mod.backend_class(name) is cls
        assert cls.kind and cls.device_type in ("cpu", "cuda") and isinstance(cls.converter_version(), str)
        for method in ("open", "forward", "converter_version"):           # each implements what it runs
            assert getattr(cls, method) is not getattr(Backend, method), (name, method)
        if name != "eager":
            assert cls.file and cls.export is not Backend.export and name in backend_mod.AGREEMENT
    assert backend_mod.OpenVINOBf16.kind == backend_mod.OpenVINO.kind     # one IR, either precision
    with pytest.raises(ValueError, match="unknown inference backend 'tensorrt'; known: eager, openvino"):
        backend_mod.backend_class("tensorrt")


def test_auto_tries_what_it_tried_on_a_cpu_and_the_cuda_tower_on_cuda():
    assert backend_mod.auto_backends("cpu") == ("openvino", "onnxruntime") == backend_mod.AUTO
    assert backend_mod.auto_backends(torch.device("cuda", 0)) == ("cuda",)


def test_auto_on_a_cpu_picks_the_same_backend_as_before(model, cache):
    try:
        assert use_backend(model, "auto", cache) == "openvino" and isinstance(backend_of(model), backend_mod.OpenVINO)
    finally:
        use_backend(model, "eager")


def test_a_backend_for_another_device_is_not_used(model, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="jointspace.backend"):
        assert use_backend(model, "cuda", tmp_path) == "eager"
    assert len(_backend_lines(caplog)) == 1 and "runs on cpu" in _backend_lines(caplog)[0]
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("rows, size", [(1, 1), (2, 2), (3, 4), (17, 32), (64, 64), (65, 128), (256, 256),
                                        (300, 256)])
def test_a_batch_runs_at_the_smallest_bucket_that_holds_it(rows, size):
    assert backend_mod.bucket(rows) == size
    with pytest.raises(ValueError):
        backend_mod.bucket(0)


def test_folding_the_batchnorms_keeps_the_features(model):
    """EfficientNet-Lite0's 49 BatchNorms folded into their convolutions: float32 features equal (to rounding),
    no BatchNorm left, the model itself untouched."""
    tower = backend_mod.ImageTower(copy.deepcopy(model)).eval()
    probe = backend_mod._probe(model)
    with torch.no_grad():
        before = tower(probe)
        assert backend_mod.fold_batchnorm(tower, probe[:1], tower) == 49
        after = tower(probe)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in tower.modules())
    torch.testing.assert_close(after, before, atol=1e-4, rtol=1e-4)
    assert any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())


def test_a_batchnorm_whose_input_is_read_elsewhere_is_not_folded():
    class Both(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn, self.conv2, self.bn2 = (torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4),
                                                        torch.nn.Conv2d(4, 4, 1), torch.nn.BatchNorm2d(4))

        def forward(self, x):
            y = self.conv(x)
            return self.bn2(self.conv2(self.bn(y))) + y          # conv's output read by bn and by the sum

    torch.manual_seed(0)
    net = Both().eval()
    for bn in (net.bn, net.bn2):
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        before = net(x)
        assert backend_mod.fold_batchnorm(net, x, net) == 1      # bn2 only: the sum reads conv's output too
        after = net(x)
    assert isinstance(net.bn, torch.nn.BatchNorm2d) and isinstance(net.bn2, torch.nn.Identity)
    torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-5)


def test_the_towers_normalisation_is_on_the_device_of_its_weights(model):
    """ImageTower's pixel scale and shift follow the model's weights to its device (the CUDA tower's probe is put
    where they are: left on the CPU beside CUDA weights, its conversion failed on a GPU with "Input type
    (torch.FloatTensor) and weight type (torch.cuda.FloatTensor)"); "meta" stands for a device that is not the CPU."""
    elsewhere = copy.deepcopy(model).to("meta")
    tower = backend_mod.ImageTower(elsewhere)
    assert tower.scale.device.type == tower.shift.device.type == "meta"
    assert backend_mod.ImageTower(model).scale.device.type == "cpu"


def test_the_folding_is_checked_in_full_float32(model, monkeypatch):
    """folded_tower compares the tower before and after folding with TF32 off (on an H200 the check failed with
    cuDNN's default TF32 convolutions: "folding the BatchNorms changed the features"), and leaves the settings as
    they were."""
    seen = []
    real = backend_mod.fold_batchnorm
    monkeypatch.setattr(backend_mod, "fold_batchnorm", lambda *a: seen.append(
        (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)) or real(*a))
    before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.enabled
    backend_mod.folded_tower(model)
    assert seen == [(False, False)]
    assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32,
            torch.backends.cudnn.enabled) == before


def test_the_cuda_tower_converts_caches_and_runs_on_the_cpu(model, pixels, tmp_path):
    """The CUDA backend's own steps — folded float16 weights written and checked against eager PyTorch, read back
    from the cache, batches run in bucket-sized chunks — on the CPU (no graphs there)."""
    folder = tmp_path / "cuda-x"
    backend_mod._convert(model, backend_mod.CUDA, folder)
    assert (folder / "tower.pt").is_file()
    backend = backend_mod.CUDA.open(model, folder)
    assert isinstance(backend, backend_mod.CUDA) and not backend.graphs
    assert next(backend.tower.parameters()).dtype == torch.float16
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in backend.tower.modules())
    use_backend(model, "eager")
    expected = pixel_features(model, pixels)
    got = backend.features(pixels)
    assert got.dtype == torch.float32 and got.shape == expected.shape
    assert _cosines(got, expected).min() > backend_mod.AGREEMENT["cuda"]
    many = torch.cat([pixels[:, 0]] * 60)                        # 300 rows: a chunk of 256, then one of 44
    torch.testing.assert_close(backend.forward(many)[-5:], backend.forward(pixels[:, 0]), atol=1e-2, rtol=1e-2)


def test_a_cuda_tower_that_disagrees_is_not_kept(model, tmp_path, monkeypatch):
    monkeypatch.setitem(backend_mod.AGREEMENT, "cuda", 1.5)
    with pytest.raises(RuntimeError, match="disagrees with eager PyTorch"):
        backend_mod._convert(model, backend_mod.CUDA, tmp_path / "cuda-x")
    assert not list(tmp_path.iterdir())
