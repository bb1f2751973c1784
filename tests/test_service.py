"""The HTTP service against a real tiny model and a real FAISS index: every route, every error, the API key,
dynamic batching (batches > 1, same answers as one by one), the bounded queue, index reload."""
import asyncio
import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from conftest import batch_stats, serve_app
from server_process import free_port, poll_readyz, wait_ready, wait_serving
from index.embed import embed_sentences
from index.gallery import EmbedOptions, Gallery, add, remove
from service.app import create_app
from service.settings import Settings
from training.inference.compose import compose_query, image_features_of
from training.data.datasets import load_dataset
from training.models.checkpoint import load_model

REPO = Path(__file__).resolve().parents[1]


def _png(size=(48, 40), color="red") -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def client(tiny_model_path, tiny_index_dir):
    app = create_app(Settings(model=str(tiny_model_path), index=str(tiny_index_dir), max_k=50,
                              max_upload_bytes=200_000, max_pixels=1_000_000, reload_interval_s=0))
    with TestClient(app) as c:
        wait_ready(c)
        yield c


@pytest.fixture(scope="module")
def model(tiny_model_path):
    return load_model(tiny_model_path)


def test_health_ready_docs(client, model):
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz").json()
    assert ready["status"] == "ready" and ready["model_fingerprint"] == model.fingerprint and ready["images"] > 0
    assert client.get("/docs").status_code == 200
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/v1/search/images", "/v1/search/captions", "/v1/captions", "/v1/paraphrases", "/v1/images/{image_id}",
            "/v1/folders", "/healthz", "/readyz", "/metrics"} <= set(paths)
    bodies = paths["/v1/search/images"]["post"]["requestBody"]["content"]               # text, or a composed query
    assert [b["$ref"].rsplit("/", 1)[1] for b in bodies["application/json"]["schema"]["oneOf"]] == ["TextSearch",
                                                                                                "ImageIdCompose"]
    assert set(bodies["multipart/form-data"]["schema"]["properties"]) == {
        "image", "add", "subtract", "k", "offset", "min_score", "folder", "taken_after", "taken_before", "media", "sort"}


def test_text_search_returns_the_exact_ranking(client, model, tiny_index_dir):
    r = client.post("/v1/search/images", json={"text": "a red circle above a blue square", "k": 5})
    assert r.status_code == 200
    results = r.json()["results"]
    assert len(results) == 5 and all(x["uri"] == f"/v1/images/{x['id']}" for x in results)
    scores = [x["score"] for x in results]
    assert scores == sorted(scores, reverse=True)
    gallery = Gallery.load(tiny_index_dir, model=model)
    q = embed_sentences(model, ["a red circle above a blue square"], progress=False)
    exact = [(i, s) for i, s in gallery.search_images(q, 5)[0]]
    assert [x["id"] for x in results] == [i for i, _ in exact]
    assert np.allclose(scores, [s for _, s in exact], atol=1e-5)
    assert len(client.post("/v1/search/images", json={"text": "circle"}).json()["results"]) == 10   # default k


def test_caption_search_by_upload_and_by_gallery_id(client, tiny_index_dir, synth_small):
    gallery = Gallery.load(tiny_index_dir)
    path = Path(gallery.meta.image(2).path)
    by_upload = client.post("/v1/search/captions", files={"image": ("whatever.bin", path.read_bytes(), "text/plain")},
                            data={"k": "4"})
    assert by_upload.status_code == 200
    up = by_upload.json()["results"]
    assert len(up) == 4 and [x["score"] for x in up] == sorted((x["score"] for x in up), reverse=True)
    by_id = client.post("/v1/search/captions", json={"image_id": 2, "k": 4}).json()["results"]
    # the stored embedding of a gallery image and the embedding of its uploaded file rank alike
    assert [x["caption"] for x in by_id] == [x["caption"] for x in up]
    assert np.allclose([x["score"] for x in by_id], [x["score"] for x in up], atol=1e-4)
    captions = {c for r in load_dataset(synth_small).images for c in r.captions}
    assert all(x["caption"] in captions for x in up)


def test_gallery_image_and_thumbnail(client, tiny_index_dir):
    path = Path(Gallery.load(tiny_index_dir).meta.image(1).path)
    r = client.get("/v1/images/1")
    assert r.status_code == 200 and r.content == path.read_bytes()
    assert r.headers["content-type"] == {".png": "image/png", ".jpg": "image/jpeg"}[path.suffix]
    t = client.get("/v1/images/1?size=20")
    assert t.status_code == 200 and t.headers["content-type"] == "image/jpeg"
    assert max(Image.open(io.BytesIO(t.content)).size) == 20


