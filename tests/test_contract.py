"""The HTTP contract, checked by a peer's fuzzer: schemathesis (pinned in the dev extra) generates requests from
the service's own /openapi.json — valid ones, which must be accepted, and schema-violating ones, which must be
refused — against a real ``jointspace serve`` process, with every check on (server errors, status codes, content
types, response schemas and headers, negative data rejection, positive data acceptance, unsupported methods,
authentication). Three runs, each over every operation: a retrieval-only model without an API key (the decoder
routes answer 409), and a model with a sentence decoder with an API key set, both with deploy/schemathesis_hooks.py
(real images of every declared type as uploads); and schemathesis as it ships, no hooks, with
deploy/schemathesis.toml (its one setting: the upload operations' 415 for bytes that are no image is not a refusal
of valid data). Fixed seed, bounded examples.

Plus direct checks of what the document states (limits from the settings, security only with a key, the routes
that need a decoder, the error responses) and of the 409."""
import io
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from server_process import poll_readyz, spawn, wait_ready
from service.app import create_app
from service.settings import Settings

REPO = Path(__file__).resolve().parents[1]
HOOKS = REPO / "deploy" / "schemathesis_hooks.py"
CONFIG = REPO / "deploy" / "schemathesis.toml"
SCHEMATHESIS = Path(sys.executable).parent / "schemathesis"
SEED, MAX_EXAMPLES = 0, 30


def _with_a_video(model: Path, index: Path, out: Path) -> Path:
    """A copy of ``index`` with one short clip added (video id 0)."""
    import shutil

    import numpy as np

    from index.gallery import EmbedOptions, add
    from index.video_writer import write_video
    from training.models.checkpoint import load_model

    shutil.copytree(index, out)
    clip = write_video(out.parent / "clip.mp4", (np.full((32, 32, 3), 20 * i, np.uint8) for i in range(8)), fps=4)
    add(out, load_model(model), video_paths=[clip], embedding=EmbedOptions(progress=False, workers=0))
    return out


def _serve(model: Path, index: Path, env: dict) -> tuple[subprocess.Popen, str]:
    proc, port = spawn(["--model", str(model), "--index", str(index), "--log-level", "warning"],
                       env={"JOINTSPACE_RELOAD_INTERVAL_S": "0", **env}, timeout=90, capture=True)
    return proc, f"http://127.0.0.1:{port}"


@pytest.mark.parametrize("variant", ["retrieval model, no API key", "decoder model, API key",
                                     "retrieval model, no API key, no hooks"],
                         ids=["hooks_retrieval_open", "hooks_decoder_keyed", "no_hooks_retrieval_open"])
def test_schemathesis_finds_no_contract_breach(variant, tiny_model_path, tiny_index_dir, tiny_stt_model_path,
                                               tiny_stt_index_dir, tmp_path):
    if not SCHEMATHESIS.exists():
        pytest.fail(f"schemathesis is not installed in {sys.executable}'s environment: it is a pinned dev "
                    f"dependency (pip install -c constraints.txt -e '.[cpu,dev]', or make install)")
    key = "s3cret-key" if "API key" in variant and "no API key" not in variant else None
    model, index = ((tiny_stt_model_path, tiny_stt_index_dir) if "decoder" in variant
                    else (tiny_model_path, tiny_index_dir))
    index = _with_a_video(model, index, tmp_path / "index")     # the video routes have a video to find
    # the fuzzer's authentication checks send wrong keys on purpose: not counted against its address here
    proc, url = _serve(model, index, {"JOINTSPACE_API_KEY": key or "", "JOINTSPACE_AUTH_FAILURES_PER_MINUTE": "0"})
    try:
        doc = httpx.get(f"{url}/openapi.json").json()
        assert ("securitySchemes" in doc.get("components", {})) == (key is not None)
        cmd = [str(SCHEMATHESIS), "run", f"{url}/openapi.json", "--checks", "all", "--max-examples",
               str(MAX_EXAMPLES), "--seed", str(SEED), "--workers", "1", "--generation-database", "none",
               "--no-color", "--request-timeout", "30"]
        if key:
            cmd += ["-H", f"X-API-Key: {key}"]
        env = {k: v for k, v in os.environ.items() if k != "SCHEMATHESIS_HOOKS"}
        if "no hooks" in variant:       # schemathesis as it ships, every check on: only deploy/schemathesis.toml
            cmd[1:1] = ["--config-file", str(CONFIG)]
        else:                           # real images of every declared type (deploy/schemathesis_hooks.py)
            env["SCHEMATHESIS_HOOKS"] = str(HOOKS)
        result = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert re.search(r"Tested: 15\b", out), out                      # every operation of the document
    counts = re.search(r"(\d+) generated, (\d+) passed", out)
    assert counts and int(counts.group(1)) == int(counts.group(2)) >= 300, out
    for phase in ("Examples", "Coverage", "Fuzzing", "Stateful"):
        assert re.search(rf"✅\s+{phase}", out), (phase, out)
    assert "Warnings:" not in out, out                                # e.g. an operation that answered only 401


