"""The routes that serve gallery files (``/v1/images/{id}``, ``/v1/videos/{id}`` and its frames), over a small
index of photos and videos: strong validators, 304 and ``If-Range``; byte ranges as RFC 9110 reads them (an
invalid range ignored, one past the end 416 with the JSON body, 5,000-digit positions without integer-limit text);
``HEAD``; ids read strictly; files that became unreadable or hostile after indexing answered 4xx without a server
path; frames and thumbnails under the media admission; ``/docs`` from the app's own files with a CSP."""
from __future__ import annotations

import asyncio
import io
import re
import time

import httpx
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from conftest import serve_app
from hostile_media import png, video
from server_process import wait_ready
from index.gallery import EmbedOptions, Gallery, build
from service.app import create_app
from service.apidocs import CSP
from service.settings import Settings
from training.models.checkpoint import load_model


def _jpeg(size, colour) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, "JPEG", quality=90)
    return out.getvalue()


@pytest.fixture(scope="module")
def gallery(tiny_model_path, tmp_path_factory):
    """An index of three photos and two videos (one 2560 × 1440: a heavy frame), and the rows: ``(index, photos,
    moments, videos)``, by file name."""
    folder = tmp_path_factory.mktemp("media-routes") / "gallery"
    folder.mkdir()
    for name, size, colour in (("red.jpg", (64, 48), "red"), ("blue.jpg", (64, 48), "blue"),
                               ("victim.jpg", (64, 48), "green")):
        (folder / name).write_bytes(_jpeg(size, colour))
    clips = [video(folder / "clip.mp4"), video(folder / "victim.mp4"),
             video(folder / "large.mp4", size=(2560, 1440), frames=2, options={"preset": "ultrafast"})]
    index = folder.parent / "index"
    build(index, load_model(tiny_model_path), sorted(folder.glob("*.jpg")), video_paths=clips,
          embedding=EmbedOptions(progress=False, workers=0))
    g = Gallery.load(index)
    rows = g.meta.all_images()
    photos = {r.path.rsplit("/", 1)[-1]: r for r in rows if r.video_id is None}
    videos = {v.path.rsplit("/", 1)[-1]: v for v in g.meta.all_videos()}
    moments = {name: next(r for r in rows if r.video_id == v.id) for name, v in videos.items()}
    g.close()
    return index, photos, moments, videos


def _settings(model, index, **extra) -> Settings:
    return Settings(model=str(model), index=str(index), reload_interval_s=0, **extra)


@pytest.fixture(scope="module")
def client(tiny_model_path, gallery):
    with TestClient(create_app(_settings(tiny_model_path, gallery[0]))) as c:
        yield wait_ready(c)


# --- validators and conditional requests ------------------------------------------------------------------------

def test_videos_and_frames_have_strong_validators_and_answer_304(client, gallery):
    _, photos, moments, videos = gallery
    clip = videos["clip.mp4"]
    for url in (f"/v1/videos/{clip.id}", f"/v1/videos/{clip.id}/frame?t=0.5",
                f"/v1/videos/{clip.id}/frame?t=0.5&size=32", f"/v1/images/{moments['clip.mp4'].id}",
                f"/v1/images/{photos['red.jpg'].id}", f"/v1/images/{photos['red.jpg'].id}?size=32"):
        r = client.get(url)
        assert r.status_code == 200, (url, r.text)
        etag, modified = r.headers["etag"], r.headers["last-modified"]
        assert re.fullmatch(r'"[0-9a-f]{32}"', etag) and modified.endswith("GMT")
        for headers in ({"If-None-Match": etag}, {"If-None-Match": f'"other", W/{etag}'}, {"If-None-Match": "*"},
                        {"If-Modified-Since": modified}):
            again = client.get(url, headers=headers)
            assert again.status_code == 304 and again.content == b"" and again.headers["etag"] == etag, (url, headers)
        for headers in ({"If-None-Match": '"other"'}, {"If-Modified-Since": "Thu, 01 Jan 1970 00:00:00 GMT"},
                        {"If-None-Match": '"other"', "If-Modified-Since": modified}):     # the tag decides
            assert client.get(url, headers=headers).status_code == 200, (url, headers)
    tags = {client.get(f"/v1/videos/{clip.id}/frame", params={"t": t}).headers["etag"] for t in (0.0, 0.5, 1.0)}
    assert len(tags) == 3                                       # each frame its own version


