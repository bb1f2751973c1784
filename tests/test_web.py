"""The web search page at ``GET /``, end to end: the real app served by uvicorn on a localhost port (a real tiny
model and a real FAISS index, from the session fixtures) and driven in a real headless Chromium — Debian's
``chromium`` package, driven by Playwright's Python package (its own browser download is not used).

``make test`` installs Chromium with apt-get when it is missing. Where it truly cannot be installed, only the
browser tests skip, with the reason in the summary; under CI (``CI`` set) they fail instead, because CI must run
them.
"""
import io
import shutil
import threading
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import numpy as np
import pytest
import uvicorn
from PIL import Image

from browser import CHROMIUM_FLAGS, chromium, require_browser
from conftest import STRONG_TEXT, WEAK_TEXT
from index.gallery import Gallery
from server_process import free_port
from service.app import create_app
from service.settings import Settings
from training.data.datasets import load_dataset

QUERY = "a red circle above a blue square"
TIMEOUT_MS = 20_000
DESKTOP, PHONE = {"width": 1280, "height": 900}, {"width": 390, "height": 844}


# --- the real app on a localhost port ---------------------------------------------------------------------------

class LiveServer:
    """``create_app(...)`` served by uvicorn on 127.0.0.1 in a background thread of this process."""

    def __init__(self, app):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name=f"uvicorn-{self.port}", daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.time() + 60
        while not self.server.started:
            assert self.thread.is_alive() and time.time() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=30)


def _settings(tiny_model_path, tiny_index_dir, **extra):
    return Settings(**{"model": str(tiny_model_path), "index": str(tiny_index_dir), "reload_interval_s": 0,
                       "max_k": 50, "max_upload_bytes": 200_000, **extra})


@pytest.fixture(scope="module")
def server(tiny_model_path, tiny_index_dir):
    with LiveServer(create_app(_settings(tiny_model_path, tiny_index_dir))) as live:
        yield live


# --- the browser ----------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    require_browser()
    from playwright.sync_api import sync_playwright

    profile = tmp_path_factory.mktemp("chromium-profile")           # a fresh user-data-dir
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(profile), executable_path=chromium(), headless=True, args=CHROMIUM_FLAGS,
            viewport={"width": 1100, "height": 820}, device_scale_factor=1, reduced_motion="reduce")
        context.set_default_timeout(TIMEOUT_MS)
        yield context
        context.close()


class Tab:
    """A new tab (its own sessionStorage) that records uncaught script errors and every URL it requested."""

    def __init__(self, context):
        self.page = context.new_page()
        self.script_errors, self.requests = [], []
        self.page.on("pageerror", lambda err: self.script_errors.append(str(err)))
        self.page.on("request", lambda req: self.requests.append(req.url))

    def open(self, url, path="/"):
        self.page.goto(url + path)
        return self.page


@pytest.fixture
def tab(browser):
    t = Tab(browser)
    yield t
    t.page.close()
    assert t.script_errors == [], t.script_errors


def _wait_ready(page):
    page.wait_for_function("() => document.getElementById('status').textContent.startsWith('Ready')")


def _wait_error(page, start):
    page.wait_for_function("start => document.getElementById('error').textContent.startsWith(start)", arg=start)


def _wait_heading(page, start):
    page.wait_for_function("start => document.querySelector('#results[aria-busy=false] h2')?.textContent"
                           ".startsWith(start)", arg=start)


def _images_loaded(page, selector):
    page.wait_for_function("""selector => {
        const imgs = [...document.querySelectorAll(selector)];
        return imgs.length > 0 && imgs.every((img) => img.complete && img.naturalWidth > 0);
    }""", arg=selector)


def _open_panel(page, panel):
    """Unfolds one of the panels under the search box (filters, similar, describe, paraphrase-form)."""
    if page.is_hidden(f"#{panel}"):
        page.click(f".tools [aria-controls='{panel}']")
    page.wait_for_selector(f"#{panel}", state="visible")


def _search(page, text, k=None):
    if k is not None:
        _open_panel(page, "filters")
        page.select_option("#k", str(k))
    page.fill("#query", text)
    page.press("#query", "Enter")


def _hits(page):
    page.wait_for_selector("#results[aria-busy=false] .hit")
    return page.eval_on_selector_all(".hit", "els => els.map(e => [Number(e.dataset.id), "
                                              "Number(e.querySelector('.score').textContent)])")


def _names(page):
    return page.eval_on_selector_all(".hit .name", "els => els.map(e => e.textContent)")


def _captions(page, selector):
    return page.eval_on_selector_all(f"{selector} li", "els => els.map(e => [e.querySelector('.caption').textContent, "
                                                       "Number(e.querySelector('.score').textContent)])")


def _query_of(page) -> dict:
    """The page's URL query string, parsed."""
    return {k: v[0] for k, v in parse_qs(urlsplit(page.url).query).items()}


def _api(server, path, **kwargs):
    r = httpx.post(server.url + path, timeout=30, **kwargs)
    assert r.status_code == 200, r.text
    return r.json()["results"]


def _screenshot(page, tmp_path, name):
    """A PNG of the page under the test's tmp dir (the published ones: tests/screenshots.py)."""
    path = tmp_path / name
    page.screenshot(path=str(path))
    return path


# --- the page without a browser ------------------------------------------------------------------------------------