def _composed(model, gallery, path, add=(), subtract=(), k=5):
    """The library's answer for a composed query: ``compose_query`` on the image's features, then the index."""
    query = compose_query(model, image_features_of(model, path), list(add), list(subtract))
    return gallery.search_images(query.view(1, -1).numpy(), k)[0]


def test_composed_query_image_plus_minus_words(client, model, tiny_index_dir):
    gallery = Gallery.load(tiny_index_dir, model=model)
    path = Path(gallery.meta.image(2).path)
    upload = {"image": ("q.png", path.read_bytes(), "image/png")}

    alone = client.post("/v1/search/images", files=upload, data={"k": "5"})
    assert alone.status_code == 200, alone.text
    alone = alone.json()["results"]
    assert len(alone) == 5 and alone[0]["id"] == 2 and alone[0]["score"] == pytest.approx(1.0, abs=1e-4)
    assert all(x["uri"] == f"/v1/images/{x['id']}" for x in alone)

    composed = client.post("/v1/search/images", files=upload,
                           data={"add": "green star, yellow,cross", "subtract": "red circle", "k": "5"})
    assert composed.status_code == 200, composed.text
    composed = composed.json()["results"]
    want = _composed(model, gallery, path, ["green star", "yellow", "cross"], ["red circle"])
    assert [x["id"] for x in composed] == [i for i, _ in want]
    assert np.allclose([x["score"] for x in composed], [s for _, s in want], atol=1e-5)
    scores = [x["score"] for x in composed]
    assert len(composed) == 5 and scores == sorted(scores, reverse=True)
    assert [(x["id"], round(x["score"], 4)) for x in composed] != [(x["id"], round(x["score"], 4)) for x in alone]

    # a gallery image by id composes the same query as its uploaded file
    by_id = client.post("/v1/search/images", json={"image_id": 2, "add": ["green star", "yellow", "cross"],
                                                   "subtract": ["red circle"], "k": 5}).json()["results"]
    assert [x["id"] for x in by_id] == [x["id"] for x in composed]
    assert np.allclose([x["score"] for x in by_id], scores, atol=1e-5)
    assert client.post("/v1/search/images", json={"image_id": 2, "k": 3}).json()["results"][0]["id"] == 2

    # the JSON text search is unchanged
    text = client.post("/v1/search/images", json={"text": "a green star", "k": 4}).json()["results"]
    q = embed_sentences(model, ["a green star"], progress=False)
    assert [x["id"] for x in text] == [i for i, _ in gallery.search_images(q, 4)[0]]


def test_json_text_search_errors_are_fastapis_own(client):
    """The route reads its JSON itself now (it also takes a form): for bad JSON bodies it answers what FastAPI
    answered when the route declared ``body: TextSearch``."""
    from fastapi import FastAPI

    from service.app import _add_error_handlers
    from service.schemas import request_models

    TextSearch = request_models(Settings(max_k=50, max_text_chars=1000)).text_search   # the client fixture's limits
    reference = FastAPI()
    _add_error_handlers(reference)

    @reference.post("/v1/search/images")
    async def search(body: TextSearch):
        return {}

    bodies = [b"", b"{not json", b"null", b"[]", b'"a"', b'{"text": 5}', b'{"k": 3}', b'{"text": " ", "k": 2}',
              b'{"text": "a", "k": 0}', b'{"text": "a", "k": 1e9}', b'{"text": "a", "extra": 1}', b"\xff\xfe\xfa"]
    with TestClient(reference) as ref:
        for body in bodies:
            for ctype in ("application/json", "application/json; charset=utf-8", "application/problem+json"):
                want = ref.post("/v1/search/images", content=body, headers={"content-type": ctype})
                got = client.post("/v1/search/images", content=body, headers={"content-type": ctype})
                assert want.status_code >= 400 and (got.status_code, got.json()) == (want.status_code, want.json())


def test_composition_needs_one_vector_per_image(tiny_model_path, tiny_index_dir):
    """A region-attention model (STT-ATT) has no single image vector to add words to: 409, not a crash."""
    import torch

    model = load_model(tiny_model_path)
    gallery = Gallery.load(tiny_index_dir, model=model)
    model.attention = torch.nn.Identity()       # the route only asks whether the model has one
    settings = Settings(model=str(tiny_model_path), index=str(tiny_index_dir), reload_interval_s=0)
    with TestClient(create_app(settings, model=model, gallery=gallery)) as c:
        wait_ready(c)
        for kwargs in ({"files": {"image": ("q.png", _png(), "image/png")}, "data": {"add": "red"}},
                       {"json": {"image_id": 1, "subtract": ["red"]}}):
            r = c.post("/v1/search/images", **kwargs)
            assert r.status_code == 409 and "region attention" in r.json()["detail"], r.text
        assert c.post("/v1/search/images", json={"text": "a red circle"}).status_code == 200


