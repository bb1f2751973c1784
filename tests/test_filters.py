"""Search options on every search route, the CLI and the library: folder and capture-time filters (inside FAISS,
checked against a brute-force filter over the whole gallery, also when fewer than k pass), min_score, offset,
words to subtract from a text query, query by an uploaded example photo; and the bad input each can carry (an
unknown folder, a date that is not one, a min_score outside the similarity's range, an unreadable image): a clear
4xx or CLI exit 2, never a 500, the index untouched. A date range that holds no instant is a valid filter that
matches no image, the same on every route and the CLI."""
import datetime as dt
import os
import io
import json

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from PIL import Image, ImageDraw

from index.embed import embed_sentences
from index.faiss_index import VectorIndex
from index.changes import BuildOptions
from index.gallery import EmbedOptions, Gallery, build
from index.generations import current_generation
from index.query import ImageFilter, format_time, parse_time
from training.inference import embedding as inference
from training.data.vocab import pad_batch
from service.app import create_app
from service.cli import main as cli_main
from service.settings import Settings
from training.models.checkpoint import load_model
from server_process import wait_ready

DAY = 86400.0
START = dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc).timestamp()
QUERIES = ["a red circle", "a blue square above a green star", "a yellow triangle"]


@pytest.fixture(scope="module")
def model(tiny_model_path):
    return load_model(tiny_model_path)


def _photo(path, seed, taken=None):
    rng = np.random.default_rng(seed)
    image = Image.new("RGB", (32, 32), tuple(int(v) for v in rng.integers(0, 255, 3)))
    ImageDraw.Draw(image).rectangle(tuple(int(v) for v in sorted(rng.integers(0, 32, 2))) * 2,
                                    fill=tuple(int(v) for v in rng.integers(0, 255, 3)))
    exif = Image.Exif()
    if taken is not None:
        exif.get_ifd(0x8769)[0x9003] = dt.datetime.fromtimestamp(taken, dt.timezone.utc).strftime("%Y:%m:%d %H:%M:%S")
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, "JPEG", exif=exif)
    return path


@pytest.fixture(scope="module")
def gallery_dir(model, tmp_path_factory):
    """30 photos in folders trip/, trip/day2/, home/ and the root, taken one a day from 2020-01-01."""
    root = tmp_path_factory.mktemp("filters")
    photos = root / "photos"
    folders = ["trip", "trip/day2", "home", "."]
    paths = [_photo(photos / folders[i % 4] / f"p{i:02d}.jpg", i, START + i * DAY) for i in range(30)]
    build(root / "gallery", model, paths, [(f"caption {i}", None) for i in range(12)],
          options=BuildOptions(image_root=photos), embedding=EmbedOptions(progress=False, workers=0))
    return root / "gallery"


def _brute_force(gallery, query, flt, k, offset=0, min_score=None):
    """Every image scored exactly, filtered by its metadata row, sorted: what a filtered search must return."""
    rows = gallery.meta.all_images()
    target = None if flt.folder is None else gallery.photos.resolve(flt.folder)
    keep = []
    for r in rows:
        if target is not None and not (r.folder == target or r.folder.startswith(target + "/")):
            continue
        if flt.taken_after is not None and not r.taken >= flt.taken_after:
            continue
        if flt.taken_before is not None and not r.taken < flt.taken_before:
            continue
        score = float(np.dot(gallery.images.reconstruct(r.id), query))
        if min_score is None or score >= min_score:
            keep.append((r.id, score))
    keep.sort(key=lambda h: -h[1])
    return keep[offset:offset + k]


FILTERS = [
    ImageFilter(),
    ImageFilter(folder="trip"),                                       # trip/ and trip/day2/
    ImageFilter(folder="trip/day2"),
    ImageFilter(folder="."),
    ImageFilter(taken_after=START + 10 * DAY),
    ImageFilter(taken_before=START + 5 * DAY),                        # 5 pass: fewer than k = 8
    ImageFilter(folder="home", taken_after=START + 3 * DAY, taken_before=START + 20 * DAY),
    ImageFilter(taken_after=START + 29 * DAY),                        # exactly one
    ImageFilter(taken_after=START + 100 * DAY),                       # none
]


