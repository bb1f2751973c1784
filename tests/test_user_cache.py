"""``$JOINTSPACE_CACHE`` is read by one function with one rule: unset or empty, the cache is
``~/.cache/jointspace``; every cache (converted backends, text towers, frozen features, query banks) is a folder
of that one root."""
from pathlib import Path

import pytest

from index import qbnorm
from training.data import features
from training.data.user_cache import CACHE_ENV, cache_folder
from training.inference import backend, text_tower

CACHES = {"backends": backend.graph_cache, "text": text_tower.tower_cache, "features": features.default_cache_dir,
          "querybank": qbnorm.bank_cache}


@pytest.mark.parametrize("value", [None, ""])
def test_unset_or_empty_is_the_home_cache(monkeypatch, tmp_path, value):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    if value is None:
        monkeypatch.delenv(CACHE_ENV, raising=False)
    else:
        monkeypatch.setenv(CACHE_ENV, value)
    home = tmp_path / "home" / ".cache" / "jointspace"
    assert cache_folder("x") == home / "x"
    assert {name: where() for name, where in CACHES.items()} == {name: home / name for name in CACHES}


def test_a_set_cache_holds_every_cache(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    assert {name: where() for name, where in CACHES.items()} == {name: tmp_path / "cache" / name for name in CACHES}
    monkeypatch.setenv(CACHE_ENV, "relative")                 # as given: relative to the working folder
    assert cache_folder("text") == Path("relative") / "text"
