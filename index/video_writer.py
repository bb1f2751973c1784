"""Writing a video file with PyAV: the clips of the tests, the demo gallery (``index/samples.py``) and the
benchmarks."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


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