@pytest.mark.parametrize("flt", FILTERS, ids=lambda f: f"{f.folder}|{f.taken_after}|{f.taken_before}")
def test_filtered_search_equals_a_brute_force_filter(model, gallery_dir, flt):
    gallery = Gallery.load(gallery_dir, model=model)
    queries = embed_sentences(model, QUERIES, progress=False)
    for offset, min_score in ((0, None), (2, None), (0, 0.0)):
        got = gallery.search_images(queries, 8, flt, offset=offset, min_score=min_score)
        for q, hits in zip(queries, got):
            want = _brute_force(gallery, q, flt, 8, offset, min_score)
            assert [i for i, _ in hits] == [i for i, _ in want], (flt, offset, min_score)
            assert np.allclose([s for _, s in hits], [s for _, s in want], atol=1e-5)
    gallery.close()


def test_ivf_and_order_indexes_filter_inside_the_search():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 16)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    ids = np.arange(1000, 1400)
    allowed = np.sort(rng.choice(ids, 37, replace=False))
    queries = x[:5] + 0.1
    ivf = VectorIndex.create(16, "images", "cosine", "IVF8,Flat", train_vectors=x, nprobe=8)   # probes every list
    ivf.add(x, ids)
    scores, got = ivf.search(queries, 10, ids=allowed)
    exact = queries @ x[np.isin(ids, allowed)].T
    want = allowed[np.argsort(-exact, axis=1)[:, :10]]
    assert np.array_equal(got, want)
    short = ivf.search(queries, 10, ids=allowed[:3])[1]                # fewer pass than k: only those, no padding
    assert short.shape == (5, 3) and all(set(r) == set(allowed[:3]) for r in short)
    order = VectorIndex.create(16, "images", "order", "Flat")
    pos = np.abs(x)
    order.add(pos, ids)
    o_scores, o_ids = order.search(np.abs(queries), 10, ids=allowed)
    ref = -(np.clip(np.abs(queries)[:, None, :] - pos[None, np.isin(ids, allowed)], 0, None) ** 2).sum(-1)
    assert np.array_equal(o_ids, allowed[np.argsort(-ref, axis=1, kind="stable")[:, :10]])


def test_text_subtract_and_time_parsing(model):
    plain = inference.embed_texts(model, ["a red circle"], [()])
    assert torch.allclose(plain, model.embed_texts(*pad_batch(model.encode_text_ids(["a red circle"]))), atol=1e-6)
    minus = inference.embed_texts(model, ["a red circle", "a red circle"], [("red",), ()])
    assert torch.allclose(minus[1], plain[0], atol=1e-6)               # rows do not leak into each other
    assert not torch.allclose(minus[0], plain[0], atol=1e-3)
    ids, lengths = pad_batch(model.encode_text_ids(["a red circle", "red"]))
    p = model.project_texts(ids, lengths)
    assert torch.allclose(minus[0], model.similarity.normalize((p[0] - p[1])[None])[0], atol=1e-5)
    assert parse_time("2020-01-02") == START + DAY
    assert parse_time("2020-01-01T02:00:00+02:00") == START
    for bad in ("2020-02-30", "2020-1-01", "2020-01-01T10:00:00", "yesterday"):
        with pytest.raises(ValueError, match="must be a date"):
            parse_time(bad)
    assert format_time(START + DAY + 0.7) == "2020-01-02T00:00:00Z"
    assert format_time(parse_time("0001-01-01")) == "0001-01-01T00:00:00Z"
    assert format_time(parse_time("9999-12-31T23:59:59-23:59")) is None      # past year 9999 in UTC: not shown


