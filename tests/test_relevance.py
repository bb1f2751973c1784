"""A hit's relevance (index/relevance.py): the share of an index's reference set that scores lower for the same
query — equal to that share computed by brute force, unchanged by other photos in the gallery, null without a
reference set; and as the service (fields, OpenAPI, paging, thresholds) and the CLI (table, JSON) give it."""
import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from conftest import STRONG_TEXT, WEAK_TEXT, build_index, embedded_gallery
from index.changes import BuildOptions, ChangeSet
from index.embed import embed_photos, embed_sentences
from index.gallery import EmbedOptions, Gallery, build, update
from index.generations import current_generation
from index.qbnorm import QueryBank, model_bank
from index.relevance import (DESCRIPTION_MARGIN, DESCRIPTION_TOP, NAMED_FLOOR, NAMED_MARGIN, NAMED_TOP, NULL_COUNT,
                             NULL_MARGIN, NULL_TOP, QUERY_TOP, QUERY_WEIGHT, REFERENCE_SIZE, STRONG, Descriptions,
                             both_sides, calibrated, is_strong, name_margins, null_sentences, reference_rows,
                             strong_match, strong_threshold)
from service.app import create_app
from service.cli import main as cli_main
from server_process import wait_ready
from service.settings import Settings
from training.data.datasets import load_dataset
from training.models.checkpoint import load_model
from training.inference.querybank import item_offsets


@pytest.fixture(scope="module")
def model(tiny_model_path):
    return load_model(tiny_model_path)


@pytest.fixture(scope="module")
def parts(model, synth_small):
    """The gallery (val + test) of the synthetic set embedded, and the query bank the tiny model carries."""
    bank = model_bank(model, progress=False)
    assert bank is not None and bank.captions is not None and bank.images is not None
    return *embedded_gallery(model, synth_small), bank


@pytest.fixture(scope="module")
def bank_index(tiny_model_path, synth_small, parts, tmp_path_factory):
    return build_index(tiny_model_path, synth_small, tmp_path_factory.mktemp("relevance") / "index",
                       querybank=parts[-1])


def _brute_force(queries, scores, reference, bank_other, beta):
    """The share of ``reference`` (bank vectors folded against ``bank_other``) scoring below each score."""
    ref = reference.astype(np.float32)
    offsets = item_offsets(torch.from_numpy(bank_other.astype(np.float32)), torch.from_numpy(ref), beta).numpy()
    ref_scores = queries @ ref.T - offsets[None, :]                            # (Q, m): q·r − o_r
    return [[float(np.mean(row < s)) for s in srow] for row, srow in zip(ref_scores, scores)]


def test_the_reference_rows_are_evenly_spaced_and_at_most_the_set_size():
    assert reference_rows(30).tolist() == list(range(30))
    rows = reference_rows(5000)
    assert len(rows) == REFERENCE_SIZE and rows[0] == 0 and set(np.diff(rows)) == {5}
    rows = reference_rows(1499)
    assert len(set(rows.tolist())) == REFERENCE_SIZE and rows.max() < 1499 and np.all(np.diff(rows) >= 1)
    assert strong_match([0.5, STRONG]) is True and strong_match([0.98]) is False and strong_match([]) is False
    assert strong_match(None) is None


