"""Embedding many videos: frames sampled by DataLoader workers (``index.video_decode.sample_frames``), embedded
in batches with the model's image encoder, grouped into moments (``index.moments.segment``); a file that cannot
be read is skipped with its reason, never fatal.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from training.models.protocol import EmbeddingModel

from .moments import DEFAULT_SAMPLING, Sampling, Segment, SegmentInfo, mean_vector, segment
from .video_decode import VideoError, sample_frames


@dataclass(frozen=True)
class VideoInfo:
    """What the metadata keeps of a video besides its vectors."""
    taken: float            # capture time, Unix seconds: the container's creation_time, else the file's mtime
    width: int              # upright size (rotation applied)
    height: int
    folder: str
    sha256: str
    size: int
    mtime: float
    duration: float         # seconds: what was decoded (a container may claim more)
    fps: float
    rotation: int           # degrees counter-clockwise applied to the stored frames


@dataclass
class VideoEmbeddings:
    """Embedded videos: per kept video its info, moments and vectors (positions refer to the input list,
    ``paths``)."""
    paths: list[str] = field(default_factory=list)                    # the videos asked for, as given
    kept: list[int] = field(default_factory=list)
    info: list[VideoInfo] = field(default_factory=list)
    vectors: list[np.ndarray] = field(default_factory=list)           # per kept video: its own vector (D,)
    segments: list[list[Segment]] = field(default_factory=list)
    segment_vectors: list[np.ndarray] = field(default_factory=list)   # per kept video: (moments, D)
    # per kept video: (moments,) the mean of its frames' a(x) for the person discount (index/people.py); empty: the
    # model has none
    segment_unfamiliarity: list[np.ndarray] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    frames: int = 0                                                    # sampled frames embedded

    @property
    def moments(self) -> int:
        return sum(len(s) for s in self.segments)

    def rows(self, first_video_id: int):
        """``(segment vectors (n, D), segment rows (path, SegmentInfo), video rows (id, path, VideoInfo,
        vector))`` with video ids from ``first_video_id`` in input order (paths resolved)."""
        seg_rows, video_rows, vectors = [], [], []
        for n, (pos, info, vector, segs, seg_vecs) in enumerate(zip(self.kept, self.info, self.vectors,
                                                                     self.segments, self.segment_vectors)):
            vid, path = first_video_id + n, str(Path(self.paths[pos]).resolve())
            video_rows.append((vid, path, info, vector))
            for s in segs:
                seg_rows.append((path, SegmentInfo(info.taken, info.width, info.height, info.folder, None, None,
                                                   None, vid, round(s.start, 3), round(s.end, 3),
                                                   round(s.start if s.best is None else s.best, 3))))
            vectors.append(seg_vecs)
        dim = self.vectors[0].shape[0] if self.vectors else 0
        return (np.concatenate(vectors).astype(np.float32) if vectors else np.zeros((0, dim), np.float32),
                seg_rows, video_rows)

    def moment_unfamiliarity(self) -> np.ndarray | None:
        """Each moment's a(x), in the order of :meth:`rows` (None: the model has no person discount)."""
        if not self.segment_unfamiliarity:
            return None
        return np.concatenate(self.segment_unfamiliarity).astype(np.float32)


class _Frames(IterableDataset):
    """Each worker reads its share of the videos (one whole video at a time) and yields, per video, its frames'
    pixels ``(pos, "frame", (t, pixels))`` then ``(pos, "done", facts)``, or ``(pos, "error", reason)``."""

    def __init__(self, paths: Sequence[str | Path], preprocess, sampling: Sampling):
        self.paths, self.preprocess, self.sampling = [str(p) for p in paths], preprocess, sampling

    def __iter__(self):
        worker = get_worker_info()
        mine = range(len(self.paths)) if worker is None else range(worker.id, len(self.paths), worker.num_workers)
        for pos in mine:
            facts: dict = {}
            try:
                for t, image in sample_frames(self.paths[pos], self.sampling.rate, self.sampling.max_frames,
                                              facts=facts):
                    yield pos, "frame", (t, self.preprocess.pixels(image))
                yield pos, "done", facts
            except Exception as err:  # noqa: BLE001 - any failure skips this video with its reason
                reason = str(err) if isinstance(err, VideoError) else f"{type(err).__name__}: {err}"
                yield pos, "error", reason


def _file_facts(path: Path) -> tuple[str, int, float]:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    stat = path.stat()
    return digest.hexdigest(), stat.st_size, stat.st_mtime


