"""What the service trusts: the Host names it answers (DNS rebinding), the origins that may read it (CORS, off by
default), how its images may be cached (private, no-store with a key, ETag and 304), the files it serves (never through a
symbolic link made after indexing), and index paths with URI characters (model files that may only hold tensors
and plain values: tests/test_model.py)."""
import json
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image, ImageDraw

from index.gallery import EmbedOptions, Gallery, add, build, sync
from server_process import wait_ready
from service.app import create_app
from service.cli import main as cli_main
from service.settings import Settings
from service.trust import FailureLimiter, host_name, origin_key
from training.models.checkpoint import load_model

def _client(model, index, host="127.0.0.1", **settings) -> TestClient:
    """A client of the app; ``allowed_hosts`` is "" (the default) unless given, whatever the environment says."""
    settings.setdefault("allowed_hosts", "")
    app = create_app(Settings(model=str(model), index=str(index), reload_interval_s=0, **settings))
    return TestClient(app, base_url=f"http://{host}")


@contextmanager
def _ready(client: TestClient):
    """The client, entered (the app's lifespan runs), once the app is ready."""
    with client as c:
        yield wait_ready(c)


def _photo(path: Path, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    image = Image.new("RGB", (40, 30), tuple(int(v) for v in rng.integers(0, 255, 3)))
    ImageDraw.Draw(image).rectangle((5, 5, 20 + seed % 10, 25), fill=tuple(int(v) for v in rng.integers(0, 255, 3)))
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, "JPEG")
    return path


# --- Host names -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value,name", [
    ("localhost", "localhost"), ("LocalHost:8000", "localhost"), ("127.0.0.1:1", "127.0.0.1"),
    ("[::1]", "[::1]"), ("[::1]:8000", "[::1]"), ("example.com.", "example.com"), ("photos.lan:443", "photos.lan"),
    ("", None), ("a b", None), ("[::1", None), ("[nope]:80", None), ("host:port", None), ("host:", None),
    ("::1", None), ("user@host", None), ("host:123456", None)])
def test_host_header_values_parse(value, name):
    assert host_name(value) == name


def test_an_unknown_host_is_refused_and_known_ones_pass(tiny_model_path, tiny_index_dir):
    with _ready(_client(tiny_model_path, tiny_index_dir)) as c:
        for route in ("/v1/folders", "/v1/images/0", "/", "/openapi.json", "/docs"):
            r = c.get(route, headers={"host": "evil.example"})
            assert r.status_code == 421, (route, r.status_code)
            assert "evil.example" in r.json()["detail"] and "JOINTSPACE_ALLOWED_HOSTS" in r.json()["detail"]
        r = c.post("/v1/search/images", json={"text": "a red circle"}, headers={"host": "evil.example:8000"})
        assert r.status_code == 421
        for host in ("localhost", "localhost:8000", "127.0.0.1", "127.0.0.1:49152", "[::1]", "[::1]:8000",
                     "LOCALHOST.:80"):
            assert c.get("/v1/folders", headers={"host": host}).status_code == 200, host
            assert c.post("/v1/search/images", json={"text": "a red circle"},
                          headers={"host": host}).status_code == 200, host
        for host in ("evil.example", "127.0.0.1.evil.example", "localhost.evil.example", "[::2]", "a b", "[::1"):
            assert c.get("/v1/folders", headers={"host": host}).status_code == 421, host
        # the operations routes answer any Host: probes and scrapers address a container by its own name or IP
        for route in ("/healthz", "/readyz", "/metrics"):
            assert c.get(route, headers={"host": "jointspace-replica-3:8000"}).status_code == 200, route


