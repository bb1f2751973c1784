"""Text in photos (index/ocr.py, with the real Tesseract) and the keyword index (index/keywords.py) with its search
modes (index/hybrid.py), on a small gallery: synthetic photos, a photo of a street sign and a file named like a
camera's. Through the library, the CLI and the HTTP API.

``make test`` installs Tesseract with apt-get when it is missing (``make ocr``). Where it truly cannot be installed,
the tests that read photos skip, with the reason in the summary; under CI (``CI`` set) they fail instead.
"""
import json
import os
import shutil
import sqlite3
from pathlib import Path

import pytest
from PIL import Image, ImageDraw, ImageFont

from index.embed import embed_sentences
from index.changes import BuildOptions
from index.gallery import EmbedOptions, Gallery, build, remove, sync
from index.hybrid import TextPaging, rrf, search_text
from index.keywords import folder_text, name_text, query_words
from index.ocr import GATE, OcrConfig, OcrUnavailableError, check_engine, likelihood_of, ocr_photo
from training.data.datasets import load_dataset
from training.models.checkpoint import load_model
from server_process import wait_ready

SIGN = "DSC_0007.jpg"          # the photo of the sign: its name says nothing of its words
CAMERA = "IMG_2041.jpg"        # a synthetic photo under a camera's file name


def _font(size: int):
    import matplotlib

    return ImageFont.truetype(str(Path(matplotlib.get_data_path()) / "fonts/ttf/DejaVuSans-Bold.ttf"), size)


def _sign(path: Path, words: str = "SUNSET BOULEVARD") -> None:
    image = Image.new("RGB", (640, 360), (30, 90, 50))
    ImageDraw.Draw(image).text((40, 140), words, font=_font(52), fill=(245, 245, 245))
    image.save(path, quality=92)


@pytest.fixture(scope="module")
def tesseract():
    """Tesseract with its English data, or a loud skip (a failure under CI) saying how to install it."""
    try:
        check_engine("eng")
    except OcrUnavailableError as err:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the OCR tests: {err}")
        pytest.skip(f"Tesseract cannot run here: {err}")


@pytest.fixture(scope="module")
def photos(tesseract, synth_small, tmp_path_factory):
    """A folder of synthetic photos (one of them named IMG_2041.jpg) and the sign, in a subfolder ``trip``."""
    folder = tmp_path_factory.mktemp("keyword_photos") / "trip"
    folder.mkdir()
    records = load_dataset(synth_small).split("test").images[:16]
    for n, record in enumerate(records):
        name = CAMERA if n == 5 else f"synth_{n:02d}{Path(record.path).suffix}"
        shutil.copy(record.path, folder / name)
    _sign(folder / SIGN)
    return folder


@pytest.fixture(scope="module")
def model(tiny_model_path):
    return load_model(tiny_model_path)


def _build(photos: Path, model, out: Path, ocr: OcrConfig | None) -> Path:
    build(out, model, sorted(p for p in photos.iterdir()), options=BuildOptions(image_root=photos, ocr=ocr),
          embedding=EmbedOptions(progress=False, workers=0))
    return out


@pytest.fixture(scope="module")
def ocr_index(photos, model, tmp_path_factory):
    return _build(photos, model, tmp_path_factory.mktemp("ocr_index") / "index", OcrConfig())


@pytest.fixture(scope="module")
def plain_index(photos, model, tmp_path_factory):
    return _build(photos, model, tmp_path_factory.mktemp("plain_index") / "index", None)


def _search(root, model, text, mode, k=5, **kw):
    gallery = Gallery.load(root, model=model)
    try:
        query = embed_sentences(model, [text])
        ranking = search_text(gallery, query, text, mode, TextPaging(k, **kw))
        rows = gallery.meta.images([i for i, _ in ranking.hits])
        return [(Path(rows[i].path).name, s, m) for (i, s), m in zip(ranking.hits, ranking.matched)], ranking
    finally:
        gallery.close()


