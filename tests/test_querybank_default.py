"""The query bank a model carries (training/inference/querybank.py; attached after training by
training/inference/querybank.py) and `index build`'s default use of it; gallery-side test-time augmentation
(`index build --tta flip`) and its unchanged query-time cost."""
import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

import index.embed
import index.gallery
from index.embed import embed_photos, embed_sentences
from index.changes import BuildOptions
from index.gallery import EmbedOptions, Gallery, build
from index.generations import read_manifest
import index.qbnorm
from index.qbnorm import bank_cache, embed_bank_captions, model_bank
from server_process import wait_ready
from service.cli import main as cli_main
from training.config import build_config
from training.data.datasets import load_dataset
from training.data.preprocess import ZOOM, MirroredViews, Preprocess, StackedPreprocess, zoomed
from training.inference.embedding import embed_pixels
from training.inference.querybank import item_offsets
from training.models.checkpoint import load_model
from training.inference.querybank import attach, caption_vectors, carried, image_vectors, quantize_images
from training.inference.querybank import BankDraw, make_bank
from training.train import attach_from_training


@pytest.fixture(scope="module")
def model(tiny_model_path):
    return load_model(tiny_model_path)


@pytest.fixture
def model_copy(tiny_model_path, tmp_path):
    return shutil.copy(tiny_model_path, tmp_path / "model.pt")


def _build(model_path, data, out, *extra):
    return cli_main(["index", "build", "--model", str(model_path), "--data", str(data), "--split", "val",
                     "--out", str(out), "--workers", "0", "--quiet", *extra])


# --- the bank in model.pt ---------------------------------------------------------------------------------------

def test_a_trained_model_carries_a_bank_from_its_training_split(model, synth_small):
    bank = carried(model)
    train = load_dataset(synth_small).split("train")
    texts = {c for r in train.images for c in r.captions}
    n_caps = sum(len(r.captions) for r in train.images)
    assert bank is not None and bank["beta"] == 20.0
    assert len(bank["captions"]) == min(10000, n_caps) and set(bank["captions"]) <= texts
    assert tuple(bank["images"].shape) == (min(5000, train.n_images), model.cfg.model.embed_dim)
    assert bank["images"].dtype == torch.int8 and bank["image_scales"].shape == (len(bank["images"]),)
    assert model.cfg.querybank.model_dump() == {"enabled": True, "captions": 10000, "images": 5000, "beta": 20.0}


def test_the_bank_round_trips_through_model_pt_and_keeps_the_fingerprint(model, model_copy, synth_small):
    train = load_dataset(synth_small).split("train")
    bank = make_bank(model, train, BankDraw(captions=7, images=3, beta=12.5, seed=3))
    assert len(bank["captions"]) == 7 and tuple(bank["images"].shape) == (3, model.cfg.model.embed_dim)
    attach(model_copy, bank)
    again = load_model(model_copy)
    got = carried(again)
    assert got["captions"] == bank["captions"] and got["beta"] == 12.5
    assert torch.equal(got["images"], bank["images"]) and torch.equal(got["image_scales"], bank["image_scales"])
    assert again.fingerprint == model.fingerprint
    # the stored images are this model's embeddings of three distinct training images, within half a step
    direct = embed_photos(model, [r.path for r in train.images], progress=False, workers=0).vectors
    stored = image_vectors(got)
    rows = {int(np.argmax(direct @ v)) for v in stored}
    assert len(rows) == 3
    for v, scale in zip(stored, got["image_scales"].numpy()):
        assert np.abs(direct - v).max(1).min() <= scale / 2 + 1e-6
    attach(model_copy, None)
    assert carried(load_model(model_copy)) is None and load_model(model_copy).fingerprint == model.fingerprint