# --- what the document states -----------------------------------------------------------------------------------

def _doc(tiny_model_path, tiny_index_dir, **settings):
    app = create_app(Settings(model=str(tiny_model_path), index=str(tiny_index_dir), reload_interval_s=0,
                              **settings))
    with TestClient(app) as c:
        return c.get("/openapi.json").json()


def test_the_document_states_the_configured_limits(tiny_model_path, tiny_index_dir):
    doc = _doc(tiny_model_path, tiny_index_dir, max_k=7, max_text_chars=40, max_thumbnail=300)
    schemas = doc["components"]["schemas"]
    text = schemas["TextSearch"]["properties"]
    assert text["k"]["maximum"] == 7 and text["k"]["minimum"] == 1
    assert text["text"]["maxLength"] == 40 and text["text"]["minLength"] == 1 and text["text"]["pattern"]
    assert schemas["TextSearch"]["additionalProperties"] is False and schemas["TextSearch"]["required"] == ["text"]
    assert schemas["Paraphrase"]["properties"]["n"]["maximum"] == 10
    assert schemas["ImageIdCompose"]["properties"]["add"]["maxItems"] == 16
    paths = doc["paths"]
    form = paths["/v1/search/images"]["post"]["requestBody"]["content"]["multipart/form-data"]
    assert form["schema"]["additionalProperties"] is False and form["schema"]["required"] == ["image"]
    assert form["schema"]["properties"]["k"]["maximum"] == 7
    assert form["schema"]["properties"]["add"]["maxLength"] == 40
    assert form["encoding"]["image"]["contentType"].split(", ") == ["image/jpeg", "image/png", "image/gif",
                                                                     "image/webp", "image/bmp", "image/tiff",
                                                                     "image/heic", "image/heif", "image/avif"]
    size = next(p for p in paths["/v1/images/{image_id}"]["get"]["parameters"] if p["name"] == "size")
    assert {k: size["schema"][k] for k in ("type", "minimum", "maximum")} == {"type": "integer", "minimum": 16,
                                                                           "maximum": 300}
    # every error response has the one error body; a 503 says when to retry
    for path, ops in paths.items():
        for method, op in ops.items():
            for code, response in op["responses"].items():
                if code.startswith(("4", "5")) and path.startswith("/v1/"):
                    ref = response["content"]["application/json"]["schema"]["$ref"]
                    assert ref.endswith("/Error"), (path, code)
                    if code == "503":
                        assert response["headers"]["Retry-After"]["required"] is True
    for path in ("/v1/search/images", "/v1/search/captions", "/v1/captions", "/v1/paraphrases"):
        assert {"400", "413", "415", "422", "503"} <= set(paths[path]["post"]["responses"]), path
    # the routes that need a decoder say so, with their 409
    decoder = {p for p, ops in paths.items() for op in ops.values() if op.get("x-requires-decoder")}
    assert decoder == {"/v1/captions", "/v1/paraphrases"}
    assert all("409" in paths[p]["post"]["responses"] for p in decoder)


