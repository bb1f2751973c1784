"""Photo formats and photo metadata at index time: HEIC/HEIF and AVIF (written here with pillow-heif and Pillow),
camera RAW through rawpy, unreadable or unsupported files skipped and listed; EXIF orientation applied before
embedding and in thumbnails; capture time (EXIF DateTimeOriginal, else mtime), upright size and folder stored in
the metadata; indexes written before those columns still load and are migrated by the next update."""
import datetime as dt
import io
import os
import sqlite3
import sys

import numpy as np
import pytest
from PIL import Image, ImageDraw

from index.embed import embed_photos, read_photo
from index.gallery import EmbedOptions, Gallery, sync
from index.generations import current_generation
from index.query import ImageFilter
from index.scan import find_images
from service.cli import main as cli_main
from training.data.preprocess import open_image
from training.models.checkpoint import load_model
from server_process import wait_ready

TAKEN = dt.datetime(2021, 7, 14, 9, 30, 0, tzinfo=dt.timezone.utc)
MTIME = dt.datetime(2019, 3, 2, 12, 0, 0, tzinfo=dt.timezone.utc).timestamp()


@pytest.fixture(scope="module")
def model(tiny_model_path):
    return load_model(tiny_model_path)


def picture(w=48, h=32, seed=0) -> Image.Image:
    """An asymmetric picture (a rotation or flip of it is a different picture)."""
    rng = np.random.default_rng(seed)
    image = Image.new("RGB", (w, h), tuple(int(v) for v in rng.integers(0, 255, 3)))
    draw = ImageDraw.Draw(image)
    draw.rectangle((2, 2, w // 3, h // 2), fill=(255, 0, 0))
    draw.ellipse((w // 2, h // 3, w - 3, h - 3), fill=(0, 0, 255))
    return image


def exif(taken: dt.datetime | None = None, orientation: int | None = None, offset: str | None = None):
    e = Image.Exif()
    if orientation:
        e[0x0112] = orientation
    ifd = e.get_ifd(0x8769)
    if taken is not None:
        ifd[0x9003] = taken.strftime("%Y:%m:%d %H:%M:%S")
    if offset is not None:
        ifd[0x9011] = offset
    return e


def save(image: Image.Image, path, fmt: str, **kw):
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, fmt, **kw)
    os.utime(path, (MTIME, MTIME))
    return path


def test_heic_and_avif_are_decoded_and_exif_orientation_applied(tmp_path):
    upright = picture()
    # stored turned a quarter (as a phone held sideways writes it), tagged orientation 6 = "rotate 90° CW to view"
    stored = upright.transpose(Image.Transpose.ROTATE_90)
    for fmt, suffix in (("PNG", ".png"), ("JPEG", ".jpg"), ("HEIF", ".heic"), ("AVIF", ".avif")):
        path = save(stored, tmp_path / f"turned{suffix}", fmt, exif=exif(TAKEN, orientation=6).tobytes(),
                    **({"quality": 95} if fmt != "PNG" else {}))
        image, info = read_photo(path)
        assert image.size == upright.size == (info.width, info.height), fmt
        assert info.taken == TAKEN.timestamp(), fmt
        if fmt == "PNG":                                     # lossless: exactly the upright pixels
            assert np.array_equal(np.asarray(image), np.asarray(upright))
        else:                                                # lossy: close to upright, far from the other ways
            diff = np.abs(np.asarray(image, float) - np.asarray(upright, float)).mean()
            flipped = np.abs(np.asarray(image, float) - np.asarray(upright.transpose(Image.Transpose.ROTATE_180),
                                                                     float)).mean()
            assert diff < 12 < flipped, (fmt, diff, flipped)
    # no EXIF: capture time is the file's mtime; an EXIF offset is honoured
    plain = save(picture(), tmp_path / "plain.heic", "HEIF")
    assert read_photo(plain)[1].taken == MTIME
    zoned = save(picture(), tmp_path / "zoned.jpg", "JPEG", exif=exif(TAKEN.replace(tzinfo=None), offset="+02:00"))
    assert read_photo(zoned)[1].taken == TAKEN.timestamp() - 2 * 3600


def test_orientation_is_applied_before_embedding(model, tmp_path):
    upright = picture(40, 64, seed=3)
    a = save(upright, tmp_path / "upright.png", "PNG")
    b = save(upright.transpose(Image.Transpose.ROTATE_270), tmp_path / "tagged.png", "PNG",
             exif=exif(orientation=8).tobytes())          # 8 = rotate 270° CW to view
    c = save(upright.transpose(Image.Transpose.ROTATE_270), tmp_path / "untagged.png", "PNG")
    emb = embed_photos(model, [a, b, c], progress=False, workers=0).vectors
    assert np.allclose(emb[0], emb[1], atol=1e-6)              # the tag is applied: same picture, same vector
    assert not np.allclose(emb[0], emb[2], atol=1e-3)          # without it the picture (and vector) differ
    assert open_image(b).size == (40, 64)


def _photo_folder(root):
    """JPEG, HEIC, AVIF, PNG photos in two folders, plus files that must be skipped."""
    save(picture(seed=1), root / "2021" / "a.jpg", "JPEG", exif=exif(TAKEN))
    save(picture(seed=2).transpose(Image.Transpose.ROTATE_90), root / "2021" / "b.heic", "HEIF",
         exif=exif(TAKEN + dt.timedelta(days=1), orientation=6).tobytes())
    save(picture(seed=3), root / "2022" / "c.avif", "AVIF")
    save(picture(seed=4), root / "2022" / "deep" / "d.png", "PNG")
    (root / "2022" / "broken.heic").write_bytes(b"\x00\x00\x00\x18ftypheic" + b"\x00" * 40)   # corrupt HEIC
    (root / "2022" / "camera.dng").write_bytes(b"II*\x00" + b"\x00" * 64)                     # not a real RAW
    (root / "notes.avif").write_text("not an image")
    return root


def test_build_indexes_every_format_and_stores_photo_metadata(model, tiny_model_path, tmp_path, capsys):
    photos = _photo_folder(tmp_path / "photos")
    out = tmp_path / "gallery"
    rc = cli_main(["index", "build", "--model", str(tiny_model_path), "--images", str(photos), "--out", str(out),
                   "--quiet", "--workers", "0"])
    assert rc == 0
    err = capsys.readouterr().err
    for name in ("broken.heic", "camera.dng", "notes.avif"):
        assert name in err, err
    assert "3 unreadable image(s) skipped" in err
    gallery = Gallery.load(out, model=model)
    rows = {os.path.basename(r.path): r for r in gallery.meta.all_images()}
    assert set(rows) == {"a.jpg", "b.heic", "c.avif", "d.png"}
    assert rows["a.jpg"].taken == TAKEN.timestamp() and rows["b.heic"].taken == TAKEN.timestamp() + 86400
    assert rows["c.avif"].taken == MTIME and rows["d.png"].taken == MTIME          # no EXIF: the mtime
    assert (rows["b.heic"].width, rows["b.heic"].height) == (48, 32)               # upright size
    assert rows["d.png"].folder == str((photos / "2022" / "deep").resolve())
    assert all(len(r.sha256) == 64 and r.size > 0 for r in rows.values())
    assert gallery.photos.root == str(photos.resolve())
    assert dict(gallery.photos.folder_counts()) == {"2021": 2, "2022": 1, os.path.join("2022", "deep"): 1}
    gallery.close()


def test_raw_needs_rawpy_and_says_so(model, tmp_path, monkeypatch):
    raw = tmp_path / "IMG_0001.CR2"
    raw.write_bytes(b"II*\x00\x10\x00\x00\x00CR" + b"\x00" * 100)
    ok = save(picture(), tmp_path / "ok.jpg", "JPEG")
    emb = embed_photos(model, [raw, ok], progress=False, workers=0)
    assert emb.kept == [1] and emb.skipped[0][0] == str(raw)
    try:
        import rawpy  # noqa: F401 - the optional [raw] extra
        assert "LibRaw" in emb.skipped[0][1], emb.skipped          # its own error for a file it cannot read
    except ImportError:
        assert "pip install 'jointspace[raw]'" in emb.skipped[0][1], emb.skipped
    monkeypatch.setitem(sys.modules, "rawpy", None)            # as if the [raw] extra were not installed
    emb = embed_photos(model, [raw, ok], progress=False, workers=0)
    assert emb.kept == [1] and "pip install 'jointspace[raw]'" in emb.skipped[0][1]


def test_default_and_given_excludes(tmp_path):
    root = tmp_path / "p"
    for rel in ("a.jpg", "sub/b.jpg", ".hidden/c.jpg", "sub/.d.jpg", "@eaDir/e.jpg", "sub/.thumbnails/f.jpg",
                "drafts/g.jpg", "sub/drafts/h.jpg", "2019/i.jpg", "j.png"):
        save(picture(), root / rel, "PNG" if rel.endswith(".png") else "JPEG")
    names = lambda paths: sorted(p.relative_to(root).as_posix() for p in paths)  # noqa: E731
    assert names(find_images(root)) == ["2019/i.jpg", "a.jpg", "drafts/g.jpg", "j.png", "sub/b.jpg",
                                        "sub/drafts/h.jpg"]
    assert names(find_images(root, ["drafts", "2019/*", "*.png"])) == ["a.jpg", "sub/b.jpg"]
    assert len(find_images(root, default_excludes=False)) == 10


def _strip_photo_columns(gen_dir):
    """Rewrites a generation's metadata as an index from before the photo columns existed."""
    db = gen_dir / "metadata.sqlite"
    con = sqlite3.connect(db)
    with con:
        con.execute("CREATE TABLE old (id INTEGER PRIMARY KEY, path TEXT NOT NULL, added REAL NOT NULL)")
        con.execute("INSERT INTO old SELECT id, path, added FROM images")
        con.execute("DROP TABLE images")
        con.execute("ALTER TABLE old RENAME TO images")
    con.close()


def test_an_index_without_the_photo_columns_loads_and_is_migrated(model, tiny_model_path, tmp_path):
    photos = _photo_folder(tmp_path / "photos")
    out = tmp_path / "gallery"
    assert cli_main(["index", "build", "--model", str(tiny_model_path), "--images", str(photos), "--out", str(out),
                     "--quiet", "--workers", "0", "--no-querybank", "--tta", "none"]) == 0
    _strip_photo_columns(out / current_generation(out))
    old = Gallery.load(out, model=model)                       # read-only: missing columns read as NULL
    row = next(r for r in old.meta.all_images() if r.path.endswith("d.png"))
    assert row.taken is None and row.sha256 is None and row.folder == str((photos / "2022" / "deep").resolve())
    assert len(old.allowed_ids(ImageFilter(folder="2022"))) == 2                  # folder from the path
    assert len(old.allowed_ids(ImageFilter(taken_after=0.0))) == 0                # no capture time: no match
    q = old.images.reconstruct(row.id)[None]
    assert old.search_images(q, 1)[0][0][0] == row.id
    old.close()
    # the next update adds the columns; sync embeds the rows without a content hash again, once
    report = sync(out, model, photos, embedding=EmbedOptions(progress=False, workers=0))
    assert len(report.changed) == 4 and not report.image_ids and report.removed_images == 0
    new = Gallery.load(out, model=model)
    assert all(r.sha256 and r.taken for r in new.meta.all_images())
    new.close()
    again = sync(out, model, photos, embedding=EmbedOptions(progress=False, workers=0))
    assert again.generation == report.generation and again.unchanged == 4 and not again.changed


def test_service_serves_upright_thumbnails_and_reads_heic_and_avif_uploads(model, tiny_model_path, tmp_path):
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import Settings

    photos = _photo_folder(tmp_path / "photos")
    out = tmp_path / "gallery"
    assert cli_main(["index", "build", "--model", str(tiny_model_path), "--images", str(photos), "--out", str(out),
                     "--quiet", "--workers", "0"]) == 0
    gallery = Gallery.load(out, model=model)
    ids = {os.path.basename(r.path): r.id for r in gallery.meta.all_images()}
    gallery.close()
    app = create_app(Settings(model=str(tiny_model_path), index=str(out), reload_interval_s=0))
    with TestClient(app) as c:
        wait_ready(c)
        r = c.get(f"/v1/images/{ids['b.heic']}")
        assert r.status_code == 200 and r.headers["content-type"] == "image/heic"
        assert c.get(f"/v1/images/{ids['c.avif']}").headers["content-type"] == "image/avif"
        thumb = c.get(f"/v1/images/{ids['b.heic']}", params={"size": 24})      # stored 32×48, tagged: upright
        assert thumb.status_code == 200 and Image.open(io.BytesIO(thumb.content)).size == (24, 16)
        for fmt in ("HEIF", "AVIF"):
            buf = io.BytesIO()
            picture(seed=5).save(buf, fmt)
            r = c.post("/v1/search/images", files={"image": ("x", buf.getvalue(), "application/octet-stream")})
            assert r.status_code == 200 and r.json()["results"], (fmt, r.text)
        r = c.post("/v1/search/images", files={"image": ("x.heic", b"\x00\x00\x00\x18ftypheic" + b"\x00" * 40,
                                                           "image/heic")})
        assert r.status_code == 400 and "corrupt" in r.json()["detail"], r.text
        r = c.post("/v1/search/images", files={"image": ("x.dng", b"II*\x00" + b"\x00" * 64, "image/x-dng")})
        assert r.status_code == 400, r.text           # sniffed as TIFF (DNG is TIFF-based), then not decodable
        r = c.post("/v1/search/images", files={"image": ("x.svg", b"<svg xmlns='http://www.w3.org/2000/svg'/>",
                                                           "image/svg+xml")})
        assert r.status_code == 415 and "HEIC" in r.json()["detail"], r.text
