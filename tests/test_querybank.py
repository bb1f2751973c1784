"""QB-Norm inside the index (index/qbnorm.py): the folded FAISS search ranks exactly as the inverted softmax,
matches `jointspace evaluate --querybank-norm`, survives add/sync, and is chosen per index from the CLI."""
import json
import shutil

import numpy as np
import pytest
import torch

from index.embed import embed_photos, embed_sentences
from index.changes import BuildOptions
from index.gallery import EmbedOptions, Gallery, add, build, sync
from index.generations import read_manifest
from index.qbnorm import QueryBank
from service.cli import main as cli_main
from training.data.datasets import load_dataset
from training.evaluate import querybank_metrics
from training.inference.querybank import item_offsets
from training.models.checkpoint import load_model
from conftest import build_index, embedded_gallery

BETA = 20.0


@pytest.fixture(scope="module")
def model(tiny_model_path):
    return load_model(tiny_model_path)


@pytest.fixture(scope="module")
def parts(model, synth_small):
    """The gallery (val + test) and the bank (train) of the synthetic set, embedded once."""
    bank_records = load_dataset(synth_small).split("train").images
    bank = QueryBank(captions=embed_sentences(model, [c for r in bank_records for c in r.captions], progress=False),
                     images=embed_photos(model, [r.path for r in bank_records], progress=False,
                                              workers=0).vectors, beta=BETA)
    return *embedded_gallery(model, synth_small), bank


@pytest.fixture(scope="module")
def qb_index(tiny_model_path, synth_small, parts, tmp_path_factory):
    return build_index(tiny_model_path, synth_small, tmp_path_factory.mktemp("qb") / "index", querybank=parts[-1])


def test_folded_search_is_the_inverted_softmax(model, parts, qb_index):
    records, captions, img, cap, bank = parts
    gallery = Gallery.load(qb_index, model=model)
    off_img = item_offsets(torch.from_numpy(bank.captions.astype(np.float32)), torch.from_numpy(img), BETA).numpy()
    off_cap = item_offsets(torch.from_numpy(bank.images.astype(np.float32)), torch.from_numpy(cap), BETA).numpy()
    assert np.ptp(off_img) > 1e-3 and np.ptp(off_cap) > 1e-3       # the correction changes scores per item

    # text → image: every caption against every image; scores s − o_image, ranked as exp(βs)/Σ_b exp(βs_b)
    hits = gallery.search_images(cap, len(records))
    expected = cap @ img.T - off_img[None, :]
    for q, row in enumerate(hits):
        ids = [i for i, _ in row]
        assert sorted(ids) == list(range(len(records)))
        assert np.allclose([s for _, s in row], expected[q][ids], atol=1e-4)
        inv_softmax = np.exp(BETA * (cap[q] @ img.T)) / np.exp(BETA * (bank.captions.astype(np.float32) @ img.T)).sum(0)
        assert np.all(np.diff(inv_softmax[ids]) <= 1e-6 * inv_softmax.max())
    # image → text with the image bank
    hits = gallery.search_captions(img, len(captions))
    expected = img @ cap.T - off_cap[None, :]
    for q, row in enumerate(hits):
        ids = [i for i, _ in row]
        assert np.allclose([s for _, s in row], expected[q][ids], atol=1e-4)
        assert np.all(np.diff(expected[q][ids]) <= 1e-5)
    # the stored embedding of an image comes back without its offset coordinate
    assert gallery.image_vector(3).shape == (img.shape[1],)
    assert np.allclose(gallery.image_vector(3), img[3], atol=1e-5)
    gallery.close()


def test_index_recalls_equal_evaluate_querybank_norm(model, parts, qb_index):
    """R@K from the served index = `evaluate --querybank-norm` (training/evaluate.py) on the same vectors."""
    records, captions, img, cap, bank = parts
    cap_to_img = torch.tensor([pos for _, pos in captions])
    ref = querybank_metrics(torch.from_numpy(img), torch.from_numpy(cap), cap_to_img,
                            torch.from_numpy(bank.images.astype(np.float32)),
                            torch.from_numpy(bank.captions.astype(np.float32)), BETA)
    gallery = Gallery.load(qb_index, model=model)
    t2i = [[i for i, _ in row].index(int(cap_to_img[q])) + 1
           for q, row in enumerate(gallery.search_images(cap, len(records)))]
    i2t = [min([i for i, _ in row].index(c) for c in np.flatnonzero(cap_to_img.numpy() == q)) + 1
           for q, row in enumerate(gallery.search_captions(img, len(captions)))]
    gallery.close()
    for k in (1, 5, 10):
        assert round(100.0 * np.mean(np.array(t2i) <= k), 4) == pytest.approx(ref["t2i"][f"r{k}"], abs=1e-3)
        assert round(100.0 * np.mean(np.array(i2t) <= k), 4) == pytest.approx(ref["i2t"][f"r{k}"], abs=1e-3)