def test_the_config_sizes_or_turns_off_the_bank(model, model_copy, synth_small):
    train = load_dataset(synth_small).split("train")
    attach(model_copy, None)
    off = build_config(model.cfg.model_dump(), ["querybank.enabled=false"])
    assert attach_from_training(off, model_copy, train, log=lambda *_: None) is None
    assert carried(load_model(model_copy)) is None
    sized = build_config(model.cfg.model_dump(), ["querybank.captions=4", "querybank.images=0"])
    bank = attach_from_training(sized, model_copy, train, log=lambda *_: None)
    assert len(bank["captions"]) == 4
    assert len(carried(load_model(model_copy))["captions"]) == 4 and len(carried(load_model(model_copy))["images"]) == 0


def test_bank_images_are_one_byte_a_dimension_and_float16_banks_still_read(model, model_copy, synth_small,
                                                                            tmp_path, monkeypatch):
    vectors = torch.nn.functional.normalize(torch.randn(50, 64, generator=torch.Generator().manual_seed(0)), dim=1)
    rows, scales = quantize_images(vectors)
    assert rows.dtype == torch.int8 and rows.abs().max() == 127 and scales.shape == (50,)
    back = image_vectors({"images": rows, "image_scales": scales})
    assert np.abs(back - vectors.numpy()).max(1).max() <= scales.max().item() / 2 + 1e-7   # within half a step
    # a bank written before the quantisation: float16 images, no scales, read and folded as before
    train = load_dataset(synth_small).split("train")
    bank = make_bank(model, train, BankDraw(captions=5, images=4, beta=20.0))
    old = {**bank, "images": torch.from_numpy(image_vectors(bank)).half()}
    del old["image_scales"]
    np.testing.assert_array_equal(image_vectors(old), old["images"].float().numpy())
    attach(model_copy, old)
    monkeypatch.setenv("JOINTSPACE_CACHE", str(tmp_path / "cache"))       # its captions' vectors: not the shared cache
    assert _build(model_copy, synth_small, tmp_path / "index") == 0
    assert read_manifest(tmp_path / "index")["querybank"]["images"] == 4


def test_the_querybank_command_attaches_a_bank_to_a_model_and_removes_it(model, model_copy, synth_small, capsys):
    assert cli_main(["querybank", "--model", str(model_copy), "--data", str(synth_small), "--captions", "6",
                     "--images", "5", "--beta", "15", "--seed", "2"]) == 0
    assert "6 captions and 5 images" in capsys.readouterr().out
    got = carried(load_model(model_copy))
    want = make_bank(model, load_dataset(synth_small).split("train"), BankDraw(captions=6, images=5, beta=15.0, seed=2))
    assert got["captions"] == want["captions"] and got["beta"] == 15.0
    np.testing.assert_allclose(image_vectors(got), image_vectors(want), atol=1e-6)
    assert load_model(model_copy).fingerprint == model.fingerprint
    assert cli_main(["querybank", "--model", str(model_copy), "--remove"]) == 0
    assert carried(load_model(model_copy)) is None
    assert cli_main(["querybank", "--model", str(model_copy)]) == 2
    assert "--data is needed" in capsys.readouterr().err
    assert cli_main(["querybank", "--model", str(model_copy), "--data", str(model_copy.parent)]) == 2
    assert "error:" in capsys.readouterr().err
    for bad, message in ((["--images", "-1"], "--images is a count"), (["--beta", "0"], "--beta must be positive")):
        assert cli_main(["querybank", "--model", str(model_copy), "--data", str(synth_small), *bad]) == 2
        assert message in capsys.readouterr().err


# --- index build: the model's bank by default ------------------------------------------------------------------

