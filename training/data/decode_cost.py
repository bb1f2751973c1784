"""What decoding an image costs in memory, told from its header before a pixel is decoded, and a budget of bytes
that decodings are admitted against.

The pixel limit counts pixels, not what a decoder holds while it works: a 1,930-byte lossless WebP of 7000 × 7000
takes about 940 MB to decode (libwebp's ARGB canvases, Pillow's image, its RGB copy), a 1.3 KB AVIF 660 MB, a
300 KB float TIFF 610 MB. :func:`decode_bytes` estimates the peak a decoding adds, per format and mode, from the
pixels it will decode (a JPEG at the DCT scale it is drafted to): bytes a pixel measured at 16 and 49 megapixels
(``open_checked`` of service/images.py, peak RSS growth of a process of its own), rounded up:

===========================================  =============
format / mode                                bytes a pixel
===========================================  =============
WebP (lossy or lossless)                     20  (measured 19.2)
AVIF, HEIC/HEIF                              16  (13.6–15.2; 11.7)
JPEG, at its DCT scale                       12  (12)
8-bit RGB, RGBA, CMYK; 32-bit I and F        12  (11.5–12.4)
16-bit grey (``I;16``)                       8   (7.6–7.8)
8-bit grey, palette, bilevel                 6   (5.7)
===========================================  =============

:class:`MemoryBudget` is a semaphore of bytes: a decoding holds its estimate while it runs; one that does not fit
beside those running is refused at once (:class:`DecodeBusy`: the caller answers 503 + Retry-After), one larger
than the whole budget is refused for good (:class:`DecodeTooLarge`: 413) — so the decodings running at once hold at
most the budget, whatever their number.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

from PIL import Image

from .preprocess import dct_scale

OVERHEAD = 16 * 2**20              # a decoding's fixed cost (the decoder's state, tables, the model's resize)
_FORMAT_BYTES = {"WEBP": 20, "AVIF": 16, "HEIF": 16, "HEIC": 16, "JPEG": 12, "MPO": 12}
_MODE_BYTES = {"1": 6, "L": 6, "P": 6, "I;16": 8, "I;16B": 8, "I;16L": 8, "I;16N": 8}
DEFAULT_BYTES = 12                 # bytes a pixel of any other format and mode


def bytes_per_pixel(image: Image.Image) -> int:
    """Bytes a decoded pixel of ``image`` (opened, not loaded) costs at the peak of its decoding (the table of the
    module docstring)."""
    return _FORMAT_BYTES.get(image.format or "", _MODE_BYTES.get(image.mode, DEFAULT_BYTES))


def decode_bytes(image: Image.Image, min_side: int | None = None) -> int:
    """The memory (bytes) decoding ``image`` (opened, not loaded) to an upright RGB image adds at its peak; a JPEG
    with ``min_side`` is counted at the DCT scale :func:`~training.data.preprocess.draft` will decode it at."""
    width, height = image.size
    scale = dct_scale(image.size, min_side) if min_side is not None and image.format in ("JPEG", "MPO") else 1
    return -(-width // scale) * -(-height // scale) * bytes_per_pixel(image) + OVERHEAD


class DecodeBusy(Exception):
    """The decodings running hold too much of the budget for this one now: retry later (503 + Retry-After)."""

    def __init__(self, cost: int, budget: int):
        super().__init__(f"the images being decoded hold the decoding memory budget ({budget / 2**20:,.0f} MiB); "
                         f"this one needs about {cost / 2**20:,.0f} MiB")
        self.cost, self.budget = cost, budget


class DecodeTooLarge(Exception):
    """This decoding alone would take more than the whole budget (413)."""

    def __init__(self, cost: int, budget: int):
        super().__init__(f"decoding this image would take about {cost / 2**20:,.0f} MiB of memory; the limit is "
                         f"{budget / 2**20:,.0f} MiB")
        self.cost, self.budget = cost, budget


class MemoryBudget:
    """A semaphore of ``total`` bytes for decodings, thread-safe (decodings run on worker threads): :meth:`hold`
    admits one or raises at once, never waits. ``peak`` is the most bytes ever held at once."""

    def __init__(self, total: int):
        self.total = total
        self.held = self.peak = 0
        self.refused = 0
        self._lock = threading.Lock()

    @contextmanager
    def hold(self, cost: int) -> Iterator[None]:
        """Holds ``cost`` bytes for the ``with`` block: :class:`DecodeTooLarge` when it is above the whole budget,
        :class:`DecodeBusy` when it does not fit beside what is held now."""
        if cost > self.total:
            raise DecodeTooLarge(cost, self.total)
        with self._lock:
            if self.held + cost > self.total:
                self.refused += 1
                raise DecodeBusy(cost, self.total)
            self.held += cost
            self.peak = max(self.peak, self.held)
        try:
            yield
        finally:
            with self._lock:
                self.held -= cost