def test_composed_queries_are_batched_and_match_sequential(tiny_model_path, tiny_index_dir):
    meta = Gallery.load(tiny_index_dir).meta
    images = [Path(meta.image(i).path).read_bytes() for i in range(6)]
    words = [{}, {"add": "red"}, {"subtract": "blue square"}, {"add": "star, green", "subtract": "circle"},
             {"add": "a big yellow cross"}, {}]

    def request(c, data, form):
        return c.post("/v1/search/images", files={"image": ("q.png", data, "image/png")}, data={**form, "k": "6"})

    async def concurrent(c):
        answers = await asyncio.gather(*(request(c, b, w) for b, w in zip(images, words)))
        return [r.json() for r in answers], (await c.get("/metrics")).text

    async def sequential(c):
        return [(await request(c, b, w)).json() for b, w in zip(images, words)], (await c.get("/metrics")).text

    common = dict(model=str(tiny_model_path), index=str(tiny_index_dir), reload_interval_s=0)
    batched, b_metrics = asyncio.run(serve_app(create_app(Settings(**common, max_wait_ms=200)), concurrent))
    alone, s_metrics = asyncio.run(serve_app(create_app(Settings(**common, batching=False)), sequential))
    count, total = batch_stats(b_metrics, "compose")
    assert total == len(images) and count < total, (count, total)
    assert batch_stats(s_metrics, "compose") == (len(images), len(images))
    for got, want in zip(batched, alone):
        assert [x["id"] for x in got["results"]] == [x["id"] for x in want["results"]]
        assert np.allclose([x["score"] for x in got["results"]], [x["score"] for x in want["results"]], atol=1e-5)