def test_relevance_is_the_share_of_reference_items_scoring_lower(model, parts, bank_index):
    records, captions, img, cap, bank = parts
    gallery = Gallery.load(bank_index, model=model)
    assert set(gallery.references) == {"images", "captions"}
    assert len(gallery.references["images"]) == min(len(bank.images), REFERENCE_SIZE)
    # text → image: the reference set is the bank's images, folded against its captions as gallery photos are
    hits = gallery.search_images(cap[:12], 8)
    ranked = gallery.ranked("images", cap[:12], hits)
    want = _brute_force(cap[:12], [[s for _, s in h] for h in hits], bank.images[reference_rows(len(bank.images))],
                        bank.captions, bank.beta)
    m = len(gallery.references["images"])
    for r, h, w in zip(ranked, hits, want):
        assert r.hits == h and len(r.relevance) == len(h)
        assert np.allclose(r.relevance, w, atol=1.01 / m)                    # at most one tie read otherwise
        assert all(0.0 <= x <= 1.0 for x in r.relevance) and r.relevance == sorted(r.relevance, reverse=True)
        assert r.strong_match is (max(r.relevance) >= STRONG)
    assert np.mean([np.allclose(r.relevance, w) for r, w in zip(ranked, want)]) > 0.9
    # image → text: the bank's captions, folded against its images
    hits = gallery.search_captions(img[:6], 10)
    ranked = gallery.ranked("captions", img[:6], hits)
    want = _brute_force(img[:6], [[s for _, s in h] for h in hits], bank.captions[reference_rows(len(bank.captions))],
                        bank.images, bank.beta)
    m = len(gallery.references["captions"])
    for r, w in zip(ranked, want):
        assert np.allclose(r.relevance, w, atol=1.01 / m)
    gallery.close()


def test_relevance_does_not_change_when_unrelated_photos_are_added(model, parts, bank_index, tmp_path):
    _, _, img, cap, _ = parts
    root = shutil.copytree(bank_index, tmp_path / "index")
    before = Gallery.load(root, model=model)
    every = before.images.ntotal
    old = before.ranked("images", cap[:10], before.search_images(cap[:10], every))
    before.close()
    noise = np.random.default_rng(3).standard_normal((40, img.shape[1])).astype(np.float32)
    noise /= np.linalg.norm(noise, axis=1, keepdims=True)
    rows = [(str(tmp_path / f"noise{i}.jpg"), None) for i in range(40)]
    report = update(root, model.fingerprint, ChangeSet(image_vectors=noise, image_rows=rows))
    assert len(report.image_ids) == 40
    after = Gallery.load(root, model=model)
    new = after.ranked("images", cap[:10], after.search_images(cap[:10], every + 40))
    after.close()
    for o, n in zip(old, new):
        was = dict(zip([i for i, _ in o.hits], o.relevance))
        now = dict(zip([i for i, _ in n.hits], n.relevance))
        assert len(now) == len(was) + 40
        assert all(now[i] == r for i, r in was.items())                      # the same number, not close to it


def test_an_index_without_a_reference_set_has_no_relevance(model, parts, bank_index, tiny_index_dir, tmp_path):
    _, _, _, cap, _ = parts
    plain = Gallery.load(tiny_index_dir, model=model)                          # built without a bank
    assert plain.references == {}
    ranked = plain.ranked("images", cap[:2], plain.search_images(cap[:2], 3))
    assert [r.relevance for r in ranked] == [None, None] and ranked[0].strong_match is None
    plain.close()
    # a bank written before reference sets: its file holds the bank only, its manifest entry names no references
    root = shutil.copytree(bank_index, tmp_path / "index")
    gen = root / current_generation(root)
    manifest = json.loads((gen / "manifest.json").read_text())
    entry = manifest["querybank"]
    del entry["references"]
    (gen / "manifest.json").write_text(json.dumps(manifest))
    with np.load(root / entry["file"]) as z:
        arrays = {k: z[k] for k in ("captions", "images")}
    with open(root / entry["file"], "wb") as fh:
        np.savez(fh, **arrays)
    old = Gallery.load(root, model=model)
    hits = old.search_images(cap[:2], 3)
    assert len(hits[0]) == 3 and old.ranked("images", cap[:2], hits)[0].relevance is None
    assert old.info()["hubness_correction"]["references"] == {}
    old.close()


