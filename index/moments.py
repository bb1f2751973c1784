"""Moments of a video: consecutive sampled frames grouped, each stored in the gallery like a photo.

* :class:`Sampling`: how videos are read and cut (``index build --video-rate/--video-max-frames/...``).
* :func:`segment` groups consecutive sampled frames into moments: fixed windows of ``window`` seconds, and with
  ``cut`` also a new moment wherever adjacent frames' embeddings differ by more than ``cut`` (cosine distance).
* :func:`mean_vector`: frames' embeddings → one vector (a moment's, a video's).

A moment is stored in the gallery's image index like a photo (same FAISS index, same id space), its metadata row
(:class:`SegmentInfo`) carrying ``video_id``, ``t_start`` and ``t_end`` (index/metadata.py); the video itself is a
row of the ``videos`` table with its duration, size, capture time (the container's ``creation_time``) and its own
vector (``index.video_embed.VideoInfo``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from .choices import DEFAULT_MAX_FRAMES, DEFAULT_RATE, DEFAULT_WINDOW


@dataclass(frozen=True)
class SegmentInfo:
    """A moment's metadata row (a row of the ``images`` table, index/metadata.py): the photo columns of its
    video plus the video id and the moment's time span in seconds."""
    taken: float
    width: int
    height: int
    folder: str
    sha256: None
    size: None
    mtime: None
    video_id: int
    start: float
    end: float
    frame: float            # the time of the moment's frame nearest its vector: its thumbnail



@dataclass(frozen=True)
class Segment:
    start: float            # seconds: the first frame's time
    end: float              # seconds: the last frame's time plus one sampling interval (at most the duration)
    frames: tuple[int, int]  # [first, last + 1) positions in the video's sampled frames
    best: float | None = None  # seconds: the frame nearest the moment's vector (set by embed_videos)


def segment(times: Sequence[float], vectors: np.ndarray | None = None, window: float = DEFAULT_WINDOW,
            cut: float | None = None, step: float = 1.0 / DEFAULT_RATE,
            duration: float | None = None) -> list[Segment]:
    """Consecutive sampled frames (at ``times``, sorted) → moments: a new moment starts when a frame falls in the
    next ``window``-second window after the current moment's start, and with ``cut`` (a cosine distance,
    0 to 2) also where a frame's embedding differs from the previous frame's by more than ``cut``."""
    if window <= 0:
        raise ValueError(f"window must be positive, not {window}")
    if cut is not None and vectors is None:
        raise ValueError("cutting by embedding distance needs the frames' vectors")
    out: list[Segment] = []
    first = 0
    for i in range(1, len(times) + 1):
        boundary = i == len(times) or times[i] - times[first] >= window - 1e-6
        if not boundary and cut is not None:
            assert vectors is not None
            a, b = vectors[i - 1], vectors[i]
            distance = 1.0 - float(a @ b) / max(float(np.linalg.norm(a) * np.linalg.norm(b)), 1e-12)
            boundary = distance > cut
        if boundary:
            end = times[i - 1] + step
            if duration is not None:
                end = max(min(end, duration), times[i - 1])
            out.append(Segment(float(times[first]), float(end), (first, i)))
            first = i
    return out


def mean_vector(vectors: np.ndarray, similarity) -> np.ndarray:
    """Frames' embeddings → one vector: their mean (W2VV §III-D: a video's feature is the average of its frames'),
    normalised as the model normalises an embedding."""
    mean = torch.from_numpy(np.asarray(vectors, np.float32).mean(0, keepdims=True))
    return similarity.normalize(mean)[0].numpy().astype(np.float32)


@dataclass(frozen=True)
class Sampling:
    """How videos are read and cut into moments (``index build --video-rate/--video-max-frames/...``)."""
    rate: float = DEFAULT_RATE
    max_frames: int = DEFAULT_MAX_FRAMES
    window: float = DEFAULT_WINDOW
    cut: float | None = None

    def __post_init__(self):
        if not self.rate > 0 or not math.isfinite(self.rate):
            raise ValueError(f"the video sampling rate must be a positive number of frames a second, not {self.rate}")
        if self.max_frames < 1:
            raise ValueError(f"max frames per video must be at least 1, not {self.max_frames}")
        if not self.window > 0:
            raise ValueError(f"the moment window must be positive seconds, not {self.window}")
        if self.cut is not None and not 0 < self.cut < 2:
            raise ValueError(f"the cut threshold is a cosine distance between 0 and 2, not {self.cut}")


DEFAULT_SAMPLING = Sampling()