def test_index_build_uses_the_model_bank_by_default(tiny_model_path, model, synth_small, tmp_path, capsys):
    out = tmp_path / "index"
    assert _build(tiny_model_path, synth_small, out) == 0
    assert "hubness-corrected (text→image and image→text; model query bank" in capsys.readouterr().out
    manifest = read_manifest(out)
    bank = carried(model)
    assert manifest["querybank"]["origin"] == "model"
    assert manifest["querybank"]["captions"] == len(bank["captions"])
    assert manifest["querybank"]["images"] == len(bank["images"])
    # used: scores are cosine minus the offset of the model's bank (QB-Norm eq. 3, folded)
    records = load_dataset(synth_small).split("val").images
    assert manifest["tta"] == "flip-crop"          # the default: each image, a closer crop and their mirror images
    img = embed_photos(model, [r.path for r in records], progress=False, workers=0, tta="flip-crop").vectors
    queries = embed_sentences(model, ["a red circle", "a blue square"], progress=False)
    offsets = item_offsets(torch.from_numpy(embed_sentences(model, bank["captions"], progress=False)),
                           torch.from_numpy(img), 20.0).numpy()
    gallery = Gallery.load(out, model=model)
    info = gallery.info()["hubness_correction"]
    assert info == {"text_to_image": True, "image_to_text": True, "bank": "model",
                    "bank_captions": len(bank["captions"]), "bank_images": len(bank["images"]), "beta": 20.0,
                    "references": {"images": min(len(bank["images"]), 1000),          # index/relevance.py
                                   "captions": min(len(bank["captions"]), 1000)}}
    for q, row in zip(queries, gallery.search_images(queries, len(records))):
        ids = [i for i, _ in row]
        assert np.allclose([s for _, s in row], (q @ img.T - offsets)[ids], atol=2e-3)
    gallery.close()
    # index info says so too
    assert cli_main(["index", "info", "--index", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["hubness_correction"]["text_to_image"] is True


def test_the_model_carries_its_bank_captions_vectors_and_a_build_embeds_none_of_them(model, model_copy,
                                                                                    synth_small, tmp_path,
                                                                                    monkeypatch):
    """A trained model's bank carries its captions' vectors (one byte a dimension, within half a step of
    embed_sentences), used by index build only for the model whose fingerprint they name."""
    bank = carried(model)
    assert bank["vectors_of"] == model.fingerprint and bank["caption_vectors"].dtype == torch.int8
    carried_vectors = caption_vectors(bank, model)
    direct = embed_sentences(model, list(bank["captions"]), progress=False)
    assert carried_vectors.shape == direct.shape
    assert (np.abs(carried_vectors - direct).max(1) <= bank["caption_scales"].numpy() / 2 + 1e-6).all()

    def no_embedding(*args, **kwargs):
        raise AssertionError("the bank's captions were embedded although the model carries their vectors")

    monkeypatch.setattr(index.qbnorm, "embed_bank_captions", no_embedding)
    qb = model_bank(model, progress=False)
    assert np.array_equal(qb.captions, carried_vectors.astype(np.float16))
    assert _build(model_copy, synth_small, tmp_path / "carried") == 0
    # vectors of another model are not this one's: its captions are embedded instead
    monkeypatch.undo()
    attach(model_copy, {**bank, "vectors_of": "0" * 64})
    other = load_model(model_copy)
    assert caption_vectors(carried(other), other) is None
    assert np.allclose(model_bank(other, progress=False, cache=tmp_path / "cache").captions, direct, atol=2e-3)


def _without_caption_vectors(model_path) -> None:
    """The bank of the model at ``model_path`` without its captions' vectors (as older files hold it)."""
    bank = {k: v for k, v in carried(load_model(model_path)).items()
            if k not in ("caption_vectors", "caption_scales", "vectors_of")}
    attach(model_path, bank)


def test_the_embedded_bank_is_cached_per_model(model, synth_small, model_copy, tmp_path, monkeypatch):
    tiny_model_path = model_copy
    _without_caption_vectors(tiny_model_path)
    captions = list(carried(model)["captions"])
    cache = tmp_path / "cache"
    first, hit = embed_bank_captions(model, captions, progress=False, cache=cache)
    assert not hit and len(list(cache.glob("*.npy"))) == 1
    second, hit = embed_bank_captions(model, captions, progress=False, cache=cache)
    assert hit and np.array_equal(first, second)
    assert np.allclose(first, embed_sentences(model, captions, progress=False), atol=2e-3)
    # the CLI goes through the cache under $JOINTSPACE_CACHE: a second build embeds only the gallery's captions
    assert _build(tiny_model_path, synth_small, tmp_path / "a") == 0
    assert len(list(bank_cache().glob(f"{model.fingerprint[:20]}-*.npy"))) == 1
    sizes = []
    real = index.embed.embed_sentences

    def counted(m, texts, **kw):
        sizes.append(len(texts))
        return real(m, texts, **kw)

    # what the bank is embedded with, and the gallery's captions (index/gallery.py imports it where it embeds)
    monkeypatch.setattr(index.embed, "embed_sentences", counted)
    assert _build(tiny_model_path, synth_small, tmp_path / "b") == 0
    n_val = sum(len(r.captions) for r in load_dataset(synth_small).split("val").images)
    assert sizes == [n_val]
    assert read_manifest(tmp_path / "a")["querybank"]["file"] == read_manifest(tmp_path / "b")["querybank"]["file"]


def test_no_querybank_switches_it_off_and_querybank_overrides_it(tiny_model_path, synth_small, tmp_path, capsys):
    out = tmp_path / "index"
    assert _build(tiny_model_path, synth_small, out, "--no-querybank") == 0
    assert "no hubness correction" in capsys.readouterr().out
    assert "querybank" not in read_manifest(out)
    gallery = Gallery.load(out)
    assert gallery.info()["hubness_correction"]["text_to_image"] is False
    assert gallery.images.dim == read_manifest(out)["dim"]          # raw cosine vectors
    gallery.close()
    bank_file = tmp_path / "bank.txt"
    bank_file.write_text("a red circle\na green triangle\na blue square\n")
    assert _build(tiny_model_path, synth_small, out, "--querybank", str(bank_file), "--qb-beta", "5") == 0
    entry = read_manifest(out)["querybank"]
    assert (entry["origin"], entry["captions"], entry["images"], entry["beta"]) == (str(bank_file), 3, 0, 5.0)
    assert _build(tiny_model_path, synth_small, out, "--qb-beta", "7") == 0       # the model's bank, another beta
    assert read_manifest(out)["querybank"]["origin"] == "model" and read_manifest(out)["querybank"]["beta"] == 7.0
    with pytest.raises(SystemExit):
        _build(tiny_model_path, synth_small, out, "--querybank", str(bank_file), "--no-querybank")
    assert "not allowed with argument" in capsys.readouterr().err


def test_a_model_without_a_bank_builds_without_correction(model_copy, synth_small, tmp_path, model):
    attach(model_copy, None)
    assert model_bank(load_model(model_copy)) is None
    assert _build(model_copy, synth_small, tmp_path / "index") == 0
    assert "querybank" not in read_manifest(tmp_path / "index")


def test_add_folds_new_items_with_the_default_bank(tiny_model_path, model, synth_small, tmp_path, capsys):
    out = tmp_path / "index"
    assert _build(tiny_model_path, synth_small, out) == 0
    extra = load_dataset(synth_small).split("train").images[0]
    capsys.readouterr()
    assert cli_main(["index", "add", "--index", str(out), "--model", str(tiny_model_path), str(extra.path),
                     "--workers", "0", "--quiet", "--json"]) == 0
    new_id = json.loads(capsys.readouterr().out)["image_ids"][0]
    bank = model_bank(model)
    vec = embed_photos(model, [extra.path], progress=False, workers=0, tta="flip-crop").vectors
    gallery = Gallery.load(out, model=model)
    assert np.allclose(gallery.images.reconstruct(new_id), bank.fold("images", vec)[0], atol=1e-3)
    gallery.close()


def test_readyz_says_whether_the_index_is_hubness_corrected(tiny_model_path, tiny_index_dir, synth_small, tmp_path):
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import Settings

    corrected = tmp_path / "index"
    assert _build(tiny_model_path, synth_small, corrected) == 0
    for root, expected in ((corrected, True), (tiny_index_dir, False)):
        with TestClient(create_app(Settings(model=str(tiny_model_path), index=str(root), reload_interval_s=0))) as c:
            hub = wait_ready(c).get("/readyz").json()["hubness_correction"]
            assert hub["text_to_image"] is expected and hub["image_to_text"] is expected
            assert hub["bank"] == ("model" if expected else None)


# --- gallery-side test-time augmentation ------------------------------------------------------------------------

def test_mirrored_views_are_the_views_of_the_mirror_image():
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8))
    base = Preprocess(image_size=32, resize=32)              # the whole image: its view's mirror is exact
    px = MirroredViews(base).pixels(image)
    assert px.shape == (2, 3, 32, 32) and MirroredViews(base).crops == 2
    assert torch.equal(px[0], base.pixels(image)[0]) and torch.equal(px[1], torch.flip(px[0], dims=[-1]))
    stacked = StackedPreprocess((Preprocess(image_size=32, resize=32), Preprocess(image_size=24, resize=24)))
    px = MirroredViews(stacked).pixels(image)
    small = stacked.members[1].pixels(image.transpose(Image.Transpose.FLIP_LEFT_RIGHT))[0]
    assert px.shape == (2, 6, 32, 32) and torch.equal(px[1, 3:, :24, :24], small)     # top-left, not flipped off it