@pytest.mark.parametrize("method,url,kwargs,status,message", [
    ("post", "/v1/search/images", {"json": {"text": ""}}, 422, "empty"),
    ("post", "/v1/search/images", {"json": {"text": " \t\n "}}, 422, "whitespace"),
    ("post", "/v1/search/images", {"json": {"k": 3}}, 422, "text"),
    ("post", "/v1/search/images", {"json": {"text": "a cat", "k": 0}}, 422, "k"),
    ("post", "/v1/search/images", {"json": {"text": "a cat", "k": 51}}, 422, "less than or equal to 50"),
    ("post", "/v1/search/images", {"json": {"text": "a cat", "k": "5"}}, 422, "JSON integer"),
    ("post", "/v1/search/images", {"json": {"text": "a cat", "k": True}}, 422, "JSON integer"),
    ("post", "/v1/search/images", {"json": {"text": "a cat", "k": "many"}}, 422, "k"),
    ("post", "/v1/search/images", {"json": {"text": "x" * 1001}}, 422, "at most 1000 characters"),
    ("post", "/v1/search/images", {"content": b"{not json", "headers": {"content-type": "application/json"}},
     422, "JSON"),
    ("post", "/v1/search/images", {"content": b'{"text": "a"}', "headers": {"content-type": "text/plain"}}, 415,
     "JSON"),
    ("post", "/v1/search/images", {"json": {"text": "a cat", "image_id": 1}}, 422, "text"),
    ("post", "/v1/search/images", {"json": {"image_id": 987654, "add": ["red"]}}, 404, "no gallery image"),
    ("post", "/v1/search/images", {"json": {"image_id": 1, "add": [" "]}}, 422, "empty"),
    ("post", "/v1/search/images", {"json": {"image_id": 1, "add": "red"}}, 422, "add"),
    ("post", "/v1/search/images", {"json": {"image_id": 1, "add": ["a"] * 17}}, 422, "at most 16"),
    ("post", "/v1/search/images", {"json": {"image_id": 1, "subtract": ["red, blue"]}}, 422, "without commas"),
    ("post", "/v1/search/images", {"json": {"image_id": 1, "add": ["x" * 1001]}}, 422, "at most 1000 characters"),
    ("post", "/v1/search/images", {"json": {"image_id": 1, "k": 51}}, 422, "less than or equal to 50"),
    ("post", "/v1/search/images", {"files": {"image": ("a.png", _png(), "image/png")}, "data": {"add": ""}}, 422,
     "empty"),
    ("post", "/v1/search/images", {"files": {"image": ("a.png", _png(), "image/png")}, "data": {"add": "red,"}}, 422,
     "empty"),
    ("post", "/v1/search/images", {"files": {"image": ("a.png", _png(), "image/png")},
                                   "data": {"subtract": " ,blue"}}, 422, "empty"),
    ("post", "/v1/search/images", {"files": {"image": ("a.png", _png(), "image/png")},
                                   "data": {"add": ",".join(["red"] * 17)}}, 422, "at most 16"),
    ("post", "/v1/search/images", {"files": {"image": ("a.png", _png(), "image/png")},
                                   "data": {"add": ["red", "blue"]}}, 422, "give it once"),
    ("post", "/v1/search/images", {"files": {"image": ("a.png", _png(), "image/png")},
                                   "data": {"add": "red", "colour": "blue"}}, 422, "unknown form field 'colour'"),
    ("post", "/v1/search/images", {"files": {"image": ("a.png", _png(), "image/png")}, "data": {"k": "0"}}, 422,
     "k must be an integer from 1 to 50"),
    ("post", "/v1/search/images", {"files": {"image": ("a.png", _png(), "image/png")}, "data": {"k": "51"}}, 422,
     "k must be an integer from 1 to 50"),
    ("post", "/v1/search/images", {"files": {"image": ("a.png", b"GIF89a not really", "image/png")}}, 400,
     "corrupt"),
    ("post", "/v1/search/images", {"files": {"image": ("a.png", b"", "image/png")}}, 400, "empty"),
    ("post", "/v1/search/images", {"files": {"other": ("a.png", _png(), "image/png")}, "data": {"add": "red"}}, 422,
     "'image'"),
    ("post", "/v1/search/captions", {"json": {"image_id": 987654}}, 404, "no gallery image"),
    ("post", "/v1/search/captions", {"json": {"image_id": 1, "k": 999}}, 422, "less than or equal to 50"),
    ("post", "/v1/search/captions", {"json": {"image_id": "one"}}, 422, "image_id"),
    ("post", "/v1/search/captions", {"content": b"{", "headers": {"content-type": "application/json"}}, 422, "JSON"),
    ("post", "/v1/search/captions", {"content": b"abc", "headers": {"content-type": "text/plain"}}, 415, "multipart"),
    ("post", "/v1/search/captions", {"files": {"image": ("a.png", b"GIF89a but not really an image", "image/png")}},
     400, "corrupt"),
    ("post", "/v1/search/captions", {"files": {"image": ("a.png", b"%PDF-1.4 hello", "image/png")}}, 415,
     "not an image"),
    ("post", "/v1/search/captions", {"files": {"image": ("a.png", b"", "image/png")}}, 400, "empty"),
    ("post", "/v1/search/captions", {"files": {"other": ("a.png", b"x", "image/png")}}, 422, "'image'"),
    ("post", "/v1/search/captions", {"files": {"image": ("a.png", _png(), "image/png")}, "data": {"k": "ten"}},
     422, "k"),
    ("post", "/v1/search/captions", {"content": b"--xx\r\ngarbage", "headers": {
        "content-type": "multipart/form-data; boundary=xx"}}, 422, "image"),
    ("post", "/v1/search/captions", {"files": {"image": ("big.png", _png((1001, 1000)), "image/png")}}, 413,
     "pixels"),
    ("post", "/v1/search/captions", {"files": {"image": ("big.png", b"\x89PNG\r\n\x1a\n" + b"0" * 250_000,
                                                         "image/png")}}, 413, "larger than"),
    ("post", "/v1/search/captions", {"json": {"image_id": -3}}, 422, "image_id"),
    ("post", "/v1/search/captions", {"json": {"image_id": 2 ** 70}}, 422, "image_id"),
    ("post", "/v1/search/captions", {"files": [("image", ("a.png", _png(), "image/png")),
                                               ("image", ("b.png", _png(), "image/png"))]}, 400, "files"),
    ("get", "/v1/images/987654", {}, 404, "no gallery image"),
    ("get", f"/v1/images/{2 ** 70}", {}, 422, "image_id"),
    ("get", "/v1/images/-1", {}, 422, "image_id"),
    ("get", "/v1/images/abc", {}, 422, "image_id"),
    ("get", "/v1/images/1?size=4", {}, 422, "size"),
    ("get", "/v1/images/1?size=5000", {}, 422, "less than or equal to 1024"),
    ("get", "/v1/nothing-here", {}, 404, "Not Found"),
    ("post", "/v1/captions", {"files": {"image": ("a.png", _png(), "image/png")}}, 409, "sentence decoder"),
    ("post", "/v1/paraphrases", {"json": {"text": "a dog runs", "n": 3}}, 409, "sentence decoder"),
    # without a decoder the route is unavailable whatever the body (its validation: test_service_generate.py)
    ("post", "/v1/paraphrases", {"json": {"text": "  "}}, 409, "sentence decoder"),
    ("post", "/v1/paraphrases", {"json": {"text": "a dog", "n": 11}}, 409, "sentence decoder"),
])
def test_errors_are_clear_json(client, method, url, kwargs, status, message):
    r = getattr(client, method)(url, **kwargs)
    assert r.status_code == status, r.text
    body = r.json()
    assert isinstance(body["detail"], str) and message.lower() in body["detail"].lower(), body