def test_the_crafted_index_has_a_strong_match_for_one_query_and_none_for_the_other(model, relevance_index_dir):
    gallery = Gallery.load(relevance_index_dir, model=model)
    queries = embed_sentences(model, [STRONG_TEXT, WEAK_TEXT], progress=False)
    strong, weak = gallery.ranked("images", queries, gallery.search_images(queries, 5))
    assert strong.hits[0][0] == 0 and strong.relevance[0] == 1.0 and strong.strong_match is True
    assert weak.strong_match is False and max(weak.relevance) <= 0.95
    gallery.close()


# --- the service -------------------------------------------------------------------------------------------------

def _client(model_path, index):
    return TestClient(create_app(Settings(model=str(model_path), index=str(index), max_k=50, reload_interval_s=0)))


def test_the_service_gives_each_hit_its_relevance_and_each_list_its_strong_match(model, tiny_model_path,
                                                                                relevance_index_dir):
    gallery = Gallery.load(relevance_index_dir, model=model)
    queries = embed_sentences(model, [STRONG_TEXT, WEAK_TEXT], progress=False)
    want = gallery.ranked("images", queries, gallery.search_images(queries, 12))
    with _client(tiny_model_path, relevance_index_dir) as c:
        assert wait_ready(c).get("/readyz").json()["strong_relevance"] == STRONG
        for text, ranking, strong in ((STRONG_TEXT, want[0], True), (WEAK_TEXT, want[1], False)):
            body = c.post("/v1/search/images", json={"text": text, "k": 12}).json()
            assert body["strong_match"] is strong
            assert [h["id"] for h in body["results"]] == [i for i, _ in ranking.hits]
            assert [h["relevance"] for h in body["results"]] == pytest.approx(ranking.relevance, abs=1e-9)
            # a page: the same hits with the same relevance; its strong_match is its own hits'
            page = c.post("/v1/search/images", json={"text": text, "k": 3, "offset": 2}).json()
            assert [(h["id"], h["relevance"]) for h in page["results"]] == [
                (h["id"], h["relevance"]) for h in body["results"][2:5]]
            assert page["strong_match"] is False                              # only photo 0 is a strong match
            # a threshold hides hits, not their relevance
            cut = body["results"][3]["score"]
            kept = c.post("/v1/search/images", json={"text": text, "k": 12, "min_score": cut}).json()
            assert kept["results"] == body["results"][:len(kept["results"])] and len(kept["results"]) >= 4
            # a filter searches fewer photos: the relevance of those it returns stays
            photos = c.post("/v1/search/images", json={"text": text, "k": 12, "media": "photo"}).json()
            assert photos["results"] == body["results"]
        nothing = c.post("/v1/search/images", json={"text": WEAK_TEXT, "k": 5, "offset": 40}).json()
        assert nothing == {"results": [], "strong_match": False}
        # image → captions: the caption side's reference set
        caps = c.post("/v1/search/captions", json={"image_id": 0, "k": 4}).json()
        assert len(caps["results"]) == 4 and isinstance(caps["strong_match"], bool)
        assert all(0 <= h["relevance"] <= 1 for h in caps["results"])
        doc = c.get("/openapi.json").json()["components"]["schemas"]
    gallery.close()
    for hit in ("ImageHit", "CaptionHit"):
        field = doc[hit]["properties"]["relevance"]
        assert {"type": "number", "minimum": 0.0, "maximum": 1.0} in field["anyOf"] and "reference set" in \
            field["description"]
    for results in ("ImageResults", "CaptionResults"):
        field = doc[results]["properties"]["strong_match"]
        assert {"type": "boolean"} in field["anyOf"] and f"{STRONG:g}" in field["description"]
    assert "strong match" in doc["Ready"]["properties"]["strong_relevance"]["description"]


