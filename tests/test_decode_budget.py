"""Memory admission of upload decoding (training/data/decode_cost.py, service/images.py, service/api/deps.py): each
decoding's memory estimated from the header by format and mode, held against one budget of bytes while it runs; an
image estimated above the whole budget is 413, one that does not fit beside those running 503 + Retry-After."""
from __future__ import annotations

import io
import threading
import time

import pytest
from server_process import wait_ready
from fastapi.testclient import TestClient
from PIL import Image

from service.app import create_app
from service.images import ImageError, open_checked
from service.settings import Settings
from tests.hostile_media import decode_bomb
from training.data.decode_cost import OVERHEAD, DecodeBusy, DecodeTooLarge, MemoryBudget, decode_bytes

MiB = 2 ** 20


def _opened(mode: str, fmt: str, size=(700, 500), **save) -> Image.Image:
    out = io.BytesIO()
    Image.new(mode, size).save(out, fmt, **save)
    return Image.open(io.BytesIO(out.getvalue()))


def test_the_estimate_is_by_format_mode_and_the_jpeg_scale():
    pixels = 700 * 500
    assert decode_bytes(_opened("RGB", "WEBP", lossless=True)) == 20 * pixels + OVERHEAD
    assert decode_bytes(_opened("RGB", "PNG")) == 12 * pixels + OVERHEAD
    assert decode_bytes(_opened("I;16", "PNG")) == 8 * pixels + OVERHEAD
    assert decode_bytes(_opened("L", "PNG")) == 6 * pixels + OVERHEAD
    assert decode_bytes(_opened("F", "TIFF")) == 12 * pixels + OVERHEAD
    jpeg = _opened("RGB", "JPEG", size=(4000, 3000))
    assert decode_bytes(jpeg) == 12 * 4000 * 3000 + OVERHEAD                 # decoded whole
    assert decode_bytes(jpeg, 256) == 12 * 1000 * 750 + OVERHEAD             # drafted to 1/4 for a 256 side


def test_the_budget_admits_what_fits_refuses_the_rest_at_once_and_gives_back():
    budget = MemoryBudget(100)
    with pytest.raises(DecodeTooLarge):
        with budget.hold(101):
            pass
    with budget.hold(60):
        with pytest.raises(DecodeBusy):
            with budget.hold(50):
                pass
        with budget.hold(40):
            assert budget.held == 100
    assert budget.held == 0 and budget.peak == 100 and budget.refused == 1
    with pytest.raises(RuntimeError):                       # given back when the decoding fails too
        with budget.hold(100):
            raise RuntimeError
    assert budget.held == 0


def test_threads_never_hold_more_than_the_budget():
    budget, seen, lock = MemoryBudget(10), [], threading.Lock()

    def work():
        for _ in range(200):
            try:
                with budget.hold(3):
                    with lock:
                        seen.append(budget.held)
            except DecodeBusy:
                pass

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert max(seen) <= 9 and budget.held == 0 and budget.peak <= 9


def test_a_decode_bomb_is_refused_from_its_header():
    bomb = decode_bomb("lossless WebP", 7000)                   # 2 KB, about 940 MB to decode
    assert len(bomb) < 4000
    with pytest.raises(ImageError) as err:
        open_checked(bomb, 50_000_000, 260, 260, MemoryBudget(512 * MiB))
    assert err.value.status == 413 and "JOINTSPACE_DECODE_MEMORY_BYTES" in err.value.detail
    budget = MemoryBudget(512 * MiB)
    small = decode_bomb("lossless WebP", 600)
    with budget.hold(500 * MiB):                                # the budget is held: refused for now
        with pytest.raises(DecodeBusy):
            open_checked(small, 50_000_000, 260, 260, budget)
    fresh = MemoryBudget(512 * MiB)
    assert open_checked(small, 50_000_000, 260, 260, fresh).size == (600, 600)
    assert fresh.held == 0 and fresh.peak == decode_bytes(Image.open(io.BytesIO(small)))


@pytest.fixture(scope="module")
def client(tiny_model_path, tiny_index_dir):
    with TestClient(create_app(Settings(model=str(tiny_model_path), index=str(tiny_index_dir),
                                        reload_interval_s=0))) as c:
        yield wait_ready(c)


def test_uploads_are_413_over_the_budget_and_503_while_it_is_held(client):
    for kind in ("lossless WebP", "float TIFF"):
        r = client.post("/v1/search/captions", files={"image": ("x", decode_bomb(kind, 7000), "image/webp")})
        assert r.status_code == 413 and "the limit is 512 MiB" in r.json()["detail"], (kind, r.text)
    photo = decode_bomb("lossless WebP", 300)
    budget = client.app.state.service.decode_budget
    with budget.hold(budget.total - MiB):
        r = client.post("/v1/search/captions", files={"image": ("x", photo, "image/webp")})
        assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
        assert "decoding memory budget" in r.json()["detail"]
    assert client.post("/v1/search/captions", files={"image": ("x", photo, "image/webp")}).status_code == 200
