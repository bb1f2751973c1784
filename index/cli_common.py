"""What the index's commands share (index/cli_build.py, cli_update.py, cli_search.py): loading the model a command
names (:class:`ModelChoice`), the batch size by device, reading list files, and reporting what was skipped."""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from training.inference.pretrained import model_file


def split_media(paths, videos: bool) -> tuple[list, list]:
    """Paths → (photos, videos) by content (index.scan.is_video); videos empty unless ``videos``
    (``--no-videos``)."""
    from .scan import is_video

    photos = [p for p in paths if not is_video(p)]
    return photos, [p for p in paths if is_video(p)] if videos else []


def read_lines(path: str | Path) -> list[str]:
    """The non-empty lines of the UTF-8 text file ``path``; ValueError naming it when it is not text."""
    try:
        lines = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines()]
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not a UTF-8 text file (one path or caption a line)") from None
    return [line for line in lines if line]


def report_skipped(skipped) -> None:
    from .scan import is_video

    for path, reason in skipped:
        reason = _OBJECT_REPR.sub("", reason)       # "cannot identify image file <_io.BytesIO object at 0x…>"
        print(f"skipped unreadable {'video' if is_video(path) else 'image'} {path}: {reason}", file=sys.stderr)
    videos = sum(1 for path, _ in skipped if is_video(path))
    if len(skipped) > videos:
        print(f"{len(skipped) - videos} unreadable image(s) skipped", file=sys.stderr)
    if videos:
        print(f"{videos} unreadable video(s) skipped", file=sys.stderr)


_OBJECT_REPR = re.compile(r" ?<[\w.]+ object at 0x[0-9a-fA-F]+>")


def report_outside(outside) -> None:
    """The symbolic links that were not followed because their target leaves the folder (docs/index.md)."""
    for link, reason in outside:
        print(f"skipped {link}: {reason}", file=sys.stderr)
    if outside:
        print(f"{len(outside)} symbolic link(s) leaving the folder skipped", file=sys.stderr)


@dataclass(frozen=True)
class ModelChoice:
    """The model a command loads and how it runs: ``path`` (``--model``; None: the shipped model), ``device``
    (``--device``), ``backend`` (``--backend``; None: ``$JOINTSPACE_BACKEND``, else auto) and what the backend is
    prepared for: ``throughput`` in the commands that embed a gallery, ``latency`` for one query at a time."""
    path: str | None = None
    device: str = "auto"
    backend: str | None = None
    prepare: str = "latency"


def prepare_text_search(model_path: str | None, model, progress: bool) -> None:
    """The model's text tower for ``index search --text``, prepared while the model is loaded (once per model
    file; training/inference/text_tower.py ``ensure``: never fails the command). ``model_path``: ``--model``."""
    from training.inference.text_tower import ensure

    ensure(model, model_file(model_path), progress=progress)


def load_chosen_model(choice: ModelChoice, payload: dict | None = None):
    """The model of ``choice`` on its device, its image tower on its backend (training/inference/backend.py),
    prepared as ``choice.prepare`` says; returns the model and the device. ``payload``: the model file, when
    already read (``index build``: index/cli_build.py ``_decode_early``)."""
    from training.models.checkpoint import load_model
    from training.inference.backend import backend_choice, use_backend
    from training.inference.device import resolve_device

    path = model_file(choice.path)
    device = resolve_device(choice.device)
    backend = backend_choice(choice.backend)      # an unknown JOINTSPACE_BACKEND: before the load
    model = load_model(path, device, payload)
    use_backend(model, backend, prepare=choice.prepare)
    return model, device


def batch_size_for(given: int | None, device) -> int:
    """``--batch-size`` as given, or unset, sized for the device (``embedding.default_batch_size``)."""
    if given is not None:
        return given
    from training.inference.embedding import default_batch_size

    return default_batch_size(device)


def counted(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def joined(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}"