def test_flip_crop_adds_a_closer_centre_crop_and_its_mirror_image():
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 40, 3), dtype=np.uint8))
    mirror = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    base = Preprocess(image_size=32, resize=32)
    views = MirroredViews(base, zoom=ZOOM)
    px = views.pixels(image)
    assert px.shape == (4, 3, 32, 32) and views.crops == 4
    close = Preprocess(image_size=32, resize=37)             # 32 · 8/7, then the centre 32 × 32
    assert zoomed(base) == close and views.min_side == 37 > MirroredViews(base).min_side
    assert torch.equal(px[:2], MirroredViews(base).pixels(image))          # the flip views first, unchanged
    assert torch.equal(px[2], close.pixels(image)[0]) and torch.equal(px[3], close.pixels(mirror)[0])
    assert not torch.equal(px[2], px[0])
    # a stacked preprocessing: every member enlarged by the same factor, each in its own top-left corner
    stacked = StackedPreprocess((Preprocess(image_size=32, resize=32), Preprocess(image_size=24, resize=24)))
    assert zoomed(stacked).members == (close, Preprocess(image_size=24, resize=27))
    px = MirroredViews(stacked, zoom=ZOOM).pixels(image)
    assert px.shape == (4, 6, 32, 32)
    assert torch.equal(px[3, 3:, :24, :24], Preprocess(image_size=24, resize=27).pixels(mirror)[0])


