"""Shape discipline for inference: batches reach the encoders only at the bucket sizes (padded or split), padded
rows never reach a result, results equal the unpadded ones, and the service is not ready until every bucket is
warmed."""
import threading
import time

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from index.gallery import Gallery
from server_process import poll_readyz
from service.app import create_app
from service.engine import Engine, Options
from service.settings import Settings
from training.models.checkpoint import load_model
from training.inference.names import BACKENDS
from training.inference.shapes import Chunk, bucket_sizes, plan, resolve_shapes


def test_bucket_sizes_and_plans():
    assert bucket_sizes("auto", 64) == (1, 2, 4, 8, 16, 32, 64)
    assert bucket_sizes("auto", 48) == (1, 2, 4, 8, 16, 32, 48)
    assert bucket_sizes("1, 4,16", 16) == (1, 4, 16)
    for bad, match in [("4,16", "include 1"), ("1,x", "comma-separated"), ("1,128", "above max_batch")]:
        with pytest.raises(ValueError, match=match):
            bucket_sizes(bad, 64)
    sizes = bucket_sizes("auto", 64)
    assert plan(5, sizes, "pad") == [Chunk(0, 5, 8)]
    assert plan(5, sizes, "split") == [Chunk(0, 4, 4), Chunk(4, 1, 1)]
    for n in range(1, 200):
        for mode in ("pad", "split"):
            chunks = plan(n, sizes, mode)
            assert all(c.size in sizes and 1 <= c.count <= c.size for c in chunks)
            assert [c.start for c in chunks] == list(np.cumsum([0] + [c.count for c in chunks])[:-1])
            assert sum(c.count for c in chunks) == n
            if mode == "split":
                assert all(c.count == c.size for c in chunks)          # no padding at all
            elif n <= 64:
                assert len(chunks) == 1 and chunks[0].size < 2 * n     # one pass, less than double
    assert resolve_shapes("auto", 64, "auto", "cuda") == resolve_shapes("auto", 64, "pad", "cuda")
    assert resolve_shapes("auto", 64, "auto", "cpu") is None                  # no per-shape cost on a CPU: any size
    assert resolve_shapes("auto", 64, "split", "cpu").images == "split"
    assert resolve_shapes("auto", 64, "off", "cuda") is None


def test_settings_name_a_bad_batch_size():
    with pytest.raises(ValueError, match="above max_batch"):
        Settings(batch_sizes="1,2,128", max_batch=64)
    with pytest.raises(ValueError, match="bucket_mode"):
        Settings(bucket_mode="sometimes")


class _Recorder:
    """Wraps the encoders' entry points of a model and records each forward pass's batch size."""

    def __init__(self, model):
        self.images: list[int] = []
        self.texts: list[int] = []
        # the image side's forward pass: the backbone (or its inference backend), then embed_features on its rows
        embed_images, project_texts = model.embed_features, model.project_texts

        def images(x, *a, **kw):
            self.images.append(x.shape[0])
            return embed_images(x, *a, **kw)

        def texts(ids, lengths, *a, **kw):
            self.texts.append(ids.shape[0])
            return project_texts(ids, lengths, *a, **kw)
        model.embed_features, model.project_texts = images, texts


@pytest.fixture(scope="module")
def loaded(tiny_model_path, tiny_index_dir):
    model = load_model(tiny_model_path)
    return model, Gallery.load(tiny_index_dir, model=model)


def _pixels(model, n, seed=0):
    pre = model.preprocess
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (pre.crops, pre.channels, pre.image_size, pre.image_size), generator=g,
                          dtype=torch.uint8) for _ in range(n)]


def _same(a, b):
    """Engine rankings (index/relevance.py) with the same hits and, within float error, the same scores."""
    assert [[i for i, _ in r.hits] for r in a] == [[i for i, _ in r.hits] for r in b]
    assert np.allclose([[s for _, s in r.hits] for r in a], [[s for _, s in r.hits] for r in b], atol=1e-5)