def test_without_a_reference_set_the_service_says_null(tiny_model_path, tiny_index_dir):
    with _client(tiny_model_path, tiny_index_dir) as c:
        assert wait_ready(c).get("/readyz").json()["strong_relevance"] is None
        body = c.post("/v1/search/images", json={"text": STRONG_TEXT, "k": 3}).json()
        assert body["strong_match"] is None and [h["relevance"] for h in body["results"]] == [None] * 3
        caps = c.post("/v1/search/captions", json={"image_id": 0, "k": 2}).json()
        assert caps["strong_match"] is None and [h["relevance"] for h in caps["results"]] == [None] * 2


# --- the CLI -------------------------------------------------------------------------------------------------------

def test_the_cli_shows_relevance_and_says_when_nothing_is_a_strong_match(tiny_model_path, relevance_index_dir,
                                                                         capsys):
    args = ["index", "search", "--index", str(relevance_index_dir), "--model", str(tiny_model_path), "--k", "4",
            "--device", "cpu"]
    assert cli_main([*args, "--text", WEAK_TEXT, "--json"]) == 0
    weak = json.loads(capsys.readouterr().out)
    assert weak["strong_match"] is False and all(0 <= r["relevance"] < STRONG for r in weak["results"])
    assert cli_main([*args, "--text", WEAK_TEXT]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["score", "relevance", "media", "path", "moment"]
    assert [line.split()[:2] for line in lines[1:5]] == [[f"{r['score']:.3f}", f"{r['relevance']:.3f}"]
                                                          for r in weak["results"]]
    assert lines[5:] == ["no strong match: these are the closest"]
    assert cli_main([*args, "--text", STRONG_TEXT, "--json"]) == 0
    strong = json.loads(capsys.readouterr().out)
    assert strong["strong_match"] is True and strong["results"][0]["relevance"] == 1.0
    assert cli_main([*args, "--text", STRONG_TEXT]) == 0
    out = capsys.readouterr().out
    assert "no strong match" not in out and len(out.splitlines()) == 5


# --- the text side: reference and null sentences (index/relevance.py) ----------------------------------------------

def test_each_side_is_calibrated_to_strong_at_its_margin_and_grows_with_it():
    margins = np.linspace(-1, 1, 401)
    for at in (DESCRIPTION_MARGIN, NULL_MARGIN):
        r = calibrated(margins, at)
        assert np.all(np.diff(r) > 0) and np.all((r > 0) & (r < 1))
        assert calibrated(np.array([at]), at)[0] == pytest.approx(STRONG)
        assert is_strong(float(calibrated(np.array([at + 1e-3]), at)[0]))
        assert not is_strong(float(calibrated(np.array([at - 1e-3]), at)[0]))
    assert strong_threshold() == STRONG and is_strong(None) is False and is_strong(STRONG) is True
    assert both_sides([0.999, 0.2], [0.5, 0.995]) == [0.5, 0.2]


def test_the_text_side_grows_with_the_query_score_and_is_the_smaller_of_its_two_margins():
    rng = np.random.default_rng(0)
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)            # noqa: E731
    sentences, nulls = unit(rng.standard_normal((40, 16))), unit(rng.standard_normal((30, 16)))
    d = Descriptions(sentences, nulls)
    photo = unit(rng.standard_normal(16))
    floors = d.floors(photo[None])[0]
    assert floors[0] == pytest.approx(np.sort(sentences @ photo)[-DESCRIPTION_TOP:].mean(), abs=1e-6)
    assert floors[1] == pytest.approx(np.sort(nulls @ photo)[-NULL_TOP:].mean(), abs=1e-6)
    # queries ever closer to the photo: their cosine and so their relevance rise
    away = unit(rng.standard_normal(16))
    queries = unit(np.stack([(1 - t) * away + t * photo for t in np.linspace(0, 1, 50)]))
    rel = np.array([d.relevance(q, photo[None])[0] for q in queries])
    raw = queries @ photo
    assert np.all(np.diff(raw) > 0) and np.all(np.diff(rel) >= 0) and rel[-1] > rel[0]
    want = np.minimum(calibrated(raw - floors[0], DESCRIPTION_MARGIN), calibrated(raw - floors[1], NULL_MARGIN))
    assert np.allclose(rel, want)
    # without null sentences only the description margin counts
    assert np.allclose([Descriptions(sentences).relevance(q, photo[None])[0] for q in queries],
                       calibrated(raw - floors[0], DESCRIPTION_MARGIN))


