"""Shared fixtures: a small synthetic data set generated once per test session."""
import os

import pytest

os.environ.setdefault("JOINTSPACE_CACHE", "")   # replaced per session below


@pytest.fixture(scope="session")
def synth_small(tmp_path_factory):
    """120 synthetic images (train/val/test), 64 px: enough for shape checks and smoke runs."""
    from training.synth import generate

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