def test_the_bound_address_and_configured_names_are_served(tiny_model_path, tiny_index_dir):
    with _ready(_client(tiny_model_path, tiny_index_dir, allowed_hosts="photos.example, *.lan,fd00::7")) as c:
        for host, status in (("photos.example", 200), ("Photos.Example:443", 200), ("nas.lan", 200),
                             ("a.b.lan:8080", 200), ("lan", 421), ("evil.lan.example", 421), ("[fd00::7]:80", 200),
                             ("10.1.2.3", 421), ("localhost", 200), ("example", 421)):
            assert c.get("/v1/folders", headers={"host": host}).status_code == status, host
    app = create_app(Settings(model=str(tiny_model_path), index=str(tiny_index_dir), reload_interval_s=0,
                              host="10.1.2.3", allowed_hosts=""))
    with _ready(TestClient(app, base_url="http://10.1.2.3:8000")) as c:           # the bound address, any port
        assert c.get("/v1/folders").status_code == 200
        assert c.get("/v1/folders", headers={"host": "10.1.2.3:9"}).status_code == 200
        assert c.get("/v1/folders", headers={"host": "10.1.2.4"}).status_code == 421
    with _ready(_client(tiny_model_path, tiny_index_dir, allowed_hosts="*")) as c:
        assert c.get("/v1/folders", headers={"host": "anything.example"}).status_code == 200


def test_the_allowed_hosts_come_from_the_environment(tiny_model_path, tiny_index_dir, monkeypatch):
    monkeypatch.setenv("JOINTSPACE_ALLOWED_HOSTS", "jointspace,photos.example")
    app = create_app(Settings(model=str(tiny_model_path), index=str(tiny_index_dir), reload_interval_s=0))
    with _ready(TestClient(app, base_url="http://jointspace:8000")) as c:
        assert c.get("/v1/folders").status_code == 200
        assert c.get("/v1/folders", headers={"host": "photos.example"}).status_code == 200
        assert c.get("/v1/folders", headers={"host": "evil.example"}).status_code == 421


# --- CORS -------------------------------------------------------------------------------------------------------

def test_cors_is_off_by_default_and_on_for_configured_origins(tiny_model_path, tiny_index_dir):
    origin = {"origin": "https://evil.example"}
    preflight = {**origin, "access-control-request-method": "POST",
                 "access-control-request-headers": "content-type,x-api-key"}
    with _ready(_client(tiny_model_path, tiny_index_dir)) as c:
        r = c.post("/v1/search/images", json={"text": "a red circle"}, headers=origin)     # refused: a foreign post
        assert r.status_code == 403 and not any(h.startswith("access-control-") for h in r.headers)
        r = c.options("/v1/search/images", headers=preflight)
        assert r.status_code >= 400 and "access-control-allow-origin" not in r.headers
    with _ready(_client(tiny_model_path, tiny_index_dir, cors_origins="https://photos.example/")) as c:
        ok = {"origin": "https://photos.example"}
        r = c.options("/v1/search/images", headers={**preflight, **ok})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://photos.example"
        assert "x-api-key" in r.headers["access-control-allow-headers"].lower()
        r = c.post("/v1/search/images", json={"text": "a red circle"}, headers=ok)
        assert r.headers["access-control-allow-origin"] == "https://photos.example"
        assert "Origin" in r.headers["vary"]
        r = c.post("/v1/search/images", json={"text": "a red circle"}, headers=origin)
        assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
        assert c.options("/v1/search/images", headers=preflight).status_code == 400


# --- images: private, ETag, 304 ---------------------------------------------------------------------------------

def test_images_are_private_with_an_etag_and_304(tiny_model_path, tiny_index_dir):
    with _ready(_client(tiny_model_path, tiny_index_dir)) as c:
        file, thumb = c.get("/v1/images/0"), c.get("/v1/images/0?size=32")
        for r in (file, thumb):
            assert r.status_code == 200
            assert r.headers["cache-control"] == "private, no-cache"
            assert "public" not in r.headers["cache-control"]
            assert r.headers["cross-origin-resource-policy"] == "same-origin"
            assert r.headers["x-content-type-options"] == "nosniff"
            assert "vary" not in r.headers                          # no key: the answer depends on no header
        assert file.headers["etag"] != thumb.headers["etag"] != c.get("/v1/images/0?size=64").headers["etag"]
        assert c.get("/v1/images/1").headers["etag"] != file.headers["etag"]
        assert c.get("/v1/images/0").headers["etag"] == file.headers["etag"]                # stable
        for url, r in (("/v1/images/0", file), ("/v1/images/0?size=32", thumb)):
            etag = r.headers["etag"]
            for given in (etag, f"W/{etag}", f'"other", {etag}', "*"):
                again = c.get(url, headers={"if-none-match": given})
                assert again.status_code == 304 and again.content == b"", given
                assert again.headers["etag"] == etag and again.headers["cache-control"] == "private, no-cache"
            stale = c.get(url, headers={"if-none-match": '"0123456789abcdef"'})
            assert stale.status_code == 200 and stale.content == r.content