@pytest.mark.parametrize("tta", ["flip", "flip-crop"])
def test_tta_changes_the_gallery_vectors_not_the_query_time_cost(model, synth_small, tmp_path, tta):
    records = load_dataset(synth_small).split("val").images
    paths = [r.path for r in records]
    captions = [(c, pos) for pos, r in enumerate(records) for c in r.captions]
    plain, flip = tmp_path / "plain", tmp_path / "flip"
    build(plain, model, paths, captions, embedding=EmbedOptions(progress=False, workers=0))
    build(flip, model, paths, captions, options=BuildOptions(tta=tta),
          embedding=EmbedOptions(progress=False, workers=0))
    a, b = read_manifest(plain), read_manifest(flip)
    assert (a["tta"], b["tta"]) == ("none", tta)
    for key in ("dim", "similarity", "next_image_id", "next_caption_id"):
        assert a[key] == b[key]
    assert a["images"]["factory"] == b["images"]["factory"]
    ga, gb = Gallery.load(plain, model=model), Gallery.load(flip, model=model)
    assert (ga.images.dim, ga.images.ntotal) == (gb.images.dim, gb.images.ntotal)
    files = sorted(p.name for p in (plain / ga.generation).glob("images.*.faiss"))
    assert files == sorted(p.name for p in (flip / gb.generation).glob("images.*.faiss"))
    for name in files:                       # same index type and size: the same search work per query
        assert (plain / ga.generation / name).stat().st_size == (flip / gb.generation / name).stat().st_size
    # the stored vectors are the average of the views (and their mirror images), unit length, and differ from plain
    zoom = ZOOM if tta == "flip-crop" else None
    views = torch.stack([MirroredViews(model.preprocess, zoom=zoom).pixels(Image.open(p)) for p in paths[:4]])
    expected = embed_pixels(model, views).numpy()
    for i in range(4):
        assert np.allclose(gb.image_vector(i), expected[i], atol=1e-5)
    assert not np.allclose(gb.image_vector(0), ga.image_vector(0), atol=1e-4)
    assert np.allclose(np.linalg.norm([gb.image_vector(i) for i in range(4)], axis=1), 1.0, atol=1e-4)
    # a query is embedded the same way for both (one view) and searched the same way
    q = embed_sentences(model, ["a red circle"], progress=False)
    ra, rb = ga.search_images(q, 5)[0], gb.search_images(q, 5)[0]
    assert len(ra) == len(rb) == 5
    ga.close()
    gb.close()
    # images added later are embedded with the index's augmentation (a copy: the file itself is indexed already)
    import shutil

    from index.gallery import add

    copy = shutil.copy(paths[0], tmp_path / "copy.jpg")
    report = add(flip, model, [copy], embedding=EmbedOptions(progress=False, workers=0))
    gb = Gallery.load(flip, model=model)
    assert np.allclose(gb.image_vector(report.image_ids[0]), gb.image_vector(0), atol=1e-5)
    gb.close()