# a valid body of each search route, then what is done to it: both routes must refuse each bad body alike
_SEARCH_BODIES = {"/v1/search/images": {"text": "a red circle", "k": 3}, "/v1/search/captions": {"image_id": 1, "k": 3}}
_BAD_BODIES = [
    ("unknown field", lambda body: json.dumps({**body, "colour": "red"}).encode(), "application/json"),
    ("unknown field, +json type", lambda body: json.dumps({**body, "colour": "red"}).encode(),
     "application/vnd.api+json"),
    ("unknown field, type with parameters", lambda body: json.dumps({**body, "colour": "red"}).encode(),
     "Application/JSON; charset=utf-8"),
    ("not JSON", lambda body: b"{not json", "application/json"),
    ("truncated JSON", lambda body: b'{"k": 3', "application/json"),
    ("empty body", lambda body: b"", "application/json"),
    ("not UTF-8", lambda body: b'{"k": "\xff\xfe"}', "application/json"),
    ("a JSON array", lambda body: json.dumps([body]).encode(), "application/json"),
    ("a JSON string", lambda body: b'"a red circle"', "application/json"),
    ("a JSON null", lambda body: b"null", "application/json"),
    ("wrong type: text/plain", lambda body: json.dumps(body).encode(), "text/plain"),
    ("wrong type: a form", lambda body: b"text=a+red+circle", "application/x-www-form-urlencoded"),
    ("wrong type: XML", lambda body: b"<text>a red circle</text>", "application/xml"),
    ("wrong type: json-ish", lambda body: json.dumps(body).encode(), "text/json"),
    ("no content type", lambda body: json.dumps(body).encode(), None),
]


def _shape(r) -> tuple:
    """What must not differ between the search routes: the status, the body's keys, and for a 422 each error's
    location and type."""
    body = r.json()
    errors = [(tuple(e["loc"]), e["type"]) for e in body.get("errors") or []]
    return r.status_code, r.headers["content-type"], sorted(body), isinstance(body["detail"], str), errors


@pytest.mark.parametrize("case,make,ctype", _BAD_BODIES, ids=[c for c, _, _ in _BAD_BODIES])
def test_search_routes_refuse_a_bad_body_alike(client, case, make, ctype):
    shapes = {}
    for route, body in _SEARCH_BODIES.items():
        assert client.post(route, json=body).status_code == 200        # the body itself is fine on its route
        r = client.post(route, content=make(body), headers={"content-type": ctype} if ctype else {})
        assert 400 <= r.status_code < 500, (route, r.text)
        shapes[route] = _shape(r)
    assert shapes["/v1/search/images"] == shapes["/v1/search/captions"], shapes


def test_search_routes_refuse_a_bad_form_alike(client):
    shapes = [_shape(client.post(route, files={"image": ("a.png", _png(), "image/png")}, data=data))
              for route in _SEARCH_BODIES for data in ({"colour": "red"}, {"k": "0"}, {"k": ["1", "2"]})]
    assert shapes[:3] == shapes[3:], shapes
    assert [s[4] for s in shapes[:3]] == [[(("body", "colour"), "extra_forbidden")], [(("body", "k"), "int_parsing")],
                                          [(("body", "k"), "value_error")]]

