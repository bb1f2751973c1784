"""Near-duplicate groups (index/duplicates.py, index/phash.py): ``jointspace index duplicates`` groups a photo with
its re-saved, resized and cropped copies and not with other photos, and labels each group by kind (identical bytes,
the same picture re-encoded, a near shot); ``GET /v1/duplicates`` returns the same groups, paged, and refuses bad
parameters with a 422; perceptual hashes are stored at index time and computed from the files for rows without
one. The gallery: real photos (the demo's samples) indexed with the shipped model, for which the threshold was
measured (benchmarks/duplicates.py); the tiny test model does not tell real photos apart."""
import json
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from index.duplicates import (DEFAULT_THRESHOLD, EXACT_GROUP, EXACT_UP_TO, FLOOR, HASH_DISTANCE, NEIGHBOURS,
                              check_threshold, components, find_groups, gallery_groups, kind_of, nearest)
from index.changes import BuildOptions
from index.gallery import EmbedOptions, Gallery, build
from index.generations import current_generation
from index.phash import distances, perceptual_hash
from index.samples import write_samples
from service.app import create_app
from service.cli import main as cli_main
from service.settings import Settings
from training.inference import pretrained
from training.models.checkpoint import load_model
from server_process import wait_ready

OTHERS = ("astronaut.jpg", "cameraman.jpg", "clock.jpg", "rocket.jpg", "temple.jpg", "flower.jpg")