def test_a_query_that_names_a_class_is_a_strong_match_only_on_a_photo_that_carries_that_name():
    rng = np.random.default_rng(5)
    unit = lambda x: (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)  # noqa: E731
    captions, names, nulls = (unit(rng.standard_normal((n, 32))) for n in (40, 20, 30))
    d, unnamed = Descriptions(np.concatenate([captions, names]), nulls, names=20), Descriptions(captions, nulls)
    assert np.array_equal(d.names, names) and len(d) == 60 and len(Descriptions(captions).names) == 0
    photos = unit(rng.standard_normal((6, 32)))
    floors = d.floors(photos)
    # the name columns: the rows of each photo's NAMED_TOP closest class sentences, closest first
    assert floors.shape == (6, 2 + NAMED_TOP)
    np.testing.assert_array_equal(floors[:, 2:], np.argsort(-(photos @ names.T), axis=1)[:, :NAMED_TOP])
    assert (unnamed.floors(photos)[:, 2:] == -1).all()
    # another count of best names (the benchmark's sweep): the same b(v) and n(v), that many names
    three = d.floors(photos, named_top=3)
    np.testing.assert_array_equal(three[:, :5], floors[:, :5])
    assert three.shape == (6, 5)
    # a query right on class 7 names it (t = 1 ≥ T₀): a photo among whose best names 7 is has name margin 0, one
    # whose best names are all far from it a negative one, and the text side is the smallest of the three margins
    query = names[7]
    carries = unit(names[7] + 0.3 * rng.standard_normal(32))
    lacks = unit(-names[7] + 0.3 * rng.standard_normal(32))
    both = np.stack([carries, lacks])
    f = d.floors(both)
    assert 7 in f[0, 2:] and 7 not in f[1, 2:]
    margins = name_margins(d.query_names(query), f[:, 2:], np.array([0, 0]))
    assert margins[0] == 0.0 and margins[1] == pytest.approx((names[f[1, 2:].astype(int)] @ query).max() - 1.0)
    raw = both @ query
    want = np.minimum(np.minimum(calibrated(raw - f[:, 0] - QUERY_WEIGHT * d.query_floor(query), DESCRIPTION_MARGIN),
                                 calibrated(raw - f[:, 1], NULL_MARGIN)), calibrated(margins, NAMED_MARGIN))
    np.testing.assert_allclose(d.relevance(query, both), want, rtol=1e-6)
    assert d.relevance(query, both)[1] <= calibrated(np.array([margins[1]]), NAMED_MARGIN)[0]
    # a query that names no class (closest class sentence below T₀) is weighed by the other two margins alone
    other = unit(rng.standard_normal(32))
    assert (names @ other).max() < NAMED_FLOOR
    np.testing.assert_allclose(d.relevance(other, photos), Descriptions(np.concatenate([captions, names]), nulls)
                               .relevance(other, photos), rtol=1e-6)
    assert np.isinf(name_margins(d.query_names(other), floors[:, 2:], np.zeros(6, dtype=int))).all()
    # one query's row per hit, or each query's own hits: the same margins
    two = np.stack([query, other])
    np.testing.assert_array_equal(name_margins(d.query_names(two), f[:, 2:], np.array([1, 0])),
                                  name_margins(d.query_names(two)[[1, 0]], f[:, 2:]))
    # fewer names than NAMED_TOP: a photo's best names are all of them, the rest of its columns −1
    few = Descriptions(np.concatenate([captions, names[:3]]), nulls, names=3)
    f3 = few.floors(both)
    assert (f3[:, 5:] == -1).all() and sorted(f3[0, 2:5].astype(int)) == [0, 1, 2]
    # a query on one of the three is weighed, and each photo carries every name there is
    np.testing.assert_array_equal(name_margins(few.query_names(names[1]), f3[:, 2:], np.array([0, 0])), [0.0, 0.0])
    with pytest.raises(ValueError, match="class sentences"):
        Descriptions(captions, names=41)