def test_term_and_generation_limits_are_settings_for_json_and_form_alike(tiny_model_path, tiny_index_dir):
    """JOINTSPACE_MAX_TERMS and JOINTSPACE_MAX_GENERATED bound the JSON bodies and the forms, and the document
    states them: the same model validates both."""
    settings = Settings(model=str(tiny_model_path), index=str(tiny_index_dir), reload_interval_s=0, max_terms=2,
                        max_generated=3)
    with TestClient(create_app(settings)) as c:
        wait_ready(c)
        doc = c.get("/openapi.json").json()
        schemas, paths = doc["components"]["schemas"], doc["paths"]
        assert schemas["ImageIdCompose"]["properties"]["add"]["maxItems"] == 2
        assert schemas["TextSearch"]["properties"]["subtract"]["maxItems"] == 2
        assert schemas["Paraphrase"]["properties"]["n"]["maximum"] == 3
        form = paths["/v1/search/images"]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]
        assert form["properties"]["add"]["pattern"].endswith("{0,1}$")
        captions = paths["/v1/captions"]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]
        assert captions["properties"]["n"]["maximum"] == 3 and captions["properties"]["beam_size"]["maximum"] == 3
        image = {"image": ("a.png", _png(), "image/png")}
        assert c.post("/v1/search/images", files=image, data={"add": "red, blue"}).status_code == 200
        assert c.post("/v1/search/images", json={"image_id": 0, "add": ["red", "blue"]}).status_code == 200
        for r in (c.post("/v1/search/images", files=image, data={"add": "red, blue, green"}),
                  c.post("/v1/search/images", json={"image_id": 0, "add": ["red", "blue", "green"]}),
                  c.post("/v1/search/images", json={"text": "a", "subtract": ["red", "blue", "green"]})):
            assert r.status_code == 422 and "at most 2" in r.json()["detail"], r.text
            assert [e["loc"][:2] for e in r.json()["errors"]] in (
                [["body", "add"]], [["body", "subtract"]]), r.json()


def test_a_request_model_validates_only_with_the_apps_limits():
    """The request classes name the fields; only the per-app models (limits bound from the settings) validate, so
    nothing can validate with a model that has no limits."""
    from service.schemas import TextSearch, request_models

    with pytest.raises(TypeError, match="bound model"):
        TextSearch.model_validate({"text": "a", "k": "5"})
    bound = request_models(Settings(max_k=3)).text_search
    assert issubclass(bound, TextSearch) and bound.model_validate({"text": "a", "k": 3.0}).k == 3
    for body in ({"text": "a", "k": 4}, {"text": "a", "k": "3"}):
        with pytest.raises(ValueError):
            bound.model_validate(body)


def test_security_is_declared_only_when_a_key_is_set(tiny_model_path, tiny_index_dir):
    open_doc = _doc(tiny_model_path, tiny_index_dir)
    assert "securitySchemes" not in open_doc["components"]
    assert not any("security" in op or "401" in op["responses"]
                   for ops in open_doc["paths"].values() for op in ops.values())
    keyed = _doc(tiny_model_path, tiny_index_dir, api_key="k")
    assert set(keyed["components"]["securitySchemes"]) == {"APIKeyHeader", "HTTPBearer"}
    for path, ops in keyed["paths"].items():
        for op in ops.values():
            if path.startswith("/v1/"):
                assert op["security"] == [{"APIKeyHeader": []}, {"HTTPBearer": []}] and "401" in op["responses"]
            else:                                                       # /healthz, /readyz, /metrics stay open
                assert "security" not in op


def _png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (20, 20), "red").save(buf, "PNG")
    return buf.getvalue()


_PILLOW_FORMAT = {"image/jpeg": "JPEG", "image/png": "PNG", "image/gif": "GIF", "image/webp": "WEBP",
                  "image/bmp": "BMP", "image/tiff": "TIFF", "image/heic": "HEIF", "image/heif": "HEIF",
                  "image/avif": "AVIF"}
# what a fuzzer sends as a file part besides images: a PDF, a ZIP archive, bytes of no format
_NOT_IMAGES = {"pdf": b"%PDF-1.4\n1 0 obj\n<</Type/Catalog>>\nendobj\ntrailer\n<</Root 1 0 R>>\n%%EOF\n",
               "zip": b"PK\x05\x06" + b"\x00" * 18, "random": bytes(range(7, 200, 3))}