def test_page_and_its_assets_are_served_by_the_app(server):
    page = httpx.get(server.url + "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "http" not in csp                 # nothing from another origin
    assert "http://" not in page.text and "https://" not in page.text
    for asset, media in (("app.js", "javascript"), ("api.js", "javascript"), ("style.css", "text/css"),
                         ("favicon.svg", "image/svg+xml")):
        r = httpx.get(f"{server.url}/static/{asset}")
        assert r.status_code == 200 and media in r.headers["content-type"], asset
        assert "https://" not in r.text.replace("http://www.w3.org/2000/svg", ""), asset
    assert httpx.get(server.url + "/static/nothing.js").status_code == 404
    ready = httpx.get(server.url + "/readyz").json()
    assert ready["decoder"] is False and ready["api_key_required"] is False and ready["max_k"] == 50
    assert ready["max_text_chars"] == 1000 and ready["photos"] == ready["images"] and ready["videos"] == 0
    assert "/" not in httpx.get(server.url + "/openapi.json").json()["paths"]


# --- in the browser --------------------------------------------------------------------------------------------------

def test_a_sentence_shows_the_ranked_gallery_images(server, tab, tmp_path, synth_small, tiny_index_dir):
    page = tab.open(server.url)
    _wait_ready(page)
    assert page.evaluate("document.activeElement.id") == "query"             # type at once, press Enter
    page.keyboard.type(QUERY)
    page.keyboard.press("Enter")
    hits = _hits(page)
    expected = _api(server, "/v1/search/images", json={"text": QUERY, "k": 10})           # the default k
    assert [i for i, _ in hits] == [x["id"] for x in expected]
    assert [s for _, s in hits] == pytest.approx([x["score"] for x in expected], abs=1e-3)
    assert page.inner_text("#results h2") == f"Top 10 photos for “{QUERY}”"
    assert page.eval_on_selector("#results", "e => [...e.childNodes].map(n => n.nodeName)") == ["H2", "UL", "NAV"]
    # each card names its file, as the API does and as the index holds it
    gallery = Gallery.load(tiny_index_dir)
    files = [Path(gallery.meta.image(x["id"]).path).name for x in expected]
    gallery.close()
    assert _names(page) == [x["name"] for x in expected] == files
    _images_loaded(page, ".hit img")
    assert all(src.endswith("?size=256") for src in page.eval_on_selector_all(".hit img", "els => els.map(e => e.src)"))
    assert page.is_hidden("#error") and page.is_hidden("#paraphrase-toggle")  # no decoder in this model
    ready = httpx.get(server.url + "/readyz").json()                       # words a user reads: no jargon
    assert page.inner_text("#status") == f"Ready: {ready['photos']} photos, {ready['captions']} captions"

    _search(page, QUERY, k=5)
    page.wait_for_function("() => document.querySelectorAll('.hit').length === 5")
    assert [i for i, _ in _hits(page)] == [x["id"] for x in expected[:5]]
    _images_loaded(page, ".hit img")
    shot = _screenshot(page, tmp_path, "search.png")
    assert Image.open(shot).size == (1100, 820)

    # keyboard: Enter on a result opens it larger with its nearest captions; Escape closes and returns focus
    first = page.locator(".hit").first
    first.focus()
    page.keyboard.press("Enter")
    page.wait_for_selector("#detail[open] #detail-captions[aria-busy=false] li .caption")
    image_id = expected[0]["id"]
    assert page.inner_text("#detail-title") == files[0]
    assert page.inner_text("#detail-position") == "1 of 5"
    shown = _captions(page, "#detail-captions")
    nearest = _api(server, "/v1/search/captions", json={"image_id": image_id, "k": 5})
    assert [c for c, _ in shown] == [x["caption"] for x in nearest]
    corpus = {c for r in load_dataset(synth_small).images for c in r.captions}
    assert all(c in corpus for c, _ in shown)
    _images_loaded(page, "#detail-image")
    assert page.get_attribute("#detail-image", "src").endswith("?size=640")
    _screenshot(page, tmp_path, "detail.png")
    page.keyboard.press("Escape")
    page.wait_for_selector("#detail", state="hidden")
    assert page.evaluate("document.activeElement.dataset.id") == str(image_id)

    # everything the page loaded came from the app itself: no CDN, no other origin
    assert tab.requests and all(url.startswith(server.url + "/") for url in tab.requests), tab.requests


def test_an_image_shows_its_ranked_captions(server, tab, tiny_index_dir, tmp_path):
    page = tab.open(server.url)
    _wait_ready(page)
    path = Path(Gallery.load(tiny_index_dir).meta.image(3).path)
    expected = _api(server, "/v1/search/captions", files={"image": (path.name, path.read_bytes())}, data={"k": "10"})

    page.set_input_files("#image-file", str(path))                          # "Choose an image"
    page.wait_for_selector("#results[aria-busy=false] .captions li")
    shown = _captions(page, "#results .captions")
    assert [c for c, _ in shown] == [x["caption"] for x in expected]
    assert [s for _, s in shown] == pytest.approx([x["score"] for x in expected], abs=1e-3)
    assert page.inner_text("#results h2") == f"Captions for {path.name}"
    _images_loaded(page, "#results img.preview")
    assert page.query_selector(".generated") is None                        # this model has no decoder
    _screenshot(page, tmp_path, "captions.png")

    # dropping a file on the drop zone does the same
    other = Path(Gallery.load(tiny_index_dir).meta.image(5).path)
    want = _api(server, "/v1/search/captions", files={"image": (other.name, other.read_bytes())}, data={"k": "5"})
    _open_panel(page, "filters")
    page.select_option("#k", "5")
    page.evaluate("""([bytes, name]) => {
        const transfer = new DataTransfer();
        transfer.items.add(new File([new Uint8Array(bytes)], name, {type: "image/png"}));
        document.getElementById("drop").dispatchEvent(new DragEvent("drop", {dataTransfer: transfer, bubbles: true}));
    }""", [list(other.read_bytes()), other.name])
    page.wait_for_function("name => document.querySelector('#results h2')?.textContent === `Captions for ${name}`",
                           arg=other.name)
    page.wait_for_selector("#results[aria-busy=false] .captions li")
    assert [c for c, _ in _captions(page, "#results .captions")] == [x["caption"] for x in want]


def test_errors_from_the_api_are_shown(server, tab, tmp_path):
    page = tab.open(server.url)
    _wait_ready(page)
    _search(page, QUERY)
    before = _hits(page)
    searches = len([u for u in tab.requests if u.endswith("/v1/search/images")])
    _search(page, "   ")                               # only spaces: said under the box, nothing sent, results kept
    page.wait_for_selector("#query-note:not([hidden])")
    assert page.inner_text("#query-note").startswith("Type a few words describing what to find, for example “")
    assert len([u for u in tab.requests if u.endswith("/v1/search/images")]) == searches
    assert _hits(page) == before and page.is_hidden("#error")

    not_an_image = tmp_path / "notes.png"
    not_an_image.write_text("these are words, not pixels")
    page.set_input_files("#image-file", str(not_an_image))
    _wait_error(page, "The upload is not an image this service reads (JPEG, PNG")
    assert "Error" not in page.inner_text("#error")
    assert page.get_attribute("#error", "role") == "alert"
    assert page.eval_on_selector("#results", "e => e.children.length") == 0
    assert page.get_attribute("#results", "aria-busy") == "false"

    big = io.BytesIO()
    Image.effect_noise((400, 400), 100).convert("RGB").save(big, "PNG")     # over max_upload_bytes: 413
    (tmp_path / "big.png").write_bytes(big.getvalue())
    page.set_input_files("#image-file", str(tmp_path / "big.png"))
    page.wait_for_function("() => document.getElementById('error').textContent.includes('larger than')")
    assert "Error" not in page.inner_text("#error")

    _search(page, QUERY)                                                    # the next good search clears it
    assert len(_hits(page)) == 10 and page.is_hidden("#error")


@pytest.mark.parametrize("data", [b"II*\x00" + bytes(range(256)) * 4, b"\xff\xd8\xff\xe0" + b"not a jpeg" * 50,
                                  b"these are words, not pixels"], ids=["tiff-header", "jpeg-header", "text"])
def test_an_undecodable_upload_is_a_sentence_not_an_exception(server, tab, tmp_path, data):
    """A file no decoder can read (one whose first bytes claim a format included): the API's 4xx detail and the
    page's message say it in words — no exception name, no "cannot identify image file <_io...>", no "Error 415"."""
    r = httpx.post(server.url + "/v1/search/images", files={"image": ("bad.jpg", data, "image/jpeg")}, timeout=30)
    assert r.status_code in (400, 415), r.text
    detail = r.json()["detail"]
    for raw in ("Error", "UnidentifiedImageError", "cannot identify", "_io.", "Traceback"):
        assert raw not in detail, detail
    page = tab.open(server.url)
    _wait_ready(page)
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(data)
    for panel, control in (("similar", "#similar-file"), ("describe", "#image-file")):
        _open_panel(page, panel)
        page.set_input_files(control, str(bad))
        page.wait_for_selector("#error:not([hidden])")
        shown = page.inner_text("#error")
        assert shown == detail[0].upper() + detail[1:] + ("" if detail.endswith((".", ")")) else "."), shown
        page.fill("#query", "")
        _search(page, QUERY)                                            # a good search clears it
        _hits(page)
        assert page.is_hidden("#error")


def test_the_page_asks_for_the_api_key_and_sends_it(tiny_model_path, tiny_index_dir, tab):
    with LiveServer(create_app(_settings(tiny_model_path, tiny_index_dir, api_key="s3cret"))) as live:
        page = tab.open(live.url)
        page.wait_for_selector("#key-form:not([hidden])")
        assert page.evaluate("document.activeElement.id") == "api-key"
        page.keyboard.type("wrong")
        with page.expect_response(lambda r: r.url.endswith("/v1/folders")) as folders:
            page.keyboard.press("Enter")                                    # the page tries the key at once
        assert folders.value.status == 401
        page.wait_for_selector("#key-form:not([hidden])")
        _search(page, QUERY)                                                # a search without a key is refused too
        page.wait_for_function("() => document.getElementById('error').textContent.includes('API key')")
        assert "Error 401" not in page.inner_text("#error")
        page.wait_for_selector("#key-form:not([hidden])")                   # asked again, with the API's reason
        assert "API key" in page.inner_text("#key-hint")
        assert page.evaluate("document.activeElement.id") == "query"        # without taking the typist's focus

        page.fill("#api-key", "s3cret")
        page.press("#api-key", "Enter")
        _search(page, QUERY)
        assert len(_hits(page)) == 10 and page.is_hidden("#error")
        _images_loaded(page, ".hit img")                                    # fetched with the key header
        assert all(src.startswith("blob:") for src in page.eval_on_selector_all(".hit img", "els => els.map(e => e.src)"))
        page.locator(".hit").first.click()
        page.wait_for_selector("#detail[open] #detail-captions[aria-busy=false] li .caption")
        _images_loaded(page, "#detail-image")
        # "Open original": a new tab cannot send the key, so the page fetches the file and opens it as a blob
        image_id = int(page.locator(".hit").first.get_attribute("data-id"))
        with page.expect_popup() as opened:
            page.click("#detail-original")
        original = opened.value
        original.wait_for_url(lambda url: url.startswith("blob:"), wait_until="commit")
        _images_loaded(original, "img")                                     # the browser shows the picture
        size = original.evaluate("() => [document.images[0].naturalWidth, document.images[0].naturalHeight]")
        assert tuple(size) == Image.open(Gallery.load(tiny_index_dir).meta.image(image_id).path).size
        original.close()


@pytest.fixture(scope="module")
def stt_server(tiny_stt_model_path, tiny_stt_index_dir):
    """The app serving a model with a sentence decoder (Show, Translate and Tell)."""
    with LiveServer(create_app(_settings(tiny_stt_model_path, tiny_stt_index_dir))) as live:
        yield live


def test_a_decoder_model_shows_generated_captions_and_paraphrases(stt_server, tiny_stt_index_dir, tab):
    """A model that carries a decoder turns the page's caption generation and paraphrase box on: the page shows
    the best caption of ``/v1/captions`` above the ranked ones, and the paraphrases of ``/v1/paraphrases``."""
    assert httpx.get(stt_server.url + "/readyz").json()["decoder"] is True
    page = tab.open(stt_server.url)
    _wait_ready(page)
    assert "caption generator on" in page.inner_text("#status")
    assert page.is_hidden("#paraphrase-form")                                # folded under its toggle
    _open_panel(page, "paraphrase-form")

    path = Path(Gallery.load(tiny_stt_index_dir).meta.image(0).path)
    generated = httpx.post(stt_server.url + "/v1/captions", files={"image": (path.name, path.read_bytes())}).json()
    page.set_input_files("#image-file", str(path))
    page.wait_for_selector("#results .generated:not(.loading)")
    assert page.inner_text("#results .generated") == f"Generated: {generated['captions'][0]['text']}"
    assert len(_captions(page, "#results .captions")) == 10                 # and the ranked captions
    assert page.is_hidden("#error")

    paraphrases = httpx.post(stt_server.url + "/v1/paraphrases", json={"text": QUERY, "n": 5}).json()["paraphrases"]
    page.fill("#paraphrase-text", QUERY)
    page.press("#paraphrase-text", "Enter")
    page.wait_for_selector("#results[aria-busy=false] ol.captions li")
    shown = page.eval_on_selector_all("#results ol.captions li", "els => els.map(e => e.textContent)")
    assert shown == [p["text"] for p in paraphrases] and len(shown) == 5
    assert page.is_hidden("#paraphrase-note") and page.is_hidden("#error")


def test_the_page_survives_a_501_from_the_decoder_routes(stt_server, tiny_stt_index_dir, tab):
    """A service that announces a decoder but answers 501 (say, an older version behind a proxy): the page says
    generation is not available instead of breaking, and stops offering it."""
    page = tab.open(stt_server.url)
    _wait_ready(page)
    refusal = {"status": 501, "content_type": "application/json",
               "body": '{"detail": "caption generation needs a model with a sentence decoder"}'}
    page.route("**/v1/captions", lambda route: route.fulfill(**refusal))
    page.route("**/v1/paraphrases", lambda route: route.fulfill(**refusal))

    path = Path(Gallery.load(tiny_stt_index_dir).meta.image(0).path)
    page.set_input_files("#image-file", str(path))
    page.wait_for_selector("#results .generated.note")
    assert page.inner_text("#results .generated").startswith("Caption generation is not available")
    assert "decoder" in page.inner_text("#results .generated")
    assert len(_captions(page, "#results .captions")) == 10             # the ranked captions still come
    assert page.is_hidden("#error")

    _open_panel(page, "paraphrase-form")
    page.fill("#paraphrase-text", "a red circle")
    page.press("#paraphrase-text", "Enter")
    page.wait_for_selector("#paraphrase-note:not([hidden])")
    assert page.inner_text("#paraphrase-note").startswith("Paraphrasing is not available")
    assert page.is_disabled("#paraphrase-text") and page.is_hidden("#error")

    page.set_input_files("#image-file", str(path))                     # generation is no longer offered
    page.wait_for_selector("#results[aria-busy=false] .captions li")
    assert page.query_selector(".generated") is None


def test_a_service_that_cannot_load_says_why(tiny_index_dir, tmp_path, tab):
    settings = Settings(model=str(tmp_path / "missing.pt"), index=str(tiny_index_dir), reload_interval_s=0)
    with LiveServer(create_app(settings)) as live:
        page = tab.open(live.url)
        page.wait_for_selector("#error:not([hidden])")
        assert "could not load" in page.inner_text("#status")
        error = page.inner_text("#error")
        assert error.startswith("Error 503:") and "missing.pt" in error, error
        assert page.is_disabled("#search-button")


# --- refining, paging and finding similar photos -------------------------------------------------------------------

TAKEN = "2021-05-{:02d} 10:00:00"


@pytest.fixture(scope="module")
def photo_server(tiny_model_path, synth_small, tmp_path_factory):
    """The synthetic test images as a photo folder: in trip/, trip/day2/ and home/, one taken (EXIF) a day from
    2021-05-01 — so the page's folder and date filters have something to filter."""
    from index.changes import BuildOptions
    from index.gallery import EmbedOptions, build
    from training.models.checkpoint import load_model

    data = load_dataset(synth_small)
    records = data.split("val").images + data.split("test").images
    root = tmp_path_factory.mktemp("web_photos")
    folders = ["trip", "trip/day2", "home"]
    paths = []
    for i, record in enumerate(records):
        exif = Image.Exif()
        exif.get_ifd(0x8769)[0x9003] = TAKEN.format(i + 1).replace("-", ":")
        path = root / "photos" / folders[i % 3] / f"p{i:02d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.open(record.path).convert("RGB").save(path, "JPEG", quality=95, exif=exif)
        paths.append(path)
    build(root / "gallery", load_model(tiny_model_path), paths, options=BuildOptions(image_root=root / "photos"),
          embedding=EmbedOptions(progress=False, workers=0))
    with LiveServer(create_app(_settings(tiny_model_path, root / "gallery"))) as live:
        live.photos = root / "photos"
        yield live


def _ids(results):
    return [x["id"] for x in results]


def test_threshold_filters_and_pages_on_the_page(photo_server, tab, tmp_path):
    server = photo_server
    page = tab.open(server.url)
    _wait_ready(page)
    _open_panel(page, "filters")
    page.wait_for_function("() => document.querySelectorAll('#folder option').length > 1")
    folders = page.eval_on_selector_all("#folder option", "els => els.map(e => e.value)")
    assert folders == ["", "home", "trip", "trip/day2"]
    assert page.get_attribute("#min-score", "min") == "-1" and page.get_attribute("#min-score", "max") == "1"

    # pages: Next shows the API's next page, Previous the first again
    _search(page, QUERY, k=5)
    first = _hits(page)
    assert [i for i, _ in first] == _ids(_api(server, "/v1/search/images", json={"text": QUERY, "k": 5}))
    assert page.is_disabled("#previous") and page.is_enabled("#next")
    page.click("#next")
    _wait_heading(page, "Photos 6–10 for")
    second = _hits(page)
    assert [i for i, _ in second] == _ids(_api(server, "/v1/search/images", json={"text": QUERY, "k": 5, "offset": 5}))
    page.click("#previous")
    _wait_heading(page, "Top 5 photos for")
    assert _hits(page) == first

    # a threshold hides the weak matches
    every = _api(server, "/v1/search/images", json={"text": QUERY, "k": 50})
    cut = round(every[6]["score"], 3)
    page.fill("#min-score", str(cut))
    _search(page, QUERY, k=50)
    page.wait_for_function("n => document.querySelectorAll('.hit').length === n",
                           arg=len([x for x in every if x["score"] >= cut]))
    assert [i for i, _ in _hits(page)] == _ids(_api(server, "/v1/search/images",
                                                     json={"text": QUERY, "k": 50, "min_score": cut}))
    assert page.is_disabled("#next")                                     # fewer than k: no next page
    assert page.inner_text("#filters-count") == "1"                      # the folded panel says a filter is on

    # folder and capture dates, and words to leave out
    page.fill("#min-score", "")
    page.select_option("#folder", "trip")
    page.fill("#taken-after", "2021-05-03")
    page.fill("#taken-before", "2021-05-12")
    page.fill("#subtract", "blue, square")
    want = _api(server, "/v1/search/images", json={"text": QUERY, "k": 10, "folder": "trip",
                                                   "taken_after": "2021-05-03", "taken_before": "2021-05-12",
                                                   "subtract": ["blue", "square"]})
    assert want and len(want) < 10
    _search(page, QUERY, k=10)
    _wait_heading(page, f"{len(want)} photos for")                       # all there are: not "Top"
    assert page.inner_text("#filters-count") == "4"
    assert [i for i, _ in _hits(page)] == _ids(want)
    dates = page.eval_on_selector_all(".hit .taken", "els => els.map(e => e.textContent)")
    assert dates == [f"taken {x['taken'][:10]}" for x in want]
    assert all("2021-05-03" <= d[6:] < "2021-05-12" for d in dates)
    _screenshot(page, tmp_path, "filtered.png")

    # a bad refinement: the API's 422 is shown in the page's words (the field by its label, no "Value error")
    page.fill("#taken-after", "")
    page.fill("#min-score", "5")
    _search(page, QUERY)
    _wait_error(page, "Min score: ")
    assert "Value error" not in page.inner_text("#error") and "Error 422" not in page.inner_text("#error")


def _drop(page, selector, data: bytes, name: str, media: str):
    page.evaluate("""([selector, bytes, name, media]) => {
        const transfer = new DataTransfer();
        transfer.items.add(new File([new Uint8Array(bytes)], name, {type: media}));
        document.querySelector(selector).dispatchEvent(new DragEvent("drop", {dataTransfer: transfer, bubbles: true}));
    }""", [selector, list(data), name, media])


def test_drop_a_photo_to_find_similar_gallery_images(photo_server, tab):
    import pillow_heif

    server = photo_server
    page = tab.open(server.url)
    _wait_ready(page)
    photo = sorted((server.photos / "home").glob("*.jpg"))[1]
    data = photo.read_bytes()
    files = {"image": (photo.name, data, "image/jpeg")}
    want = _api(server, "/v1/search/images", files=files, data={"k": "10"})
    _drop(page, "#similar-drop", data, photo.name, "image/jpeg")
    page.wait_for_function("name => document.querySelector('#results h2')?.textContent === "
                           "`Top 10 photos like ${name}`", arg=photo.name)
    hits = _hits(page)
    assert [i for i, _ in hits] == _ids(want) and hits[0][1] == pytest.approx(1.0, abs=2e-3)   # itself first
    page.click("#next")
    _wait_heading(page, "Photos 11–20 like")
    assert [i for i, _ in _hits(page)] == _ids(_api(server, "/v1/search/images", files=files,
                                                     data={"k": "10", "offset": "10"}))
    # a HEIC photo from a phone, with the folder filter, chosen with the file picker
    pillow_heif.register_heif_opener()
    heic = io.BytesIO()
    Image.open(photo).save(heic, "HEIF")
    want = _api(server, "/v1/search/images", files={"image": ("p.heic", heic.getvalue(), "image/heic")},
                data={"k": "10", "folder": "home"})
    _open_panel(page, "filters")
    page.select_option("#folder", "home")
    page.set_input_files("#similar-file", files=[{"name": "phone.heic", "mimeType": "image/heic",
                                                   "buffer": heic.getvalue()}])
    page.wait_for_function("() => document.querySelector('#results h2')?.textContent.endsWith('like phone.heic')")
    assert [i for i, _ in _hits(page)] == _ids(want) and len(want) == 8
    # not a photo: the API's 415 is shown
    _drop(page, "#similar-drop", b"just words", "notes.txt", "text/plain")
    _wait_error(page, "The upload is not an image this service reads")


def test_a_photo_search_clears_the_words_and_a_gallery_photo_gets_a_shareable_url(photo_server, tab):
    """A photo as the query: the old words leave the box and the URL. A photo that is in the gallery becomes "more
    like" that item (?like=ID), so a reload repeats the search; any other photo leaves no stale `q=` behind."""
    server = photo_server
    page = tab.open(server.url, "/?q=" + QUERY.replace(" ", "%20"))
    _hits(page)
    photo = sorted((server.photos / "trip").glob("*.jpg"))[0]
    data = photo.read_bytes()
    want = _api(server, "/v1/search/images", files={"image": (photo.name, data, "image/jpeg")}, data={"k": "10"})
    item = want[0]
    assert item["name"] == photo.name
    _drop(page, "#similar-drop", data, photo.name, "image/jpeg")
    _wait_heading(page, f"Top 10 photos like {photo.name}")
    assert page.input_value("#query") == ""
    page.wait_for_function("() => !location.search.includes('q=')")
    assert _query_of(page) == {"like": str(item["id"])}
    assert [i for i, _ in _hits(page)] == _ids(want)
    page.reload()                                                       # the URL repeats it
    _wait_heading(page, f"Top 10 photos like {photo.name}")
    assert [i for i, _ in _hits(page)] == _ids(_api(server, "/v1/search/images",
                                                     json={"image_id": item["id"], "k": 10}))

    # a photo the gallery does not hold: no URL can carry it, and none keeps the old words
    _search(page, QUERY)
    _wait_heading(page, "Top 10 photos for")
    assert "q" in _query_of(page)
    noise = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(noise, "PNG")
    first = _api(server, "/v1/search/images", files={"image": ("noise.png", noise.getvalue(), "image/png")},
                 data={"k": "10"})[0]
    assert first["score"] < 0.99                                        # not a gallery picture
    _drop(page, "#similar-drop", noise.getvalue(), "noise.png", "image/png")
    _wait_heading(page, "Top 10 photos like noise.png")
    assert page.input_value("#query") == "" and _query_of(page) == {}


def test_the_start_page_shows_the_newest_photos_and_searches_to_try(photo_server, server, tab):
    """Before a search: the library's newest photos (capture time, newest first; each finds photos like it) and a
    few example searches that run when clicked — from the index's captions when it has them."""
    page = tab.open(photo_server.url)
    _wait_ready(page)
    page.wait_for_selector("#results[aria-busy=false] .recent-grid .recent")
    shown = page.eval_on_selector_all(".recent", "els => els.map(e => Number(e.dataset.id))")
    newest = _api(photo_server, "/v1/search/images", json={"text": "a photo", "k": 12, "sort": "newest",
                                                           "media": "photo", "min_score": -1})
    assert shown == _ids(newest) and len(shown) == 12
    taken = [x["taken"] for x in newest]
    assert taken == sorted(taken, reverse=True)                         # newest first
    _images_loaded(page, ".recent img")
    examples = page.eval_on_selector_all(".example", "els => els.map(e => e.textContent)")
    assert 1 <= len(examples) <= 4
    page.click(".example >> nth=0")
    _wait_heading(page, f"Top 10 photos for “{examples[0]}”")
    assert _query_of(page) == {"q": examples[0]} and page.input_value("#query") == examples[0]
    page.go_back()                                                      # Back: the start page again
    page.wait_for_selector("#results[aria-busy=false] .recent")
    page.click(".recent >> nth=1")                                      # a photo: more like it, in the URL
    _wait_heading(page, f"Top 10 photos like {newest[1]['name']}")
    assert _query_of(page) == {"like": str(newest[1]["id"])}

    # an index with a caption corpus: its examples are the captions nearest the newest photos
    page.goto(server.url)
    page.wait_for_selector("#results[aria-busy=false] .example")
    examples = page.eval_on_selector_all(".example", "els => els.map(e => e.textContent)")
    recent = page.eval_on_selector_all(".recent", "els => els.map(e => Number(e.dataset.id))")
    nearest = [_api(server, "/v1/search/captions", json={"image_id": i, "k": 1})[0]["caption"] for i in recent[:4]]
    assert examples == list(dict.fromkeys(nearest))


# --- video moments ----------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def video_server(tiny_model_path, synth_small, tmp_path_factory):
    """Photos and two WebM clips (VP9: Chromium plays it without proprietary codecs), moments of 2 s."""
    from index.changes import BuildOptions
    from index.gallery import EmbedOptions, build
    from index.moments import Sampling
    from index.video_writer import write_video
    from training.models.checkpoint import load_model

    folder = tmp_path_factory.mktemp("video_gallery")
    for src in sorted((synth_small / "images").glob("*.jpg"))[:4]:
        shutil.copy(src, folder / src.name)
    clips = []
    for n, colour in enumerate([(215, 35, 35), (40, 80, 220)]):
        frames = []
        for i in range(24):                                   # 6 s at 4 fps: a square moving right
            a = np.full((64, 64, 3), 200, np.uint8)
            a[24:40, 2 * i:2 * i + 16] = colour
            frames.append(a)
        clips.append(write_video(folder / f"clip{n}.webm", frames, fps=4))
    index = folder.parent / "video_index"
    build(index, load_model(tiny_model_path), sorted(folder.glob("*.jpg")), video_paths=clips,
          options=BuildOptions(image_root=folder),
          embedding=EmbedOptions(progress=False, workers=0, sampling=Sampling(window=2.0)))
    with LiveServer(create_app(_settings(tiny_model_path, index))) as live:
        yield live


def test_a_video_moment_shows_as_a_frame_with_its_time_span_and_plays_from_its_start(video_server, tab):
    page = tab.open(video_server.url)
    _wait_ready(page)
    ready = httpx.get(video_server.url + "/readyz").json()            # photos, videos and moments, counted apart
    assert (ready["photos"], ready["videos"], ready["moments"]) == (4, 2, 6) and ready["images"] == 10
    assert page.inner_text("#status") == f"Ready: 4 photos, 2 videos (6 moments), {ready['captions']} captions"
    want = _api(video_server, "/v1/search/images", json={"text": "a red square", "k": 10})
    moments = [x for x in want if x["media"] == "video"]
    later = next(x for x in moments if x["start"] > 0)
    _search(page, "a red square")
    assert [i for i, _ in _hits(page)] == [x["id"] for x in want]
    # a page of both says so: results, and how many of each
    assert page.inner_text("#results h2") == "10 results for “a red square”"
    assert page.inner_text("#results .breakdown") == "4 photos, 6 video moments"
    assert _names(page) == [x["name"] for x in want] and {x["name"] for x in moments} == {"clip0.webm", "clip1.webm"}
    _images_loaded(page, ".hit img")                                  # the moments' frames, as JPEG thumbnails
    spans = page.eval_on_selector_all(".hit.video .moment", "els => els.map(e => e.textContent)")
    assert spans == [f"▶ 0:{int(m['start']):02d}–0:{int(m['end']):02d}" for m in moments]
    page.click(f".hit[data-id='{later['id']}']")
    page.wait_for_selector("#detail[open] #detail-video:not([hidden])")
    assert page.is_hidden("#detail-image")
    start = later["start"]
    assert page.inner_text("#detail-title") == f"{later['name']}, 0:{int(start):02d}–0:{int(later['end']):02d}"
    # "Open original" is the video itself, from the moment's start
    assert page.get_attribute("#detail-original", "href") == f"v1/videos/{later['video_id']}#t={start:g}"
    src = page.get_attribute("#detail-video", "src")
    assert src == f"v1/videos/{later['video_id']}#t={start:g}"
    # the browser fetched the file (range requests) and stands at the moment's start
    page.wait_for_function("t => { const v = document.getElementById('detail-video'); "
                           "return v.readyState >= 1 && Math.abs(v.currentTime - t) < 1.0; }", arg=start)
    page.keyboard.press("Escape")
    page.wait_for_selector("#detail", state="hidden")
    # the dialog's "close" event (which stops the video) is a task queued after the dialog hides: wait for it
    page.wait_for_function("() => document.getElementById('detail-video').paused")
    _open_panel(page, "filters")
    for media, noun in (("video", "video moments"), ("photo", "photos")):   # "Show": one media type only
        only = _api(video_server, "/v1/search/images", json={"text": "a red square", "k": 10, "media": media})
        assert only and {x["media"] for x in only} == {media}
        page.select_option("#media", media)
        _search(page, "a red square")
        assert [i for i, _ in _hits(page)] == [x["id"] for x in only]
        assert page.inner_text("#results h2") == f"{len(only)} {noun} for “a red square”"
        assert page.is_hidden("#results .breakdown")


# --- the URL holds the search: a shared link, reload, Back -------------------------------------------------------------

def test_a_shared_link_opens_with_its_search_and_back_and_reload_keep_it(photo_server, tab):
    server = photo_server
    page = tab.open(server.url, "/?q=a%20red%20circle")
    want = _api(server, "/v1/search/images", json={"text": "a red circle", "k": 10})
    assert [i for i, _ in _hits(page)] == _ids(want)
    assert page.input_value("#query") == "a red circle"
    assert page.inner_text("#results h2") == "Top 10 photos for “a red circle”"

    # a search from the box goes into the URL, with its filters and its page
    _open_panel(page, "filters")
    page.select_option("#folder", "trip")
    page.fill("#taken-after", "2021-05-02")
    _search(page, QUERY, k=5)
    _wait_heading(page, "Top 5 photos for")
    page.click("#next")
    _wait_heading(page, "Photos 6–10 for")
    assert _query_of(page) == {"q": QUERY, "folder": "trip", "after": "2021-05-02", "k": "5", "page": "2"}
    assert "q=a%20red%20circle%20above" in page.url                             # spaces as %20, as typed in a link
    second = _ids(_api(server, "/v1/search/images", json={"text": QUERY, "k": 5, "offset": 5, "folder": "trip",
                                                           "taken_after": "2021-05-02"}))
    assert [i for i, _ in _hits(page)] == second

    # reload: the same page of the same search, the filters set as they were
    page.reload()
    _wait_heading(page, "Photos 6–10 for")
    assert [i for i, _ in _hits(page)] == second and page.input_value("#query") == QUERY
    assert (page.input_value("#folder"), page.input_value("#taken-after"), page.input_value("#k")) == \
        ("trip", "2021-05-02", "5")
    assert page.inner_text("#filters-count") == "2"

    # Back: its first page, then the shared link's search (its filters with it); Forward: the search again
    page.go_back()
    _wait_heading(page, "Top 5 photos for")
    page.go_back()
    _wait_heading(page, "Top 10 photos for “a red circle”")
    assert [i for i, _ in _hits(page)] == _ids(want) and page.input_value("#query") == "a red circle"
    assert page.inner_text("#filters-count") == ""
    page.go_forward()
    _wait_heading(page, "Top 5 photos for")
    assert _query_of(page)["folder"] == "trip"

    # a page past the end says so and leads back
    page.goto(server.url + f"/?q={QUERY}&page=30")
    _wait_heading(page, "No more photos for")
    assert page.is_enabled("#previous") and page.is_disabled("#next")


def test_the_open_result_is_in_the_url(photo_server, tab):
    server = photo_server
    page = tab.open(server.url, f"/?q={QUERY}")
    hits = _hits(page)
    want = _api(server, "/v1/search/images", json={"text": QUERY, "k": 10})
    page.locator(".hit").nth(2).click()
    page.wait_for_selector("#detail[open]")
    assert _query_of(page) == {"q": QUERY, "open": str(hits[2][0])}
    page.go_back()                                                      # Back closes it, the results stay
    page.wait_for_selector("#detail", state="hidden")
    assert _query_of(page) == {"q": QUERY} and _hits(page) == hits
    page.go_forward()                                                   # Forward opens it again
    page.wait_for_selector("#detail[open]")
    assert page.inner_text("#detail-title") == want[2]["name"]
    page.reload()                                                       # and so does a reload
    page.wait_for_selector("#detail[open]")
    page.wait_for_function("name => document.querySelector('#detail-title').textContent === name", arg=want[2]["name"])
    page.keyboard.press("Escape")
    page.wait_for_selector("#detail", state="hidden")
    page.wait_for_function("() => !location.search.includes('open=')")
    assert _query_of(page) == {"q": QUERY}


def test_results_are_a_few_tabs_away_and_arrow_keys_step_through_them(photo_server, tab):
    server = photo_server
    page = tab.open(server.url)
    _wait_ready(page)
    page.keyboard.type(QUERY)
    page.keyboard.press("Enter")
    hits = _hits(page)
    names = [x["name"] for x in _api(server, "/v1/search/images", json={"text": QUERY, "k": 10})]
    tabs = 0
    while not page.evaluate("document.activeElement.classList.contains('hit')"):
        page.keyboard.press("Tab")
        tabs += 1
        assert tabs <= 5, page.evaluate("document.activeElement.outerHTML")
    assert page.evaluate("document.activeElement.dataset.id") == str(hits[0][0])
    page.keyboard.press("Enter")
    page.wait_for_selector("#detail[open]")
    assert page.inner_text("#detail-title") == names[0] and page.is_disabled("#detail-previous")

    def at(i):
        page.wait_for_function("name => document.getElementById('detail-title').textContent === name", arg=names[i])
        assert _query_of(page)["open"] == str(hits[i][0]) and page.inner_text("#detail-position") == f"{i + 1} of 10"

    page.keyboard.press("ArrowRight")
    at(1)
    page.keyboard.press("ArrowRight")
    at(2)
    page.keyboard.press("ArrowLeft")
    at(1)
    page.click("#detail-next")
    at(2)
    for _ in range(9):
        page.keyboard.press("ArrowRight")
    at(9)                                                               # the last result of the page: it stays
    assert page.is_disabled("#detail-next")
    page.keyboard.press("Escape")                                       # focus goes back to the card shown last
    # (the dialog's "close" event, which moves the focus and the URL, is a task queued after the dialog hides)
    page.wait_for_function("id => document.activeElement.dataset.id === id", arg=str(hits[9][0]))
    page.wait_for_function("() => !location.search.includes('open=')")
    assert _query_of(page) == {"q": QUERY}
    page.go_back()                                                      # the detail view was one history entry
    page.wait_for_function("() => !location.search")


def test_the_detail_view_opens_the_original_and_finds_more_like_it(photo_server, tab):
    server = photo_server
    page = tab.open(server.url, f"/?q={QUERY}")
    _hits(page)
    item = _api(server, "/v1/search/images", json={"text": QUERY, "k": 10})[1]
    page.locator(".hit").nth(1).click()
    page.wait_for_selector("#detail[open]")
    assert page.inner_text("#detail-title") == item["name"]
    facts = page.inner_text("#detail-facts")
    assert f"in {item['folder']}" in facts and f"taken {item['taken'][:10]}" in facts

    # open original: the file itself, in a new tab
    assert page.get_attribute("#detail-original", "href") == f"v1/images/{item['id']}"
    with page.expect_popup() as opened:
        page.click("#detail-original")
    original = opened.value
    original.wait_for_load_state()
    assert original.url == f"{server.url}/v1/images/{item['id']}"
    assert httpx.get(original.url).content == (server.photos / item["folder"] / item["name"]).read_bytes()
    original.close()

    # more like this: the gallery item is the query (itself first)
    like = _api(server, "/v1/search/images", json={"image_id": item["id"], "k": 10})
    page.click("#detail-like")
    _wait_heading(page, f"Top 10 photos like {item['name']}")
    assert page.is_hidden("#detail") and page.input_value("#query") == ""
    assert [i for i, _ in _hits(page)] == _ids(like) and like[0]["id"] == item["id"]
    assert _query_of(page) == {"like": str(item["id"])}
    page.reload()                                                       # the URL holds it: it names the item
    _wait_heading(page, f"Top 10 photos like {item['name']}")
    page.go_back()                                                      # Back: the sentence's results
    _wait_heading(page, f"Top 10 photos for “{QUERY}”")
    assert _query_of(page) == {"q": QUERY}


def test_next_knows_the_last_page(tiny_model_path, tiny_index_dir, tab):
    """A page as long as what is left is the last one: Next is off without an empty page to show it, asked as k + 1
    results or, when k is the service's largest, with one probe past the page."""
    gallery = Gallery.load(tiny_index_dir)
    n = gallery.images.ntotal
    gallery.close()
    half = n // 2
    assert n == 2 * half
    for max_k in (50, half):
        with LiveServer(create_app(_settings(tiny_model_path, tiny_index_dir, max_k=max_k))) as live:
            page = tab.open(live.url, f"/?q={QUERY}&k={half}")
            assert len(_hits(page)) == half and page.is_enabled("#next")
            page.click("#next")
            _wait_heading(page, f"Photos {half + 1}–{n} for")
            assert len(_hits(page)) == half and page.is_disabled("#next")


def test_a_search_without_a_strong_match_says_so_on_its_first_page(tiny_model_path, relevance_index_dir, tab):
    """Relevance on the page (index/relevance.py), over the index of conftest.py made for it: the first page of a
    search without a strong match says so above its results, its next page does not, and a search with one marks
    that card instead."""
    with LiveServer(create_app(_settings(tiny_model_path, relevance_index_dir))) as live:
        page = tab.open(live.url)
        _wait_ready(page)
        _search(page, WEAK_TEXT, k=5)
        _wait_heading(page, "Top 5 photos for")
        assert page.inner_text("#results .no-strong") == f"No strong match for “{WEAK_TEXT}”. These are the closest."
        assert page.eval_on_selector("#results", "e => [...e.childNodes].map(n => n.nodeName)") == ["H2", "P", "UL",
                                                                                                     "NAV"]
        assert page.locator(".hit.strong").count() == 0
        page.click("#next")
        _wait_heading(page, "Photos 6–10 for")
        assert page.locator("#results .no-strong").count() == 0
        _search(page, STRONG_TEXT)
        _wait_heading(page, f"Top 5 photos for “{STRONG_TEXT}”")
        assert page.locator("#results .no-strong").count() == 0
        assert page.eval_on_selector_all(".hit.strong", "els => els.map(e => e.dataset.id)") == ["0"]
        assert page.inner_text(".hit.strong .strong") == "strong match"
        assert page.get_attribute(".hit.strong", "aria-label").endswith(", strong match: show it larger")


# --- phone and desktop, light and dark; the search box's limits -------------------------------------------------------

def _first_result_in_view(page):
    page.wait_for_function("""() => {
        const box = document.querySelector('#results[aria-busy=false] .hit')?.getBoundingClientRect();
        return box && box.top >= 0 && box.left >= 0 && box.bottom <= innerHeight && box.right <= innerWidth;
    }""")


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["desktop", "phone"])
def test_the_first_result_is_in_view_right_after_a_search(server, tab, viewport):
    tab.page.set_viewport_size(viewport)
    page = tab.open(server.url)
    _wait_ready(page)
    _search(page, QUERY)
    _first_result_in_view(page)
    assert page.evaluate("scrollY") == 0                     # no move needed: the results sit under the box
    assert page.evaluate("document.documentElement.scrollWidth") <= viewport["width"]   # nothing wider than it
    # with the filters open (taller than a phone's screen) the page moves down to the results
    _open_panel(page, "filters")
    _search(page, "a blue square")
    _first_result_in_view(page)


