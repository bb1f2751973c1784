"""A perceptual hash of a photo: the 64-bit DCT hash (pHash). The picture is averaged down to 32 × 32 grey levels,
transformed by a 2-D DCT-II, and the 8 × 8 lowest frequencies but the constant one (the DC term) are compared with
their median: one bit each (63 bits, the top bit is 0). Re-encoding, resizing and small colour changes move few
bits; a crop or another shot moves many (the distances measured: benchmarks/duplicates.py, docs/index.md).

The hash is stored as a signed 64-bit integer (what SQLite holds) and computed at index time from the decoded
photo (index/embed.py), or from the file for photos indexed before hashes were kept (:func:`hash_file`).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

SIDE = 32            # the grey picture the DCT runs on
LOW = 8              # the low frequencies kept: LOW × LOW, less the DC term
BITS = LOW * LOW - 1


def _dct_matrix(n: int) -> np.ndarray:
    k = np.arange(n)[:, None]
    x = np.arange(n)[None, :]
    m = np.cos(np.pi * (2 * x + 1) * k / (2 * n)) * np.sqrt(2.0 / n)
    m[0] /= np.sqrt(2.0)
    return m


_DCT = _dct_matrix(SIDE)[:LOW]               # only the low rows are ever used


def perceptual_hash(image) -> int:
    """A PIL image → its 63-bit DCT hash, as a non-negative Python int below 2**63 (so it fits SQLite's signed
    64-bit integers as it is)."""
    from PIL import Image

    grey = image.convert("L") if image.mode not in ("L", "I;16") else image
    small = np.asarray(grey.resize((SIDE, SIDE), Image.Resampling.BOX), dtype=np.float64)
    low = (_DCT @ small @ _DCT.T).ravel()[1:]                   # 8 × 8 lowest frequencies, without DC
    bits = low > np.median(low)
    return int(sum(1 << i for i, b in enumerate(bits) if b))


def hash_file(path: str | Path) -> int | None:
    """The hash of an image file (decoded shrunk, as the index decodes it); None when it cannot be read."""
    from training.data.preprocess import decode_image

    path = Path(path)
    try:
        return perceptual_hash(decode_image(path.read_bytes(), path.suffix, 64).image)
    except Exception:  # noqa: BLE001 - a file gone or unreadable since it was indexed has no hash
        return None


def distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Bitwise Hamming distances between int64 hashes, elementwise (broadcast)."""
    x = np.bitwise_xor(np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)).view(np.uint64)
    return np.unpackbits(x[..., None].view(np.uint8), axis=-1).sum(axis=-1)