def test_added_and_synced_images_get_offsets_from_the_stored_bank(model, parts, qb_index, synth_small, tmp_path):
    records, captions, img, cap, bank = parts
    root = shutil.copytree(qb_index, tmp_path / "index")
    extra = load_dataset(synth_small).split("train").images[:3]
    report = add(root, model, [r.path for r in extra], ["a brand new caption"],
                 embedding=EmbedOptions(progress=False, workers=0))
    gallery = Gallery.load(root, model=model)
    new = embed_photos(model, [r.path for r in extra], progress=False, workers=0).vectors
    folded = bank.fold("images", new)
    for i, vec in zip(report.image_ids, folded):
        assert np.allclose(gallery.images.reconstruct(i), vec, atol=1e-4)
        assert np.allclose(gallery.image_vector(i), new[report.image_ids.index(i)], atol=1e-5)
    new_cap = embed_sentences(model, ["a brand new caption"], progress=False)
    assert np.allclose(gallery.captions.reconstruct(report.caption_ids[0]), bank.fold("captions", new_cap)[0],
                       atol=1e-4)
    gallery.close()
    # sync a folder: its files are folded the same way; every generation names the one bank file
    folder = tmp_path / "photos"
    folder.mkdir()
    for r in extra[:2]:
        shutil.copy(r.path, folder / r.path.name)
    report = sync(root, model, folder, embedding=EmbedOptions(progress=False, workers=0))
    gallery = Gallery.load(root, model=model)
    for i in report.image_ids:
        assert gallery.images.reconstruct(i).shape == (img.shape[1] + 1,)
    assert len(list(root.glob("querybank-*.npz"))) == 1
    assert read_manifest(root)["querybank"]["file"] == read_manifest(qb_index)["querybank"]["file"]
    gallery.close()


def test_cli_build_with_a_querybank_then_without(tiny_model_path, synth_small, tmp_path, capsys):
    out, caps = tmp_path / "index", tmp_path / "bank.txt"
    caps.write_text("a red circle\n\na blue square on the left\n")
    args = ["index", "build", "--model", str(tiny_model_path), "--data", str(synth_small), "--split", "val",
            "--out", str(out), "--workers", "0", "--quiet"]
    assert cli_main(args + ["--querybank", str(caps), "--qb-beta", "10"]) == 0
    manifest = read_manifest(out)
    assert manifest["querybank"]["captions"] == 2 and manifest["querybank"]["images"] == 0
    assert manifest["querybank"]["beta"] == 10.0
    gallery = Gallery.load(out)
    assert gallery.images.dim == manifest["dim"] + 1 and gallery.captions.dim == manifest["dim"]   # only t→i
    gallery.close()
    capsys.readouterr()
    assert cli_main(["index", "search", "--index", str(out), "--model", str(tiny_model_path),
                     "--text", "a red circle", "--k", "3", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["results"]) == 3
    # a data set as the bank: both sides; then a rebuild without one drops the bank file
    assert cli_main(args + ["--querybank", str(synth_small)]) == 0
    manifest = read_manifest(out)
    assert manifest["querybank"]["captions"] > 0 and manifest["querybank"]["images"] > 0
    assert cli_main(args + ["--no-querybank"]) == 0
    assert cli_main(args + ["--no-querybank"]) == 0          # the generations that named a bank are gone now
    assert "querybank" not in read_manifest(out) and not list(out.glob("querybank-*.npz"))
    assert cli_main(args + ["--querybank", str(tmp_path / "nope.txt")]) == 2
    assert "no such file or data set" in capsys.readouterr().err


def test_bad_banks_are_refused(tmp_path):
    with pytest.raises(ValueError, match="captions and/or images"):
        QueryBank()
    with pytest.raises(ValueError, match="non-empty"):
        QueryBank(captions=np.zeros((0, 4), np.float32))
    with pytest.raises(ValueError, match="beta"):
        QueryBank(captions=np.ones((2, 4), np.float32), beta=0)
    with pytest.raises(FileNotFoundError, match="missing"):
        QueryBank.load(tmp_path, {"file": "querybank-0.npz", "beta": 20.0})


def test_a_bank_file_met_before_is_copied_from_the_cache_once_checked(parts, tmp_path, monkeypatch):
    """The bank file is named by its vectors and beta; a second index of the same bank copies the cached file
    (its reference sets are not computed again) once it is read back and matches its name; a damaged or foreign
    cached file is made again; another beta is another file."""
    *_, bank = parts
    cache = tmp_path / "cache"
    first = bank.save(tmp_path / "one", cache)
    made = (tmp_path / "one" / first["file"]).read_bytes()
    assert (cache / first["file"]).read_bytes() == made
    assert first["references"] == {"images": len(bank.images), "captions": len(bank.captions)}

    monkeypatch.setattr(QueryBank, "reference", lambda *a: pytest.fail("reference sets computed again"))
    assert bank.save(tmp_path / "two", cache) == first
    assert (tmp_path / "two" / first["file"]).read_bytes() == made
    monkeypatch.undo()

    (cache / first["file"]).write_bytes(made[:len(made) // 2])          # a damaged cache file
    assert bank.save(tmp_path / "three", cache) == first
    assert (tmp_path / "three" / first["file"]).read_bytes() == made
    other = QueryBank(captions=bank.captions[::-1].copy(), images=bank.images, beta=BETA)
    shutil.copy(tmp_path / "one" / first["file"], cache / f"querybank-{other.key()}.npz")   # another bank's file
    entry = other.save(tmp_path / "four", cache)
    assert entry["file"] == f"querybank-{other.key()}.npz" != first["file"]
    with np.load(tmp_path / "four" / entry["file"]) as z:
        np.testing.assert_array_equal(z["captions"], other.captions)
    warmer = QueryBank(captions=bank.captions, images=bank.images, beta=BETA / 2)
    assert warmer.key() != bank.key()
