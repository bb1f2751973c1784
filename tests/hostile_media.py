"""A generated corpus of hostile media files, for the tests (tests/test_hostile_media.py), the measurements
(benchmarks/hostile_media.py) and the soak's mix (benchmarks/soak.py): nothing downloaded, every file written here.

Each :class:`Case` is a file (its bytes, the name it is given) and what the service must answer when it is uploaded
(``upload``: a status) and what indexing must do with it in a gallery (``index``: ``photo`` or ``video`` when it is
indexed as that, else a phrase the skip reason holds):

* aspect extremes: a 118-byte 20000 × 2 PNG, a 2 × 20000 one, a 48-KB 24,500,000 × 2 one (grey; its pixel count
  under the 50 MP limit), and a 2048 × 16 video;
* huge declared sizes: headers of a PNG, a JPEG, a GIF, a BMP and a WebP that claim far more pixels than they hold;
* a progressive-JPEG scan bomb: 1000 scans, refused from its markers before it is decoded;
* truncated files: a PNG, a JPEG and an MP4 cut short, and the 24,500,000 × 2 PNG cut before its pixels (refused
  for its size before anything is decoded, so a 413 and never a 400);
* polyglots: a PNG with a ZIP appended, a JPEG whose comment holds a script, a GIF header followed by HTML, an HTML
  page, an MP4 header with an image brand;
* many streams: a Matroska file with 1 video and 24 audio streams;
* lying containers: a JPEG named ``.mp4``, an MP4 named ``.jpg``.
"""
from __future__ import annotations

import io
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image


@dataclass(frozen=True)
class Case:
    name: str            # the file's name (its suffix may lie)
    data: bytes
    upload: int          # the status of POST /v1/search/captions with it
    index: str           # "photo", "video", or a phrase of the skip reason at index time
    why: str


# --- PNGs of any geometry, written without their pixels in memory -----------------------------------------------

def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def png(width: int, height: int, truncate: bool = False) -> bytes:
    """A valid grey PNG of ``width`` × ``height`` (all black), its pixel rows compressed as they are made: a
    24,500,000 × 2 image is 48 KB. ``truncate``: the file ends after its header and the first bytes of its
    pixels."""
    head = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
    if truncate:                                                   # the start of the first row, and the end
        return head + _chunk(b"IDAT", zlib.compress(bytes(1024))[:32])
    packer = zlib.compressobj(9)
    out = []
    block = bytes(min(width, 1 << 20))
    for _ in range(height):
        out.append(packer.compress(b"\x00"))                       # the row's filter byte
        left = width
        while left:
            n = min(left, len(block))
            out.append(packer.compress(block[:n]))
            left -= n
    data = b"".join(out) + packer.flush()
    return head + _chunk(b"IDAT", data) + _chunk(b"IEND", b"")


def _image(size: tuple[int, int], fmt: str, seed: int = 0, **save) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, fmt, **save)
    return out.getvalue()


def jpeg(size: tuple[int, int] = (48, 32), seed: int = 0, **save) -> bytes:
    return _image(size, "JPEG", seed, **save)


def _segments(data: bytes) -> list[tuple[int, int, int]]:
    """``(marker code, start, end)`` of each marker segment of a JPEG before its first scan's data, then of each
    scan (SOS and its entropy-coded data), up to EOI."""
    from training.data.jpeg_scans import _MARKER

    out, pos = [], 2
    while pos < len(data):
        found = _MARKER.match(data, pos)
        code, start = found.group(1)[0], found.start()
        if code == 0xD9:
            out.append((code, start, found.end()))
            return out
        end = found.end() + int.from_bytes(data[found.end():found.end() + 2], "big")
        if code == 0xDA:
            end = _MARKER.search(data, end).start()
        out.append((code, start, end))
        pos = end
    return out


def scan_bomb(width: int = 7000, height: int = 7000, scans: int = 6000) -> bytes:
    """A grey progressive JPEG of ``width`` × ``height`` (all black) whose last scan (an AC refinement with
    end-of-band runs, tens of bytes) is repeated until the file holds ``scans`` scans: libjpeg runs every one over
    the whole image. A 7000² one of 6000 scans is about 60 KB; written here, nothing downloaded."""
    out = io.BytesIO()
    Image.new("L", (width, height)).save(out, "JPEG", progressive=True, quality=90)
    data = out.getvalue()
    parts = _segments(data)
    sos = [p for p in parts if p[0] == 0xDA]
    last = sos[-1]
    repeat = data[last[1]:last[2]]
    eoi = parts[-1][1]
    return data[:eoi] + repeat * max(0, scans - len(sos)) + data[eoi:]


DECODE_BOMBS = ("lossless WebP", "lossy WebP", "AVIF", "float TIFF", "16-bit PNG")


def decode_bomb(kind: str, side: int = 7000) -> bytes:
    """A small file of ``side`` × ``side`` black pixels whose decoder needs far more memory than its pixels' count
    suggests — one of :data:`DECODE_BOMBS`: a lossless WebP (about 2 KB at 7000²), a lossy one, an AVIF (about 1
    KB), a 32-bit float TIFF (deflate) and a 16-bit grey PNG."""
    mode, fmt, save = {"lossless WebP": ("RGB", "WEBP", {"lossless": True}),
                       "lossy WebP": ("RGB", "WEBP", {"quality": 10}),
                       "AVIF": ("RGB", "AVIF", {"quality": 10, "speed": 10}),
                       "float TIFF": ("F", "TIFF", {"compression": "tiff_adobe_deflate"}),
                       "16-bit PNG": ("I;16", "PNG", {})}[kind]
    out = io.BytesIO()
    Image.new(mode, (side, side)).save(out, fmt, **save)
    return out.getvalue()


