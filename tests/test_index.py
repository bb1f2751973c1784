"""The gallery index: build/search against exact ranking, add/remove by id, model check, crash safety, CLI."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import tiny_config
from index.embed import embed_photos, embed_sentences
from index.faiss_index import FLAT_LIMIT, SQ_FROM, VectorIndex, default_factory
from index.changes import BuildOptions
from index.gallery import EmbedOptions, Gallery, IndexMismatchError, add, build, remove
from index.generations import current_generation
from service.cli import main as cli_main
from training.data.datasets import load_dataset
from training.data.vocab import Vocabulary
from training.models.model import build_model
from training.models.checkpoint import load_model, save_model

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model(tiny_model_path):
    return load_model(tiny_model_path)


def _records(synth_small):
    data = load_dataset(synth_small)
    return data.split("val").images + data.split("test").images


def test_search_matches_exact_ranking_and_metadata(model, tiny_index_dir, synth_small):
    gallery = Gallery.load(tiny_index_dir, model=model)
    records = _records(synth_small)
    info = gallery.info()
    assert info["images"]["factory"] == "Flat" and info["similarity"] == "cosine"
    assert gallery.images.ntotal == len(records) == info["metadata"]["images"]
    assert gallery.captions.ntotal == sum(len(r.captions) for r in records)

    img = embed_photos(model, [r.path for r in records], progress=False, workers=0).vectors
    queries = [records[0].captions[0], records[5].captions[1], "a green star"]
    q = embed_sentences(model, queries, progress=False)
    exact = model.similarity(torch.from_numpy(img), torch.from_numpy(q)).t().numpy()   # (queries, images)
    hits = gallery.search_images(q, 5)
    for row, got in zip(exact, hits):
        assert [i for i, _ in got] == np.argsort(-row)[:5].tolist()
        assert np.allclose([s for _, s in got], [row[i] for i, _ in got], atol=1e-5)
        assert all(a[1] >= b[1] for a, b in zip(got, got[1:]))                          # best first
    # metadata: id → the file it came from, caption id → its text and image
    assert gallery.meta.image(3).path == str(Path(records[3].path).resolve())
    first_caps = gallery.meta.captions([0, 1])
    assert first_caps[0].text == records[0].captions[0] and first_caps[0].image_id == 0
    gallery.close()


def test_unreadable_images_are_skipped_and_listed(model, tiny_model_path, synth_small, tmp_path, capsys):
    images = tmp_path / "photos"
    (images / "sub").mkdir(parents=True)
    good = sorted((Path(synth_small) / "images").glob("*"))[:3]
    for i, src in enumerate(good):
        (images / "sub" / f"ok{i}{src.suffix}").write_bytes(src.read_bytes())
    (images / "broken.png").write_bytes(good[0].read_bytes()[:100])      # truncated
    (images / "notes.jpg").write_text("not an image at all")
    captions = tmp_path / "caps.txt"
    captions.write_text("a red circle\n\na blue square\n")
    out = tmp_path / "index"
    rc = cli_main(["index", "build", "--model", str(tiny_model_path), "--images", str(images), "--out", str(out),
                   "--captions", str(captions), "--quiet", "--workers", "0"])
    assert rc == 0
    err = capsys.readouterr().err
    assert "broken.png" in err and "notes.jpg" in err and "2 unreadable image(s) skipped" in err
    gallery = Gallery.load(out, model=model)
    assert gallery.images.ntotal == 3 and gallery.captions.ntotal == 2
    assert sorted(Path(gallery.meta.image(i).path).stem for i in gallery.images.ids()) == ["ok0", "ok1",
                                                                                          "ok2"]


def test_add_and_remove_by_id_without_rebuild(model, index_copy, synth_small):
    before = Gallery.load(index_copy, model=model)
    n_img, n_cap, gen = before.images.ntotal, before.captions.ntotal, before.generation
    train_images = load_dataset(synth_small).split("train").images[:3]
    report = add(index_copy, model, [r.path for r in train_images], ["a brand new caption"],
                 embedding=EmbedOptions(progress=False, workers=0))
    assert report.image_ids == [n_img, n_img + 1, n_img + 2] and report.caption_ids == [n_cap]

    after = Gallery.load(index_copy, model=model)
    assert after.generation != gen and after.images.ntotal == n_img + 3 and after.captions.ntotal == n_cap + 1
    own = embed_photos(model, [train_images[1].path], progress=False, workers=0).vectors
    assert np.allclose(after.images.reconstruct(n_img + 1), own[0], atol=1e-5)
    assert after.meta.image(n_img + 1).path == str(Path(train_images[1].path).resolve())
    q = embed_sentences(model, ["a brand new caption"], progress=False)
    assert after.captions.reconstruct(n_cap).tolist() == pytest.approx(q[0].tolist(), abs=1e-5)

    report = remove(index_copy, image_ids=[0, n_img + 1, 10_000], caption_ids=[n_cap])
    assert report.removed_images == 2 and report.removed_captions == 1 and report.missing == [10_000]
    final = Gallery.load(index_copy, model=model)
    assert final.images.ntotal == n_img + 1 and final.captions.ntotal == n_cap
    assert final.meta.image(0) is None and final.meta.image(n_img + 1) is None
    ids = set(final.images.ids().tolist())
    assert 0 not in ids and n_img + 1 not in ids and n_img + 2 in ids
    every = final.search_images(q, final.images.ntotal)[0]
    assert {i for i, _ in every} == ids                       # removed ids never come back from a search
    # ids are never reused: the next add continues after the largest ever given
    again = add(index_copy, model, captions=["another"], embedding=EmbedOptions(progress=False, workers=0))
    assert again.caption_ids == [n_cap + 1]
    # only the live and the previous generation are kept on disk
    assert sorted(p.name for p in index_copy.glob("gen-*")) == sorted(
        {current_generation(index_copy), final.generation})


def test_index_built_with_another_model_is_refused(model, tiny_model_path, index_copy, tmp_path, capsys):
    other = load_model(tiny_model_path)
    with torch.no_grad():
        next(other.image_proj.parameters()).add_(0.01)
    other_path = tmp_path / "other.pt"
    save_model(other, other_path)
    other = load_model(other_path)
    assert other.fingerprint != model.fingerprint
    with pytest.raises(IndexMismatchError, match="built with model .* Rebuild the index"):
        Gallery.load(index_copy, model=other)
    with pytest.raises(IndexMismatchError):
        add(index_copy, other, captions=["x"], embedding=EmbedOptions(progress=False))
    rc = cli_main(["index", "add", "--index", str(index_copy), "--model", str(other_path), "--captions",
                   str(_write(tmp_path / "c.txt", "a caption\n")), "--quiet"])
    assert rc == 2 and "was built with model" in capsys.readouterr().err
    assert Gallery.load(index_copy, model=model).captions.ntotal > 0      # untouched


def _write(path, text):
    path.write_text(text)
    return path


CRASH_SCRIPT = r"""
import os, signal, sys
import index.faiss_index as fi
from index.gallery import EmbedOptions, add
from training.models.checkpoint import load_model

