"""The decoder routes of the HTTP service (``/v1/captions``, ``/v1/paraphrases``) against a real tiny
Show-Translate-Tell model and an index built with it: well-formed ranked sentences, the same answers as the
training package's inference API, batched decoding across concurrent requests, validation, and 409 without a
decoder."""
import asyncio
import io
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

import service.engine
from conftest import batch_stats, serve_app
from server_process import wait_ready
from index.gallery import Gallery
from service.app import create_app
from service.settings import Settings
from training.data.vocab import tokenize
from training.inference.embedding import embed_texts
from training.inference.generate import caption_embeddings, caption_images, paraphrase_texts
from training.models.checkpoint import load_model

SENTENCES = ["a red circle left of a blue square", "a green star above a yellow cross",
             "a small purple square below a big red star", "an orange cross right of a green circle"]


def _png(size=(48, 40), color="red") -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, "PNG")
    return buf.getvalue()


def _settings(model_path, index_dir, **extra):
    return Settings(model=str(model_path), index=str(index_dir), reload_interval_s=0, max_upload_bytes=200_000,
                    max_pixels=1_000_000, **extra)


@pytest.fixture(scope="module")
def model(tiny_stt_model_path):
    return load_model(tiny_stt_model_path)


@pytest.fixture(scope="module")
def gallery_paths(tiny_stt_index_dir):
    meta = Gallery.load(tiny_stt_index_dir).meta
    return [Path(meta.image(i).path) for i in range(8)]


@pytest.fixture(scope="module")
def client(tiny_stt_model_path, tiny_stt_index_dir):
    with TestClient(create_app(_settings(tiny_stt_model_path, tiny_stt_index_dir))) as c:
        assert wait_ready(c).get("/readyz").json()["decoder"] is True
        yield c


def _well_formed(results, n, model, exclude=()):
    """``n`` ranked, non-empty sentences of vocabulary words (never ``<unk>``), none of them in ``exclude``."""
    assert len(results) == n, results
    scores = [r["score"] for r in results]
    assert scores == sorted(scores, reverse=True) and all(s <= 0 for s in scores)
    for r in results:
        words = r["text"].split()
        assert words and r["text"] == " ".join(words), r
        assert "<unk>" not in words and all(w in model.vocab for w in words), r
        assert 1 <= len(words) <= model.cfg.decoder.max_len
        assert r["text"] not in exclude
    assert len({r["text"] for r in results}) == n


def test_captions_are_ranked_well_formed_and_those_of_the_inference_api(client, model, gallery_paths):
    path = gallery_paths[0]
    r = client.post("/v1/captions", files={"image": ("x.bin", path.read_bytes(), "text/plain")},
                    data={"n": "3", "beam_size": "4"})
    assert r.status_code == 200, r.text
    got = r.json()["captions"]
    _well_formed(got, 3, model)
    want = caption_images(model, [path], n=3, beam_size=4)[0]
    assert [x["text"] for x in got] == [t for t, _ in want]
    assert np.allclose([x["score"] for x in got], [s for _, s in want], atol=1e-5)
    default = client.post("/v1/captions", files={"image": ("x.png", path.read_bytes(), "image/png")}).json()
    assert [x["text"] for x in default["captions"]] == [t for t, _ in caption_images(model, [path], n=1)[0]]
    greedy = client.post("/v1/captions", files={"image": ("x.png", path.read_bytes(), "image/png")},
                         data={"n": "1", "beam_size": "1"}).json()["captions"]
    _well_formed(greedy, 1, model)


def test_paraphrases_are_well_formed_and_never_the_input(client, model):
    for text in SENTENCES[:2]:
        r = client.post("/v1/paraphrases", json={"text": text, "n": 4})
        assert r.status_code == 200, r.text
        got = r.json()["paraphrases"]
        _well_formed(got, 4, model, exclude={" ".join(tokenize(text))})
        want = paraphrase_texts(model, [text], n=4)[0]
        assert [x["text"] for x in got] == [t for t, _ in want]
        assert np.allclose([x["score"] for x in got], [s for _, s in want], atol=1e-5)
    assert len(client.post("/v1/paraphrases", json={"text": SENTENCES[0]}).json()["paraphrases"]) == 5  # default

    # a sentence the decoder writes back for its own embedding (found by iterating decode ∘ embed): the route
    # must leave it out and still answer n others
    sentence, echoed = SENTENCES[0], False
    for _ in range(10):
        raw = [t for t, _ in caption_embeddings(model, embed_texts(model, [sentence]), n=3)[0]]
        if " ".join(tokenize(sentence)) in raw:
            echoed = True
            break
        sentence = raw[0]
    assert echoed, "no sentence the tiny model repeats: the exclusion below would test nothing"
    for beam in (None, 2, 10):
        got = client.post("/v1/paraphrases", json={"text": sentence, "n": 3, "beam_size": beam}).json()
        _well_formed(got["paraphrases"], 3, model, exclude={" ".join(tokenize(sentence))})


