"""Image search results by capture time (index/order.py): ``sort: newest|oldest`` keeps the hits that pass
``min_score`` and orders them by capture time, ties by id, photos without one last; paging is stable (the pages
put together are the whole sorted list); the library, the CLI (``index search --sort``) and the API
(``POST /v1/search/images``) give the same order; a bad ``sort`` is 422 naming the values."""
import datetime as dt
import json
import time

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image, ImageDraw

from index.embed import embed_sentences
from index.changes import BuildOptions
from index.gallery import EmbedOptions, Gallery, build
from index.order import SORTS, by_time
from service.app import create_app
from service.cli import main as cli_main
from service.settings import Settings
from training.models.checkpoint import load_model
from server_process import wait_ready

DAY = 86400.0
START = dt.datetime(2021, 3, 1, tzinfo=dt.timezone.utc).timestamp()
# capture day of photo i: not the order of the ids, nor (by chance) of the scores
DAYS = [5, 0, 9, 3, 7, 1, 11, 2, 8, 4, 10, 6]
QUERY = "a red circle"


def _photo(path, seed, taken):
    rng = np.random.default_rng(seed)
    image = Image.new("RGB", (32, 32), tuple(int(v) for v in rng.integers(0, 255, 3)))
    ImageDraw.Draw(image).ellipse(tuple(int(v) for v in sorted(rng.integers(0, 32, 2))) * 2,
                                  fill=tuple(int(v) for v in rng.integers(0, 255, 3)))
    exif = Image.Exif()
    exif.get_ifd(0x8769)[0x9003] = dt.datetime.fromtimestamp(taken, dt.timezone.utc).strftime("%Y:%m:%d %H:%M:%S")
    image.save(path, "JPEG", exif=exif)
    return path


@pytest.fixture(scope="module")
def model(tiny_model_path):
    return load_model(tiny_model_path)


@pytest.fixture(scope="module")
def gallery_dir(model, tmp_path_factory):
    root = tmp_path_factory.mktemp("sort")
    (root / "photos").mkdir()
    paths = [_photo(root / "photos" / f"p{i:02d}.jpg", i, START + d * DAY) for i, d in enumerate(DAYS)]
    build(root / "gallery", model, paths, options=BuildOptions(image_root=root / "photos"),
          embedding=EmbedOptions(progress=False, workers=0))
    return root / "gallery"


@pytest.fixture(scope="module")
def expected(model, gallery_dir):
    """The relevance ranking, a min_score between its 7th and 8th hit, and the 7 hits above it by capture time."""
    gallery = Gallery.load(gallery_dir)
    query = embed_sentences(model, [QUERY], progress=False)
    ranked = gallery.search_images(query, len(DAYS))[0]
    cut = (ranked[6][1] + ranked[7][1]) / 2
    assert ranked[6][1] > cut > ranked[7][1]
    taken = {r.id: r.taken for r in gallery.meta.all_images()}
    gallery.close()
    kept = [i for i, _ in ranked[:7]]
    newest = sorted(kept, key=lambda i: (-taken[i], i))
    assert newest != [i for i, _ in ranked[:7]], "the test needs a capture-time order unlike the ranking"
    return {"cut": cut, "newest": newest, "ranked": [i for i, _ in ranked]}


def test_newest_orders_the_hits_above_min_score_by_capture_time_and_pages_stably(model, gallery_dir, expected):
    gallery = Gallery.load(gallery_dir)
    query = embed_sentences(model, [QUERY], progress=False)
    try:
        newest = gallery.search_images(query, 20, min_score=expected["cut"], sort="newest")[0]
        assert [i for i, _ in newest] == expected["newest"]
        assert all(s >= expected["cut"] for _, s in newest)
        oldest = gallery.search_images(query, 20, min_score=expected["cut"], sort="oldest")[0]
        assert [i for i, _ in oldest] == expected["newest"][::-1]
        pages = [gallery.search_images(query, 3, offset=o, min_score=expected["cut"], sort="newest")[0]
                 for o in (0, 3, 6, 9)]
        assert [i for p in pages for i, _ in p] == expected["newest"]
        assert pages[-1] == []
        # relevance is the ranking as before
        assert [i for i, _ in gallery.search_images(query, 20, sort="relevance")[0]] == expected["ranked"]
        with pytest.raises(ValueError, match="sort must be one of relevance, newest, oldest"):
            gallery.search_images(query, 5, sort="latest")
    finally:
        gallery.close()