def test_with_an_api_key_images_are_not_stored_and_vary_on_the_key(tiny_model_path, tiny_index_dir):
    with _ready(_client(tiny_model_path, tiny_index_dir, api_key="s3cret")) as c:
        for headers in ({"X-API-Key": "s3cret"}, {"Authorization": "Bearer s3cret"}):
            for url in ("/v1/images/0", "/v1/images/0?size=32"):
                r = c.get(url, headers=headers)
                assert r.status_code == 200 and r.headers["cache-control"] == "private, no-store"
                assert {v.strip().lower() for v in r.headers["vary"].split(",")} >= {"x-api-key", "authorization"}
                assert c.get(url, headers={**headers, "if-none-match": r.headers["etag"]}).status_code == 304
                assert c.get(url, headers={"if-none-match": r.headers["etag"]}).status_code == 401


def test_a_rebuilt_index_reusing_an_id_changes_its_etag(tiny_model_path, tmp_path):
    photos = [_photo(tmp_path / "photos" / f"p{i}.jpg", i) for i in range(3)]
    model = load_model(tiny_model_path)
    build(tmp_path / "index", model, photos, embedding=EmbedOptions(progress=False, workers=0))
    with _ready(_client(tiny_model_path, tmp_path / "index")) as c:
        first = c.get("/v1/images/0")
        assert first.content == photos[0].read_bytes()
    build(tmp_path / "index", model, photos[::-1],
          embedding=EmbedOptions(progress=False, workers=0))      # id 0 is another photo now
    with _ready(_client(tiny_model_path, tmp_path / "index")) as c:
        now = c.get("/v1/images/0", headers={"if-none-match": first.headers["etag"]})
        assert now.status_code == 200 and now.content == photos[2].read_bytes()
        assert now.headers["etag"] != first.headers["etag"]
    add(tmp_path / "index", model, [_photo(tmp_path / "photos" / "p3.jpg", 3)],
        embedding=EmbedOptions(progress=False, workers=0))
    with _ready(_client(tiny_model_path, tmp_path / "index")) as c:                 # a new generation
        assert c.get("/v1/images/0").headers["etag"] != now.headers["etag"]


def test_a_gallery_file_replaced_by_a_link_is_not_served(tiny_model_path, tmp_path):
    photos = [_photo(tmp_path / "photos" / f"p{i}.jpg", i) for i in range(2)]
    secret = _photo(tmp_path / "elsewhere" / "secret.jpg", 7)
    build(tmp_path / "index", load_model(tiny_model_path), photos, embedding=EmbedOptions(progress=False, workers=0))
    photos[1].unlink()
    photos[1].symlink_to(secret)                                      # made after indexing
    with _ready(_client(tiny_model_path, tmp_path / "index")) as c:
        assert c.get("/v1/images/0").status_code == 200
        for url in ("/v1/images/1", "/v1/images/1?size=32"):
            r = c.get(url)
            assert r.status_code == 404 and "symbolic link" in r.json()["detail"], r.text
        r = c.post("/v1/search/images", json={"image_id": 1})
        assert r.status_code == 404


# --- index paths with URI characters -----------------------------------------------------------------------------