# --- HTTP -------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def client(tiny_model_path, gallery_dir):
    app = create_app(Settings(model=str(tiny_model_path), index=str(gallery_dir), reload_interval_s=0))
    with TestClient(app) as c:
        yield wait_ready(c)


def _day(i):
    return (dt.date(2020, 1, 1) + dt.timedelta(days=i)).isoformat()


def test_http_filters_paging_and_threshold_match_the_library(client, model, gallery_dir):
    gallery = Gallery.load(gallery_dir, model=model)
    q = embed_sentences(model, ["a red circle"], progress=False)[0]
    body = {"text": "a red circle", "k": 6, "folder": "trip", "taken_after": _day(2), "taken_before": _day(25)}
    flt = ImageFilter.parse("trip", _day(2), _day(25))
    r = client.post("/v1/search/images", json=body)
    assert r.status_code == 200, r.text
    hits = r.json()["results"]
    assert [h["id"] for h in hits] == [i for i, _ in _brute_force(gallery, q, flt, 6)]
    assert all(h["folder"] in ("trip", "trip/day2") and _day(2) <= h["taken"][:10] < _day(25) for h in hits)
    assert all(h["width"] == 32 and h["height"] == 32 for h in hits)
    # pagination: page 2 continues page 1; min_score hides the weak ones
    every = client.post("/v1/search/images", json={"text": "a red circle", "k": 30}).json()["results"]
    p1 = client.post("/v1/search/images", json={"text": "a red circle", "k": 4}).json()["results"]
    p2 = client.post("/v1/search/images", json={"text": "a red circle", "k": 4, "offset": 4}).json()["results"]
    assert [h["id"] for h in p1 + p2] == [h["id"] for h in every[:8]]
    cut = every[10]["score"]
    strong = client.post("/v1/search/images", json={"text": "a red circle", "k": 30, "min_score": cut}).json()
    assert [h["id"] for h in strong["results"]] == [h["id"] for h in every if h["score"] >= cut]
    # fewer than k pass: only those
    one = client.post("/v1/search/images", json={"text": "a red circle", "k": 10, "taken_after": _day(29)})
    assert [h["taken"][:10] for h in one.json()["results"]] == [_day(29)]
    gallery.close()


def test_text_subtract_over_http(client, model, gallery_dir):
    gallery = Gallery.load(gallery_dir, model=model)
    q = inference.embed_texts(model, ["a red circle"], [("red", "circle")]).numpy()
    want = gallery.search_images(q, 5)[0]
    r = client.post("/v1/search/images", json={"text": "a red circle", "subtract": ["red", "circle"], "k": 5})
    assert r.status_code == 200 and [h["id"] for h in r.json()["results"]] == [i for i, _ in want]
    plain = client.post("/v1/search/images", json={"text": "a red circle", "k": 5}).json()["results"]
    assert [h["id"] for h in plain] != [i for i, _ in want] or \
        [h["score"] for h in plain] != pytest.approx([s for _, s in want])
    gallery.close()


def _jpeg(seed=3):
    buf = io.BytesIO()
    _photo_image = Image.new("RGB", (40, 40), (200, 30, 30))
    ImageDraw.Draw(_photo_image).ellipse((5, 5, 30, 30), fill=(seed * 20 % 255, 200, 40))
    _photo_image.save(buf, "JPEG")
    return buf.getvalue()


