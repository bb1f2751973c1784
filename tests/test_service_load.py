"""benchmarks/service_load.py on a gallery that holds a video: its image queries are photos (or frames of the
moments when there are no photos), never a video read as an image; a brief run end to end against two servers."""
from __future__ import annotations

import importlib.util
import io
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from index.changes import BuildOptions
from index.gallery import EmbedOptions, Gallery, build
from index.moments import Sampling
from index.video_writer import write_video
from training.models.checkpoint import load_model

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("service_load", ROOT / "benchmarks" / "service_load.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("service_load", module)
    spec.loader.exec_module(module)
    return module


def _clip(path: Path, frames: int = 8) -> Path:
    rng = np.random.default_rng(0)
    return write_video(path, [np.full((64, 64, 3), rng.integers(0, 256, 3), np.uint8) for _ in range(frames)], fps=4)


def _index(folder: Path, out: Path, model_path: Path, photos: list[Path], captions: bool = True) -> Path:
    build(out, load_model(model_path), photos, [("a red circle", None)] if captions else [],
          video_paths=[_clip(folder / "clip.mp4")], options=BuildOptions(image_root=folder),
          embedding=EmbedOptions(progress=False, workers=0, sampling=Sampling(window=1.0)))
    return out


@pytest.fixture(scope="module")
def mixed_index(synth_small, tiny_model_path, tmp_path_factory):
    """Three photos and a two-second video (two moments), and one caption."""
    folder = tmp_path_factory.mktemp("service_load") / "media"
    folder.mkdir()
    photos = [Path(shutil.copy(p, folder / p.name)) for p in sorted((synth_small / "images").glob("*.jpg"))[:3]]
    return _index(folder, folder.parent / "index", tiny_model_path, photos)


def test_the_image_queries_are_the_photos_not_the_video(bench, mixed_index):
    gallery = Gallery.load(mixed_index)
    try:
        assert any(r.video_id is not None for r in gallery.meta.all_images())
        images = bench.query_images(gallery)
        assert [name for name, _ in images] == sorted(name for name, _ in images) and len(images) == 3
        assert all(name.endswith(".jpg") for name, _ in images)
        assert bench.query_texts(gallery) == ["a red circle"]
    finally:
        gallery.close()


def test_a_gallery_of_videos_only_is_queried_with_frames_of_its_moments(bench, tiny_model_path, tmp_path):
    folder = tmp_path / "media"
    folder.mkdir()
    gallery = Gallery.load(_index(folder, tmp_path / "index", tiny_model_path, [], captions=False))
    try:
        images = bench.query_images(gallery)
        assert len(images) == 2                                       # one frame per moment
        for _, data in images:
            assert Image.open(io.BytesIO(data)).size == (64, 64)
        assert bench.query_texts(gallery) == bench.FALLBACK_TEXTS   # no captions: fixed sentences
    finally:
        gallery.close()


def test_a_brief_run_on_a_gallery_with_a_video(bench, mixed_index, tiny_model_path, tmp_path, capsys):
    out = tmp_path / "load.json"
    assert bench.main(["--model", str(tiny_model_path), "--index", str(mixed_index), "--concurrency", "1",
                       "--seconds", "0.3", "--repeats", "1", "--raw-seconds", "0.1", "--warmup-seconds", "0.2",
                       "--overload", "0", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert {(r["route"], r["batching"]) for r in result["rows"]} == {(route, on) for route in ("text", "image")
                                                                    for on in (True, False)}
    assert all(r["errors"] == 0 and r["rps"] > 0 for r in result["rows"]), result["rows"]
    assert result["backend"] == "eager"                               # the tiny model's backbone trains
    assert "WARNING" not in capsys.readouterr().out