def test_the_image_part_accepts_every_media_type_it_declares_and_no_other_bytes(tiny_model_path, tiny_index_dir):
    """Every operation with a multipart form declares its image part's media types (``encoding.contentType``):
    a file of each of them is answered (200) whatever the part's label, and bytes that are no image — labelled as
    one of those types — are the declared 415 with the error body (the searches; /v1/captions needs a decoder)."""
    from training.data.preprocess import register_heif

    register_heif()                                   # Pillow writes HEIF (HEVC-coded, brand heic) through it
    app = create_app(Settings(model=str(tiny_model_path), index=str(tiny_index_dir), reload_interval_s=0))
    with TestClient(app) as c:
        wait_ready(c)
        doc = c.get("/openapi.json").json()
        forms = {path: op["requestBody"]["content"]["multipart/form-data"] for path, ops in doc["paths"].items()
                 for op in ops.values() if "multipart/form-data" in op.get("requestBody", {}).get("content", {})}
        assert set(forms) == {"/v1/search/images", "/v1/search/captions", "/v1/captions"}
        for path, form in forms.items():
            declared = form["encoding"]["image"]["contentType"].split(", ")
            assert declared == list(_PILLOW_FORMAT), path
            image = form["schema"]["properties"]["image"]
            assert image["type"] == "string" and image["format"] == "binary" and image["minLength"] == 1
            response = doc["paths"][path]["post"]["responses"]["415"]
            assert response["content"]["application/json"]["schema"]["$ref"].endswith("/Error"), path
            if doc["paths"][path]["post"].get("x-requires-decoder"):
                continue                                  # 409 with this retrieval-only model (the next test)
            for media_type in declared:
                buf = io.BytesIO()
                Image.new("RGB", (24, 16), "teal").save(buf, _PILLOW_FORMAT[media_type])
                r = c.post(path, files={"image": ("upload", buf.getvalue(), media_type)})
                assert r.status_code == 200 and r.json()["results"], (path, media_type, r.text)
            r = c.post(path, files={"image": ("upload.jpg", _png(), "image/jpeg")})     # the content decides
            assert r.status_code == 200, (path, r.text)
            for name, data in _NOT_IMAGES.items():
                for media_type in ("image/png", "image/avif"):
                    r = c.post(path, files={"image": (f"upload.{name}", data, media_type)})
                    assert r.status_code == 415 and r.json()["detail"], (path, name, media_type, r.text)


def test_decoder_routes_answer_409_with_the_reason(tiny_model_path, tiny_index_dir):
    app = create_app(Settings(model=str(tiny_model_path), index=str(tiny_index_dir), reload_interval_s=0))
    with TestClient(app) as c:
        wait_ready(c)
        for r in (c.post("/v1/captions", files={"image": ("a.png", _png(), "image/png")}),
                  c.post("/v1/paraphrases", json={"text": "a red circle"})):
            assert r.status_code == 409, r.text
            assert "sentence decoder" in r.json()["detail"] and "configs/stt.yaml" in r.json()["detail"]


@pytest.mark.parametrize("body,status", [
    ({"text": "a", "surprise": 1}, 422),                     # unknown field
    ({"text": "a", "k": "5"}, 422),                          # a string is not a JSON integer
    ({"text": "a", "k": True}, 422),                         # nor is a boolean
    ({"text": "a", "k": 5.0}, 200),                          # 5.0 is one
    ({"text": "a", "k": 5.5}, 422),
    ({"text": "a", "k": 10 ** 400}, 422),                    # huge numbers
    ({"text": "a", "k": 1e308}, 422),
    ({"text": "\u2003\u3000\ufeff\x1c"}, 422),              # whitespace by any engine's definition is blank
    ({"text": "\x00"}, 200),                                 # a NUL is a character like any other
])
def test_json_bodies_are_read_as_the_schema_says(tiny_model_path, tiny_index_dir, body, status):
    app = create_app(Settings(model=str(tiny_model_path), index=str(tiny_index_dir), reload_interval_s=0))
    with TestClient(app) as c:
        wait_ready(c)
        r = c.post("/v1/search/images", content=json.dumps(body), headers={"content-type": "application/json"})
        assert r.status_code == status, r.text