@pytest.mark.parametrize("url,kwargs,status,message", [
    ("/v1/captions", {"data": {"n": "0"}}, 422, "n must be an integer from 1 to 10"),
    ("/v1/captions", {"data": {"n": "11"}}, 422, "n must be"),
    ("/v1/captions", {"data": {"n": "two"}}, 422, "n must be"),
    ("/v1/captions", {"data": {"n": ""}}, 422, "n must be"),
    ("/v1/captions", {"data": {"beam_size": "0"}}, 422, "beam_size must be an integer from 1 to 10"),
    ("/v1/captions", {"data": {"beam_size": "99"}}, 422, "beam_size"),
    ("/v1/captions", {"data": {"beam_size": "1.5"}}, 422, "beam_size"),
    ("/v1/captions", {"files": {"image": ("a.png", b"GIF89a but not really an image", "image/png")}}, 400, "corrupt"),
    ("/v1/captions", {"files": {"image": ("a.png", b"%PDF-1.4 hello", "image/png")}}, 415, "not an image"),
    ("/v1/captions", {"files": {"image": ("a.png", b"", "image/png")}}, 400, "empty"),
    ("/v1/captions", {"files": {"image": ("big.png", _png((1001, 1000)), "image/png")}}, 413, "pixels"),
    ("/v1/captions", {"files": {"image": ("big.png", b"\x89PNG\r\n\x1a\n" + b"0" * 250_000, "image/png")}}, 413,
     "larger than"),
    ("/v1/captions", {"files": {"other": ("a.png", _png(), "image/png")}}, 422, "'image'"),
    ("/v1/captions", {"json": {"image_id": 1}}, 415, "multipart"),
    ("/v1/paraphrases", {"json": {"text": ""}}, 422, "empty"),
    ("/v1/paraphrases", {"json": {"text": " \t "}}, 422, "whitespace"),
    ("/v1/paraphrases", {"json": {"text": "x" * 1001}}, 422, "at most 1000 characters"),
    ("/v1/paraphrases", {"json": {"text": "a dog", "n": 0}}, 422, "n"),
    ("/v1/paraphrases", {"json": {"text": "a dog", "n": 11}}, 422, "n"),
    ("/v1/paraphrases", {"json": {"text": "a dog", "beam_size": 0}}, 422, "beam_size"),
    ("/v1/paraphrases", {"json": {"text": "a dog", "beam_size": 11}}, 422, "beam_size"),
    ("/v1/paraphrases", {"json": {"text": "a dog", "temperature": 2}}, 422, "temperature"),
    ("/v1/paraphrases", {"json": {"n": 2}}, 422, "text"),
    ("/v1/paraphrases", {"content": b"{oops", "headers": {"content-type": "application/json"}}, 422, "JSON"),
])
def test_bad_requests_are_clear_4xx(client, url, kwargs, status, message):
    if url == "/v1/captions" and "files" not in kwargs and "json" not in kwargs:
        kwargs = {**kwargs, "files": {"image": ("a.png", _png(), "image/png")}}
    r = client.post(url, **kwargs)
    assert r.status_code == status, r.text
    assert message.lower() in r.json()["detail"].lower(), r.json()


def test_a_model_without_decoder_answers_409(tiny_model_path, tiny_index_dir):
    with TestClient(create_app(_settings(tiny_model_path, tiny_index_dir))) as c:
        assert wait_ready(c).get("/readyz").json()["decoder"] is False
        assert "caption" not in c.app.state.service.batchers and "paraphrase" not in c.app.state.service.batchers
        for r in (c.post("/v1/captions", files={"image": ("a.png", _png(), "image/png")}, data={"n": "2"}),
                  c.post("/v1/paraphrases", json={"text": "a red circle", "n": 2})):
            assert r.status_code == 409
            detail = r.json()["detail"]
            assert "sentence decoder" in detail and "STT model" in detail and "configs/stt.yaml" in detail, detail
        assert c.post("/v1/search/images", json={"text": "a red circle"}).status_code == 200   # retrieval works


def test_openapi_describes_the_decoder_routes(client):
    paths = client.get("/openapi.json").json()["paths"]
    form = paths["/v1/captions"]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert set(form["properties"]) == {"image", "n", "beam_size"} and form["properties"]["n"]["maximum"] == 10
    para = paths["/v1/paraphrases"]["post"]
    assert "409" in para["responses"] and "422" in para["responses"] and para["x-requires-decoder"] is True


# --- batched decoding -----------------------------------------------------------------------------------------

# (n, beam_size) per request: identical settings, and different ones that make the same beam width (n=2 with
# the model's default beam 3, n=3 with beam 3), share a decoding call
CAPTION_SETTINGS = [(2, None), (3, 3), (2, None), (1, 1), (3, 5), (2, None), (1, 1), (3, 3)]
PARAPHRASE_SETTINGS = [(2, None), (3, None), (2, 4), (1, 1), (2, None), (3, None), (2, 4), (1, 1)]