def test_words_split_names_at_digits_and_separators():
    assert name_text("/p/IMG_2041.jpg") == "img 2041 jpg"
    assert name_text("holiday-2024.paris3.HEIC") == "holiday 2024 paris 3 heic"
    assert folder_text("/home/me/Photos/2024_Summer/Paris") == "photos 2024 summer paris"   # the last three
    assert query_words("The sunset on a Boulevard, the SUNSET") == ["sunset", "boulevard"]


def test_rrf_fuses_ranks():
    fused = rrf([[1, 2, 3], [3, 4]], [1.0, 1.0], k=60)
    assert [i for i, _ in fused] == [3, 1, 2, 4]          # 3: in both lists; then by rank in one list
    assert fused[0][1] == pytest.approx(1 / 63 + 1 / 61)


def test_the_gate_passes_the_sign_and_tesseract_reads_it(photos):
    check_engine("eng")
    assert likelihood_of(photos / SIGN) >= GATE
    read = ocr_photo(photos / SIGN, OcrConfig())
    assert read.read and {"SUNSET", "BOULEVARD"} <= {w.text for w in read.words if w.confidence >= 50}
    flat = photos.parent / "flat.png"
    Image.new("RGB", (300, 200), (120, 130, 140)).save(flat)
    assert likelihood_of(flat) == 0.0 and ocr_photo(flat, OcrConfig()) == ocr_photo(flat, OcrConfig())
    assert not ocr_photo(flat, OcrConfig()).read


def test_a_build_takes_the_gate_from_the_photo_it_decoded(photos, model, tmp_path, monkeypatch):
    """The indexer scores each photo for the gate while it decodes it to embed (index/embed.py): OCR opens again
    only the photos the gate passes (here the sign), and reads the same words as from the file alone."""
    import index.ocr as ocr
    from index.embed import read_photo as decode_photo

    _, info = decode_photo(photos / SIGN, min_side=model.preprocess.min_side)
    assert info.text_likelihood >= GATE
    opened = []
    real = ocr.likelihood_of
    monkeypatch.setattr(ocr, "likelihood_of", lambda path: opened.append(Path(path).name) or real(path))
    read = []
    real_words = ocr.read_words
    monkeypatch.setattr(ocr, "read_words", lambda image, lang: read.append(1) or real_words(image, lang))
    root = _build(photos, model, tmp_path / "index", OcrConfig())
    assert opened == [] and len(read) == 1              # no photo scored twice; only the sign read by Tesseract
    gallery = Gallery.load(root, model=model)
    try:
        hits, _ = _search(root, model, "sunset boulevard", "keyword")
        assert hits[0][0] == SIGN
    finally:
        gallery.close()


def test_photos_are_read_while_the_others_are_embedded(photos, model, tmp_path, monkeypatch):
    """A build hands each decoded photo to OCR (index/ocr.py TextReading) as its batch comes, before the next
    batch is embedded; nothing is read after the embedding (read_rows finds every photo's text in its info), and
    the sign's words are stored. An index update does the same."""
    import index.ocr as ocr
    import training.inference.embedding as embedding

    order = []
    real_add, real_embed = ocr.TextReading.add, embedding.embed_pixels
    monkeypatch.setattr(ocr.TextReading, "add", lambda self, *a: order.append("read") or real_add(self, *a))
    monkeypatch.setattr(embedding, "embed_pixels", lambda *a, **k: order.append("embed") or real_embed(*a, **k))
    monkeypatch.setattr(ocr, "ocr_photos", lambda *a, **k: pytest.fail("photos read after the embedding"))
    files = sorted(p for p in photos.iterdir())
    root = tmp_path / "index"
    build(root, model, files[:-1], options=BuildOptions(image_root=photos, ocr=OcrConfig()),
          embedding=EmbedOptions(progress=False, workers=0, batch_size=8))
    first_embed = order.index("embed")
    assert order[0] == "read" and "read" in order[first_embed:]          # the second batch read after the first
    from index.gallery import add
    add(root, model, files[-1:], embedding=EmbedOptions(progress=False, workers=0))
    hits, _ = _search(root, model, "sunset boulevard", "keyword")
    assert hits and hits[0][0] == SIGN


