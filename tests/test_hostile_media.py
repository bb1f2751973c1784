"""Hostile media (tests/hostile_media.py's generated corpus: aspect extremes, huge declared sizes, truncated and
polyglot files, many streams, lying containers), each asserted on what the service answers when it is uploaded and
on what indexing does with it; the geometry limits refuse before any pixel is decoded and no resize can grow an
image past them; a decoder's failure is told in the one mapping's words; media types come from content; every
error the suite provokes is read for server paths and reprs (tests/error_bodies.py), and that check is tested too.

Time and memory of the two aspect-extreme PNGs at upload and at index time are measured by
benchmarks/hostile_media.py (docs/service.md), not here."""
from __future__ import annotations

import io
import re
import struct
import time
from pathlib import Path

import pytest
from server_process import wait_ready
from fastapi import FastAPI, HTTPException
from fastapi.testclient import TestClient
from PIL import Image, ImageFile, UnidentifiedImageError

from error_bodies import ErrorBodies, LeakedError
from hostile_media import corpus, png
from index.gallery import EmbedOptions, build
from index.scan import is_video, scan_media
from index.video_decode import VideoError, probe
from service.app import create_app
from service.images import ImageError, open_checked, thumbnail, upload_to_pixels
from service.settings import Settings
from training.data.media import (CORRUPT, TOO_LARGE, TRUNCATED, UNDECODABLE, UNREADABLE, UNRECOGNISED,
                                 UNSUPPORTED, decoder_error, sniff_image, sniff_video)
from training.data.preprocess import (MAX_ASPECT, MAX_RESIZED_PIXELS, ImageGeometryError, Preprocess,
                                      StackedPreprocess, check_geometry, decode_image, resized_size)
from training.models.checkpoint import load_model

_INTERNALS = re.compile(r"0x[0-9a-f]{6,}|<[^>]*>|/tmp|/home|/usr|/work|site-packages|Traceback|Errno", re.I)


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    return corpus(tmp_path_factory.mktemp("hostile-corpus"))


@pytest.fixture(scope="module")
def client(tiny_model_path, tiny_index_dir):
    with TestClient(create_app(Settings(model=str(tiny_model_path), index=str(tiny_index_dir),
                                        reload_interval_s=0))) as c:
        yield wait_ready(c)


# --- uploads --------------------------------------------------------------------------------------------------------

def test_every_hostile_upload_is_answered_its_status_with_a_clean_message(cases, client):
    for case in cases:
        for path, extra in (("/v1/search/captions", {}), ("/v1/search/images", {"data": {"add": "a dog"}})):
            r = client.post(path, files={"image": (case.name, case.data, "application/octet-stream")}, **extra)
            assert r.status_code == case.upload, (case.name, case.why, path, r.text)
            if r.status_code != 200:
                detail = r.json()["detail"]
                assert not _INTERNALS.search(detail), (case.name, detail)
                if case.upload == 413:
                    assert "limit" in detail, (case.name, detail)        # the 4xx names the limit


def test_the_aspect_extremes_name_the_aspect_limit(client):
    for width, height in ((20_000, 2), (24_500_000, 2), (2, 20_000)):
        r = client.post("/v1/search/captions", files={"image": ("x.png", png(width, height), "image/png")})
        assert r.status_code == 413, r.text
        assert f"{width}×{height}" in r.json()["detail"] and f"limit of {MAX_ASPECT}:1" in r.json()["detail"]


# --- the geometry check comes before any pixel work ------------------------------------------------------------------

def test_the_geometry_check_refuses_before_anything_is_decoded(monkeypatch):
    """The 24,500,000 × 2 PNG — and one whose pixels are not even in the file — is refused from its header: no image
    is loaded, so the 2.6 G-pixel resize is never reached."""
    loads = []

    def no_load(self, *args, **kwargs):
        loads.append(self.size)
        raise AssertionError("an image was decoded")

    monkeypatch.setattr(ImageFile.ImageFile, "load", no_load)
    for data in (png(24_500_000, 2), png(24_500_000, 2, truncate=True), png(20_000, 2)):
        with pytest.raises(ImageError) as err:
            open_checked(data, 50_000_000, 32, 32)
        assert err.value.status == 413 and "aspect ratio" in err.value.detail
        with pytest.raises(ImageGeometryError) as geometry:
            decode_image(data, ".png", min_side=32)
        assert geometry.value.limit == "aspect"
    assert loads == []
    monkeypatch.undo()
    pixels = upload_to_pixels(png(400, 300), 50_000_000, Preprocess(32, 32))     # a fine PNG still decodes
    assert pixels.shape == (1, 3, 32, 32)