def _luminance(css: str) -> float:
    r, g, b = (int(v) / 255 for v in css[css.index("(") + 1:css.index(")")].split(",")[:3])
    lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in (r, g, b)]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def test_dark_mode_follows_the_system(server, tab):
    page = tab.open(server.url)
    _wait_ready(page)
    _search(page, QUERY)
    _hits(page)
    colours = {}
    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        colours[scheme] = page.evaluate("""() => [document.documentElement, document.querySelector('.hit'),
                                                   document.getElementById('query')]
                                                  .map(e => [getComputedStyle(e).color, getComputedStyle(e).backgroundColor])""")
    assert _luminance(colours["dark"][0][1]) < 0.05 < 0.8 < _luminance(colours["light"][0][1])
    for scheme, pairs in colours.items():                    # text readable on its background (WCAG AA: 4.5)
        for fg, bg in pairs:
            hi, lo = sorted((_luminance(fg), _luminance(bg)), reverse=True)
            assert (hi + 0.05) / (lo + 0.05) >= 4.5, (scheme, fg, bg)


def test_the_search_box_takes_what_the_api_takes(server, tab):
    page = tab.open(server.url)
    _wait_ready(page)
    limit = httpx.get(server.url + "/readyz").json()["max_text_chars"]
    assert page.get_attribute("#query", "maxlength") == str(limit)
    long = (QUERY + " ") * 100                                         # 3,300 characters, pasted
    page.focus("#query")
    page.keyboard.insert_text(long)
    assert page.input_value("#query") == long[:limit]
    assert page.inner_text("#query-note") == f"The search box takes up to {limit:,} characters."
    page.keyboard.press("Enter")
    assert len(_hits(page)) == 10 and page.is_hidden("#error")
    # a link with a longer query: searched as far as the box goes, and said
    page.goto(server.url + "/?q=" + long.replace(" ", "%20"))
    assert len(_hits(page)) == 10 and page.is_hidden("#error")
    assert page.input_value("#query") == long[:limit]
    assert "the rest was left out" in page.inner_text("#query-note")