def test_every_augmentation_the_parser_offers_has_its_views(tiny_model_path):
    import pickle

    from index.tta import DEFAULT_TTA, TTA

    tiny_model = load_model(tiny_model_path)
    crops = {tta: getattr(index.embed.view_preprocess(tiny_model, tta), "crops", 1) for tta in TTA}
    assert DEFAULT_TTA in TTA and crops["flip"] == 2 * crops["none"] and crops["flip-crop"] == 4 * crops["none"]
    with pytest.raises(ValueError, match="unknown test-time augmentation"):
        index.embed.view_preprocess(tiny_model, "rotate")
    views = MirroredViews(Preprocess(image_size=32, resize=32), zoom=ZOOM)
    assert views.crops == 4 and pickle.loads(pickle.dumps(views)) == views     # decoding workers get a copy


def test_tta_option_of_index_build(tiny_model_path, synth_small, tmp_path):
    assert _build(tiny_model_path, synth_small, tmp_path / "i", "--tta", "flip", "--no-querybank") == 0
    assert read_manifest(tmp_path / "i")["tta"] == "flip"
    assert _build(tiny_model_path, synth_small, tmp_path / "j", "--tta", "flip", "--engine", "ray") == 2
    assert _build(tiny_model_path, synth_small, tmp_path / "k", "--tta", "flip-crop", "--engine", "ray") == 2


def test_the_querybank_command_stores_caption_vectors_for_an_older_file(model, model_copy, capsys):
    _without_caption_vectors(model_copy)
    assert "caption_vectors" not in carried(load_model(model_copy))
    assert cli_main(["querybank", "--model", str(model_copy), "--caption-vectors"]) == 0
    again = load_model(model_copy)
    bank = carried(again)
    assert bank["vectors_of"] == again.fingerprint == model.fingerprint
    assert np.array_equal(caption_vectors(bank, again), caption_vectors(carried(model), model))
    attach(model_copy, None)
    assert cli_main(["querybank", "--model", str(model_copy), "--caption-vectors"]) == 2
    assert "carries no query bank" in capsys.readouterr().err
