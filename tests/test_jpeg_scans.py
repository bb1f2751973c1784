"""Counting a JPEG's scans from its markers (training/data/jpeg_scans.py) and refusing a progressive scan bomb
before it is decoded: at upload (service/images.py), for a thumbnail, and at index time (decode_image)."""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from service.images import ImageError, open_checked, thumbnail
from tests.hostile_media import scan_bomb
from training.data.jpeg_scans import MAX_SCANS, count_scans
from training.data.preprocess import ImageGeometryError, decode_image


def _jpeg(mode: str = "RGB", size=(96, 64), **save) -> bytes:
    rng = np.random.default_rng(0)
    shape = (size[1], size[0], 3) if mode == "RGB" else (size[1], size[0])
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, shape, np.uint8), mode).save(out, "JPEG", **save)
    return out.getvalue()


def test_counts_the_scans_encoders_write():
    assert count_scans(_jpeg()) == 1                                  # baseline: one interleaved scan
    assert count_scans(_jpeg(progressive=True)) == 10                 # libjpeg's colour progression
    assert count_scans(_jpeg("L", progressive=True)) == 6             # and its grey one
    # random pixels: the entropy-coded data is full of stuffed 0xFF00; restart markers inside a scan are no scans
    assert count_scans(_jpeg(size=(256, 256), quality=100, restart_marker_blocks=1)) == 1
    assert count_scans(_jpeg(size=(256, 256), progressive=True, restart_marker_rows=1)) == 10


def test_counts_a_bomb_and_stops_past_the_limit():
    bomb = scan_bomb(64, 64, 500)
    assert count_scans(bomb) == 500
    assert count_scans(bomb, MAX_SCANS) == MAX_SCANS + 1              # stops once above the limit
    assert count_scans(scan_bomb(64, 64, MAX_SCANS)) == MAX_SCANS    # at the limit: decodable
    Image.open(io.BytesIO(scan_bomb(64, 64, MAX_SCANS))).load()


def test_not_a_jpeg_or_cut_short_counts_what_is_there():
    assert count_scans(b"\x89PNG\r\n\x1a\n" + bytes(32)) == 0
    assert count_scans(b"") == 0
    data = _jpeg(progressive=True)
    cut = data[:len(data) // 2]
    assert 0 < count_scans(cut) < 10
    assert count_scans(b"\xff\xd8\xff\xda") == 0                     # a length cut off: nothing more to count
    assert count_scans(b"\xff\xd8garbage") == 0                        # no marker where one must be


def test_an_upload_a_thumbnail_and_the_indexer_refuse_a_bomb(tmp_path):
    bomb = scan_bomb(512, 512, 1000)
    with pytest.raises(ImageError) as err:
        open_checked(bomb, 50_000_000, 260, 260)
    assert err.value.status == 413 and f"more than {MAX_SCANS} scans" in err.value.detail
    path = tmp_path / "bomb.jpg"
    path.write_bytes(bomb)
    with pytest.raises(ImageError) as err:
        thumbnail(path, 128, 50_000_000)
    assert err.value.status == 413
    for source in (bomb, path):
        with pytest.raises(ImageGeometryError) as geometry:
            decode_image(source, ".jpg", 260)
        assert geometry.value.limit == "scans"
    fine = tmp_path / "fine.jpg"
    fine.write_bytes(_jpeg(progressive=True))
    assert thumbnail(fine, 32, 50_000_000)[1] == "image/jpeg"
    assert decode_image(fine).size == (96, 64)