@torch.no_grad()
def embed_videos(model: EmbeddingModel, paths: Sequence[str | Path], sampling: Sampling = DEFAULT_SAMPLING, batch_size: int = 64,
                 workers: int | None = None, progress: bool = True, pad: bool | None = None) -> VideoEmbeddings:
    """Every readable video of ``paths`` → its moments' vectors and its own vector (frames embedded with
    ``training.inference.embedding.embed_pixels``, decoded by up to ``workers`` DataLoader workers, one video per worker
    at a time). A file that cannot be read is skipped with its reason. Puts the model in eval mode. ``pad``: every
    forward pass at ``batch_size`` rows (``embed.fixed_batches``; default: on CUDA)."""
    from tqdm.auto import tqdm

    from training.data.features import loader_options
    from training.inference.embedding import device_of, embed_pixels, fixed_batches, person_discount

    model.eval()
    out = VideoEmbeddings(paths=[str(p) for p in paths])
    if not paths:
        return out
    shapes = fixed_batches(batch_size, device_of(model), pad)     # on CUDA: one shape, whatever a flush holds
    if workers is None:                    # as photos: half the usable cores on a CPU, all but one on CUDA
        workers = loader_options(len(paths) + 1, 1, None, device_of(model))["num_workers"]
    workers = min(workers, len(paths), os.cpu_count() or 1)
    loader = DataLoader(_Frames(paths, model.preprocess, sampling), batch_size=None, num_workers=workers)
    times: dict[int, list[float]] = {}
    frame_vectors: dict[int, list[np.ndarray]] = {}
    pending: list[tuple[int, torch.Tensor]] = []           # (pos, pixels) not yet embedded
    done: dict[int, dict] = {}
    unfamiliarity = person_discount(model) > 0       # then each frame's row carries its a(x) last (embed_pixels)

    def flush():
        if pending:
            vectors = embed_pixels(model, torch.stack([px for _, px in pending]), shapes,
                                   unfamiliarity).cpu().numpy()
            for (pos, _), v in zip(pending, vectors):
                frame_vectors.setdefault(pos, []).append(v)
            out.frames += len(pending)
            pending.clear()

    def finish(pos: int, facts: dict):
        rows = np.stack(frame_vectors.pop(pos))
        vectors = rows[:, :model.cfg.model.embed_dim]
        ts = times.pop(pos)
        path = Path(paths[pos])
        sha, size, mtime = _file_facts(path)
        rotated = facts.get("rotation", 0) in (90, 270)
        w, h = (facts["height"], facts["width"]) if rotated else (facts["width"], facts["height"])
        duration = float(facts.get("duration") or ts[-1] + 1.0 / sampling.rate)
        info = VideoInfo(taken=facts.get("taken") or mtime, width=w, height=h, folder=str(path.resolve().parent),
                         sha256=sha, size=size, mtime=mtime, duration=round(duration, 3), fps=facts.get("fps", 0.0),
                         rotation=facts.get("rotation", 0))
        segs = segment(ts, vectors, sampling.window, sampling.cut, 1.0 / sampling.rate, duration)
        means = np.stack([mean_vector(vectors[a:b], model.similarity) for a, b in (s.frames for s in segs)])
        segs = [replace(s, best=ts[s.frames[0] + int(np.argmax(vectors[s.frames[0]:s.frames[1]] @ m))])
                for s, m in zip(segs, means)]
        out.kept.append(pos)
        out.info.append(info)
        out.vectors.append(mean_vector(vectors, model.similarity))
        out.segments.append(segs)
        out.segment_vectors.append(means)
        if unfamiliarity:                  # a moment's a(x): the mean of its frames'
            a = rows[:, model.cfg.model.embed_dim]
            out.segment_unfamiliarity.append(np.array([a[lo:hi].mean() for lo, hi in (s.frames for s in segs)],
                                                      np.float32))

    for pos, kind, value in tqdm(loader, desc="reading videos", unit="frame", disable=not progress):
        if kind == "frame":
            t, pixels = value
            times.setdefault(pos, []).append(float(t))
            pending.append((pos, pixels))
            if len(pending) >= batch_size:
                flush()
        elif kind == "done":
            done[pos] = value
        else:
            out.skipped.append((str(paths[pos]), value))
            times.pop(pos, None)
            frame_vectors.pop(pos, None)
            pending[:] = [(p, px) for p, px in pending if p != pos]
        if done and not pending:
            for p in sorted(done):
                finish(p, done[p])
            done.clear()
    flush()
    for p in sorted(done):
        finish(p, done[p])
    order = np.argsort(out.kept, kind="stable")
    for name in ("kept", "info", "vectors", "segments", "segment_vectors", "segment_unfamiliarity"):
        values = getattr(out, name)
        if values:
            setattr(out, name, [values[i] for i in order])
    return out