def test_if_range_lets_a_range_through_only_for_the_current_version(client, gallery):
    clip = gallery[3]["clip.mp4"]
    url = f"/v1/videos/{clip.id}"
    whole = client.get(url)
    etag, modified = whole.headers["etag"], whole.headers["last-modified"]
    for if_range, status in ((etag, 206), (modified, 206), ('"stale"', 200), (f"W/{etag}", 200),
                             ("Thu, 01 Jan 1970 00:00:00 GMT", 200)):
        r = client.get(url, headers={"Range": "bytes=0-9", "If-Range": if_range})
        assert r.status_code == status, (if_range, r.status_code)
        assert r.content == (whole.content[:10] if status == 206 else whole.content)


# --- byte ranges ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("route", ["video", "image"])
def test_ranges_are_read_as_rfc_9110_says(client, gallery, route):
    url = (f"/v1/videos/{gallery[3]['clip.mp4'].id}" if route == "video"
           else f"/v1/images/{gallery[1]['red.jpg'].id}")
    data = client.get(url).content
    size = len(data)
    huge = "1" + "0" * 4999
    for header, status, body in (
            ("bytes=5-1", 200, data),                           # last before first: invalid, ignored
            ("bytes=0-1,4-5", 200, data),                       # several ranges: served whole
            ("items=0-3", 200, data), ("bytes=a-b", 200, data), ("bytes=-", 200, data),
            ("bytes=2-5", 206, data[2:6]), ("BYTES = 2-5", 206, data[2:6]), ("bytes=-4", 206, data[-4:]),
            (f"bytes={size - 3}-", 206, data[-3:]), (f"bytes=0-{huge}", 206, data),      # past the end: clipped
            (f"bytes=-{huge}", 206, data), (f"bytes=3-{size + 10}", 206, data[3:]),
            (f"bytes={huge}-", 416, None), (f"bytes={size}-", 416, None), (f"bytes={huge}-{huge}9", 416, None),
            ("bytes=-0", 416, None)):
        r = client.get(url, headers={"Range": header})
        assert r.status_code == status, (header[:40], r.status_code, r.text[:200])
        if status == 416:
            assert r.headers["content-type"] == "application/json" and r.headers["content-range"] == f"bytes */{size}"
            assert "range not satisfiable" in r.json()["detail"]
            assert not re.search(r"digit|4300|sys\.set_int_max_str_digits|limit", r.json()["detail"]), r.text
        else:
            assert r.content == body, header[:40]
            if status == 206:
                first = size - len(body) if header.startswith("bytes=-") else data.index(body)
                assert r.headers["content-range"] == f"bytes {first}-{first + len(body) - 1}/{size}"


def test_head_answers_the_headers_of_the_file_routes(client, gallery):
    _, photos, moments, videos = gallery
    clip = videos["clip.mp4"]
    for url, media in ((f"/v1/videos/{clip.id}", "video/mp4"), (f"/v1/images/{photos['red.jpg'].id}", "image/jpeg")):
        got = client.get(url)
        head = client.head(url)
        assert head.status_code == 200 and head.content == b"" and head.headers["content-type"] == media
        assert head.headers["content-length"] == str(len(got.content)) and head.headers["etag"] == got.headers["etag"]
        part = client.head(url, headers={"Range": "bytes=1-4"})
        assert part.status_code == 206 and part.headers["content-length"] == "4" and part.content == b""
        assert client.head(url, headers={"If-None-Match": got.headers["etag"]}).status_code == 304
    for url in (f"/v1/images/{photos['red.jpg'].id}?size=32", f"/v1/videos/{clip.id}/frame?t=0.5",
                f"/v1/images/{moments['clip.mp4'].id}"):
        head = client.head(url)                                      # made on request: not made for a HEAD
        assert head.status_code == 200 and head.content == b"" and head.headers["content-type"] == "image/jpeg"
        assert head.headers["etag"] == client.get(url).headers["etag"]
    paths = client.get("/openapi.json").json()["paths"]
    for path in ("/v1/images/{image_id}", "/v1/videos/{video_id}", "/v1/videos/{video_id}/frame"):
        assert {"get", "head"} <= set(paths[path]), path
    assert {"304", "206", "416"} <= set(paths["/v1/images/{image_id}"]["get"]["responses"])