def test_the_limits_and_the_resized_size():
    check_geometry((4000, 3000), 600, 50_000_000)                       # a photo
    check_geometry((MAX_ASPECT * 10, 10), 256)                          # exactly the aspect limit
    assert resized_size((20_000, 2), 256) == (2_560_000, 256)          # what the resize would have made
    for size, side, max_pixels, limit in (((MAX_ASPECT * 10 + 1, 10), None, None, "aspect"),
                                          ((5000, 100), 600, None, "resized"),      # 30000 × 600 = 18 MP
                                          ((8000, 7000), None, 50_000_000, "pixels"),
                                          ((0, 10), None, None, "pixels")):
        with pytest.raises(ImageGeometryError) as err:
            check_geometry(size, side, max_pixels)
        assert err.value.limit == limit
        assert size == (0, 10) or "limit" in str(err.value)
    assert 30_000 * 600 > MAX_RESIZED_PIXELS


def test_no_resize_can_grow_an_image_past_the_limits():
    """An image that reaches a preprocessing some other way than a checked decode is checked again before each
    resize (a plain, a stacked and a mirrored preprocessing), so the resize that once raised OverflowError on a
    24,500,000 × 2 image is never attempted."""
    from training.data.preprocess import MirroredViews

    wide = Image.new("L", (24_500_000, 2))
    for pre in (Preprocess(32, 32), StackedPreprocess((Preprocess(32, 32), Preprocess(48, 56))),
                MirroredViews(Preprocess(32, 32), zoom=8 / 7)):
        with pytest.raises(ImageGeometryError):
            pre.pixels(wide)
    with pytest.raises(ImageGeometryError, match="resized"):
        Preprocess(600, 600).pixels(Image.new("RGB", (1500, 30)))       # 30000 × 600 once resized


# --- index time ----------------------------------------------------------------------------------------------------

def test_indexing_the_corpus_skips_each_with_its_reason_and_reads_media_by_content(cases, tiny_model_path,
                                                                                     tmp_path):
    folder = tmp_path / "gallery"
    folder.mkdir()
    for case in cases:
        (folder / case.name).write_bytes(case.data)
    (folder / "good.jpg").write_bytes(_jpeg())
    scan = scan_media(folder, photos=True, videos=True)
    photos = [p for p in scan.found if not is_video(p)]
    videos = [p for p in scan.found if is_video(p)]
    report = build(tmp_path / "index", load_model(tiny_model_path), photos, video_paths=videos,
                   embedding=EmbedOptions(progress=False, workers=0))
    skipped = {Path(path).name: reason for path, reason in report.skipped}
    from index.gallery import Gallery

    gallery = Gallery.load(tmp_path / "index")
    photo_names = {Path(r.path).name for r in gallery.meta.all_images() if r.video_id is None}
    video_names = {Path(r.path).name for r in gallery.meta.all_videos()}
    gallery.close()
    assert "good.jpg" in photo_names
    for case in cases:
        if case.index == "photo":
            assert case.name in photo_names, (case.name, skipped.get(case.name))
        elif case.index == "video":
            assert case.name in video_names, (case.name, skipped.get(case.name))
        else:
            assert case.name in skipped, (case.name, case.why)
            assert case.index in skipped[case.name], (case.name, skipped[case.name])


def _jpeg(size=(64, 48), colour="red") -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, "JPEG")
    return out.getvalue()