def _edits(src: Path, out: Path) -> dict[str, str]:
    """coffee.jpg re-saved (JPEG quality 60), at half size and cropped to its central 80 %; cat.jpg re-saved and
    at half size (no crop); grass.jpg copied byte for byte. File → the photo it copies."""
    out.mkdir()
    made = {}
    for name, kinds in (("coffee.jpg", ("resaved", "small", "crop")), ("cat.jpg", ("resaved", "small"))):
        image = Image.open(src / name).convert("RGB")
        w, h = image.size
        for kind in kinds:
            copy = {"resaved": image, "small": image.resize((w // 2, h // 2), Image.Resampling.LANCZOS),
                    "crop": image.crop((w // 10, h // 10, w - w // 10, h - h // 10))}[kind]
            copy.save(out / f"{Path(name).stem}_{kind}.jpg", "JPEG", quality=60 if kind == "resaved" else 90)
            made[f"copies/{Path(name).stem}_{kind}.jpg"] = name
    shutil.copyfile(src / "grass.jpg", out / "grass_copy.jpg")
    made["copies/grass_copy.jpg"] = "grass.jpg"
    return made


@pytest.fixture(scope="module")
def shipped():
    return load_model(pretrained.model_path())


@pytest.fixture(scope="module")
def gallery(shipped, tmp_path_factory):
    """The photo folder, its index (the shipped model, one view a photo, no query bank) and which file copies
    which."""
    root = tmp_path_factory.mktemp("duplicates")
    samples = write_samples(root / "samples")
    photos = root / "photos"
    photos.mkdir()
    for name in ("coffee.jpg", "cat.jpg", "grass.jpg", *OTHERS):
        shutil.copyfile(samples / name, photos / name)
    copies = _edits(photos, photos / "copies")
    build(root / "index", shipped, sorted(photos.rglob("*.jpg")), options=BuildOptions(image_root=photos),
          embedding=EmbedOptions(progress=False, workers=0))
    return photos, root / "index", copies


def _expected(copies: dict[str, str]) -> dict[frozenset, str]:
    """The groups (as sets of file names relative to the folder) and their kinds."""
    groups: dict[str, set] = {}
    for copy, original in copies.items():
        groups.setdefault(original, {original}).add(copy)
    kinds = {"coffee.jpg": "near", "cat.jpg": "re-encode", "grass.jpg": "identical"}
    return {frozenset(g): kinds[o] for o, g in groups.items()}


def _named(groups: list[dict], photos: Path) -> dict[frozenset, str]:
    return {frozenset(str(Path(i["path"]).relative_to(photos.resolve())) for i in g["images"]): g["kind"]
            for g in groups}


def test_index_duplicates_groups_a_photo_with_its_copies_and_not_with_other_photos(gallery, capsys):
    photos, index, copies = gallery
    capsys.readouterr()
    assert cli_main(["index", "duplicates", "--index", str(index), "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["threshold"] == DEFAULT_THRESHOLD and found["photos"] == 3 + len(OTHERS) + len(copies)
    assert _named(found["groups"], photos) == _expected(copies)
    assert [len(g["images"]) for g in found["groups"]] == [4, 3, 2]             # the largest first
    assert all(g["min_score"] >= DEFAULT_THRESHOLD for g in found["groups"])    # no chaining here
    # the table names each group's kind and files, relative to the gallery's folder
    assert cli_main(["index", "duplicates", "--index", str(index)]) == 0
    table = capsys.readouterr().out
    assert "group 1: near, 4 photos" in table and "copies/coffee_crop.jpg" in table
    assert "group 3: identical, 2 photos" in table
    assert f"3 group(s) of near-duplicates (9 of {found['photos']} photos) at threshold {DEFAULT_THRESHOLD:g}" in table
    # at the highest threshold only the same bytes stay together; a bad threshold is refused
    assert cli_main(["index", "duplicates", "--index", str(index), "--threshold", "1", "--json"]) == 0
    strict = json.loads(capsys.readouterr().out)["groups"]
    assert all(g["kind"] == "identical" for g in strict) and len(strict) >= 1
    assert cli_main(["index", "duplicates", "--index", str(index), "--threshold", "1.5"]) == 2
    assert "from 0.5 to 1" in capsys.readouterr().err


def test_the_perceptual_hash_is_stored_at_index_time_and_separates_re_encodes_from_crops(gallery):
    photos, index, _ = gallery
    g = Gallery.load(index)
    rows = {str(Path(r.path).relative_to(photos.resolve())): r for r in g.meta.all_images()}
    g.close()
    assert all(r.phash is not None and 0 <= r.phash < 2 ** 63 for r in rows.values())
    same = [distances(rows["cat.jpg"].phash, rows[f"copies/cat_{k}.jpg"].phash) for k in ("resaved", "small")]
    assert max(same) <= HASH_DISTANCE
    assert distances(rows["coffee.jpg"].phash, rows["copies/coffee_crop.jpg"].phash) > HASH_DISTANCE
    others = [rows[n].phash for n in OTHERS]
    assert min(distances(a, b) for i, a in enumerate(others) for b in others[i + 1:]) > HASH_DISTANCE
    # the hash of a file is the hash of its picture, whatever the file's size
    image = Image.open(photos / "temple.jpg")
    assert distances(perceptual_hash(image), perceptual_hash(image.resize((64, 48)))) <= HASH_DISTANCE


def test_rows_indexed_before_hashes_are_hashed_from_their_files(gallery, tmp_path):
    photos, index, copies = gallery
    old = Path(shutil.copytree(index, tmp_path / "index"))
    db = old / current_generation(old) / "metadata.sqlite"
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE images SET phash = NULL")
    g = Gallery.load(old)
    try:
        found = gallery_groups(g, DEFAULT_THRESHOLD)
        assert found.hashed == sum(len(x.ids) for x in found.groups if x.kind != "identical") > 0
        paths = {r.id: str(Path(r.path).relative_to(photos.resolve())) for r in g.meta.all_images()}
        assert {frozenset(paths[i] for i in x.ids): x.kind for x in found.groups} == _expected(copies)
    finally:
        g.close()


def test_groups_are_connected_components_labelled_by_kind():
    rng = np.random.default_rng(0)
    base = rng.standard_normal((4, 16)).astype(np.float32)
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    a, b = base[0], base[1]
    mid = (a + b) / np.linalg.norm(a + b)          # near both a and b: a chain a – mid – b in one group
    vectors = np.stack([a, base[2], mid, b, base[3], a])
    found = find_groups(np.array([10, 11, 12, 13, 14, 15]), vectors, threshold=0.7,
                        sha256=["x", "y", "z", "w", "v", "x"], hashes=lambda row: 0)
    assert [g.ids for g in found.groups] == [(10, 12, 13, 15)]
    assert found.groups[0].min_score < 0.7 and found.photos == 6
    assert kind_of(["x", "x"], [0, 2 ** 40]) == "identical"
    assert kind_of(["x", "y"], [0, 0b111]) == "re-encode"
    assert kind_of(["x", "y"], [0, 2 ** 20 - 1]) == "near"
    assert kind_of(["x", "y"], [0, None]) == "near"
    for bad in (0, 0.49, -0.5, 1.01, float("nan")):
        with pytest.raises(ValueError, match="from 0.5 to 1"):
            check_threshold(bad)


@pytest.fixture(scope="module")
def client(shipped, gallery):
    _, index, _ = gallery
    app = create_app(Settings(index=str(index), reload_interval_s=0, warmup="off"), model=shipped,
                     gallery=Gallery.load(index, model=shipped))
    with TestClient(app) as c:
        yield wait_ready(c, timeout=120)


def test_get_duplicates_returns_the_same_groups_paged(gallery, client, capsys):
    photos, index, copies = gallery
    capsys.readouterr()
    assert cli_main(["index", "duplicates", "--index", str(index), "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    r = client.get("/v1/duplicates")
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["threshold"], body["photos"], body["total"], body["offset"]) == \
        (cli["threshold"], cli["photos"], len(cli["groups"]), 0)
    assert [[i["id"] for i in g["images"]] for g in body["groups"]] == \
        [[i["id"] for i in g["images"]] for g in cli["groups"]]
    assert [g["kind"] for g in body["groups"]] == [g["kind"] for g in cli["groups"]]
    image = body["groups"][0]["images"][0]
    assert image["uri"] == f"/v1/images/{image['id']}" and image["name"] and image["width"] and image["size"]
    assert client.get(image["uri"], params={"size": 64}).status_code == 200
    pages = [client.get("/v1/duplicates", params={"limit": 1, "offset": o}).json() for o in range(4)]
    assert [g for p in pages for g in p["groups"]] == body["groups"] and pages[-1]["total"] == body["total"]
    strict = client.get("/v1/duplicates", params={"threshold": 1}).json()
    assert strict["threshold"] == 1 and all(g["kind"] == "identical" for g in strict["groups"])


def _planted(n: int, dim: int = 32, copies: int = 3, seed: int = 0) -> tuple[np.ndarray, list[set[int]]]:
    """``n`` random unit vectors, then ``copies`` noisy copies of each of the first 50 (cosine about 0.95)."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((n, dim)).astype(np.float32)
    extra, truth = [], []
    for i in range(50):
        members = {i}
        for _ in range(copies):
            members.add(n + len(extra))
            extra.append(base[i] + 0.2 * rng.standard_normal(dim).astype(np.float32))
        truth.append(members)
    return np.concatenate([base, np.stack(extra)]), truth


@pytest.mark.parametrize("n", [400, EXACT_UP_TO + 1000])
def test_neighbour_search_finds_planted_copies_and_is_bounded(n):
    """Exact (Flat) for a small gallery, a random projection beyond EXACT_UP_TO: the planted copies are grouped exactly,
    and the pairs are at most NEIGHBOURS a photo whatever the threshold — even when every photo is alike."""
    vectors, truth = _planted(n, dim=160)                    # above PROJECTED: the projection is used beyond
    found = find_groups(np.arange(len(vectors)), vectors, threshold=0.8)
    assert sorted(map(set, (g.ids for g in found.groups)), key=min) == truth
    assert nearest(vectors).exact == (len(vectors) <= EXACT_UP_TO)
    alike = np.ones((3000, 8), np.float32) + 1e-3 * np.random.default_rng(1).standard_normal((3000, 8))
    pairs = nearest(alike)
    assert len(pairs.left) <= 3000 * NEIGHBOURS and (pairs.left < pairs.right).all()
    everything = find_groups(np.arange(3000), alike, threshold=FLOOR)
    assert [len(g.ids) for g in everything.groups] == [3000]             # one group, its lowest pair's score
    assert len(everything.groups[0].ids) > EXACT_GROUP and everything.groups[0].min_score >= FLOOR


def test_components_match_a_reference_union_find():
    rng = np.random.default_rng(3)
    n = 500
    left, right = rng.integers(0, n, 400), rng.integers(0, n, 400)
    labels = components(n, left, right)
    parent = list(range(n))

    def root(x):
        while parent[x] != x:
            x = parent[x]
        return x

    for a, b in zip(left, right):
        ra, rb = root(a), root(b)
        parent[max(ra, rb)] = min(ra, rb)
    assert labels.tolist() == [root(x) for x in range(n)]


@pytest.mark.parametrize("params, field", [({"threshold": 0}, "threshold"), ({"threshold": 0.49}, "threshold"),
                                           ({"threshold": 1.2}, "threshold"),
                                           ({"threshold": "high"}, "threshold"), ({"limit": 0}, "limit"),
                                           ({"limit": 101}, "limit"), ({"offset": -1}, "offset")])
def test_bad_duplicates_parameters_are_422(client, params, field):
    r = client.get("/v1/duplicates", params=params)
    assert r.status_code == 422
    assert r.json()["detail"].startswith(f"{field}:"), r.json()


def test_openapi_documents_duplicates(client):
    doc = client.get("/openapi.json").json()
    op = doc["paths"]["/v1/duplicates"]["get"]
    params = {p["name"]: p["schema"] for p in op["parameters"]}
    assert params["threshold"]["minimum"] == FLOOR and params["threshold"]["maximum"] == 1
    assert params["limit"]["maximum"] == 100 and "422" in op["responses"]
    assert "Duplicates" in doc["components"]["schemas"]


def test_duplicates_need_the_api_key_when_one_is_set(tiny_model_path, tiny_index_dir):
    app = create_app(Settings(model=str(tiny_model_path), index=str(tiny_index_dir), reload_interval_s=0,
                              api_key="s3cret-key"))
    with TestClient(app) as c:
        wait_ready(c)
        assert c.get("/v1/duplicates").status_code == 401
        r = c.get("/v1/duplicates", headers={"X-API-Key": "s3cret-key"})
        assert r.status_code == 200 and r.json()["photos"] > 0