def test_an_index_and_photos_under_uri_characters_build_load_sync_and_serve(tiny_model_path, tmp_path):
    odd = tmp_path / "a#b%20c?d" / "x%y"
    photos = [_photo(odd / "ph#o?s" / f"p{i}%3F.jpg", i) for i in range(3)]
    index = odd / "in#dex?"
    assert cli_main(["index", "build", "--model", str(tiny_model_path), "--images", str(odd / "ph#o?s"),
                     "--out", str(index), "--quiet", "--workers", "0"]) == 0
    model = load_model(tiny_model_path)
    gallery = Gallery.load(index, model=model)
    assert sorted(Path(r.path) for r in gallery.meta.all_images()) == sorted(p.resolve() for p in photos)
    gallery.close()
    _photo(odd / "ph#o?s" / "new.jpg", 9)
    report = sync(index, model, odd / "ph#o?s", embedding=EmbedOptions(progress=False, workers=0))
    assert len(report.image_ids) == 1 and report.unchanged == 3
    with _ready(_client(tiny_model_path, index)) as c:
        hits = c.post("/v1/search/images", json={"text": "a red circle", "k": 4}).json()["results"]
        assert len(hits) == 4
        by_id = {r.id: Path(r.path) for r in Gallery.load(index).meta.all_images()}
        for hit in hits:
            assert c.get(hit["uri"]).content == by_id[hit["id"]].read_bytes()
        assert c.get(f"{hits[0]['uri']}?size=16").status_code == 200
        assert c.get("/v1/folders").json()["folders"] == [{"folder": ".", "images": 4}]


# --- cross-site posts -------------------------------------------------------------------------------------------

def test_a_post_from_a_foreign_origin_is_refused_before_its_body_is_read(tiny_model_path, tiny_index_dir):
    body = {"text": "a circle", "k": 1}
    with _ready(_client(tiny_model_path, tiny_index_dir)) as c:
        # same origin (the Host it was sent to, port and all), or no Origin (not a browser): served
        for headers in ({}, {"Origin": "http://127.0.0.1"}, {"Origin": "HTTP://127.0.0.1:80"}):
            assert c.post("/v1/search/images", json=body, headers=headers).status_code == 200, headers
        for origin in ("http://evil.example", "http://127.0.0.1:8001", "https://127.0.0.1:8443", "null",
                       "http://localhost"):
            r = c.post("/v1/search/images", json=body, headers={"Origin": origin})
            assert r.status_code == 403 and "cross-site request refused" in r.json()["detail"], origin
            r = c.post("/v1/search/captions", headers={"Origin": origin},
                       files={"image": ("a.jpg", b"\xff\xd8" + bytes(200_000), "image/jpeg")})
            assert r.status_code == 403, origin                  # a multipart upload too, its body never read
        # reading is not posting: a GET from anywhere is answered (CORS decides whether the page may read it)
        assert c.get("/v1/folders", headers={"Origin": "http://evil.example"}).status_code == 200
        two = c.post("/v1/search/images", json=body, headers=[("Origin", "http://127.0.0.1"),
                                                                ("Origin", "http://127.0.0.1")])
        assert two.status_code == 403
    configured = _client(tiny_model_path, tiny_index_dir, allowed_origins="https://photos.example",
                         cors_origins="http://app.example:3000")
    with _ready(configured) as c:
        for origin in ("https://photos.example", "https://photos.example:443", "http://app.example:3000"):
            assert c.post("/v1/search/images", json=body, headers={"Origin": origin}).status_code == 200, origin
        assert c.post("/v1/search/images", json=body, headers={"Origin": "https://evil.example"}).status_code == 403
    with _ready(_client(tiny_model_path, tiny_index_dir, allowed_origins="*")) as c:
        assert c.post("/v1/search/images", json=body, headers={"Origin": "null"}).status_code == 200


def test_origins_parse():
    assert origin_key("https://Photos.Example") == ("https", "photos.example", "443")
    assert origin_key("http://[::1]:8000") == ("http", "[::1]", "8000")
    assert origin_key("http://localhost:8000") == ("http", "localhost", "8000")
    for bad in ("null", "", "localhost:8000", "ftp://x", "http://x/path", "http://a b"):
        assert origin_key(bad) is None, bad


