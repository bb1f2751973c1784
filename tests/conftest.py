"""Shared fixtures: a small synthetic data set generated once per test session."""
import os
from pathlib import Path

import pytest

os.environ.setdefault("JOINTSPACE_CACHE", "")   # replaced per session below
# Starlette's TestClient sends ``Host: testserver``: a name the service answers only when configured to
# (service/trust.py); tests of the Host check pass their own allowed_hosts
os.environ["JOINTSPACE_ALLOWED_HOSTS"] = "testserver"
# every error answer of the suite is checked for server paths and object reprs (tests/error_bodies.py)
pytest_plugins = ["error_bodies"]


@pytest.fixture(scope="session")
def synth_small(tmp_path_factory):
    """120 synthetic images (train/val/test), 64 px: enough for shape checks and smoke runs."""
    from training.data.synth import generate

    out = tmp_path_factory.mktemp("synth_small")
    generate(out, n_images=120, seed=1, image_size=64, progress=False)
    return out


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    """Feature caches of the tests never touch the user's ~/.cache."""
    os.environ["JOINTSPACE_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    yield


def tiny_config(**sections):
    """A config for seconds-long runs on the synthetic set (small CNN + GRU)."""
    from training.config import build_config

    base = {
        "image": {"backbone": "smallcnn", "image_size": 32, "resize": 32, "options": {"width": 8, "out_dim": 64}},
        "text": {"encoder": "gru", "word_dim": 16, "hidden": 32},
        "model": {"embed_dim": 32},
        "loss": {"name": "sum", "margin": 0.2},
        "train": {"epochs": 1, "batch_size": 16, "lr": 1e-3, "workers": 0, "seed": 0},
    }
    for name, values in sections.items():
        base.setdefault(name, {}).update(values)
    return build_config(base)


# --- index / service fixtures: a real tiny model and a real FAISS index built from it -----------------------

@pytest.fixture(scope="session")
def tiny_model_path(synth_small, tmp_path_factory):
    """A model trained for one epoch on ``synth_small`` (seconds): the real encoders, not a mock."""
    from training.train import train

    out = tmp_path_factory.mktemp("tiny_model")
    train(tiny_config(train={"epochs": 1}), synth_small, out, progress=False, log=lambda *_: None)
    return out / "model.pt"


def gallery_records(synth_dir):
    """The gallery of the tests' indexes: ``synth_dir``'s val+test records, and each caption with its record's
    position."""
    from training.data.datasets import load_dataset

    data = load_dataset(synth_dir)
    records = data.split("val").images + data.split("test").images
    return records, [(c, pos) for pos, r in enumerate(records) for c in r.captions]


def embedded_gallery(model, synth_dir):
    """``gallery_records(synth_dir)`` embedded by ``model``: (records, captions, image vectors, caption vectors)."""
    from index.embed import embed_photos, embed_sentences

    records, captions = gallery_records(synth_dir)
    images = embed_photos(model, [r.path for r in records], progress=False, workers=0).vectors
    return records, captions, images, embed_sentences(model, [c for c, _ in captions], progress=False)


def build_index(model_path, synth_dir, out, querybank=None):
    """A FAISS index of ``gallery_records(synth_dir)``, built with ``model_path`` (``querybank``: the
    ``index.qbnorm.QueryBank`` to store the items against)."""
    from index.changes import BuildOptions
    from index.gallery import EmbedOptions, build
    from training.models.checkpoint import load_model

    records, captions = gallery_records(synth_dir)
    build(out, load_model(model_path), [r.path for r in records], captions,
          options=BuildOptions(querybank=querybank), embedding=EmbedOptions(progress=False, workers=0))
    return out


@pytest.fixture(scope="session")
def tiny_index_dir(synth_small, tiny_model_path, tmp_path_factory):
    """A FAISS index of ``synth_small``'s val+test images and their captions, built with ``tiny_model_path``.
    Read-only: tests that change an index copy it first (``index_copy``)."""
    return build_index(tiny_model_path, synth_small, tmp_path_factory.mktemp("tiny_index") / "index")


STT_DECODER = {"enabled": True, "word_dim": 16, "hidden": 32, "max_len": 12}


@pytest.fixture(scope="session")
def tiny_stt_model_path(synth_small, tmp_path_factory):
    """A Show-Translate-Tell model (``tiny_config`` plus a small sentence decoder) trained for a few epochs on
    ``synth_small`` (about a second): its captions and paraphrases are poor but real decoder output."""
    from training.train import train

    out = tmp_path_factory.mktemp("tiny_stt_model")
    train(tiny_config(decoder=STT_DECODER, train={"epochs": 4, "sampling": "image"}), synth_small, out,
          progress=False, log=lambda *_: None)
    return out / "model.pt"


@pytest.fixture(scope="session")
def tiny_stt_index_dir(synth_small, tiny_stt_model_path, tmp_path_factory):
    """Like ``tiny_index_dir``, built with ``tiny_stt_model_path``. Read-only."""
    return build_index(tiny_stt_model_path, synth_small, tmp_path_factory.mktemp("tiny_stt_index") / "index")


STRONG_TEXT, WEAK_TEXT = "a red circle", "a blue square below a green triangle"


@pytest.fixture(scope="session")
def relevance_index_dir(synth_small, tiny_model_path, tmp_path_factory):
    """An index of 12 of ``synth_small``'s photos whose vectors are made so that ``STRONG_TEXT`` has a strong match
    (index/relevance.py) and ``WEAK_TEXT`` none, with ``tiny_model_path``'s own query embeddings ``a`` and ``b``:
    photo 0 is ``a`` itself, the other photos, the bank's captions and 95 of its 100 images are random unit vectors
    orthogonal to ``a`` and ``b``, and its other 5 images are ``b``. For ``a`` photo 0 outscores every reference
    photo; for ``b`` the 5% of them that are ``b`` outscore every photo. Read-only."""
    import numpy as np

    from index.embed import embed_photos, embed_sentences
    from index.changes import BuildOptions, ChangeSet, ModelFacts
    from index.gallery import build_from_vectors
    from index.qbnorm import QueryBank
    from training.data.datasets import load_dataset
    from training.models.checkpoint import load_model

    model = load_model(tiny_model_path)
    a, b = embed_sentences(model, [STRONG_TEXT, WEAK_TEXT], progress=False)
    a, b = a / np.linalg.norm(a), b / np.linalg.norm(b)
    assert a @ b < 0.999, "the two queries must differ"
    rng = np.random.default_rng(0)
    basis, _ = np.linalg.qr(np.column_stack([a, b, rng.standard_normal((len(a), len(a) - 2))]))

    def unrelated(n):                                   # unit vectors orthogonal to a and b
        x = rng.standard_normal((n, len(a) - 2)) @ basis[:, 2:].T
        return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)

    paths = sorted((synth_small / "images").glob("*.jpg"))[:12]
    emb = embed_photos(model, paths, progress=False, workers=0)
    images = np.vstack([a[None], unrelated(len(paths) - 1)]).astype(np.float32)
    bank = QueryBank(captions=unrelated(50), images=np.vstack([unrelated(95), np.repeat(b[None], 5, axis=0)]))
    out = tmp_path_factory.mktemp("relevance_index") / "index"
    build_from_vectors(out, ModelFacts(model.fingerprint, "cosine"), ChangeSet(
        image_vectors=images, image_ids=np.arange(len(paths)),
        image_rows=[(str(p), info) for p, info in zip(paths, emb.info)], caption_vectors=unrelated(6),
        captions=[(f"caption {i}", i) for i in range(6)]),
        BuildOptions(querybank=bank, image_root=synth_small / "images"))
    return out


@pytest.fixture
def index_copy(tiny_index_dir, tmp_path):
    import shutil

    return Path(shutil.copytree(tiny_index_dir, tmp_path / "index"))


# --- service helpers shared by the service test modules ------------------------------------------------------

async def serve_app(app, work):
    """Runs ``app`` (lifespan included) in process, waits until /readyz says ready, then ``await work(client)``."""
    import httpx

    from server_process import wait_ready_async

    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=60) as c:
            return await work(await wait_ready_async(c))


def batch_stats(metrics_text: str, name: str) -> tuple[float, float]:
    """(number of batches, requests in them) of batcher ``name``, read from the /metrics text."""
    import re

    count = float(re.search(rf'jointspace_batch_size_count{{batcher="{name}"}} (\S+)', metrics_text).group(1))
    total = float(re.search(rf'jointspace_batch_size_sum{{batcher="{name}"}} (\S+)', metrics_text).group(1))
    return count, total