def test_a_query_is_as_close_to_a_class_as_to_its_closest_sentence_its_aliases_included():
    """Alias sentences (a class's other names): a class's closeness to a query is the largest over its class sentence
    and its aliases, so a query right on an alias names that class (t(q) = 1) and is weighed on a photo whose best
    names lack it, while the photos' best names stay those of the class sentences."""
    rng = np.random.default_rng(7)
    unit = lambda x: (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)  # noqa: E731
    captions, names, nulls, aliases = (unit(rng.standard_normal((n, 32))) for n in (40, 20, 30, 9))
    owner = np.array([4, 4, 0, 19, 7, 4, 12, 0, 3])
    d = Descriptions(np.concatenate([captions, names]), nulls, names=20, aliases=aliases, alias_classes=owner)
    plain = Descriptions(np.concatenate([captions, names]), nulls, names=20)
    queries = unit(rng.standard_normal((6, 32)))
    want = queries @ names.T
    for a, c in zip(aliases, owner):
        want[:, c] = np.maximum(want[:, c], queries @ a)
    np.testing.assert_allclose(d.query_names(queries), want, rtol=1e-6, atol=1e-7)   # float32 rounding near 0
    assert (d.query_names(queries) >= plain.query_names(queries) - 1e-7).all()
    photos = unit(rng.standard_normal((5, 32)))
    np.testing.assert_array_equal(d.floors(photos), plain.floors(photos))         # the photos' names unchanged
    # "a hedgehog" (an alias of class 4) names class 4 as closely as its own sentence would
    query = aliases[1]
    said = d.query_names(query)
    assert said.max() == pytest.approx(1.0) and int(said.argmax()) == 4 and plain.query_names(query).max() < 0.9
    carries = unit(names[4] + 0.3 * rng.standard_normal(32))
    lacks = unit(-names[4] + 0.3 * rng.standard_normal(32))
    f = d.floors(np.stack([carries, lacks]))
    assert 4 in f[0, 2:] and 4 not in f[1, 2:]
    margins = name_margins(said, f[:, 2:], np.array([0, 0]))
    assert margins[0] == pytest.approx(0.0, abs=1e-6) and margins[1] < NAMED_MARGIN
    assert np.isinf(name_margins(plain.query_names(query), f[:, 2:], np.array([0, 0]))).all()  # not weighed before
    with pytest.raises(ValueError, match="go together"):
        Descriptions(np.concatenate([captions, names]), names=20, aliases=aliases)
    with pytest.raises(ValueError, match="alias classes"):
        Descriptions(np.concatenate([captions, names]), names=20, aliases=aliases, alias_classes=owner + 1)
    with pytest.raises(ValueError, match="alias classes"):
        Descriptions(np.concatenate([captions, names]), names=20, aliases=aliases, alias_classes=owner[:3])
    with pytest.raises(ValueError, match="same width"):
        Descriptions(np.concatenate([captions, names]), names=20, aliases=aliases[:, :8], alias_classes=owner)


def test_many_queries_hits_at_once_are_each_querys_own():
    """Descriptions.relevance_of (every query's hits in one call, r(q) in one product) gives each hit what
    relevance gives it for its own query alone (to float32's rounding: r(q) comes from one matrix product, not one
    a query)."""
    rng = np.random.default_rng(3)
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)            # noqa: E731
    d = Descriptions(*(unit(rng.standard_normal((n, 16))) for n in (40, 30, 50)))
    queries, photos = unit(rng.standard_normal((5, 16))), unit(rng.standard_normal((12, 16)))
    owner = np.array([3, 0, 0, 4, 3, 1, 1, 1, 4, 0, 3, 3])                    # query 2 has no hits
    got = d.relevance_of(queries, photos, owner)
    for q in range(5):
        np.testing.assert_allclose(got[owner == q], d.relevance(queries[q], photos[owner == q]), rtol=1e-5,
                                   atol=1e-9)
    np.testing.assert_allclose(d.query_floors(queries), [d.query_floor(q) for q in queries], rtol=1e-6, atol=1e-7)


