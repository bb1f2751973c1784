"""What a media file holds, told by its content, and what a decoder's failure is called in public.

* :func:`sniff_image` and :func:`sniff_video`: the media type announced by a file's first bytes (magic numbers,
  an ISO base media file's ``ftyp`` brands, a Matroska file's DocType), never by its name: a JPEG named
  ``clip.mp4`` is a photo, an MP4 named ``photo.jpg`` a video. HEIF and AVIF share MP4's container; their brands
  tell them apart.
* :func:`decoder_error`: the one mapping from a decoder's exception (Pillow, libheif, FFmpeg through PyAV,
  ``struct``/``zlib`` inside a plugin) to a fixed phrase saying what kind of failure it was. A library's own
  message can name a server path (FFmpeg quotes the file it opened), hold an object's repr or speak of internals,
  so it is never passed on: every error a client or a skip list sees is one of these phrases.
"""
from __future__ import annotations

import struct
import zlib
from pathlib import Path

HEAD_BYTES = 64             # how much of a file sniffing reads

IMAGE_SIGNATURES = (
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"BM", "image/bmp"),
    (b"II*\x00", "image/tiff"),
    (b"MM\x00*", "image/tiff"),
)
# ISO base media files: the 'ftyp' box's major brand, else a compatible brand, says which
_AVIF_BRANDS = {b"avif", b"avis"}
_HEIF_BRANDS = {b"heic", b"heix", b"hevc", b"hevx", b"heim", b"heis", b"hevm", b"hevs", b"mif1", b"msf1"}
# a QuickTime file written before 'ftyp' existed starts with one of these atoms
_QUICKTIME_ATOMS = {b"moov", b"mdat", b"wide", b"free", b"skip", b"pnot"}
_EBML = b"\x1a\x45\xdf\xa3"


def _brands(head: bytes) -> list[bytes]:
    """An ISO base media file's major brand, then its compatible brands (as far as ``head`` holds them)."""
    size = int.from_bytes(head[:4], "big")
    return [head[8:12]] + [head[i:i + 4] for i in range(16, min(size, len(head)) - 3, 4)]


def sniff_image(head: bytes) -> str | None:
    """The image media type announced by the magic bytes at the start of ``head``, else None."""
    if len(head) >= 12 and head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    if len(head) >= 12 and head[4:8] == b"ftyp":
        brands = _brands(head)
        if any(b in _AVIF_BRANDS for b in brands):
            return "image/avif"
        if any(b in _HEIF_BRANDS for b in brands):
            return "image/heic" if brands[0] in {b"heic", b"heix", b"heim", b"heis"} else "image/heif"
        return None
    return next((media for magic, media in IMAGE_SIGNATURES if head.startswith(magic)), None)


def sniff_video(head: bytes) -> str | None:
    """The video container announced by the first bytes of ``head`` (MP4 and its kin, QuickTime, Matroska, WebM,
    AVI), else None; an ISO base media file with an image brand (HEIF, AVIF) is not a video."""
    if len(head) >= 12 and head[4:8] == b"ftyp":
        if sniff_image(head) is not None:
            return None
        return "video/quicktime" if head[8:12] == b"qt  " else "video/mp4"
    if len(head) >= 8 and head[4:8] in _QUICKTIME_ATOMS:
        return "video/quicktime"
    if head.startswith(_EBML):
        return "video/webm" if b"webm" in head[:HEAD_BYTES] else "video/x-matroska"
    if len(head) >= 12 and head[:4] == b"RIFF" and head[8:12] == b"AVI ":
        return "video/x-msvideo"
    return None


def file_head(path: str | Path) -> bytes:
    """The first :data:`HEAD_BYTES` of a file (OSError when it cannot be read)."""
    with open(path, "rb") as fh:
        return fh.read(HEAD_BYTES)


# --- decoder errors in public words -----------------------------------------------------------------------------

TRUNCATED = "the file is truncated"
CORRUPT = "its data is corrupt"
UNRECOGNISED = "no decoder recognises its content"
UNSUPPORTED = "its format or codec is not supported by this installation"
UNREADABLE = "the file cannot be read"
TOO_LARGE = "it is too large to decode"
UNDECODABLE = "its data cannot be decoded"


# PyAV's exception classes (av.error), by name, and their words
_FFMPEG = (({"EOFError"}, TRUNCATED),
           ({"DecoderNotFoundError", "DemuxerNotFoundError", "PatchWelcomeError", "OptionNotFoundError"}, UNSUPPORTED),
           ({"FileNotFoundError", "PermissionError", "IsADirectoryError"}, UNREADABLE),
           ({"InvalidDataError"}, CORRUPT),
           ({"MemoryError"}, TOO_LARGE))


def decoder_error(err: BaseException) -> str:
    """The public phrase for a decoder's exception: what kind of failure it was, from the exception's type (and,
    for Pillow's plain OSErrors and SyntaxErrors, a word of its message), never the message itself."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(err, (Image.DecompressionBombError, Image.DecompressionBombWarning, MemoryError)):
        return TOO_LARGE
    if isinstance(err, UnidentifiedImageError):
        return UNRECOGNISED
    ffmpeg = {c.__name__ for c in type(err).__mro__ if c.__module__ == "av.error"}    # PyAV's, without importing it
    if "FFmpegError" in ffmpeg:
        for names, words in _FFMPEG:
            if ffmpeg & names:
                return words
        return UNDECODABLE
    text = str(err).lower()
    if isinstance(err, EOFError) or "truncated" in text:
        return TRUNCATED
    if isinstance(err, (SyntaxError, struct.error, zlib.error, IndexError, KeyError, ZeroDivisionError)):
        return CORRUPT
    if isinstance(err, (FileNotFoundError, PermissionError, IsADirectoryError)):
        return UNREADABLE
    if isinstance(err, OSError) and "decoder" in text and "not available" in text:
        return UNSUPPORTED
    if isinstance(err, (OSError, ValueError)) and any(w in text for w in ("broken", "corrupt", "invalid", "bad")):
        return CORRUPT
    return UNDECODABLE