def test_ids_are_read_strictly(client, gallery):
    clip = gallery[3]["clip.mp4"]
    assert client.get(f"/v1/videos/{clip.id}").status_code == 200
    for raw in ("%20" + str(clip.id), str(clip.id) + "%20", "+" + str(clip.id), "0" + str(clip.id), "-0",
                f"{clip.id}_0", "0x0", "%EF%BC%90", "1e0", "9" * 30):
        for url in (f"/v1/videos/{raw}", f"/v1/videos/{raw}/frame", f"/v1/images/{raw}"):
            r = client.get(url)
            assert r.status_code == 422 and r.json()["detail"], (url, r.status_code)


# --- files that turned hostile after indexing -------------------------------------------------------------------

def test_files_that_became_unreadable_or_hostile_are_4xx_without_a_server_path(tiny_model_path, gallery):
    """The issue's case: a video made unreadable after indexing once answered FFmpeg's message with its path, on
    the frame route, on a moment's image and in a search by the moment's id."""
    index, photos, moments, videos = gallery
    # the index stores absolute paths: these are the module's files, replaced here and put back afterwards
    victim_video, victim_photo = videos["victim.mp4"], photos["victim.jpg"]
    saved = {p: open(p, "rb").read() for p in (victim_video.path, victim_photo.path)}
    try:
        with open(victim_video.path, "wb") as fh:
            fh.write(b"\x00\x00\x00\x18ftypisom" + bytes(2000))
        with open(victim_photo.path, "wb") as fh:
            fh.write(png(20_000, 2))
        with TestClient(create_app(_settings(tiny_model_path, index))) as c:
            wait_ready(c)
            moment = moments["victim.mp4"]
            answers = [c.get(f"/v1/videos/{victim_video.id}/frame"), c.get(f"/v1/images/{moment.id}?size=64"),
                       c.get(f"/v1/images/{moment.id}"),
                       c.post("/v1/search/images", json={"image_id": moment.id}),      # decodes the frame
                       c.get(f"/v1/images/{victim_photo.id}?size=64")]
            statuses = [r.status_code for r in answers]
            assert statuses == [404, 404, 404, 404, 413], [r.text for r in answers]
            for r in answers:
                detail = r.json()["detail"]
                assert str(index.parent) not in detail and "/" not in detail, detail
            assert "cannot be decoded" in answers[0].json()["detail"]
            assert "aspect ratio" in answers[-1].json()["detail"]
    finally:
        for path, data in saved.items():
            with open(path, "wb") as fh:
                fh.write(data)


# --- the media admission ---------------------------------------------------------------------------------------------

def test_heavy_frames_are_bounded_and_a_small_thumbnail_still_answers(tiny_model_path, gallery):
    """Twelve full-size frames of the 2560 × 1440 video at once (heavy: above 32 MB each) with two heavy ones
    admitted at most: the rest are refused at once (503 + Retry-After), and a thumbnail of a small photo asked
    meanwhile is made."""
    index, photos, _, videos = gallery
    large, red = videos["large.mp4"], photos["red.jpg"]
    app = create_app(_settings(tiny_model_path, index, max_thumbnails=4, thumbnail_workers=2))

    async def work(c: httpx.AsyncClient):
        frames = [asyncio.create_task(c.get(f"/v1/videos/{large.id}/frame", params={"t": i / 10}))
                  for i in range(12)]
        await asyncio.sleep(0)
        thumb = await c.get(f"/v1/images/{red.id}", params={"size": 32})
        return await asyncio.gather(*frames), thumb, (await c.get("/metrics")).text

    frames, thumb, metrics = asyncio.run(serve_app(app, work))
    assert thumb.status_code == 200 and thumb.headers["content-type"] == "image/jpeg"
    statuses = [r.status_code for r in frames]
    assert set(statuses) <= {200, 503} and 200 in statuses and 503 in statuses, statuses
    for r in frames:
        if r.status_code == 503:
            assert r.headers["retry-after"] == "1" and "thumbnails" in r.json()["detail"]
        else:
            assert Image.open(io.BytesIO(r.content)).size == (2560, 1440)
    shed = re.search(r'jointspace_shed_total\{batcher="media",reason="queue_full"\} (\S+)', metrics)
    assert shed and float(shed.group(1)) == statuses.count(503)
    assert app.state.service.media.running_bytes == 0 and app.state.service.media.admitted == 0