def test_a_query_typical_photos_answer_well_needs_a_closer_fit_to_describe_a_photo():
    rng = np.random.default_rng(1)
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)            # noqa: E731
    sentences, nulls, photos = (unit(rng.standard_normal((n, 16))) for n in (40, 30, 50))
    plain, csls = Descriptions(sentences, nulls), Descriptions(sentences, nulls, photos)
    photo = unit(rng.standard_normal(16))
    common, rare = photos[0], unit(rng.standard_normal(16))          # a query right on a reference photo, one not
    for query in (common, rare):
        r = np.sort(photos @ query)[-QUERY_TOP:].mean()
        assert csls.query_floor(query) == pytest.approx(r, abs=1e-6) and plain.query_floor(query) == 0.0
        floors = csls.floors(photo[None])[0]
        raw = float(query @ photo)
        want = min(calibrated(np.array([raw - floors[0] - QUERY_WEIGHT * r]), DESCRIPTION_MARGIN)[0],
                   calibrated(np.array([raw - floors[1]]), NULL_MARGIN)[0])
        assert csls.relevance(query, photo[None])[0] == pytest.approx(want)
        assert csls.relevance(query, photo[None])[0] <= plain.relevance(query, photo[None])[0] + 1e-12 or r < 0
    assert csls.query_floor(common) > csls.query_floor(rare)
    with pytest.raises(ValueError, match="same width"):
        Descriptions(sentences, nulls, photos[:, :8])


def test_the_null_sentences_are_fixed_by_their_seed_and_apart_from_the_nonsense_queries_measured():
    nulls = null_sentences()
    assert len(nulls) == NULL_COUNT and len(set(nulls)) > 0.95 * NULL_COUNT and all(n.strip() for n in nulls)
    assert nulls == null_sentences() and nulls != null_sentences(seed=1)
    measured = (Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "nonsense_queries.txt").read_text()
    shared = set(nulls) & set(measured.splitlines())                  # the dev set is not the null set: at most a
    assert all(not any(c.isalnum() for c in t) for t in shared)       # run of punctuation in both, by chance