def test_concurrent_requests_decode_in_shared_batches_and_match_alone(tiny_stt_model_path, tiny_stt_index_dir,
                                                                       gallery_paths, monkeypatch):
    calls = []
    real = service.engine.caption_embeddings

    def counting(model, embeddings, **kwargs):
        calls.append(embeddings.shape[0])
        return real(model, embeddings, **kwargs)

    monkeypatch.setattr(service.engine, "caption_embeddings", counting)
    images = [p.read_bytes() for p in gallery_paths]
    texts = (SENTENCES * 2)[:len(PARAPHRASE_SETTINGS)]

    def caption_request(c, data, n, beam):
        form = {"n": str(n)} | ({"beam_size": str(beam)} if beam else {})
        return c.post("/v1/captions", files={"image": ("x.png", data, "image/png")}, data=form)

    def paraphrase_request(c, text, n, beam):
        return c.post("/v1/paraphrases", json={"text": text, "n": n, "beam_size": beam})

    async def concurrent(c):
        caps = await asyncio.gather(*(caption_request(c, b, n, beam)
                                      for b, (n, beam) in zip(images, CAPTION_SETTINGS)))
        paras = await asyncio.gather(*(paraphrase_request(c, t, n, beam)
                                       for t, (n, beam) in zip(texts, PARAPHRASE_SETTINGS)))
        return [r.json() for r in caps], [r.json() for r in paras], (await c.get("/metrics")).text

    async def alone(c):
        caps = [(await caption_request(c, b, n, beam)).json() for b, (n, beam) in zip(images, CAPTION_SETTINGS)]
        paras = [(await paraphrase_request(c, t, n, beam)).json()
                 for t, (n, beam) in zip(texts, PARAPHRASE_SETTINGS)]
        return caps, paras, (await c.get("/metrics")).text

    # no warm-up: only the requests' own decoder calls are counted
    common = _settings(tiny_stt_model_path, tiny_stt_index_dir, warmup="off").model_dump()
    b_caps, b_paras, b_metrics = asyncio.run(serve_app(create_app(Settings(**{**common, "max_batch": 64,
                                                                             "max_wait_ms": 200})), concurrent))
    batched_calls, calls[:] = list(calls), []
    s_caps, s_paras, s_metrics = asyncio.run(serve_app(create_app(Settings(**{**common, "batching": False})), alone))

    for name, requests in (("caption", len(CAPTION_SETTINGS)), ("paraphrase", len(PARAPHRASE_SETTINGS))):
        count, total = batch_stats(b_metrics, name)
        assert total == requests and count < requests, (name, count, total)           # batches of several
        assert batch_stats(s_metrics, name) == (requests, requests)                  # one request per batch
    # one decoding call per distinct beam width of a batch, never one per request
    assert sum(batched_calls) == 16 and len(batched_calls) < 16 and max(batched_calls) > 1, batched_calls
    assert calls == [1] * 16

    for got, want, (n, _) in zip(b_caps + b_paras, s_caps + s_paras, CAPTION_SETTINGS + PARAPHRASE_SETTINGS):
        key = "captions" if "captions" in got else "paraphrases"
        g, w = got[key], want[key]
        assert len(g) == n and [x["text"] for x in g] == [x["text"] for x in w], (g, w)
        assert np.allclose([x["score"] for x in g], [x["score"] for x in w], atol=1e-5)


def test_malformed_requests_never_produce_a_500(client):
    """Seeded random bodies and content types against the decoder routes: a success or a JSON error."""
    rng = np.random.default_rng(1)
    png = _png()
    bodies = [b"", b"{}", b"null", b'{"text": null}', b'{"text": "ok", "n": 1e9}', b'{"text": "ok", "n": true}',
              b'{"text": "ok", "beam_size": "3"}', png, png[:20], bytes(rng.integers(0, 256, 300, np.uint8)),
              b"--b\r\nContent-Disposition: form-data; name=\"image\"; filename=\"x\"\r\n\r\n" + png[:40],
              b"--b\r\nContent-Disposition: form-data; name=\"n\"\r\n\r\n3\r\n--b--\r\n"]
    types = ["application/json", "multipart/form-data; boundary=b", "multipart/form-data", "image/png",
             "text/plain", ""]
    for _ in range(40):
        route = ["/v1/captions", "/v1/paraphrases"][rng.integers(2)]
        body, ctype = bodies[rng.integers(len(bodies))], types[rng.integers(len(types))]
        r = client.post(route, content=body, headers={"content-type": ctype} if ctype else {})
        assert r.status_code < 500, (route, ctype, body[:40], r.status_code, r.text)
        if r.status_code >= 400:
            assert isinstance(r.json()["detail"], str)
