"""Reading a video file with PyAV: checking it, sampling its frames, taking one frame.

* :func:`probe` opens a file and checks it before any frame is decoded: a video stream, a sane size (at most
  :data:`MAX_SIDE` pixels a side, so a 16k × 16k stream is refused, and no more elongated than a photo may be:
  ``training.data.preprocess.MAX_ASPECT``), frame rate and claimed duration. Every failure is told in
  ``training.data.media.decoder_error``'s words, never FFmpeg's own message (which names the file's path).
* :func:`sample_frames` yields ``(seconds, upright RGB image)`` at ``rate`` frames a second, at most
  ``max_frames``: a generator, one frame in memory at a time. Far targets are reached by seeking to the keyframe
  before them; near ones by decoding on. Rotation metadata (the display matrix) is applied. A file that claims a
  longer duration than it holds simply ends where its frames end.
* :func:`frame_at` decodes the one frame at a time (a moment's thumbnail, the service's frame route), and
  :func:`frame_cost` estimates the memory it takes before anything is decoded.

Whether a file is a video at all is told by its content: ``index.scan.is_video``. Grouping sampled frames into
moments: ``index/moments.py``; embedding many videos: ``index/video_embed.py``.
"""
from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from PIL import Image
from training.data.media import decoder_error
from training.data.preprocess import ImageGeometryError, check_geometry

from .choices import DEFAULT_MAX_FRAMES, DEFAULT_RATE

MAX_SIDE = 8192                 # pixels: larger streams (16k × 16k) are refused before decoding
MAX_FPS = 1000.0                # a claimed frame rate above this is no real video
MAX_DURATION = 7 * 24 * 3600.0  # seconds: a claimed duration above a week is a lie
MAX_DECODE_ERRORS = 8           # damaged packets skipped in a video before it is taken to end there
SEEK_GAP = 4.0                  # seconds: a target farther than this ahead is reached by seeking, not decoding
FRAME_SIDE = 512                # frames are scaled (before conversion to RGB) so the shorter side is at most this


class VideoError(ValueError):
    """A file that is not a readable video; ``str()`` says why."""



@dataclass(frozen=True)
class _Probe:
    stream_index: int
    width: int
    height: int
    fps: float
    duration: float | None
    taken: float | None
    rotation: int



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