def test_an_index_that_reads_text_is_updated_without_tesseract_with_one_warning(photos, model, tmp_path,
                                                                                 monkeypatch):
    import index.ocr as ocr
    from index.gallery import add

    files = sorted(p for p in photos.iterdir())
    root = tmp_path / "index"
    build(root, model, [f for f in files if f.name != SIGN][:2], options=BuildOptions(image_root=photos, ocr=OcrConfig()),
          embedding=EmbedOptions(progress=False, workers=0))
    monkeypatch.setattr(ocr, "TESSERACT", str(tmp_path / "absent"))
    monkeypatch.setattr(ocr, "_WARNED", set())              # warned once per process and reason
    with pytest.warns(UserWarning, match="photos indexed without reading their text") as caught:
        add(root, model, [photos / SIGN], embedding=EmbedOptions(progress=False, workers=0))
        add(root, model, [photos / SIGN], embedding=EmbedOptions(progress=False, workers=0))
    assert len([w for w in caught if "without reading" in str(w.message)]) == 1
    hits, _ = _search(root, model, "sunset boulevard", "keyword")
    assert not hits or hits[0][0] != SIGN


def test_reading_text_imports_no_binding(tesseract):
    """Every index update checks the engine (``tesseract --list-langs``) and a photo the gate passes is piped to the
    program: no Python binding is imported (pytesseract pulls in pandas, a third of a second)."""
    import subprocess
    import sys

    code = ("import sys; from PIL import Image; from index.ocr import check_engine, read_words; check_engine('eng'); "
            "read_words(Image.new('RGB', (64, 32), 'white')); "
            "print(sorted(m for m in ('pytesseract', 'pandas') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.strip() == "[]"


def test_tesseracts_tsv_is_read_as_words_with_whole_confidences():
    from index.ocr import Word, tsv_words

    tsv = ("level\tpage_num\tblock_num\tpar_num\tline_num\tword_num\tleft\ttop\twidth\theight\tconf\ttext\n"
           "1\t1\t0\t0\t0\t0\t0\t0\t640\t480\t-1\t\n"
           "5\t1\t1\t1\t1\t1\t10\t10\t80\t20\t96.512711\tSUNSET\n"
           "5\t1\t1\t1\t1\t2\t95\t10\t90\t20\t0.000000\t<s\n"
           "5\t1\t1\t1\t1\t3\t95\t10\t90\t20\t88.1\t  \n"
           "5\t1\t1\t1\t1\t4\t95\t10\t90\t20\t71.9\ttab\tinside\n"
           "5\t1\t1\n")
    assert tsv_words(tsv) == (Word("SUNSET", 96.0), Word("<s", 0.0), Word("tab\tinside", 71.0))
    assert tsv_words("") == ()


def test_a_failing_tesseract_reads_as_no_text(photos, tmp_path, monkeypatch):
    import index.ocr as ocr

    failing = tmp_path / "tesseract"
    failing.write_text("#!/bin/sh\necho 'Error: cannot read input' >&2\nexit 1\n")
    failing.chmod(0o755)
    monkeypatch.setattr(ocr, "TESSERACT", str(failing))
    with pytest.raises(RuntimeError, match="tesseract exited 1: Error: cannot read input"):
        ocr.read_words(Image.new("RGB", (64, 32), "white"))
    assert ocr_photo(photos / SIGN, OcrConfig()) == ocr.PhotoText(0.0, False)
    monkeypatch.setattr(ocr, "TESSERACT", str(tmp_path / "absent"))
    with pytest.raises(RuntimeError, match="not installed"):
        ocr.read_words(Image.new("RGB", (64, 32), "white"))


def test_a_missing_language_is_named_with_its_package(tesseract):
    with pytest.raises(OcrUnavailableError, match="tesseract-ocr-zzz"):
        check_engine("eng+zzz")
    with pytest.raises(ValueError, match="joined by"):
        check_engine("eng; rm -rf")


def test_sunset_boulevard_is_first_in_hybrid_mode_only_with_ocr(ocr_index, plain_index, model):
    hits, ranking = _search(ocr_index, model, "sunset boulevard", "hybrid")
    assert hits[0][0] == SIGN and hits[0][2] == ["sunset", "boulevard"]
    assert ranking.fused is not None and ranking.fused[0] == max(ranking.fused)
    # the hit's score is its embedding similarity: what vector mode gives for it
    vector, _ = _search(ocr_index, model, "sunset boulevard", "vector", k=20)
    assert dict((n, s) for n, s, _ in vector)[SIGN] == pytest.approx(hits[0][1], abs=1e-5)
    assert [n for n, _, _ in vector][0] != SIGN           # by its look alone, the tiny model does not find it
    plain, _ = _search(plain_index, model, "sunset boulevard", "hybrid")
    assert plain[0][0] != SIGN and all(m == [] for _, _, m in plain)
    assert [n for n, _, _ in plain] == [n for n, _, _ in vector[:5]]   # no keyword hit: the vector ranking
    assert _search(plain_index, model, "sunset boulevard", "keyword")[0] == []
    gallery = Gallery.load(ocr_index, model=model)
    sign = next(r.id for r in gallery.meta.all_images() if r.path.endswith(SIGN))
    assert ("SUNSET", pytest.approx(96, abs=5)) in gallery.meta.ocr_words(sign)
    assert gallery.manifest["ocr"]["lang"] == "eng"
    gallery.close()


def test_keyword_search_by_file_name_and_folder(ocr_index, photos, model):
    for text, words in (("IMG_2041", ["img", "2041"]), ("photo 2041", ["2041"])):
        hits, _ = _search(ocr_index, model, text, "keyword")
        assert [(n, m) for n, _, m in hits] == [(CAMERA, words)]
    hits, _ = _search(ocr_index, model, "trip", "keyword", k=20)          # the folder's name: every photo
    assert len(hits) == len(list(photos.iterdir())) and all(m == ["trip"] for _, _, m in hits)
    hits, _ = _search(ocr_index, model, "2041", "hybrid", min_score=1.0)  # the cut applies to the similarity
    assert hits == []


def test_remove_and_sync_keep_the_keyword_table_in_step(ocr_index, photos, model, tmp_path):
    root = tmp_path / "index"
    shutil.copytree(ocr_index, root)
    remove(root, paths=[photos / SIGN])
    assert _search(root, model, "sunset", "keyword")[0] == []
    gallery = Gallery.load(root, model=model)
    db = sqlite3.connect(gallery.root / gallery.generation / "metadata.sqlite")
    ids = {r[0] for r in db.execute("SELECT id FROM images")}
    assert {r[0] for r in db.execute("SELECT rowid FROM keywords")} == ids
    assert {r[0] for r in db.execute("SELECT image_id FROM ocr_words")} <= ids
    db.close()
    gallery.close()
    # sync: a new photo is read and indexed, a deleted one leaves the keyword table
    folder = tmp_path / "trip"
    shutil.copytree(photos, folder)
    build(root, model, sorted(folder.iterdir()), options=BuildOptions(image_root=folder, ocr=OcrConfig()),
          embedding=EmbedOptions(progress=False, workers=0))
    _sign(folder / "scan.jpg", "HARBOR LANE")
    report = sync(root, model, folder, embedding=EmbedOptions(progress=False, workers=0))
    assert len(report.image_ids) == 1
    assert [n for n, _, _ in _search(root, model, "harbor lane", "keyword")[0]] == ["scan.jpg"]
    (folder / "scan.jpg").unlink()
    (folder / CAMERA).unlink()
    sync(root, model, folder, embedding=EmbedOptions(progress=False, workers=0))
    assert _search(root, model, "harbor", "keyword")[0] == [] and _search(root, model, "2041", "keyword")[0] == []


def test_cli_build_and_search_modes(photos, tiny_model_path, tmp_path, capsys):
    from service.cli import main

    out = tmp_path / "index"
    assert main(["index", "build", "--model", str(tiny_model_path), "--images", str(photos), "--out", str(out),
                 "--workers", "0", "--quiet", "--no-videos", "--ocr"]) == 0
    capsys.readouterr()
    assert main(["index", "search", "--model", str(tiny_model_path), "--index", str(out), "--text",
                 "sunset boulevard", "--mode", "hybrid", "--k", "3", "--json"]) == 0
    results = json.loads(capsys.readouterr().out)["results"]
    assert Path(results[0]["path"]).name == SIGN and results[0]["matched"] == ["sunset", "boulevard"]
    assert main(["index", "search", "--model", str(tiny_model_path), "--index", str(out), "--image",
                 str(photos / SIGN), "--mode", "keyword"]) != 0
    assert "--mode keyword needs --text" in capsys.readouterr().err
    assert main(["index", "build", "--model", str(tiny_model_path), "--images", str(photos), "--out",
                 str(tmp_path / "other"), "--ocr-lang", "zzz", "--ocr"]) != 0
    err = capsys.readouterr().err
    assert "no data for the language(s) zzz" in err and "apt-get install tesseract-ocr tesseract-ocr-zzz" in err
    assert not (tmp_path / "other").exists()


def test_api_modes(ocr_index, tiny_model_path):
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import Settings

    app = create_app(Settings(model=str(tiny_model_path), index=str(ocr_index), reload_interval_s=0))
    with TestClient(app) as client:
        wait_ready(client)
        r = client.post("/v1/search/images", json={"text": "sunset boulevard", "k": 3, "mode": "hybrid"})
        assert r.status_code == 200, r.text
        first = r.json()["results"][0]
        assert first["name"] == SIGN and first["matched"] == ["sunset", "boulevard"]
        assert first["keyword_score"] > 0 and first["fused_score"] > 0
        r = client.post("/v1/search/images", json={"text": "IMG_2041", "k": 3, "mode": "keyword"})
        assert [h["name"] for h in r.json()["results"]] == [CAMERA]
        plain = client.post("/v1/search/images", json={"text": "sunset boulevard", "k": 3}).json()["results"]
        assert all(h["matched"] is None and h["fused_score"] is None for h in plain)
        r = client.post("/v1/search/images", json={"text": "sunset", "mode": "fuzzy"})
        assert r.status_code == 422 and "'vector', 'keyword' or 'hybrid'" in r.text
        spec = client.get("/openapi.json").json()
        text_search = next(s for name, s in spec["components"]["schemas"].items() if name.startswith("TextSearch"))
        assert text_search["properties"]["mode"]["enum"] == ["vector", "keyword", "hybrid"]
        assert text_search["properties"]["mode"]["default"] == "vector"
        assert "matched" in spec["components"]["schemas"]["ImageHit"]["properties"]


def test_the_install_steps_install_tesseract():
    """``make test`` installs Tesseract where it is root (the ``ocr`` target); the container image has it."""
    repo = Path(__file__).resolve().parents[1]
    makefile = (repo / "Makefile").read_text()
    assert "TESSERACT_PACKAGES := tesseract-ocr tesseract-ocr-eng" in makefile
    assert any(line.startswith("test:") and " ocr " in f"{line} " for line in makefile.splitlines())
    dockerfile = (repo / "Dockerfile").read_text()
    assert "tesseract-ocr tesseract-ocr-eng" in dockerfile


def test_an_index_written_before_the_keyword_table_gets_it_at_its_next_update(plain_index, photos, model, tmp_path):
    root = tmp_path / "index"
    shutil.copytree(plain_index, root)
    gallery = Gallery.load(root, model=model)
    db = sqlite3.connect(gallery.root / gallery.generation / "metadata.sqlite")
    gallery.close()
    with db:
        for name, kind in db.execute("SELECT name, type FROM sqlite_master WHERE type IN ('trigger', 'table') "
                                     "AND (name LIKE 'keywords%' OR name LIKE 'ocr_%')").fetchall():
            if kind == "trigger" or name in ("keywords", "ocr_words", "ocr_photos"):
                db.execute(f"DROP {kind.upper()} IF EXISTS {name}")
    db.close()
    assert _search(root, model, "2041", "keyword")[0] == []              # read-only: no table, no keyword hits
    assert _search(root, model, "2041", "hybrid")[0] == _search(root, model, "2041", "vector")[0]
    remove(root, paths=[photos / SIGN])                                  # any update writes the table
    assert [n for n, _, _ in _search(root, model, "2041", "keyword")[0]] == [CAMERA]