def test_unpaired_surrogates_and_bad_multipart_parts_are_4xx(tiny_model_path, tiny_index_dir):
    app = create_app(Settings(model=str(tiny_model_path), index=str(tiny_index_dir), reload_interval_s=0))
    with TestClient(app) as c:
        wait_ready(c)
        r = c.post("/v1/search/images", content=b'{"text": "a \\ud800 b"}', headers={"content-type": "application/json"})
        assert r.status_code == 422 and "unicode" in r.json()["detail"], r.text
        r = c.post("/v1/search/images", content=b'{"image_id": 0, "add": ["\\udfff"]}',
                   headers={"content-type": "application/json"})
        assert r.status_code == 422, r.text
        png = _png()
        for files, data, status, message in [
            ({"image": ("a.png", b"", "image/png")}, {}, 400, "empty"),                       # empty file part
            ({"image": ("a.png", png, "image/png")}, {"k": ""}, 422, "k"),                   # empty text part
            ({"image": ("a.png", png, "image/png")}, {"add": ""}, 422, "empty"),
            ({"image": ("a.png", png, "image/png")}, {"mystery": "1"}, 422, "unknown form field"),
            ({"image": ("a.png", png, "image/png")}, {"k": ["2", "3"]}, 422, "once"),
            ({"image": ("a.png", png, "image/png")}, {"k": "99999999999999999999999"}, 422, "k"),
            ({"image": ("a.png", png, "image/png"), "k": ("k.txt", b"5", "text/plain")}, {}, 400, "files"),
        ]:
            r = c.post("/v1/search/images", files=files, data=data)
            assert r.status_code == status and message in r.json()["detail"], (files.keys(), data, r.text)


# --- the document is FastAPI's, from the routes' declarations; what needs no body is answered before it is read ---

def test_the_document_is_generated_from_the_routes_declarations(tiny_model_path, tiny_index_dir):
    """No ``openapi()`` of the app's own: FastAPI writes the document from the routes — a model route's JSON body is
    its endpoint's declared ``body`` parameter (the bound models, in ``components``), ``?size=`` is the declared
    query parameter with the app's limit. The one thing a route adds, as ``openapi_extra``, is its multipart form:
    FastAPI states one media type per operation, and the form is generated from the same bound model."""
    from fastapi import FastAPI
    from fastapi.routing import APIRoute, iter_route_contexts

    from service.api.routing import ServedTable
    from service.contract import MAX_ID

    settings = Settings(model=str(tiny_model_path), index=str(tiny_index_dir), reload_interval_s=0, max_k=9,
                        max_thumbnail=200)
    app = create_app(settings)
    assert type(app).openapi is FastAPI.openapi
    doc = app.openapi()
    table: ServedTable = app.state.operations
    routes = {c.path: c.original_route for c in iter_route_contexts(app.routes)
              if isinstance(c.original_route, APIRoute)}
    for route in table.routes:
        declared = routes[route.path]
        extra = declared.openapi_extra or {}
        assert set(extra) <= {"requestBody", "x-requires-decoder"}, route.path
        assert set(extra.get("requestBody", {}).get("content", {})) <= {"multipart/form-data"}, route.path
        content = doc["paths"][route.path]["post"]["requestBody"]["content"]
        if route.json:
            body = declared.body_field
            assert body is not None and body.field_info.media_type == "application/json"
            assert {b["$ref"].rsplit("/", 1)[1] for b in content["application/json"]["schema"].get(
                "oneOf", [content["application/json"]["schema"]])} == {
                    table.models[route.path, op.name].__name__ for op in route.json}
        else:
            assert declared.body_field is None and "application/json" not in content
        assert ("multipart/form-data" in content) == (route.form is not None)
    assert doc["components"]["schemas"]["TextSearch"]["properties"]["k"]["maximum"] == 9
    # FastAPI writes a schema's bounds as floats: the largest id is one a float holds exactly
    image_id = doc["components"]["schemas"]["ImageIdSearch"]["properties"]["image_id"]
    assert image_id["maximum"] == MAX_ID and float(MAX_ID) == MAX_ID
    assert all(r.openapi_extra is None for path, r in routes.items() if path not in {t.path for t in table.routes})
    for path in ("/v1/images/{image_id}", "/v1/videos/{video_id}/frame"):
        size = next(p for p in doc["paths"][path]["get"]["parameters"] if p["name"] == "size")
        assert size["schema"]["maximum"] == 200 and routes[path].openapi_extra is None