# --- API keys: one a request, guessing rate-limited -------------------------------------------------------------

def test_one_key_a_request_and_wrong_keys_are_rate_limited(tiny_model_path, tiny_index_dir):
    with _ready(_client(tiny_model_path, tiny_index_dir, api_key="s3cret", auth_failures_per_minute=3)) as c:
        two = [[("X-API-Key", "guess"), ("X-API-Key", "s3cret")],
               [("Authorization", "Bearer guess"), ("Authorization", "Bearer s3cret")]]
        for headers in two:                                   # never tried: 400 whatever the keys
            r = c.get("/v1/folders", headers=headers)
            assert r.status_code == 400 and "send one key" in r.json()["detail"]
        # both schemes: the X-API-Key header is the one key tried, the Bearer token is not
        assert c.get("/v1/folders", headers={"X-API-Key": "s3cret", "Authorization": "Bearer x"}).status_code == 200
        assert c.get("/v1/folders").status_code == 401        # no key: no guess, not counted
        r = c.get("/v1/folders", headers={"X-API-Key": "guess", "Authorization": "Bearer s3cret"})
        assert r.status_code == 401                            # one guess, counted
        for _ in range(2):
            assert c.get("/v1/folders", headers={"X-API-Key": "guess"}).status_code == 401
        for key in ("guess", "s3cret"):                       # the right key too: the answer must not tell
            r = c.get("/v1/folders", headers={"X-API-Key": key})
            assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1, r.text
        assert c.get("/healthz").status_code == 200           # the open routes stay open


def test_the_failure_limiter_refills_and_forgets():
    now = [0.0]
    limiter = FailureLimiter(6, addresses=2, clock=lambda: now[0])     # one token every 10 s
    for _ in range(6):
        assert limiter.wait("a") == 0
        limiter.failed("a")
    assert limiter.wait("a") == 10 and limiter.wait("b") == 0
    now[0] = 9.0
    assert limiter.wait("a") == 1
    now[0] = 10.0
    assert limiter.wait("a") == 0                          # one more guess after 10 s
    limiter.failed("a")
    assert limiter.wait("a") == 10
    limiter.failed("b")
    limiter.failed("c")                                    # three addresses, two remembered: "a" forgotten
    assert limiter.wait("a") == 0
    assert FailureLimiter(0).wait("a") == 0


def test_a_model_route_checks_its_key_once_and_parses_its_json_once(tiny_model_path, tiny_index_dir, monkeypatch):
    """The route class reads the key and the JSON body before FastAPI does (service/api/routing.py): the key is
    checked there only (the router's dependency states its schemes in the document without checking it) and the
    strictly parsed value is what FastAPI validates (Starlette's parser never runs)."""
    import types

    import starlette.requests

    import service.api.deps as deps

    keys: list[str | None] = []
    given = deps._given_key
    monkeypatch.setattr(deps, "_given_key", lambda request: keys.append(given(request)) or keys[-1])
    parsed: list[bytes] = []
    monkeypatch.setattr(starlette.requests, "json", types.SimpleNamespace(
        loads=lambda body: parsed.append(body) or json.loads(body)))
    with _ready(_client(tiny_model_path, tiny_index_dir, api_key="s3cret")) as c:
        r = c.post("/v1/search/images", json={"text": "a dog", "k": 2}, headers={"X-API-Key": "s3cret"})
        assert r.status_code == 200 and len(r.json()["results"]) == 2, r.text
        assert keys == ["s3cret"] and parsed == []
        keys.clear()
        assert c.get("/v1/folders", headers={"X-API-Key": "s3cret"}).status_code == 200   # the dependency alone
        assert keys == ["s3cret"]
        keys.clear()
        r = c.post("/v1/search/images", json={"text": "a dog"}, headers={"X-API-Key": "guess"})
        assert r.status_code == 401 and keys == ["guess"]