def test_query_by_uploaded_example_with_filters(client, gallery_dir, model):
    photo = sorted((gallery_dir.parent / "photos" / "home").glob("*.jpg"))[0]
    files = {"image": ("x.jpg", photo.read_bytes(), "image/jpeg")}
    r = client.post("/v1/search/images", files=files, data={"k": "3", "folder": "home"})
    assert r.status_code == 200, r.text
    hits = r.json()["results"]
    gallery = Gallery.load(gallery_dir, model=model)
    same = next(x.id for x in gallery.meta.all_images() if x.path == str(photo.resolve()))
    assert hits[0]["id"] == same and hits[0]["score"] == pytest.approx(1.0, abs=1e-4)   # finds itself first
    assert all(h["folder"] == "home" for h in hits)
    r = client.post("/v1/search/images", files=files, data={"k": "5", "offset": "1", "min_score": "-1",
                                                            "taken_before": _day(8)})
    assert r.status_code == 200 and all(h["taken"][:10] < _day(8) for h in r.json()["results"])
    r = client.post("/v1/search/captions", files=files, data={"k": "3", "offset": "2", "min_score": "-0.5"})
    assert r.status_code == 200 and len(r.json()["results"]) <= 3
    folders = client.get("/v1/folders").json()["folders"]
    assert {f["folder"]: f["images"] for f in folders} == {".": 7, "home": 7, "trip": 8, "trip/day2": 8}
    gallery.close()


@pytest.mark.parametrize("after,before", [(_day(5), _day(2)), (_day(5), _day(5)),
                                          ("2020-01-03T00:00:00Z", "2020-01-03")])
def test_a_date_range_that_holds_no_instant_matches_no_image(client, gallery_dir, tiny_model_path, capsys, after,
                                                             before):
    """``taken_before`` not later than ``taken_after``: a valid filter that lets no image through — 200 with no
    results on every search of gallery images (JSON and form, text and example photo), an empty list in the
    library, and CLI exit 0 with no hits; the folder is still checked (404 for one without images)."""
    gen = current_generation(gallery_dir)
    assert ImageFilter.parse(None, after, before).active
    gallery = Gallery.load(gallery_dir)
    assert gallery.photos.allowed(ImageFilter.parse("trip", after, before)).size == 0
    assert gallery.photos.allowed(ImageFilter.parse("trip", after, _day(20))).size > 0      # ends later: not empty
    gallery.close()
    dates = {"taken_after": after, "taken_before": before}
    for kwargs in ({"json": {"text": "a red circle", **dates}}, {"json": {"image_id": 0, "add": ["red"], **dates}},
                   {"files": {"image": ("a.jpg", _jpeg(), "image/jpeg")}, "data": {"k": "3", **dates}},
                   {"json": {"text": "a", "folder": "trip", "sort": "newest", "min_score": -1, **dates}}):
        r = client.post("/v1/search/images", **kwargs)
        assert r.status_code == 200 and r.json()["results"] == [], r.text
    r = client.post("/v1/search/images", json={"text": "a", "folder": "nowhere", **dates})
    assert r.status_code == 404 and "nowhere" in r.json()["detail"], r.text
    rc, hits, _ = _cli_search(tiny_model_path, gallery_dir, capsys, "--text", "a", "--taken-after", after,
                              "--taken-before", before)
    assert rc == 0 and hits == []
    assert current_generation(gallery_dir) == gen