@pytest.mark.parametrize("mode", ["pad", "split"])
def test_only_bucket_shapes_reach_the_encoders_and_results_equal_the_unpadded(loaded, mode):
    model, gallery = loaded
    plain = Engine(model, gallery)
    shapes = resolve_shapes("1,2,4,8", 8, mode, "cpu")
    bucketed = Engine(model, gallery, shapes)
    rec = _Recorder(model)
    texts = ["a red circle", "a blue square above a green triangle", "two shapes", "a yellow star", "a circle"]
    pixels = _pixels(model, 7)
    want_t = plain.search_texts([(t, 5) for t in texts])
    want_p = plain.search_pixels([(p, 5) for p in pixels])
    assert rec.texts == [5] and rec.images == [7]                  # without shapes: the batch's own size
    rec.texts.clear(), rec.images.clear()
    got_t = bucketed.search_texts([(t, 5) for t in texts])
    got_p = bucketed.search_pixels([(p, 5) for p in pixels])
    assert set(rec.texts) <= {1, 2, 4, 8} and set(rec.images) <= {1, 2, 4, 8}
    assert (rec.texts, rec.images) == (([8], [8]) if mode == "pad" else ([4, 1], [4, 2, 1]))
    assert len(got_t) == 5 and len(got_p) == 7                     # padded rows never reach a result
    _same(got_t, want_t)
    _same(got_p, want_p)
    # words to subtract join the sentences in one forward pass: that pass is bucketed too
    opts = [Options(k=5, subtract=("red",)), Options(k=5), Options(k=5, subtract=("blue", "square"))]
    items = list(zip(texts[:3], opts))
    want = plain.search_texts(items)
    assert rec.texts[-1] == 6                                      # 3 sentences + 3 words: one pass of 6
    rec.texts.clear()
    _same(bucketed.search_texts(items), want)
    assert rec.texts == ([8] if mode == "pad" else [4, 2])


def test_warm_up_runs_every_image_size_and_the_text_extremes(loaded):
    model, gallery = loaded
    engine = Engine(model, gallery, resolve_shapes("1,2,4", 4, "pad", "cpu"))
    rec = _Recorder(model)
    seconds = engine.warm_up((1, 2, 4))
    assert rec.texts == [1, 4] and rec.images == [1, 2, 4] and seconds > 0
    assert [(route, size) for route, size, _ in engine.warmup_steps] == [
        ("text search", 1), ("text search", 4), ("image search", 1), ("image search", 2), ("image search", 4)]
    assert seconds >= sum(s for *_, s in engine.warmup_steps) > 0


def test_bulk_embedding_runs_one_shape_when_padded_and_gives_the_unpadded_vectors(tiny_model_path, synth_small,
                                                                                   tmp_path):
    """index build / add / sync and video frames: on CUDA every forward pass has ``batch_size`` rows (a short last
    batch, or one a skipped file shortened, is padded), so a build costs one shape's set-up, not one per size."""
    from index.moments import Sampling
    from index.video_embed import embed_videos
    from index.video_writer import write_video
    from training.data.datasets import load_dataset
    from training.inference.embedding import FileReading, embed_image_files, fixed_batches

    assert fixed_batches(64, torch.device("cpu")) is None                       # a CPU has no per-shape cost
    assert fixed_batches(64, torch.device("cuda")).sizes == (64,)              # (no CUDA needed to choose)
    assert fixed_batches(64, torch.device("cpu"), pad=True).sizes == (64,)
    model = load_model(tiny_model_path)
    paths = [r.path for r in load_dataset(synth_small).split("test").images][:11]
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"not a picture")
    paths.insert(2, broken)                                  # the first batch holds 3 readable images of 4
    rec = _Recorder(model)
    plain = embed_image_files(model, paths, FileReading(batch_size=4, workers=0), progress=False)      # the CPU's default
    assert rec.images == [3, 4, 4]
    rec.images.clear()
    padded = embed_image_files(model, paths, FileReading(batch_size=4, workers=0), progress=False, pad=True)
    assert rec.images == [4, 4, 4]
    assert padded.kept == plain.kept and len(padded.skipped) == 1
    np.testing.assert_allclose(padded.vectors, plain.vectors, atol=1e-5)

    clip = write_video(tmp_path / "c.mp4", (np.full((48, 48, 3), 40 * i, np.uint8) for i in range(5)), fps=1)
    rec.images.clear()
    want = embed_videos(model, [clip], Sampling(rate=1.0, window=2.0), batch_size=4, workers=0, progress=False)
    assert rec.images == [4, 1]
    rec.images.clear()
    got = embed_videos(model, [clip], Sampling(rate=1.0, window=2.0), batch_size=4, workers=0, progress=False,
                       pad=True)
    assert rec.images == [4, 4]
    np.testing.assert_allclose(np.concatenate(got.segment_vectors), np.concatenate(want.segment_vectors), atol=1e-5)