def _declaring_jpeg(width: int, height: int) -> bytes:
    """A small JPEG whose frame header (SOF0) claims ``width`` × ``height``."""
    data = bytearray(jpeg((16, 16)))
    sof = data.index(b"\xff\xc0")
    data[sof + 5:sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def _declaring_gif(width: int, height: int) -> bytes:
    data = bytearray(_image((8, 8), "GIF"))
    data[6:10] = struct.pack("<HH", width, height)
    return bytes(data)


def _declaring_bmp(width: int, height: int) -> bytes:
    data = bytearray(_image((8, 8), "BMP"))
    data[18:26] = struct.pack("<ii", width, height)
    return bytes(data)


def _declaring_webp(width: int, height: int) -> bytes:
    """An extended WebP (VP8X) whose canvas claims ``width`` × ``height`` and holds nothing."""
    vp8x = b"VP8X" + struct.pack("<I", 10) + bytes(4) + (width - 1).to_bytes(3, "little") \
        + (height - 1).to_bytes(3, "little")
    return b"RIFF" + struct.pack("<I", 4 + len(vp8x)) + b"WEBP" + vp8x


# --- videos --------------------------------------------------------------------------------------------------------

def video(path: Path, size: tuple[int, int] = (64, 48), frames: int = 8, fps: float = 4.0, audio_streams: int = 0,
          codec: str | None = None, options: dict[str, str] | None = None) -> Path:
    """A short clip written with PyAV (``size`` = width × height, even); ``audio_streams`` silent audio streams
    beside its video stream."""
    import av

    path = Path(path)
    width, height = size
    codec = codec or {".webm": "libvpx-vp9", ".avi": "mpeg4"}.get(path.suffix.lower(), "libx264")
    rng = np.random.default_rng(0)
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=int(fps))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        if options:
            stream.options = dict(options)
        audio = [container.add_stream("aac", rate=8000) for _ in range(audio_streams)]
        base = rng.integers(0, 256, (max(1, height // 16), max(1, width // 16), 3), np.uint8)
        picture = np.asarray(Image.fromarray(base).resize((width, height), Image.Resampling.NEAREST))
        for i in range(frames):
            frame = av.VideoFrame.from_ndarray(np.roll(picture, 4 * i, axis=1), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
            for a in audio:
                sound = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
                sound.sample_rate = 8000
                sound.pts = i * 1024
                for packet in a.encode(sound):
                    container.mux(packet)
        for s in [stream, *audio]:
            for packet in s.encode():
                container.mux(packet)
    return path


def corpus(work: Path) -> list[Case]:
    """Every hostile file of the module docstring (videos are written under ``work``)."""
    work.mkdir(parents=True, exist_ok=True)
    mp4 = video(work / "clip.mp4").read_bytes()
    photo = jpeg((48, 32))
    tall = video(work / "tall.mp4", size=(2048, 16), frames=2).read_bytes()
    streams = video(work / "streams.mkv", audio_streams=24).read_bytes()
    return [
        Case("wide.png", png(20_000, 2), 413, "aspect ratio", "20000 × 2: 118 bytes, 2.6 M × 260 once resized"),
        Case("tall.png", png(2, 20_000), 413, "aspect ratio", "2 × 20000"),
        Case("widest.png", png(24_500_000, 2), 413, "aspect ratio", "24,500,000 × 2: under the pixel limit"),
        Case("widest-cut.png", png(24_500_000, 2, truncate=True), 413, "aspect ratio",
             "refused for its size before its (missing) pixels are read"),
        Case("claims.png", png(100_000, 100_000, truncate=True), 413, "pixels", "a header claiming 10 G pixels"),
        Case("claims.jpg", _declaring_jpeg(65_000, 65_000), 413, "pixels", "a JPEG frame header claiming 4 G"),
        Case("claims.gif", _declaring_gif(65_535, 65_535), 413, "pixels", "a GIF screen claiming 4 G"),
        Case("claims.bmp", _declaring_bmp(30_000, 30_000), 413, "pixels", "a BMP header claiming 900 M"),
        Case("claims.webp", _declaring_webp(16_383, 16_383), 413, "pixels", "a WebP canvas claiming 268 M"),
        Case("scans.jpg", scan_bomb(512, 512, 1000), 413, "scans", "a progressive JPEG of 1000 scans (a scan bomb)"),
        Case("cut.png", _image((64, 48), "PNG")[:300], 400, "", "a PNG cut short"),
        Case("cut.jpg", jpeg((64, 48))[:400], 400, "", "a JPEG cut short"),
        Case("cut.mp4", mp4[:len(mp4) // 3], 415, "", "an MP4 cut short"),
        Case("zip.png", _image((40, 30), "PNG") + b"PK\x03\x04" + bytes(64), 200, "photo", "a PNG and a ZIP"),
        Case("script.jpg", jpeg((40, 30), comment=b"<script>alert(1)</script>"), 200, "photo",
             "a JPEG whose comment is a script"),
        Case("html.gif", b"GIF89a<html><script>alert(1)</script></html>", 400, "", "a GIF header, then HTML"),
        Case("page.jpg", b"<!DOCTYPE html><html><body>hello</body></html>", 415, "", "an HTML page"),
        Case("heic.mp4", mp4[:8] + b"heic" + mp4[12:], 400, "", "an MP4 whose ftyp brand says HEIC"),
        Case("streams.mkv", streams, 415, "video", "1 video and 24 audio streams"),
        Case("tall.mkv", tall, 415, "aspect ratio", "a 2048 × 16 video"),
        Case("photo.mp4", photo, 200, "photo", "a JPEG named .mp4"),
        Case("clip.jpg", mp4, 415, "video", "an MP4 named .jpg"),
    ]