def test_truncated_image_is_400(client, tiny_index_dir):
    data = Path(Gallery.load(tiny_index_dir).meta.image(0).path).read_bytes()
    r = client.post("/v1/search/captions", files={"image": ("a.png", data[: len(data) // 2], "image/png")})
    assert r.status_code == 400 and "truncated" in r.json()["detail"]


def test_oversized_upload_is_refused_from_content_length(client):
    r = client.post("/v1/search/captions", content=b"0" * 1_400_000,
                    headers={"content-type": "multipart/form-data; boundary=x"})
    assert r.status_code == 413 and "larger than" in r.json()["detail"]


def test_metrics_count_routes_batches_and_queue(client):
    client.post("/v1/search/images", json={"text": "a star"})
    text = client.get("/metrics").text
    assert re.search(r'jointspace_requests_total\{method="POST",route="/v1/search/images",status="200"\} \d', text)
    assert re.search(r'jointspace_request_seconds_bucket\{le="0.01",method="POST",route="/v1/search/images"\}', text)
    assert 'jointspace_batch_size_bucket{batcher="text",le="1.0"}' in text
    assert 'jointspace_queue_depth{batcher="text"}' in text
    assert re.search(r'jointspace_index_vectors\{side="images"\} [1-9]', text)


def test_api_key(tiny_model_path, tiny_index_dir):
    app = create_app(Settings(model=str(tiny_model_path), index=str(tiny_index_dir), api_key="s3cret",
                              reload_interval_s=0))
    with TestClient(app) as c:
        wait_ready(c)
        for headers in ({}, {"X-API-Key": "wrong"}, {"Authorization": "Bearer wrong"}):
            r = c.post("/v1/search/images", json={"text": "a circle"}, headers=headers)
            assert r.status_code == 401 and "API key" in r.json()["detail"]
            assert c.get("/v1/images/0", headers=headers).status_code == 401
        assert c.post("/v1/search/images", json={"text": "a circle"}, headers={"X-API-Key": "s3cret"}).status_code == 200
        assert c.get("/v1/images/0", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        # either scheme suffices (the document's two security alternatives), one key tried a request: the
        # X-API-Key header when there is one
        assert c.get("/v1/images/0", headers={"X-API-Key": "s3cret", "Authorization": "Bearer x"}).status_code == 200
        assert c.get("/v1/images/0", headers={"X-API-Key": "x", "Authorization": "Bearer s3cret"}).status_code == 401
        assert c.get("/v1/images/0", headers={"X-API-Key": "no", "Authorization": "Basic czNjcmV0"}).status_code == 401
        assert c.get("/v1/images/0", headers={"X-API-Key": "s3cret",
                                              "Authorization": "Basic czNjcmV0"}).status_code == 200
        for open_route in ("/healthz", "/readyz", "/metrics"):
            assert c.get(open_route).status_code == 200


def test_not_ready_and_mismatched_index_answer_503_not_500(tiny_model_path, tiny_index_dir, tmp_path):
    import torch
    from training.models.checkpoint import save_model

    other = load_model(tiny_model_path)
    with torch.no_grad():
        next(other.text_proj.parameters()).mul_(1.5)
    save_model(other, tmp_path / "other.pt")
    for settings, expected in ((Settings(model=str(tmp_path / "missing.pt"), index=str(tiny_index_dir)), "missing"),
                               (Settings(model=str(tmp_path / "other.pt"), index=str(tiny_index_dir)),
                                "built with model")):
        with TestClient(create_app(settings)) as c:
            r = poll_readyz(c, until=lambda r: "error" in r.json()["status"], timeout=30)
            assert r.status_code == 503 and expected in r.json()["status"]
            assert c.get("/healthz").status_code == 200
            s = c.post("/v1/search/images", json={"text": "a cat"})       # the reason (server paths) is /readyz's
            assert s.status_code == 503 and "loading the model or the index failed" in s.json()["detail"]
            assert str(tmp_path) not in s.text and str(tiny_index_dir) not in s.text


# --- dynamic batching --------------------------------------------------------------------------------------------

QUERIES = [f"a {c} {s} {p} a {c2} {s2}" for c, s, p, c2, s2 in [
    ("red", "circle", "above", "blue", "square"), ("green", "star", "left of", "yellow", "cross"),
    ("purple", "square", "below", "red", "star"), ("orange", "cross", "right of", "green", "circle")]] * 6


def test_concurrent_requests_are_batched_and_match_sequential(tiny_model_path, tiny_index_dir):
    images = [Path(Gallery.load(tiny_index_dir).meta.image(i).path).read_bytes() for i in range(8)]

    async def concurrent(c):
        texts = await asyncio.gather(*(c.post("/v1/search/images", json={"text": q, "k": 7}) for q in QUERIES))
        uploads = await asyncio.gather(*(c.post("/v1/search/captions", files={"image": ("x.png", b, "image/png")},
                                                data={"k": "5"}) for b in images * 2))
        return [r.json() for r in texts], [r.json() for r in uploads], (await c.get("/metrics")).text

    async def sequential(c):
        texts = [(await c.post("/v1/search/images", json={"text": q, "k": 7})).json() for q in QUERIES]
        uploads = [(await c.post("/v1/search/captions", files={"image": ("x.png", b, "image/png")},
                                 data={"k": "5"})).json() for b in images * 2]
        return texts, uploads, (await c.get("/metrics")).text

    common = dict(model=str(tiny_model_path), index=str(tiny_index_dir), reload_interval_s=0)
    batched = create_app(Settings(**common, max_batch=64, max_wait_ms=100))
    unbatched = create_app(Settings(**common, batching=False))
    b_text, b_img, b_metrics = asyncio.run(serve_app(batched, concurrent))
    s_text, s_img, s_metrics = asyncio.run(serve_app(unbatched, sequential))

    count, total = batch_stats(b_metrics, "text")
    assert total == len(QUERIES) and count < total / 2, (count, total)          # mean batch size > 2
    count, total = batch_stats(b_metrics, "image")
    assert total == 2 * len(images) and count < total, (count, total)
    assert batch_stats(s_metrics, "text") == (len(QUERIES), len(QUERIES))       # off: one request per pass

    for got, want in zip(b_text + b_img, s_text + s_img):
        g, w = got["results"], want["results"]
        assert len(g) == len(w)
        assert np.allclose([x["score"] for x in g], [x["score"] for x in w], atol=1e-5)
        assert [x.get("id") for x in g] == [x.get("id") for x in w]


class SlowTexts:
    """The real engine's text search, taking at least ``seconds`` per batch (as a loaded GPU or a bigger model
    would), counting the queries it computed."""

    def __init__(self, engine, seconds: float):
        self.engine, self.seconds, self.computed = engine, seconds, []

    def __call__(self, items):
        time.sleep(self.seconds)
        self.computed.extend(t for t, _ in items)
        return self.engine.search_texts(items)


def _shed_count(metrics: str, batcher: str, reason: str) -> float:
    m = re.search(rf'jointspace_shed_total{{batcher="{batcher}",reason="{reason}"}} (\S+)', metrics)
    return float(m.group(1)) if m else 0.0


def test_requests_past_their_deadline_are_dropped_before_any_work(tiny_model_path, tiny_index_dir):
    app = create_app(Settings(model=str(tiny_model_path), index=str(tiny_index_dir), reload_interval_s=0,
                              max_batch=1, max_wait_ms=0, deadline_ms=150, retry_after_s=2))
    queries = [f"a red circle number {i}" for i in range(12)]

    async def flood(c):
        state = app.state.service
        slow = SlowTexts(state.engine, 0.05)
        state._search_texts = slow              # the batcher calls state._search_texts through its fn
        state.batchers["text"].fn = slow
        answers = await asyncio.gather(*(c.post("/v1/search/images", json={"text": q, "k": 3}) for q in queries))
        return answers, slow.computed, (await c.get("/metrics")).text

    answers, computed, metrics = asyncio.run(serve_app(app, flood))
    ok = [q for q, r in zip(queries, answers) if r.status_code == 200]
    shed = [r for r in answers if r.status_code == 503]
    assert len(ok) + len(shed) == len(queries) and ok and shed, [r.status_code for r in answers]
    assert sorted(computed) == sorted(ok)                   # a dropped request was never computed
    assert all(r.headers["retry-after"] == "2" and "deadline" in r.json()["detail"] for r in shed)
    assert _shed_count(metrics, "text", "deadline") == len(shed)
    assert re.search(r"^jointspace_in_flight 0\.0$", metrics, re.M)


def test_admission_refuses_beyond_max_queue_before_any_work(tiny_model_path, tiny_index_dir):
    app = create_app(Settings(model=str(tiny_model_path), index=str(tiny_index_dir), reload_interval_s=0,
                              max_queue=4, max_batch=1, max_wait_ms=0, deadline_ms=0))

    async def flood(c):
        state = app.state.service
        slow = SlowTexts(state.engine, 0.05)
        state.batchers["text"].fn = slow
        answers = await asyncio.gather(*(c.post("/v1/search/images", json={"text": q}) for q in QUERIES[:12]))
        return answers, slow.computed, (await c.get("/metrics")).text

    answers, computed, metrics = asyncio.run(serve_app(app, flood))
    codes = [r.status_code for r in answers]
    assert codes.count(200) == len(computed) and 1 <= codes.count(200) <= 4 and codes.count(503) >= 8, codes
    busy = [r for r in answers if r.status_code == 503]
    assert all(r.headers["retry-after"] == "1" and "capacity" in r.json()["detail"] for r in busy)
    assert _shed_count(metrics, "admission", "queue_full") == len(busy)
    assert re.search(r"^jointspace_in_flight 0\.0$", metrics, re.M)


def test_full_queue_answers_503_with_retry_after(tiny_model_path, tiny_index_dir):
    app = create_app(Settings(model=str(tiny_model_path), index=str(tiny_index_dir), reload_interval_s=0,
                              max_queue=1, max_batch=1, max_wait_ms=0))

    async def flood(c):
        return await asyncio.gather(*(c.post("/v1/search/images", json={"text": q}) for q in QUERIES))

    responses = asyncio.run(serve_app(app, flood))
    codes = [r.status_code for r in responses]
    assert set(codes) <= {200, 503} and 503 in codes and 200 in codes, codes
    busy = next(r for r in responses if r.status_code == 503)
    assert busy.headers["retry-after"] == "1" and "capacity" in busy.json()["detail"]


# --- index updates while serving -----------------------------------------------------------------------------------

def test_service_picks_up_index_add_and_remove(tiny_model_path, index_copy, synth_small, model):
    app = create_app(Settings(model=str(tiny_model_path), index=str(index_copy), reload_interval_s=0.1))
    new_image = load_dataset(synth_small).split("train").images[0].path
    with TestClient(app) as c:
        gen = wait_ready(c).get("/readyz").json()["index_generation"]
        report = add(index_copy, model, [new_image], embedding=EmbedOptions(progress=False, workers=0))
        new_id = report.image_ids[0]
        poll_readyz(c, until=lambda r: r.json()["index_generation"] != gen, timeout=20)
        assert c.get(f"/v1/images/{new_id}").content == Path(new_image).read_bytes()
        assert c.post("/v1/search/captions", json={"image_id": new_id, "k": 2}).status_code == 200
        gen = c.get("/readyz").json()["index_generation"]
        remove(index_copy, image_ids=[new_id])
        poll_readyz(c, until=lambda r: r.json()["index_generation"] != gen, timeout=20)
        assert c.get(f"/v1/images/{new_id}").status_code == 404
        ids = {x["id"] for x in c.post("/v1/search/images", json={"text": "a shape", "k": 50}).json()["results"]}
        assert new_id not in ids


# --- the real server process -----------------------------------------------------------------------------------------

def test_jointspace_serve_runs_uvicorn(tiny_model_path, tiny_index_dir, tmp_path):
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "JOINTSPACE_MAX_K": "7"}      # settings from the environment
    proc = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--model", str(tiny_model_path),
                             "--index", str(tiny_index_dir), "--port", str(port), "--log-level", "warning"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_serving(proc, port, timeout=90)
        r = httpx.post(f"{base}/v1/search/images", json={"text": "a blue circle", "k": 7}, timeout=10)
        assert r.status_code == 200 and len(r.json()["results"]) == 7
        assert httpx.post(f"{base}/v1/search/images", json={"text": "a blue circle", "k": 8}).status_code == 422
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_serve_refuses_a_mismatched_index_at_start(tiny_index_dir, tmp_path, capsys):
    import torch
    from service.cli import main
    from training.data.vocab import Vocabulary
    from training.models.model import build_model
    from training.models.checkpoint import save_model

    from conftest import tiny_config

    save_model(build_model(tiny_config(), Vocabulary.build(["a b c"])), tmp_path / "untrained.pt")
    assert main(["serve", "--model", str(tmp_path / "untrained.pt"), "--index", str(tiny_index_dir)]) == 2
    assert "was built with model" in capsys.readouterr().err


def test_no_input_produces_a_500(client):
    """Seeded random bodies, content types and paths against every route: a success or a JSON error with a
    string detail, never a 5xx."""
    rng = np.random.default_rng(0)
    png = _png()
    bodies = [b"", b"{}", b"null", b"[]", b'{"text": null}', b'{"text": 5}', b'{"text": "ok", "k": 1e9}',
              b'{"image_id": 1.5}', b'{"image_id": true}', png, png[:20], bytes(rng.integers(0, 256, 300, np.uint8)),
              b"--b\r\nContent-Disposition: form-data; name=\"image\"; filename=\"x\"\r\n\r\n" + png[:40]]
    types = ["application/json", "multipart/form-data; boundary=b", "multipart/form-data", "image/png",
             "text/plain", "application/x-www-form-urlencoded", ""]
    routes = ["/v1/search/images", "/v1/search/captions", "/v1/captions", "/v1/paraphrases"]
    for _ in range(60):
        route = routes[rng.integers(len(routes))]
        body = bodies[rng.integers(len(bodies))]
        ctype = types[rng.integers(len(types))]
        r = client.post(route, content=body, headers={"content-type": ctype} if ctype else {})
        assert r.status_code < 500, (route, ctype, body[:40], r.status_code, r.text)
        assert isinstance(r.json()["detail"], str)
    for path in ("/v1/images/1?size=abc", "/v1/images/%00", "/v1/images/1?size=-5", "/v1/images/1.5"):
        r = client.get(path)
        assert 400 <= r.status_code < 500 and isinstance(r.json()["detail"], str), (path, r.text)