def test_what_needs_no_body_is_answered_before_the_body_is_read(tiny_model_path, tiny_index_dir, monkeypatch):
    """A model route answers what it can know without the body — not ready (503), a missing or wrong API key
    (401), a decoder the model lacks (409), a content type it does not take (415) — before anything reads the
    body: neither FastAPI (``Request.body``/``Request.form``) nor the service's own reader is called, so a
    malformed or huge body changes nothing about the answer. A request that passes is read (and answered)."""
    from starlette.requests import Request

    reads: list[str] = []
    body, form = Request.body, Request.form

    async def spied_body(self):
        reads.append("body")
        return await body(self)

    def spied_form(self, **kwargs):
        reads.append("form")
        return form(self, **kwargs)

    monkeypatch.setattr(Request, "body", spied_body)
    monkeypatch.setattr(Request, "form", spied_form)
    junk = {"content": b"{not json" + b"9" * 5000, "headers": {"content-type": "application/json"}}
    upload = {"files": {"image": ("a.png", b"\x89PNG" + b"\x00" * 50_000, "image/png")}, "data": {"k": "oops"}}

    def answered(client, status, path, **kwargs):
        reads.clear()
        r = client.post(path, **kwargs)
        assert r.status_code == status and (status == 200 or r.json()["detail"]), r.text
        return list(reads)

    broken = create_app(Settings(model=str(tiny_model_path.parent / "missing.pt"), index=str(tiny_index_dir),
                                 reload_interval_s=0))
    with TestClient(broken) as c:
        poll_readyz(c, lambda answer: answer.json()["status"].startswith("error"), timeout=30)
        for kwargs in (junk, upload):
            assert answered(c, 503, "/v1/search/images", **kwargs) == []
    keyed = create_app(Settings(model=str(tiny_model_path), index=str(tiny_index_dir), reload_interval_s=0,
                                api_key="s3cret", auth_failures_per_minute=0))
    with TestClient(keyed) as c:
        wait_ready(c)
        for path in ("/v1/search/images", "/v1/search/captions", "/v1/paraphrases", "/v1/captions"):
            for kwargs in (junk, upload):
                assert answered(c, 401, path, **kwargs) == [], path
                assert answered(c, 401, path, headers={**kwargs.get("headers", {}), "x-api-key": "wrong"},
                                **{k: v for k, v in kwargs.items() if k != "headers"}) == [], path
        key = {"x-api-key": "s3cret"}
        for path in ("/v1/captions", "/v1/paraphrases"):                 # this model has no decoder
            assert answered(c, 409, path, content=junk["content"], headers={**junk["headers"], **key}) == []
            assert answered(c, 409, path, headers=key, **upload) == []
        assert answered(c, 415, "/v1/search/images", content=b"<x/>" * 10_000,
                        headers={"content-type": "application/xml", **key}) == []
        assert answered(c, 415, "/v1/search/captions", content=b"0" * 100_000,
                        headers={"content-type": "text/plain", **key}) == []
        # past those, the body is read: by the service's strict JSON reader, then by FastAPI for the declared body
        assert answered(c, 422, "/v1/search/images", content=junk["content"],
                        headers={**junk["headers"], **key}) == ["body"]
        assert set(answered(c, 200, "/v1/search/images", json={"text": "a red circle"}, headers=key)) == {"body"}
        assert answered(c, 422, "/v1/search/images", headers=key, **upload) == ["form"]