@pytest.mark.parametrize("kwargs,status,message", [
    ({"json": {"text": "a", "folder": "nowhere"}}, 404, "no indexed images in folder 'nowhere'"),
    ({"json": {"text": "a", "folder": "../../etc"}}, 404, "no indexed images in that folder"),
    ({"json": {"image_id": 0, "folder": "trip/nope"}}, 404, "no indexed images in folder"),
    ({"json": {"text": "a", "taken_after": "2020-02-30"}}, 422, "must be a date"),
    ({"json": {"text": "a", "taken_after": "2020-01-01T10:00:00"}}, 422, "must be a date"),
    ({"json": {"text": "a", "min_score": 1.5}}, 422, "min_score"),
    ({"json": {"text": "a", "min_score": -2}}, 422, "min_score"),
    ({"json": {"text": "a", "min_score": "0.5"}}, 422, "min_score"),
    ({"json": {"image_id": 0, "min_score": 3}}, 422, "min_score"),
    ({"json": {"text": "a", "offset": -1}}, 422, "offset"),
    ({"json": {"text": "a", "offset": 10001}}, 422, "offset"),
    ({"json": {"text": "a", "folder": "  "}}, 422, "folder"),
    ({"json": {"text": "a", "subtract": [""]}}, 422, "subtract"),
    ({"files": {"image": ("a.jpg", _jpeg(), "image/jpeg")}, "data": {"min_score": "2"}}, 422, "min_score"),
    ({"files": {"image": ("a.jpg", _jpeg(), "image/jpeg")}, "data": {"min_score": "nan"}}, 422, "min_score"),
    ({"files": {"image": ("a.jpg", _jpeg(), "image/jpeg")}, "data": {"folder": "nowhere"}}, 404, "folder"),
    ({"files": {"image": ("a.jpg", _jpeg(), "image/jpeg")}, "data": {"taken_before": "soon"}}, 422, "must be a date"),
    ({"files": {"image": ("a.txt", b"just some text", "text/plain")}, "data": {"k": "3"}}, 415, "HEIC"),
])
def test_bad_search_input_is_a_clear_4xx(client, gallery_dir, kwargs, status, message):
    gen = current_generation(gallery_dir)
    r = client.post("/v1/search/images", **kwargs)
    assert r.status_code == status and message in r.json()["detail"], r.text
    assert "/tmp" not in r.json()["detail"]                          # no server paths in the answer
    assert current_generation(gallery_dir) == gen


# --- CLI --------------------------------------------------------------------------------------------------------

def _cli_search(tiny_model_path, gallery_dir, capsys, *args):
    rc = cli_main(["index", "search", "--index", str(gallery_dir), "--model", str(tiny_model_path), "--device", "cpu", "--json",
                   *args])
    out = capsys.readouterr()
    return rc, (json.loads(out.out)["results"] if rc == 0 else None), out.err


def test_cli_search_with_filters_threshold_paging_and_an_example_photo(tiny_model_path, gallery_dir, model, capsys):
    gallery = Gallery.load(gallery_dir, model=model)
    q = embed_sentences(model, ["a red circle"], progress=False)[0]
    rc, hits, _ = _cli_search(tiny_model_path, gallery_dir, capsys, "--text", "a red circle", "--k", "4", "--offset",
                              "1", "--folder", "trip", "--taken-after", _day(1), "--taken-before", _day(28))
    assert rc == 0
    want = _brute_force(gallery, q, ImageFilter.parse("trip", _day(1), _day(28)), 4, 1)
    assert [h["id"] for h in hits] == [i for i, _ in want]
    assert all(h["folder"].endswith(("trip", "trip/day2")) for h in hits)
    rc, hits, _ = _cli_search(tiny_model_path, gallery_dir, capsys, "--text", "a red circle", "--k", "30",
                              "--min-score", "0.0")
    assert rc == 0 and all(h["score"] >= 0 for h in hits)
    assert [h["id"] for h in hits] == [i for i, _ in _brute_force(gallery, q, ImageFilter(), 30, 0, 0.0)]
    photo = sorted((gallery_dir.parent / "photos" / "trip").glob("*.jpg"))[0]
    rc, hits, _ = _cli_search(tiny_model_path, gallery_dir, capsys, "--image", str(photo), "--k", "2")
    assert rc == 0 and hits[0]["path"] == str(photo.resolve())
    rc, hits, _ = _cli_search(tiny_model_path, gallery_dir, capsys, "--text", "a red circle", "--subtract", "red")
    want = gallery.search_images(inference.embed_texts(model, ["a red circle"], [("red",)]).numpy(), 10)[0]
    assert rc == 0 and [h["id"] for h in hits] == [i for i, _ in want]
    gallery.close()