def test_media_types_come_from_content(tmp_path, cases):
    by_name = {c.name: c for c in cases}
    for name, expected in (("photo.mp4", False), ("clip.jpg", True), ("streams.mkv", True), ("heic.mp4", False),
                           ("wide.png", False)):
        path = tmp_path / name
        path.write_bytes(by_name[name].data)
        assert is_video(path) is expected, name
    assert is_video(tmp_path / "gone.mp4") is True                      # unreadable: by its name
    assert sniff_video(by_name["clip.jpg"].data[:64]) == "video/mp4"
    assert sniff_image(by_name["photo.mp4"].data[:64]) == "image/jpeg"
    for head, media in ((b"\x1a\x45\xdf\xa3\x93\x42\x82\x88matroska", "video/x-matroska"),
                        (b"\x1a\x45\xdf\xa3\x9f\x42\x82\x84webm", "video/webm"),
                        (b"RIFF\x00\x00\x00\x00AVI LIST", "video/x-msvideo"),
                        (b"\x00\x00\x00\x14ftypqt  \x00\x00\x00\x00", "video/quicktime"),
                        (b"\x00\x00\x00\x08wide\x00\x00\x00\x00mdat", "video/quicktime"),
                        (b"\x00\x00\x00\x18ftypavif\x00\x00\x00\x00mif1", None),
                        (b"GIF89a", None)):
        assert sniff_video(head) == media, head


def test_a_video_refused_for_its_aspect_ratio_says_so(tmp_path, cases):
    path = tmp_path / "tall.mp4"
    path.write_bytes(next(c for c in cases if c.name == "tall.mkv").data)
    with pytest.raises(VideoError, match="aspect ratio 128:1"):
        probe(path)


# --- one mapping of decoder errors ---------------------------------------------------------------------------------

def test_decoder_errors_are_told_in_fixed_words():
    import av.error

    secret = "/srv/gallery/private/clip.mkv"
    errors = [(UnidentifiedImageError("cannot identify image file <_io.BytesIO object at 0x7f00deadbeef>"),
               UNRECOGNISED),
              (OSError("image file is truncated (3 bytes not processed)"), TRUNCATED),
              (SyntaxError(f"not a PNG file: {secret}"), CORRUPT),
              (struct.error("unpack requires a buffer of 4 bytes"), CORRUPT),
              (Image.DecompressionBombError("Image size (10 pixels) exceeds limit"), TOO_LARGE),
              (av.error.InvalidDataError(1094995529, "Invalid data found when processing input", secret),
               CORRUPT),
              (av.error.FileNotFoundError(2, "No such file or directory", secret), UNREADABLE),
              (av.error.EOFError(541478725, "End of file", secret), TRUNCATED),
              (av.error.DecoderNotFoundError(1, "Decoder not found", secret), UNSUPPORTED),
              (RuntimeError(f"something at {secret}"), UNDECODABLE)]
    for err, words in errors:
        assert decoder_error(err) == words, (err, decoder_error(err))
        assert secret not in decoder_error(err) and "0x" not in decoder_error(err)


def test_a_thumbnail_of_a_hostile_gallery_file_is_refused_by_its_header(tmp_path):
    path = tmp_path / "wide.png"
    path.write_bytes(png(20_000, 2))
    with pytest.raises(ImageError) as err:
        thumbnail(path, 128, 50_000_000)
    assert err.value.status == 413 and "aspect ratio" in err.value.detail and str(tmp_path) not in err.value.detail


# --- the check of every error body ----------------------------------------------------------------------------------

def test_the_error_body_check_catches_paths_and_reprs(error_bodies, tmp_path):
    checker = ErrorBodies([str(tmp_path)])
    assert checker.leak(f"no file at {tmp_path}/gallery/a.jpg") == str(tmp_path)
    assert checker.leak("cannot identify image file <_io.BytesIO object at 0x7f3a>") == "object at 0x"
    assert checker.leak("no gallery image with id 5") is None
    before = error_bodies.checked
    app = FastAPI()

    @app.get("/leak")
    async def leak():
        raise HTTPException(404, f"gone: {tmp_path / 'gallery' / 'clip.mkv'}")

    @app.get("/clean")
    async def clean():
        raise HTTPException(404, "no gallery video with id 3")

    with TestClient(app) as c:
        assert c.get("/clean").status_code == 404                        # checked, and clean
        with pytest.raises(LeakedError, match="clip.mkv"):
            c.get("/leak")
    assert error_bodies.checked >= before + 2