real_save = fi.VectorIndex.save
calls = []
def save_then_die(self, path):
    real_save(self, path)
    calls.append(path)
    if len(calls) == 1:                     # the new caption segment written, manifest not yet, CURRENT untouched
        with open(path, "r+b") as fh:       # leave a torn file behind too
            fh.truncate(10)
        os.kill(os.getpid(), signal.SIGKILL)
fi.VectorIndex.save = save_then_die
add(sys.argv[1], load_model(sys.argv[2]), captions=["written by a process that dies"],
    embedding=EmbedOptions(progress=False))
"""


def test_killed_update_leaves_previous_index_loadable(model, tiny_model_path, index_copy):
    before = Gallery.load(index_copy, model=model)
    gen, n_cap = before.generation, before.captions.ntotal
    q = embed_sentences(model, ["a red circle"], progress=False)
    expected = before.search_images(q, 5)
    proc = subprocess.run([sys.executable, "-c", CRASH_SCRIPT, str(index_copy), str(tiny_model_path)],
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr                         # really killed mid-write
    assert list(index_copy.glob(".tmp-gen-*")), "the dead writer's temporary generation is still there"
    after = Gallery.load(index_copy, model=model)
    assert after.generation == gen and after.captions.ntotal == n_cap
    assert after.search_images(q, 5) == expected
    # the next writer cleans up and succeeds
    report = add(index_copy, model, captions=["after the crash"], embedding=EmbedOptions(progress=False))
    assert report.caption_ids == [before.manifest["next_caption_id"]]
    assert not list(index_copy.glob(".tmp-gen-*"))


def test_failure_inside_metadata_write_keeps_previous_generation(model, index_copy, monkeypatch):
    from index import metadata

    gen = current_generation(index_copy)

    def fail(self, rows, added=None):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(metadata.Metadata, "add_captions", fail)
    with pytest.raises(OSError, match="disk full"):
        add(index_copy, model, captions=["never lands"], embedding=EmbedOptions(progress=False))
    assert current_generation(index_copy) == gen and not list(index_copy.glob(".tmp-gen-*"))
    assert Gallery.load(index_copy, model=model).generation == gen


def test_order_similarity_index_is_exact(synth_small, tmp_path):
    """STT eq. 9 is not an inner product: the index must rank with the model's own similarity.
    (An untrained order model — its ranking is as real as a trained one's, and it costs no training time.)"""
    records = _records(synth_small)[:20]
    torch.manual_seed(0)
    vocab = Vocabulary.build(c for r in records for c in r.captions)
    save_model(build_model(tiny_config(model={"similarity": "order"}), vocab), tmp_path / "order.pt")
    model = load_model(tmp_path / "order.pt")
    captions = [(c, pos) for pos, r in enumerate(records) for c in r.captions]
    build(tmp_path / "index", model, [r.path for r in records], captions,
          embedding=EmbedOptions(progress=False, workers=0))
    gallery = Gallery.load(tmp_path / "index", model=model)
    img = torch.from_numpy(embed_photos(model, [r.path for r in records], progress=False, workers=0).vectors)
    cap = torch.from_numpy(embed_sentences(model, [c for c, _ in captions], progress=False))
    sim = model.similarity(img, cap)                                    # (images, captions), eq. 9
    t2i = gallery.search_images(cap[:7].numpy(), 4)
    for c, hits in enumerate(t2i):
        assert [i for i, _ in hits] == sim[:, c].topk(4).indices.tolist()
        assert np.allclose([s for _, s in hits], sim[:, c].topk(4).values.numpy(), atol=1e-6)
    i2t = gallery.search_captions(img[:5].numpy(), 6)
    for i, hits in enumerate(i2t):
        assert [c for c, _ in hits] == sim[i].topk(6).indices.tolist()
    # an inner-product ranking would differ for these vectors: the check above is not vacuous
    ip = (img @ cap.t())
    assert any(ip[:, c].topk(4).indices.tolist() != sim[:, c].topk(4).indices.tolist() for c in range(7))
    with pytest.raises(ValueError, match="needs an exact 'Flat' index"):
        build(tmp_path / "ivf", model, [r.path for r in records], captions, options=BuildOptions(factory="IVF2,Flat"),
              embedding=EmbedOptions(progress=False, workers=0))


def test_default_factory_thresholds():
    assert default_factory(1_000, 256) == "Flat"
    assert default_factory(FLAT_LIMIT - 1, 256) == "Flat"
    assert default_factory(FLAT_LIMIT, 256).startswith("IVF") and default_factory(FLAT_LIMIT, 256).endswith(",Flat")
    assert default_factory(SQ_FROM, 256) == "IVF4096,SQ8"


def _clustered(n, d, seed, centers=200):
    rng = np.random.default_rng(seed)
    c = np.random.default_rng(1234).standard_normal((centers, d)).astype(np.float32)   # queries share the centres
    x = c[rng.integers(0, centers, n)] + 0.35 * rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_default_ivf_recall_against_exact_search():
    """The default for a 60k gallery (IVF, nprobe = nlist/16) finds ≥ 90% of the exact top-10."""
    d = 32
    x, q = _clustered(FLAT_LIMIT + 10_000, d, 0), _clustered(200, d, 1)
    factory = default_factory(len(x), d)
    ivf = VectorIndex.create(d, "images", "cosine", factory, train_vectors=x)
    ivf.add(x, np.arange(len(x)))
    flat = VectorIndex.create(d, "images", "cosine", "Flat")
    flat.add(x, np.arange(len(x)))
    _, approx = ivf.search(q, 10)
    _, exact = flat.search(q, 10)
    recall = np.mean([len(set(a) & set(e)) / 10 for a, e in zip(approx, exact)])
    assert factory.startswith("IVF") and recall >= 0.9, (factory, recall)


def test_ivf_add_remove_reconstruct_by_id_and_hnsw_refuses_removal():
    x = _clustered(600, 16, 2)
    ids = np.arange(1000, 1600)
    ivf = VectorIndex.create(16, "images", "cosine", "IVF4,Flat", train_vectors=x)
    ivf.add(x, ids)
    assert ivf.remove([1000, 1005, 7]) == 2
    assert sorted(ivf.ids().tolist()) == [i for i in ids.tolist() if i not in (1000, 1005)]
    assert np.allclose(ivf.reconstruct(1001), x[1])
    with pytest.raises(KeyError):
        ivf.reconstruct(1000)
    _, found = ivf.search(x[:50], 1)
    assert 1000 not in found and (found[1:5, 0] == ids[1:5]).all()
    hnsw = VectorIndex.create(16, "images", "cosine", "HNSW16")
    hnsw.add(x, ids)
    with pytest.raises(ValueError, match="cannot remove"):
        hnsw.remove([1001])
    with pytest.raises(ValueError, match="invalid FAISS factory"):
        VectorIndex.create(16, "images", "cosine", "NotAnIndex")
    with pytest.raises(ValueError, match="trained on at least"):
        VectorIndex.create(16, "images", "cosine", "IVF64,Flat", train_vectors=x[:10])


@pytest.mark.parametrize("factory", ["Flat", "IVF4,Flat", "HNSW16", "IVF4,PQ4"])
def test_many_vectors_are_read_back_in_one_call_as_one_at_a_time(factory):
    x = _clustered(600, 16, 2)
    index = VectorIndex.create(16, "images", "cosine", factory, train_vectors=x)
    index.add(x, np.arange(1000, 1600))
    wanted = [1599, 1000, 1234, 1234, 1001]
    many = index.reconstruct_many(wanted)
    assert many.shape == (5, 16) and many.dtype == np.float32
    assert np.array_equal(many, np.stack([index.reconstruct(i) for i in wanted]))
    assert index.reconstruct_many([]).shape == (0, 16)
    with pytest.raises(KeyError) as err:
        index.reconstruct_many([1001, 7, 1002])
    assert err.value.args == (7,)


def test_cli_build_from_dataset_add_remove_info(tiny_model_path, synth_small, tmp_path, capsys):
    out = tmp_path / "index"
    assert cli_main(["index", "build", "--model", str(tiny_model_path), "--data", str(synth_small), "--split",
                     "test", "--caption-split", "train", "--out", str(out), "--quiet", "--workers", "0"]) == 0
    capsys.readouterr()
    assert cli_main(["index", "info", "--index", str(out)]) == 0
    info = json.loads(capsys.readouterr().out)
    data = load_dataset(synth_small)
    assert info["images"]["count"] == data.split("test").n_images
    assert info["captions"]["count"] == data.split("train").n_captions
    img = sorted((Path(synth_small) / "images").glob("*"))[0]
    assert cli_main(["index", "add", "--index", str(out), "--model", str(tiny_model_path), str(img), "--quiet",
                     "--json"]) == 0
    added = json.loads(capsys.readouterr().out)
    assert added["image_ids"] == [info["next_image_id"]]
    assert cli_main(["index", "remove", "--index", str(out), "--ids", str(added["image_ids"][0]), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["removed_images"] == 1
    folder = tmp_path / "more"                      # a file given alone and inside its folder is added once
    folder.mkdir()
    for p in sorted((Path(synth_small) / "images").glob("*"))[:2]:
        shutil.copy(p, folder / p.name)
    one = sorted(folder.iterdir())[0]
    assert cli_main(["index", "add", "--index", str(out), "--model", str(tiny_model_path), str(one), str(folder),
                     "--quiet", "--workers", "0", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["image_ids"]) == 2
    assert cli_main(["index", "info", "--index", str(tmp_path / "nothing")]) == 2
    assert "no jointspace index" in capsys.readouterr().err


def test_cuda_search_falls_back_to_cpu_faiss_with_a_warning_and_same_results():
    """Where FAISS has no GPU support (faiss-cpu, as in CI) a CUDA device still searches an IVF index, on the CPU,
    and says so (a Flat one is searched in torch on the GPU: tests/test_torch_search.py). (The faiss-gpu path,
    index_cpu_to_gpu, needs a GPU machine; none is available to these tests.)"""
    import faiss

    x = _clustered(300, 16, 3)
    index = VectorIndex.create(16, "images", "cosine", "IVF4,Flat", train_vectors=x, nprobe=4)
    index.add(x, np.arange(300))
    expected = index.search(x[:5], 4)
    if hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0:
        index.to_device("cuda")
    else:
        with pytest.warns(RuntimeWarning, match="searched on the CPU"):
            index.to_device("cuda")
    got = index.search(x[:5], 4)
    assert np.array_equal(got[1], expected[1]) and np.allclose(got[0], expected[0], atol=1e-5)
    assert index.backend == ("faiss-gpu" if faiss.get_num_gpus() > 0 else "faiss-cpu")


def test_query_by_example_is_the_image_alone_or_composed_with_its_words(model, synth_small):
    """The one query by example of ``index search --image`` and the service: an image without words is its
    embedding, one with words its composed query, each row as it would be alone; region attention cannot compose."""
    from training.data.preprocess import open_image
    from training.inference.compose import compose_query, example_queries
    from training.inference.embedding import embed_pixels, pixel_features

    paths = [r.path for r in load_dataset(synth_small).split("test").images[:2]]
    pixels = torch.stack([model.preprocess.pixels(open_image(p)) for p in paths])
    words = [((), ()), (("red",), ("circle", "blue square"))]
    queries = example_queries(model, pixels, words)
    torch.testing.assert_close(queries[0], embed_pixels(model, pixels[:1])[0], atol=1e-6, rtol=0)
    composed = compose_query(model, pixel_features(model, pixels[1:])[0], *words[1])
    torch.testing.assert_close(queries[1], composed, atol=1e-6, rtol=0)
    torch.testing.assert_close(example_queries(model, pixels, [((), ())] * 2), embed_pixels(model, pixels))
    attention = build_model(tiny_config(attention={"enabled": True}), model.vocab, load_weights=False).eval()
    torch.testing.assert_close(example_queries(attention, pixels, [((), ())] * 2), embed_pixels(attention, pixels))
    with pytest.raises(ValueError, match="region attention"):
        example_queries(attention, pixels, words)


def test_evaluate_index_compose_and_service_embed_alike(model, synth_small):
    """One inference path (training/inference/embedding.py): evaluation's embeddings of a split, the index's of the same files
    and captions, a composed query without words and the service engine's agree."""
    from service.engine import Engine
    from service.images import upload_to_pixels
    from training.inference.compose import compose_query, image_features_of
    from training.data.features import ImageFiles
    from training.data.sources import ImageSource
    from training.inference.embedding import embed_image_source, embed_split

    split = load_dataset(synth_small).split("test")
    paths = [r.path for r in split.images]
    texts = [c for r in split.images for c in r.captions]
    img, cap, cap_to_img = embed_split(model, split, progress=False, workers=0)          # what evaluate scores
    assert img.shape == (len(paths), model.cfg.model.embed_dim) and cap.shape[0] == len(texts)
    files = embed_image_source(model, ImageSource("files", ImageFiles(paths, model.preprocess)), workers=0)
    indexed = embed_photos(model, paths, progress=False, workers=0)
    assert indexed.kept == list(range(len(paths))) and not indexed.skipped
    torch.testing.assert_close(torch.from_numpy(indexed.vectors), img, atol=1e-6, rtol=0)
    torch.testing.assert_close(files.cpu(), img, atol=1e-6, rtol=0)
    torch.testing.assert_close(torch.from_numpy(embed_sentences(model, texts, batch_size=7, progress=False)), cap,
                               atol=1e-6, rtol=0)                   # batching does not change a sentence's vector
    composed = compose_query(model, image_features_of(model, paths[3]))                 # no words: the image itself
    torch.testing.assert_close(composed, img[3], atol=1e-6, rtol=0)
    engine = Engine(model, gallery=None)
    pixels = [upload_to_pixels(p, 50_000_000, model.preprocess) for p in paths]   # decoded as the service does
    np.testing.assert_allclose(engine.embed_pixels(pixels), img.numpy(), atol=1e-6, rtol=0)
    np.testing.assert_allclose(engine.embed_texts(texts[:5]), cap[:5].numpy(), atol=1e-6, rtol=0)


def test_the_progress_bar_counts_images_not_batches(tiny_model_path, synth_small, capsys):
    """`index build`'s bar says "7/7 images", not "4/4" batches of two, and is drawn before the first batch."""
    from training.inference.embedding import FileReading, embed_image_files
    from training.models.checkpoint import load_model

    paths = sorted((Path(synth_small) / "images").glob("*"))[:7]
    embed_image_files(load_model(tiny_model_path), paths, FileReading(batch_size=2, workers=0), progress=True)
    err = capsys.readouterr().err
    assert "0/7" in err and "7/7" in err and "image" in err and "batch" not in err and "/4" not in err