def test_words_only_finds_a_file_name_and_the_cards_show_the_words(photo_server, tab):
    """The filter panel's Match: Words only sends mode keyword (kept in the URL), and each card shows the words
    of the search it matched (here in its file name)."""
    page = tab.open(photo_server.url)
    _wait_ready(page)
    _open_panel(page, "filters")
    page.select_option("#mode", "keyword")
    _search(page, "p07")
    want = _api(photo_server, "/v1/search/images", json={"text": "p07", "k": 10, "mode": "keyword"})
    assert [i for i, _ in _hits(page)] == _ids(want) and _names(page)[0] == "p07.jpg"
    assert page.eval_on_selector_all(".hit .matched", "els => els.map(e => e.textContent)")[0] == "words: p, 07"
    assert _query_of(page)["match"] == "keyword"


def test_an_index_without_captions_offers_none(photo_server, server, tab):
    """A gallery indexed without a caption corpus (a user's own photos): the page does not offer "Captions for an
    image", and a result opened larger shows no "Nearest captions" (no "No captions in the corpus." either) and
    asks the API for none. With a corpus both are there."""
    page = tab.open(photo_server.url)
    _wait_ready(page)
    assert httpx.get(photo_server.url + "/readyz").json()["captions"] == 0
    assert page.is_hidden("#captions-toggle")
    _search(page, "p07")
    page.wait_for_function("() => document.querySelectorAll('.hit').length > 0")
    page.locator(".hit").first.focus()
    page.keyboard.press("Enter")
    page.wait_for_selector("#detail[open]")
    page.wait_for_function("() => document.getElementById('detail-title').textContent.length > 0")
    assert page.is_hidden("#detail-captions") and page.is_hidden("#detail-captions-title")
    assert "No captions in the corpus" not in page.inner_text("#detail")
    assert not any("/v1/search/captions" in url for url in tab.requests)
    page.keyboard.press("Escape")
    other = Tab(tab.page.context)
    try:
        page = other.open(server.url)
        _wait_ready(page)
        assert page.is_visible("#captions-toggle")
    finally:
        other.page.close()


def test_clear_filters_runs_the_search_again_without_them(server, tab):
    """A search shown under `media=video` (none in this gallery: no results): "Clear filters" empties the controls
    and runs the search again without them — the photos come back and `media` leaves the URL."""
    page = tab.open(server.url, "/?q=" + QUERY.replace(" ", "%20") + "&media=video")
    _wait_ready(page)
    _wait_heading(page, "No")                           # nothing under that filter here
    assert page.eval_on_selector_all(".hit", "els => els.length") == 0 and _query_of(page)["media"] == "video"
    _open_panel(page, "filters")
    page.click("#clear-filters")
    page.wait_for_function("() => document.querySelectorAll('.hit').length > 0")
    assert page.input_value("#media") == "" and "media" not in _query_of(page)
    assert _query_of(page)["q"] == QUERY
    want = _api(server, "/v1/search/images", json={"text": QUERY, "k": 10})
    assert [i for i, _ in _hits(page)] == _ids(want)