def test_a_bank_with_sentences_gives_the_image_side_both_directions(model, parts, tmp_path):
    records, captions, img, cap, bank = parts
    assert bank.sentences is None and bank.nulls is None                      # the tiny model has no concept head
    said = replace(bank, sentences=cap[:40], nulls=cap[40:60])
    assert said.key() != bank.key() and replace(said, nulls=None).key() not in (said.key(), bank.key())
    root = tmp_path / "index"
    build(root, model, [r.path for r in records], captions, options=BuildOptions(querybank=said),
          embedding=EmbedOptions(progress=False, workers=0))
    gallery = Gallery.load(root, model=model)
    assert gallery.info()["hubness_correction"]["references"] == {"images": len(gallery.references["images"]),
                                                                 "captions": len(gallery.references["captions"]),
                                                                 "sentences": 40, "nulls": 20}
    d = gallery.references["images"].descriptions
    assert d is not None and gallery.references["captions"].descriptions is None
    ref_caps = bank.captions[reference_rows(len(bank.captions))].astype(np.float32)
    assert len(d) == len(ref_caps) + 40
    assert np.allclose(d.sentences, np.concatenate([ref_caps, cap[:40].astype(np.float16).astype(np.float32)]))
    hits = gallery.search_images(cap[:8], 6)
    ranked = gallery.ranked("images", cap[:8], hits)
    photo_side = _brute_force(cap[:8], [[s for _, s in h] for h in hits],
                              bank.images[reference_rows(len(bank.images))], bank.captions, bank.beta)
    for q, h, r, p in zip(cap[:8], hits, ranked, photo_side):
        vectors = np.stack([gallery.image_vector(i) for i, _ in h])
        assert np.array_equal(gallery.image_vectors([i for i, _ in h]), vectors)     # read in one call, the same
        assert np.allclose(r.relevance, np.minimum(p, d.relevance(q, vectors)), atol=1e-6)
        assert all(x <= y + 1e-9 for x, y in zip(r.relevance, p))            # never above the photo side
    again = gallery.ranked("images", cap[:8], hits)                           # the floors, cached, give the same
    assert [r.relevance for r in again] == [r.relevance for r in ranked]
    # all queries' text sides in one call: a query without hits among them, the others as alone
    mixed = gallery.ranked("images", cap[[0, 1, 2]], [hits[0], [], hits[2]])
    assert [r.relevance for r in mixed] == [ranked[0].relevance, [], ranked[2].relevance]
    assert gallery.ranked("images", cap[:2], [[], []])[1].relevance == []
    gallery.close()
    # an add re-reads the bank (sentences and nulls included) and keeps its file
    before = json.loads((root / current_generation(root) / "manifest.json").read_text())["querybank"]["file"]
    update(root, model.fingerprint, ChangeSet(image_vectors=img[:1], image_rows=[(str(tmp_path / "x.jpg"), None)]))
    after = json.loads((root / current_generation(root) / "manifest.json").read_text())["querybank"]
    assert after["file"] == before and after["references"]["sentences"] == 40


def test_a_banks_alias_sentences_reach_the_index_and_its_name_term(model, parts, tmp_path):
    """Alias sentences travel with the bank: part of its key and file, counted in the index's references, given to
    the image side's Descriptions with their classes, read back from the bank cache; refused without their classes
    or the reference sentences, or with a class beyond them."""
    records, captions, img, cap, bank = parts
    said = replace(bank, sentences=cap[:40], nulls=cap[40:60])
    aliased = replace(said, aliases=cap[60:66], alias_classes=np.array([3, 3, 0, 39, 7, 3]))
    assert aliased.key() != said.key()
    assert replace(aliased, alias_classes=np.array([3, 3, 0, 39, 7, 2])).key() != aliased.key()
    root = tmp_path / "index"
    build(root, model, [r.path for r in records], captions, options=BuildOptions(querybank=aliased),
          embedding=EmbedOptions(progress=False, workers=0))
    gallery = Gallery.load(root, model=model)
    assert gallery.info()["hubness_correction"]["references"]["aliases"] == 6
    d = gallery.references["images"].descriptions
    assert d is not None and np.array_equal(d.aliases, cap[60:66].astype(np.float16).astype(np.float32))
    q = cap[60].astype(np.float16).astype(np.float32)          # a query right on the alias sentences of class 3
    assert int(d.query_names(q).argmax()) == 3 and d.query_names(q).max() == pytest.approx(float(q @ q), abs=1e-6)
    gallery.close()
    entry = aliased.save(tmp_path / "again", tmp_path / "cache")
    back = QueryBank.load(tmp_path / "again", entry)
    assert back.key() == aliased.key() and back.alias_classes.tolist() == [3, 3, 0, 39, 7, 3]
    with pytest.raises(ValueError, match="need their classes"):
        replace(said, aliases=cap[60:66])
    with pytest.raises(ValueError, match="need their classes"):
        replace(bank, aliases=cap[60:66], alias_classes=np.zeros(6, int))
    with pytest.raises(ValueError, match="alias classes"):
        replace(said, aliases=cap[60:66], alias_classes=np.array([3, 3, 0, 40, 7, 3]))