def test_a_frame_without_size_is_scaled_to_the_frame_limit(tiny_model_path, gallery):
    index, _, _, videos = gallery
    with TestClient(create_app(_settings(tiny_model_path, index, max_frame_pixels=640 * 360))) as c:
        wait_ready(c)
        r = c.get(f"/v1/videos/{videos['large.mp4'].id}/frame")
        assert r.status_code == 200 and Image.open(io.BytesIO(r.content)).size == (640, 360)
        small = c.get(f"/v1/videos/{videos['large.mp4'].id}/frame", params={"size": 128})
        assert Image.open(io.BytesIO(small.content)).size == (128, 72)


# --- /docs -----------------------------------------------------------------------------------------------------------

def test_docs_are_served_from_the_apps_own_files_with_a_csp(client):
    page = client.get("/docs")
    assert page.status_code == 200 and page.headers["content-security-policy"] == CSP
    assert not re.search(r"https?://", page.text), page.text                   # no CDN, nothing off-site
    assert "<script>" not in page.text                                          # no inline script
    for src in re.findall(r'(?:src|href)="([^"]+)"', page.text):
        asset = client.get("/" + src)
        assert asset.status_code == 200 and asset.headers["content-security-policy"] == CSP, src
        assert asset.headers["x-content-type-options"] == "nosniff"
    assert "SwaggerUIBundle" in client.get("/docs/assets/swagger-ui-bundle.js").text
    assert client.get("/docs/assets/swagger-ui.js.map").status_code == 404
    assert client.get("/redoc").status_code == 404
    assert "'self'" in CSP and "unsafe-inline" not in CSP and "default-src 'none'" in CSP


def test_docs_render_in_a_browser_within_their_csp(tiny_model_path, tiny_index_dir):
    """Swagger UI shows every operation of the document, with no script error and no CSP violation (Chromium logs
    each as a console error), loading nothing from another origin."""
    from browser import CHROMIUM_FLAGS, chromium, require_browser
    from test_web import LiveServer

    require_browser()
    from playwright.sync_api import sync_playwright

    app = create_app(_settings(tiny_model_path, tiny_index_dir))
    with LiveServer(app) as live, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), headless=True, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page()
            problems, requests = [], []
            page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(f"{live.url}/docs")
            page.wait_for_selector(".opblock", timeout=20_000)
            operations = sum(len(ops) for ops in app.openapi()["paths"].values())
            assert page.locator(".opblock").count() == operations
            page.locator(".opblock-summary").first.click()
            page.wait_for_timeout(300)
        finally:
            browser.close()
    assert problems == []
    assert requests and all(u.startswith(live.url) for u in requests), requests


def test_the_service_imports_its_video_decoder_before_it_is_ready(tiny_model_path, tiny_index_dir):
    """PyAV's first import is not safe from two threads at once: two decoding threads that each imported it first
    (a frame, and a truncated upload's error) once answered 500. The service imports it while it loads."""
    import subprocess
    import sys
    from pathlib import Path

    code = (f"import sys\n"
            f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
            f"from fastapi.testclient import TestClient\n"
            f"from server_process import wait_ready\n"
            f"from service.app import create_app\n"
            f"from service.settings import Settings\n"
            f"assert 'av' not in sys.modules\n"
            f"app = create_app(Settings(model={str(tiny_model_path)!r}, index={str(tiny_index_dir)!r}, "
            f"reload_interval_s=0))\n"
            f"with TestClient(app) as c:\n"
            f"    wait_ready(c, timeout=240)\n"
            f"    assert 'av' in sys.modules\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            env={**__import__("os").environ, "JOINTSPACE_ALLOWED_HOSTS": "testserver"})
    assert result.returncode == 0, result.stderr[-2000:]
