"""Videos in the gallery: read a file with PyAV, sample frames, embed them, group them into moments.

* :func:`probe` opens a file and checks it before any frame is decoded: a video stream, a sane size (at most
  :data:`MAX_SIDE` pixels a side, so a 16k × 16k stream is refused, and no more elongated than a photo may be:
  ``training.data.preprocess.MAX_ASPECT``), frame rate and claimed duration. A file is a video by its content
  (:func:`is_video`), not its name. Every failure is told in ``training.data.media.decoder_error``'s words, never
  FFmpeg's own message (which names the file's path).
* :func:`sample_frames` yields ``(seconds, upright RGB image)`` at ``rate`` frames a second, at most
  ``max_frames``: a generator, one frame in memory at a time. Far targets are reached by seeking to the keyframe
  before them; near ones by decoding on. Rotation metadata (the display matrix) is applied. A file that claims a
  longer duration than it holds simply ends where its frames end.
* :func:`segment` groups consecutive sampled frames into moments: fixed windows of ``window`` seconds, and with
  ``cut`` also a new moment wherever adjacent frames' embeddings differ by more than ``cut`` (cosine distance).
* :func:`embed_videos` does the above for many files, decoded by DataLoader workers; a file that cannot be read
  is skipped with its reason, never fatal.

A moment is stored in the gallery's image index like a photo (same FAISS index, same id space), its metadata row
carrying ``video_id``, ``t_start`` and ``t_end`` (index/metadata.py); the video itself is a row of the ``videos``
table with its duration, size, capture time (the container's ``creation_time``) and its own vector.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import torch
from PIL import Image
from training.data.media import decoder_error, file_head, sniff_video
from training.data.preprocess import ImageGeometryError, check_geometry
from training.models.protocol import EmbeddingModel
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

VIDEO_SUFFIXES = {".mp4", ".mov", ".m4v", ".webm", ".mkv", ".avi"}
MAX_SIDE = 8192                 # pixels: larger streams (16k × 16k) are refused before decoding
MAX_FPS = 1000.0                # a claimed frame rate above this is no real video
MAX_DURATION = 7 * 24 * 3600.0  # seconds: a claimed duration above a week is a lie
MAX_DECODE_ERRORS = 8           # damaged packets skipped in a video before it is taken to end there
SEEK_GAP = 4.0                  # seconds: a target farther than this ahead is reached by seeking, not decoding
DEFAULT_RATE = 1.0              # sampled frames a second
DEFAULT_MAX_FRAMES = 3600       # per video
DEFAULT_WINDOW = 5.0            # seconds a moment spans (fixed windows)
FRAME_SIDE = 512                # frames are scaled (before conversion to RGB) so the shorter side is at most this


class VideoError(ValueError):
    """A file that is not a readable video; ``str()`` says why."""


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
class _Probe:
    stream_index: int
    width: int
    height: int
    fps: float
    duration: float | None
    taken: float | None
    rotation: int


def find_videos(root: str | Path, exclude: Sequence[str] = (), default_excludes: bool = True) -> list[Path]:
    """Every video file (by suffix) under ``root``, recursively, sorted, without the excluded files and with
    symbolic links as photos are treated (``index.embed.scan_images``)."""
    return scan_media(root, exclude, default_excludes, videos=True).found


def scan_media(root: str | Path, exclude: Sequence[str] = (), default_excludes: bool = True, photos: bool = False,
               videos: bool = True):
    """One walk of ``root`` for photos and/or videos (``index.embed.scan_images``: excludes, symbolic links leaving
    the folder skipped and listed)."""
    from .embed import IMAGE_SUFFIXES, scan_images

    suffixes = (IMAGE_SUFFIXES if photos else frozenset()) | (VIDEO_SUFFIXES if videos else frozenset())
    return scan_images(root, exclude, default_excludes, suffixes=suffixes)


def is_video(path: str | Path) -> bool:
    """Whether a file holds a video, told by its content (``training.data.media.sniff_video``), not its name: a
    JPEG named ``.mp4`` is a photo. A file that cannot be read (gone since) is told by its suffix."""
    try:
        head = file_head(path)
    except OSError:
        return Path(path).suffix.lower() in VIDEO_SUFFIXES
    return sniff_video(head) is not None


def decoder():
    """PyAV, imported on first use. Its first import is not safe from two threads at once (a half-initialised
    module seen by the second), so a process that decodes on several threads makes it first: the service does
    before it is ready (service/state.py). Without PyAV (an install that lacks the ``av`` package) a video is
    refused with a :class:`VideoError` that says so; photos are unaffected."""
    try:
        import av
    except ImportError:
        raise VideoError("videos cannot be read here: PyAV (the Python package 'av', a dependency of jointspace) "
                         "is not installed") from None
    return av


def _open(path: str | Path):
    av = decoder()
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as err:
        raise VideoError(f"cannot read the file: {decoder_error(err)}") from None
    if size == 0:
        raise VideoError("empty file (0 bytes)")
    try:
        return av.open(str(path), metadata_errors="ignore")
    except Exception as err:  # noqa: BLE001 - any container error: not a readable video
        raise VideoError(f"not a readable video container: {decoder_error(err)}") from err


def _creation_time(metadata: dict) -> float | None:
    value = metadata.get("creation_time")
    if not value:
        return None
    try:
        when = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return when.timestamp() if when.year > 1970 else None    # 1970/1904 epochs: an unset clock


def _probe(container) -> _Probe:
    """Checks an opened container (no frame decoded): its first video stream, size, rate, claimed duration."""
    if not container.streams.video:
        kinds = sorted({s.type for s in container.streams})
        raise VideoError("no video stream" + (f" (only {', '.join(kinds)})" if kinds else ""))
    stream = container.streams.video[0]
    width, height = stream.codec_context.width, stream.codec_context.height
    if not width or not height:
        raise VideoError("the video stream has no frame size")
    if width > MAX_SIDE or height > MAX_SIDE:
        raise VideoError(f"frames of {width} × {height} pixels: larger than {MAX_SIDE} a side, refused")
    try:
        check_geometry((width, height))                     # the aspect ratio a frame may have, as a photo
    except ImageGeometryError as err:
        raise VideoError(f"frames of {width} × {height} pixels, refused: {err}") from None
    rate = stream.average_rate or stream.guessed_rate or stream.base_rate
    fps = float(rate) if rate else 0.0
    if not 0 < fps <= MAX_FPS:
        if fps > MAX_FPS:
            raise VideoError(f"a frame rate of {fps:g} per second: above {MAX_FPS:g}, refused")
        fps = 0.0                                               # unknown: read on
    duration = None
    if stream.duration is not None and stream.time_base:
        duration = float(stream.duration * stream.time_base)
    elif container.duration is not None:
        duration = container.duration / 1_000_000
    if duration is not None and (not math.isfinite(duration) or duration < 0 or duration > MAX_DURATION):
        raise VideoError(f"a claimed duration of {duration:g} s: refused")
    taken = _creation_time(dict(stream.metadata)) or _creation_time(dict(container.metadata))
    return _Probe(stream.index, width, height, fps, duration, taken, 0)


def probe(path: str | Path) -> dict:
    """A video file's stream facts (size as stored, frame rate, claimed duration, creation time) without decoding a
    frame; :class:`VideoError` saying why it is not a video this reads."""
    container = _open(path)
    try:
        p = _probe(container)
    finally:
        container.close()
    return {"width": p.width, "height": p.height, "fps": p.fps, "duration": p.duration, "taken": p.taken}


def _upright(frame, side: int | None, max_pixels: int | None = None) -> Image.Image:
    """A decoded frame → RGB PIL image, scaled (before it is converted to RGB) so its shorter side is at most
    ``side`` and its area at most ``max_pixels``, rotation applied."""
    w, h = frame.width, frame.height
    scale = 1.0
    if side and min(w, h) > side:
        scale = side / min(w, h)
    if max_pixels and w * h * scale * scale > max_pixels:
        scale = math.sqrt(max_pixels / (w * h))
    if scale < 1.0:
        w, h = max(2, int(w * scale)), max(2, int(h * scale))
    image = frame.to_image(width=w, height=h) if (w, h) != (frame.width, frame.height) else frame.to_image()
    rotation = int(round(getattr(frame, "rotation", 0) or 0)) % 360
    if rotation:
        image = image.rotate(rotation, expand=True)     # the display matrix's angle, counter-clockwise
    return image


def sample_frames(path: str | Path, rate: float = DEFAULT_RATE, max_frames: int = DEFAULT_MAX_FRAMES,
                  side: int | None = FRAME_SIDE, facts: dict | None = None) -> Iterator[tuple[float, Image.Image]]:
    """``(seconds, upright RGB image)`` of the frames at ``0, 1/rate, 2/rate, ...`` (the first frame at or after
    each target), at most ``max_frames``; one frame held at a time. ``facts``: filled with the probe's results and,
    when the generator ends, ``duration`` (seconds up to the end of the last frame decoded) and ``rotation``.
    :class:`VideoError` when the file is not a readable video (before the first frame) or when no frame decodes."""
    if rate <= 0:
        raise ValueError(f"rate must be positive, not {rate}")
    if max_frames < 1:
        raise ValueError(f"max_frames must be at least 1, not {max_frames}")
    container = _open(path)
    try:
        p = _probe(container)
        if facts is not None:
            facts.update(width=p.width, height=p.height, fps=p.fps, claimed=p.duration, taken=p.taken, rotation=0)
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        step = 1.0 / rate
        frame_gap = 1.0 / p.fps if p.fps else 0.0
        start = float(stream.start_time * stream.time_base) if stream.start_time is not None else 0.0
        taken, target, last_end, errors = 0, 0.0, 0.0, 0
        frames = container.decode(stream)
        while taken < max_frames:
            got = None
            try:
                for frame in frames:
                    if frame.time is None:
                        continue
                    t = frame.time - start
                    last_end = max(last_end, t + frame_gap)
                    if t + 1e-6 >= target:
                        got = (t, frame)
                        break
            except Exception as err:  # noqa: BLE001 - a damaged packet: decode on from the next one
                errors += 1
                if errors <= MAX_DECODE_ERRORS:
                    frames = container.decode(stream)
                    continue
                if taken == 0:
                    raise VideoError(f"no frame decodes: {decoder_error(err)}") from err
                break                                               # damaged from here on: the video ends here
            if got is None:
                break                                               # end of the stream
            t, frame = got
            image = _upright(frame, side)
            if facts is not None:
                facts["rotation"] = int(round(getattr(frame, "rotation", 0) or 0)) % 360
            yield t, image
            taken += 1
            target = max(target + step, math.floor(t / step + 1e-6) * step + step)
            if target - t > SEEK_GAP:
                try:                                                # to the keyframe at or before the target
                    container.seek(int((target + start) / stream.time_base), stream=stream, backward=True)
                    frames = container.decode(stream)
                except Exception:  # noqa: BLE001 - a stream that cannot seek is decoded on
                    pass
        if taken == 0:
            raise VideoError("no frame decodes (an empty or truncated video stream)")
        if facts is not None:
            # the stream ended: what was decoded; stopped at max_frames: the claimed duration, if any
            facts["duration"] = last_end if taken < max_frames or p.duration is None else p.duration
    finally:
        container.close()


# bytes a frame request may take per pixel: of the stream, the decoder's YUV 4:2:0 frames (1.5 bytes a pixel: the
# frame, its references, one per decoding thread); of the frame served, the RGB the scaler writes and Pillow's copy
FRAME_STREAM_BYTES_PER_PIXEL = 6
FRAME_OUTPUT_BYTES_PER_PIXEL = 8


def frame_cost(size: tuple[int, int], side: int | None, max_pixels: int | None = None) -> int:
    """The memory (bytes) :func:`frame_at` takes for a video whose frames are ``size``, scaled to ``side`` and
    ``max_pixels`` as it scales them: estimated from the size alone, before anything is decoded."""
    width, height = size
    scale = min(1.0, side / min(width, height)) if side else 1.0
    if max_pixels and width * height * scale * scale > max_pixels:
        scale = math.sqrt(max_pixels / (width * height))
    out = int(width * scale) * int(height * scale)
    return width * height * FRAME_STREAM_BYTES_PER_PIXEL + out * FRAME_OUTPUT_BYTES_PER_PIXEL


def frame_at(path: str | Path, seconds: float, side: int | None = FRAME_SIDE,
             max_pixels: int | None = None) -> Image.Image:
    """The upright frame at ``seconds`` (the first at or after it; the last one when ``seconds`` is past the end):
    seeks to the keyframe before it and decodes on, one decoding thread (a frame asked for by a client takes one
    core, whatever its size). The frame is scaled to ``side`` and ``max_pixels`` (:func:`_upright`) before it is
    converted to RGB. :class:`VideoError` when none decodes."""
    container = _open(path)
    try:
        _probe(container)
        stream = container.streams.video[0]
        stream.thread_count = 1
        start = float(stream.start_time * stream.time_base) if stream.start_time is not None else 0.0
        try:
            container.seek(int((max(seconds, 0.0) + start) / stream.time_base), stream=stream, backward=True)
        except Exception:  # noqa: BLE001 - decode from the start instead
            container.seek(0)
        last = None
        try:
            for frame in container.decode(stream):
                last = frame
                if frame.time is not None and frame.time - start + 1e-6 >= seconds:
                    break
        except Exception as err:  # noqa: BLE001
            if last is None:
                raise VideoError(f"no frame decodes: {decoder_error(err)}") from err
        if last is None:
            raise VideoError("no frame decodes at that time")
        return _upright(last, side, max_pixels)
    finally:
        container.close()


# --- segments --------------------------------------------------------------------------------------------------

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


# --- embedding many files ----------------------------------------------------------------------------------------

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


@dataclass
class VideoEmbeddings:
    """Embedded videos: per kept video its info, moments and vectors (positions refer to the input list)."""
    kept: list[int] = field(default_factory=list)
    info: list[VideoInfo] = field(default_factory=list)
    vectors: list[np.ndarray] = field(default_factory=list)           # per kept video: its own vector (D,)
    segments: list[list[Segment]] = field(default_factory=list)
    segment_vectors: list[np.ndarray] = field(default_factory=list)   # per kept video: (moments, D)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    frames: int = 0                                                    # sampled frames embedded

    @property
    def moments(self) -> int:
        return sum(len(s) for s in self.segments)

    def rows(self, paths: Sequence[str | Path], first_video_id: int):
        """``(segment vectors (n, D), segment rows (path, SegmentInfo), video rows (id, path, VideoInfo,
        vector))`` with video ids from ``first_video_id`` in input order."""
        seg_rows, video_rows, vectors = [], [], []
        for n, (pos, info, vector, segs, seg_vecs) in enumerate(zip(self.kept, self.info, self.vectors,
                                                                     self.segments, self.segment_vectors)):
            vid, path = first_video_id + n, str(Path(paths[pos]).resolve())
            video_rows.append((vid, path, info, vector))
            for s in segs:
                seg_rows.append((path, SegmentInfo(info.taken, info.width, info.height, info.folder, None, None,
                                                   None, vid, round(s.start, 3), round(s.end, 3),
                                                   round(s.start if s.best is None else s.best, 3))))
            vectors.append(seg_vecs)
        dim = self.vectors[0].shape[0] if self.vectors else 0
        return (np.concatenate(vectors).astype(np.float32) if vectors else np.zeros((0, dim), np.float32),
                seg_rows, video_rows)


def take_video_ids(manifest: dict, videos: VideoEmbeddings, paths: Sequence[str | Path]):
    """:meth:`VideoEmbeddings.rows` with video ids from the manifest's ``next_video_id`` (0 in an index written
    before videos), which it advances."""
    first = int(manifest.get("next_video_id", 0))
    out = videos.rows(paths, first)
    manifest["next_video_id"] = first + len(videos.kept)
    return out


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
    from training.inference.embedding import device_of, embed_pixels, fixed_batches

    model.eval()
    out = VideoEmbeddings()
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

    def flush():
        if pending:
            vectors = embed_pixels(model, torch.stack([px for _, px in pending]), shapes).cpu().numpy()
            for (pos, _), v in zip(pending, vectors):
                frame_vectors.setdefault(pos, []).append(v)
            out.frames += len(pending)
            pending.clear()

    def finish(pos: int, facts: dict):
        vectors = np.stack(frame_vectors.pop(pos))
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
    for name in ("kept", "info", "vectors", "segments", "segment_vectors"):
        values = getattr(out, name)
        setattr(out, name, [values[i] for i in order])
    return out


def write_video(path: str | Path, frames, fps: float = 4.0, codec: str | None = None, rotation: int = 0,
                faststart: bool = False, codec_options: dict[str, str] | None = None) -> Path:
    """Writes RGB frames (``(H, W, 3)`` uint8 arrays, all one even size) as a video file with PyAV: H.264 for
    .mp4/.mov/.m4v/.mkv, VP9 for .webm, MPEG-4 part 2 for .avi unless ``codec`` says otherwise. ``rotation``:
    display-matrix degrees (counter-clockwise) a player applies. ``faststart``: the MP4 index first.
    ``codec_options``: the encoder's (e.g. ``{"preset": "ultrafast"}`` for H.264)."""
    import av

    path = Path(path)
    codec = codec or {".webm": "libvpx-vp9", ".avi": "mpeg4"}.get(path.suffix.lower(), "libx264")
    options = {"movflags": "faststart"} if faststart else {}
    with av.open(str(path), "w", options=options) as container:
        stream: Any = None                      # av's VideoStream (add_stream is typed as any stream kind)
        for array in frames:
            array = np.ascontiguousarray(array, dtype=np.uint8)
            if stream is None:
                from fractions import Fraction

                stream = container.add_stream(codec, rate=Fraction(fps).limit_denominator(1000))
                stream.height, stream.width = array.shape[:2]
                stream.pix_fmt = "yuv420p"
                if codec_options:
                    stream.options = dict(codec_options)
                if rotation:
                    stream.set_display_rotation(rotation)
            for packet in stream.encode(av.VideoFrame.from_ndarray(array, format="rgb24")):
                container.mux(packet)
        if stream is not None:
            for packet in stream.encode():
                container.mux(packet)
    return path