def test_cli_search_errors_exit_2_with_a_message(tiny_model_path, gallery_dir, tmp_path, capsys):
    text = tmp_path / "notes.txt"
    text.write_text("not a photo")
    heic = tmp_path / "broken.heic"
    heic.write_bytes(b"\x00\x00\x00\x18ftypheic" + b"\x00" * 40)
    for args, message in [
        (["--text", "a", "--folder", "nowhere"], "no indexed images in folder 'nowhere'"),
        (["--text", "a", "--taken-after", "last week"], "must be a date"),
        (["--text", "a", "--min-score", "1.5"], "min_score must be from -1 to 1"),
        (["--text", "a", "--offset", "-3"], "--offset"),
        (["--text", "a", "--k", "0"], "--k"),
        (["--image", str(text)], "cannot read"),
        (["--image", str(heic)], "cannot read"),
        (["--image", str(tmp_path / "missing.jpg")], "no image file"),
    ]:
        rc, _, err = _cli_search(tiny_model_path, gallery_dir, capsys, *args)
        assert rc == 2 and message in err, (args, err)


def test_the_folder_filter_takes_gallery_relative_paths_only(client, model, gallery_dir):
    """An absolute path — of a folder of the gallery or of none — and a path climbing out of the root are answered
    alike, 404 as a folder without images: the answer never tells whether a path exists on the server."""
    gallery = Gallery.load(gallery_dir, model=model)
    root = gallery.photos.root
    gallery.close()
    tried = [os.path.join(root, "trip"), root, "/tmp", "/no/such/folder", f"../{os.path.basename(root)}/trip"]
    for folder in tried:
        for kwargs in ({"json": {"text": "a", "folder": folder}},
                       {"files": {"image": ("a.jpg", _jpeg(), "image/jpeg")}, "data": {"folder": folder}}):
            r = client.post("/v1/search/images", **kwargs)
            assert r.status_code == 404, (folder, r.text)
            assert r.json() == {"detail": "no indexed images in that folder: folders are relative to the gallery's "
                                          "root folder (GET /v1/folders lists them)"}
    assert client.post("/v1/search/images", json={"text": "a", "folder": "trip/../home"}).status_code == 200


def test_a_generations_rows_are_read_once_and_shown_as_the_metadata_says(gallery_dir, monkeypatch):
    import index.gallery as gallery_module
    from index.hits import image_hits
    from index.query import inside
    from index.relevance import Ranking

    gallery = Gallery.load(gallery_dir)
    every = {r.id: r for r in gallery.meta.all_images()}
    queried: list[list[int]] = []
    read = gallery.meta.images
    monkeypatch.setattr(gallery.meta, "images", lambda ids: queried.append(list(ids)) or read(ids))
    ids = [5, 3, 10_000, 5, 7]                                           # one unknown, one twice
    assert gallery.image_rows(ids) == {i: every[i] for i in (5, 3, 7)}
    assert queried == [[5, 3, 10_000, 7]]
    assert gallery.image_rows([7, 10_000, 3]) == {7: every[7], 3: every[3]} and len(queried) == 1   # kept
    hits = image_hits(gallery, Ranking([(3, 0.5), (7, 0.4), (10_000, 0.3)], [0.9, 0.8, 0.7]))
    assert [(h.id, h.path, h.taken, h.folder) for h in hits] == [
        (3, every[3].path, format_time(every[3].taken), every[3].folder),
        (7, every[7].path, format_time(every[7].taken), every[7].folder), (10_000, None, None, None)]
    for folder in {r.folder for r in every.values()}:
        assert gallery.photos.relative(folder) == inside(folder, gallery.photos.root)
        assert gallery.photos.relative(folder) == gallery.photos.relative(folder)       # kept, the same
    monkeypatch.setattr(gallery_module, "CACHED_ROWS", 2)                 # at most the rows used last
    gallery.image_rows([1, 2, 3])
    assert list(gallery._rows) == [2, 3]
    gallery.image_rows([2, 1])
    assert list(gallery._rows) == [2, 1] and queried[-1] == [1]
    gallery.close()