def test_a_forward_pass_holds_batch_size_views_whatever_the_augmentation(tiny_model_path, synth_small):
    """index build --tta: each photo's 2 or 4 views count against --batch-size, so a pass's memory does not grow
    with the augmentation; the vectors are those of one pass per photo."""
    from index.embed import embed_photos
    from training.data.datasets import load_dataset

    model = load_model(tiny_model_path)
    paths = [r.path for r in load_dataset(synth_small).split("test").images][:10]
    rec = _Recorder(model)
    views = []
    real = model.image_features

    def features(x, *a, **kw):
        views.append(x.shape[0] * x.shape[1])               # (photos, views, C, S, S)
        return real(x, *a, **kw)

    model.image_features = features
    got = {}
    for tta, photos in (("none", [8, 2]), ("flip", [4, 4, 2]), ("flip-crop", [2, 2, 2, 2, 2])):
        rec.images.clear()
        views.clear()
        got[tta] = embed_photos(model, paths, batch_size=8, workers=0, progress=False, tta=tta).vectors
        assert rec.images == photos, tta
        assert max(views) == 8, tta
    one = [embed_photos(model, [p], batch_size=1, workers=0, progress=False, tta="flip-crop").vectors[0]
           for p in paths[:3]]
    np.testing.assert_allclose(got["flip-crop"][:3], np.stack(one), atol=1e-5)


def test_warm_up_sizes_by_device(tiny_model_path, tiny_index_dir):
    base = dict(model=str(tiny_model_path), index=str(tiny_index_dir), max_batch=16, bucket_mode="pad")
    from service.metrics import Metrics
    from service.state import ServiceState

    state = ServiceState(Settings(**base), Metrics())
    assert state.warmup_sizes() == (1,)                            # auto on the CPU: the smallest
    state.device = torch.device("cuda")                            # (no CUDA needed to choose the sizes)
    assert state.warmup_sizes() == (1, 2, 4, 8, 16)                # auto on CUDA: all of them
    assert ServiceState(Settings(**base, warmup="off"), Metrics()).warmup_sizes() == ()
    assert ServiceState(Settings(**base, batching=False), Metrics()).shapes.sizes == (1,)
    cpu_auto = ServiceState(Settings(**{**base, "bucket_mode": "auto"}), Metrics())
    assert cpu_auto.shapes is None and cpu_auto.warmup_sizes() == (1,)


def test_decode_threads_by_device(tiny_model_path, tiny_index_dir, monkeypatch):
    """Upload decoding: 2 threads beside a CPU model, every core (2 to 32) beside a GPU one, or the setting."""
    import os

    from service.metrics import Metrics
    from service.state import ServiceState, decode_threads

    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    for cores, on_gpu in ((1, 2), (2, 2), (16, 16), (96, 32)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda _pid, n=cores: set(range(n)))
        assert decode_threads(0, cpu) == 2
        assert decode_threads(0, gpu) == on_gpu
        assert decode_threads(5, gpu) == decode_threads(5, cpu) == 5
    state = ServiceState(Settings(model=str(tiny_model_path), index=str(tiny_index_dir), device="cpu"), Metrics())
    assert state.decode_pool._max_workers == 2
    state = ServiceState(Settings(model=str(tiny_model_path), index=str(tiny_index_dir), device="cpu",
                                  decode_workers=3), Metrics())
    assert state.decode_pool._max_workers == 3


def test_not_ready_until_warm_up_ends(tiny_model_path, tiny_index_dir, monkeypatch):
    release, seen = threading.Event(), []
    warm_up = Engine.warm_up

    def held(self, sizes):
        seen.append(tuple(sizes))
        release.wait(30)
        return warm_up(self, sizes)
    monkeypatch.setattr(Engine, "warm_up", held)
    app = create_app(Settings(model=str(tiny_model_path), index=str(tiny_index_dir), max_batch=8, warmup="all",
                              bucket_mode="pad", reload_interval_s=0))
    with TestClient(app) as client:
        deadline = time.time() + 30
        while not seen and time.time() < deadline:
            time.sleep(0.02)
        r = client.get("/readyz")
        assert r.status_code == 503 and r.json()["status"] == "warming up"
        busy = client.post("/v1/search/images", json={"text": "a red circle"})
        assert busy.status_code == 503 and busy.json()["detail"] == "not ready: warming up"
        release.set()
        ready = poll_readyz(client, timeout=30, poll=0.02).json()
    assert seen == [(1, 2, 4, 8)]
    assert ready["status"] == "ready" and ready["batch_sizes"] == [1, 2, 4, 8]
    assert ready["warmup_seconds"] > 0 and ready["search_backend"] == "faiss-cpu"
    assert ready["image_backend"] == app.state.service.backend and ready["image_backend"] in set(BACKENDS) - {"auto"}