def test_photos_without_a_capture_time_come_last_and_ties_go_by_id():
    ids = np.array([1, 2, 3, 4, 5])
    taken = np.array([10.0, np.nan, 30.0, 10.0, np.nan])
    hits = [(5, 0.9), (4, 0.8), (3, 0.7), (2, 0.6), (1, 0.5)]
    assert [i for i, _ in by_time(hits, ids, taken, "newest")] == [3, 1, 4, 2, 5]
    assert [i for i, _ in by_time(hits, ids, taken, "oldest")] == [1, 4, 3, 2, 5]
    assert by_time(hits, ids, taken, "relevance") == hits
    assert [i for i, _ in by_time([(9, 1.0), (3, 0.5)], ids, taken, "newest")] == [3, 9]   # an unknown id: last


def test_the_cli_sorts_as_the_library(tiny_model_path, gallery_dir, expected, capsys):
    code = cli_main(["index", "search", "--index", str(gallery_dir), "--model", str(tiny_model_path), "--text", QUERY,
                     "--min-score", repr(expected["cut"]), "--sort", "newest", "--k", "20", "--json",
                     "--device", "cpu"])
    assert code == 0
    results = json.loads(capsys.readouterr().out)["results"]
    assert [r["id"] for r in results] == expected["newest"]
    taken = [r["taken"] for r in results]
    assert taken == sorted(taken, reverse=True)


@pytest.fixture(scope="module")
def client(tiny_model_path, gallery_dir):
    app = create_app(Settings(model=str(tiny_model_path), index=str(gallery_dir), reload_interval_s=0))
    with TestClient(app) as c:
        yield wait_ready(c)


def test_the_api_sorts_after_the_relevance_cut_and_pages_stably(client, expected):
    body = {"text": QUERY, "min_score": expected["cut"], "sort": "newest"}
    r = client.post("/v1/search/images", json={**body, "k": 20})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [h["id"] for h in results] == expected["newest"]
    assert [h["taken"] for h in results] == sorted((h["taken"] for h in results), reverse=True)
    pages = [client.post("/v1/search/images", json={**body, "k": 2, "offset": o}).json()["results"]
             for o in (0, 2, 4, 6)]
    assert [h["id"] for p in pages for h in p] == expected["newest"]
    oldest = client.post("/v1/search/images", json={**body, "k": 20, "sort": "oldest"}).json()["results"]
    assert [h["id"] for h in oldest] == expected["newest"][::-1]
    # by example (a gallery image) as well
    like = client.post("/v1/search/images", json={"image_id": 0, "sort": "oldest", "k": 20})
    assert like.status_code == 200
    assert [h["taken"] for h in like.json()["results"]] == sorted(h["taken"] for h in like.json()["results"])


def test_a_bad_sort_is_422_naming_the_values(client):
    r = client.post("/v1/search/images", json={"text": QUERY, "sort": "latest"})
    assert r.status_code == 422
    detail = r.json()["detail"]
    assert "sort" in detail and all(f"'{s}'" in detail for s in SORTS), detail
    doc = client.get("/openapi.json").json()
    field = doc["components"]["schemas"]["TextSearch"]["properties"]["sort"]
    assert field["enum"] == list(SORTS) and field["default"] == "relevance"


@pytest.mark.parametrize("mode", ["hybrid", "keyword"])
def test_keyword_and_hybrid_search_sort_their_hits_above_min_score_too(model, gallery_dir, mode):
    from index.hybrid import TextPaging, search_text

    text = "p03 p07 p10 a red circle"                   # file names as words: keyword hits
    gallery = Gallery.load(gallery_dir)
    query = embed_sentences(model, [text], progress=False)
    try:
        ranked = search_text(gallery, query, text, mode, TextPaging(k=len(DAYS)))
        assert ranked.hits and any(ranked.matched)
        cut = sorted(s for _, s in ranked.hits)[len(ranked.hits) // 3]
        taken = {r.id: r.taken for r in gallery.meta.all_images()}
        kept = [i for i, s in ranked.hits if s >= cut]
        newest = search_text(gallery, query, text, mode, TextPaging(k=len(DAYS), min_score=cut, sort="newest"))
        assert [i for i, _ in newest.hits] == sorted(kept, key=lambda i: (-taken[i], i))
        pages = [search_text(gallery, query, text, mode, TextPaging(k=2, offset=o, min_score=cut, sort="newest")).hits
                 for o in range(0, len(kept) + 2, 2)]
        assert [i for p in pages for i, _ in p] == [i for i, _ in newest.hits]
    finally:
        gallery.close()
