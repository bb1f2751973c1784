"""Where jointspace keeps what it computes once and reuses: ``$JOINTSPACE_CACHE/<name>`` — converted image towers
(``backends``, training/inference/backend.py), text towers (``text``, training/inference/text_tower.py), frozen
features (``features``, training/data/features.py), embedded query banks (``querybank``, index/querybank.py).

One rule for the variable, read at each call: unset or empty, the cache is ``~/.cache/jointspace``.
"""
from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "JOINTSPACE_CACHE"


def cache_folder(name: str) -> Path:
    """The cache folder ``name`` under ``$JOINTSPACE_CACHE`` (unset or empty: ``~/.cache/jointspace``); not
    created here."""
    root = os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "jointspace"
    return Path(root) / name
