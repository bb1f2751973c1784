"""How many scans a JPEG holds, counted from its markers before it is decoded.

A progressive JPEG is decoded in time proportional to its pixels times its scans: libjpeg runs every scan over the
whole coefficient buffer. A *scan bomb* — a 7000 × 7000 progressive JPEG with thousands of empty AC scans of about
10 bytes each — costs seconds of CPU per kilobyte. libjpeg-turbo's answer is a scan limit (``djpeg -maxscans``,
TurboJPEG's ``TJPARAM_SCANLIMIT``); Pillow does not expose one, so the scans are counted here, on the file's bytes,
and the caller refuses a file above :data:`MAX_SCANS`.

The count walks the marker segments from SOI (each segment's length skips it) and, after each SOS, finds the end
of its entropy-coded data — the next ``0xFF`` followed by a byte that is neither 0 (a stuffed ``0xFF``), a restart
marker (``RST0``–``RST7``) nor another ``0xFF`` (fill) — with one regular-expression search (C speed), so a file
costs one pass over its bytes and at most ``limit + 1`` steps of Python. It stops at EOI (an MPO's later images are
not decoded on open), at the end of the data, or at anything that is not a marker where one must be (the decoder
then says what is wrong with the file).
"""
from __future__ import annotations

import re

# libjpeg's default progression writes 10 scans for a colour image and 6 for a grey one; jpegtran -optimize,
# mozjpeg's scan optimisation and Photoshop write at most a few dozen. 100 is several times what any encoder
# writes, and bounds the decoding of a 50-megapixel image (the pixel limit) to 100 passes over its coefficients.
MAX_SCANS = 100

_SOI, _EOI, _SOS, _TEM = 0xD8, 0xD9, 0xDA, 0x01
# fill bytes, then a marker code (not RSTn, not stuffing); written as one literal 0xFF first so that the search runs
# at memchr speed over the entropy-coded data (``\xff+`` instead: 18× slower, 0.6 ms of GIL-held time per 85 KB upload)
_MARKER = re.compile(rb"\xff\xff*([^\x00\xd0-\xd7\xff])")
_RST = range(0xD0, 0xD8)


def count_scans(data: bytes | bytearray | memoryview, limit: int | None = None) -> int:
    """The number of SOS markers (scans) of the JPEG ``data`` up to its first EOI; counting stops once it is
    above ``limit`` (so the answer is then ``limit + 1``). 0 for data that does not start with SOI."""
    if bytes(data[:2]) != b"\xff\xd8":
        return 0
    pos, scans, end = 2, 0, len(data)
    while pos < end:
        found = _MARKER.match(data, pos)
        if found is None:                   # not a marker where one must be: the decoder judges the file
            break
        code, pos = found.group(1)[0], found.end()
        if code == _EOI:
            break
        if code == _TEM or code == _SOI or code in _RST:       # markers without a length
            continue
        if pos + 2 > end:
            break
        length = int.from_bytes(data[pos:pos + 2], "big")
        if length < 2:
            break
        pos += length
        if code == _SOS:
            scans += 1
            if limit is not None and scans > limit:
                break
            after = _MARKER.search(data, pos)       # the end of the scan's entropy-coded data
            if after is None:
                break
            pos = after.start()
    return scans
