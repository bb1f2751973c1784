"""Index updates that cost the change: append-only segments, tombstones, compaction, crash safety at every step
of a writer, indexes written before segments, memory-budget sizing and memory-mapped loading."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import index.segments as segments
from index.faiss_index import (ID_BYTES, VectorIndex, default_factory, estimate_bytes, factory_for_memory,
                               parse_bytes, training_sample)
from index.changes import BuildOptions, ChangeSet, ModelFacts
from index.gallery import Gallery, build_from_vectors, compact, remove, update
from index.generations import current_generation
from index.metadata import Metadata
from index.query import ImageFilter
from training.data.fileio import write_json, write_text

REPO = Path(__file__).resolve().parents[1]
FP = "f" * 64               # the model fingerprint these vector-level indexes are written under
DIM = 16


def _unit(n, seed, dim=DIM):
    x = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _rows(ids, folder="/photos"):
    return [(f"{folder}/{i}.jpg", None) for i in ids]


def _build(root, n=200, factory="Flat", seed=0, n_captions=30):
    build_from_vectors(root, ModelFacts(FP, "cosine"), ChangeSet(
        image_vectors=_unit(n, seed), image_ids=np.arange(n), image_rows=_rows(range(n)),
        caption_vectors=_unit(n_captions, 99), captions=[(f"caption {i}", None) for i in range(n_captions)]),
        BuildOptions(factory=factory))


def _add(root, n, seed):
    changes = ChangeSet(image_vectors=_unit(n, seed), image_rows=_rows(range(n), f"/new{seed}"))
    return update(root, FP, changes).image_ids


def _exact(vectors: dict[int, np.ndarray], q, k):
    ids = np.array(sorted(vectors))
    scores = q @ np.stack([vectors[i] for i in ids]).T
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return [[(int(ids[j]), float(scores[r, j])) for j in row] for r, row in enumerate(order)]


def _same(hits, want):
    assert [[i for i, _ in h] for h in hits] == [[i for i, _ in w] for w in want]
    assert np.allclose([[s for _, s in h] for h in hits], [[s for _, s in w] for w in want], atol=1e-5)


def _files(gen_dir: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in gen_dir.iterdir()}


def test_add_writes_a_segment_and_leaves_stored_vectors_untouched(tmp_path):
    root = tmp_path / "index"
    _build(root, n=2000)
    old = root / current_generation(root)
    base = _files(old)["images.00000001.faiss"]
    ids = _add(root, 1000, seed=5)
    assert ids == list(range(2000, 3000))
    new = root / current_generation(root)
    manifest = json.loads((new / "manifest.json").read_text())
    assert [s["count"] for s in manifest["images"]["segments"]] == [2000, 1000]
    assert manifest["images"]["count"] == 3000 and manifest["captions"]["segments"][0]["file"] == \
        "captions.00000002.faiss"
    # the 2,000 stored vectors: the very same file (a hard link), neither rewritten nor touched
    assert _files(new)["images.00000001.faiss"] == base and (new / "images.00000001.faiss").stat().st_nlink >= 2
    written = (new / manifest["images"]["segments"][1]["file"]).stat().st_size
    assert written < 1000 * (DIM * 4 + 16) + 4096         # the new segment holds the 1,000 new vectors only
    gallery = Gallery.load(root)
    assert gallery.images.ntotal == 3000 and gallery.meta.counts()["images"] == 3000
    vectors = {i: v for i, v in zip(range(2000), _unit(2000, 0))} | dict(zip(range(2000, 3000), _unit(1000, 5)))
    q = _unit(7, 42)
    _same(gallery.search_images(q, 10), _exact(vectors, q, 10))
    assert np.allclose(gallery.images.reconstruct(2500), vectors[2500], atol=1e-6)


def test_tombstones_are_never_returned_and_search_paths_match_exact_search(tmp_path):
    root = tmp_path / "index"
    _build(root, n=300)
    _add(root, 100, seed=1)
    _add(root, 100, seed=2)
    vectors = dict(zip(range(300), _unit(300, 0))) | dict(zip(range(300, 400), _unit(100, 1))) \
        | dict(zip(range(400, 500), _unit(100, 2)))
    q = _unit(5, 7)
    gone = [i for i, _ in Gallery.load(root).search_images(q, 3)[0]] + [0, 305, 499]   # the best hits among them
    report = remove(root, gone + [10_000])
    assert report.removed_images == len(set(gone)) and report.missing == [10_000]
    manifest = json.loads((root / current_generation(root) / "manifest.json").read_text())
    assert len(manifest["images"]["segments"]) == 3 and manifest["images"]["deleted"] == len(set(gone))
    for i in gone:
        vectors.pop(i, None)
    g = Gallery.load(root)
    assert g.images.ntotal == len(vectors) and set(g.images.ids().tolist()) == set(vectors)
    with pytest.raises(KeyError):
        g.images.reconstruct(gone[0])
    kept = [i for i in (499, 3, 320, 3, 410) if i in vectors]                 # across segments, in any order
    assert np.array_equal(g.images.reconstruct_many(kept), np.stack([g.images.reconstruct(i) for i in kept]))
    with pytest.raises(KeyError):
        g.images.reconstruct_many([kept[0], gone[0]])                         # a removed one is absent
    _same(g.search_images(q, 10), _exact(vectors, q, 10))
    _same(g.search_images(q, 5, offset=4), [w[4:9] for w in _exact(vectors, q, 9)])
    cut = _exact(vectors, q, 10)[0][3][1]
    assert [i for i, _ in g.search_images(q[:1], 10, min_score=cut)[0]] == [i for i, _ in _exact(vectors, q, 4)[0]]
    allowed = np.array([i for i in range(0, 500, 3)] + gone)       # a filter that lets deleted ids through
    want = _exact({i: v for i, v in vectors.items() if i in set(allowed.tolist())}, q, 10)
    _same(g.search_images(q, 10, allowed=allowed), want)
    folder = ImageFilter.parse("/new2", None, None)                  # a folder filter (the third segment's)
    _same(g.search_images(q, 10, folder), _exact({i: v for i, v in vectors.items() if i >= 400}, q, 10))
    every = g.search_images(q, 1000)
    assert all(len(h) == len(vectors) and not set(gone) & {i for i, _ in h} for h in every)
    # compaction drops the deleted vectors into one segment and finds the same
    out = compact(root)
    assert out["before"]["images"] == {"segments": 3, "deleted": len(set(gone))}
    assert out["after"]["images"] == {"segments": 1, "deleted": 0}
    c = Gallery.load(root)
    assert c.images.ntotal == len(vectors) and c.images.segments[0][1].ntotal == len(vectors)
    _same(c.search_images(q, 10), _exact(vectors, q, 10))


def test_order_similarity_segments_are_exact(tmp_path):
    import torch

    from training.models.factory import build_similarity

    root = tmp_path / "index"
    x = np.abs(_unit(50, 0))
    build_from_vectors(root, ModelFacts(FP, "order"), ChangeSet(
        image_vectors=x, image_ids=np.arange(50), image_rows=_rows(range(50)), caption_vectors=np.abs(_unit(5, 9)),
        captions=[(f"c{i}", None) for i in range(5)]))
    update(root, FP, ChangeSet(image_vectors=np.abs(_unit(20, 1)), image_rows=_rows(range(20), "/b")))
    remove(root, [3, 55])
    every = np.concatenate([x, np.abs(_unit(20, 1))])
    keep = [i for i in range(70) if i not in (3, 55)]
    q = np.abs(_unit(4, 3))
    sim = build_similarity("order")(torch.from_numpy(every[keep]), torch.from_numpy(q)).t().numpy()
    want = [[keep[j] for j in np.argsort(-row, kind="stable")[:8]] for row in sim]
    assert [[i for i, _ in h] for h in Gallery.load(root).search_images(q, 8)] == want


def test_automatic_compaction_keeps_the_base_and_drops_deleted(tmp_path, monkeypatch):
    monkeypatch.setattr(segments, "MAX_SEGMENTS", 3)
    root = tmp_path / "index"
    _build(root, n=400, factory="IVF4,Flat")
    base = _files(root / current_generation(root))["images.00000001.faiss"]
    for seed in (1, 2):
        _add(root, 20, seed)
    assert len(Gallery.load(root).images.segments) == 3
    _add(root, 20, 3)               # a fourth segment: the three after the base become one, the base stays
    gen = root / current_generation(root)
    manifest = json.loads((gen / "manifest.json").read_text())
    assert [s["count"] for s in manifest["images"]["segments"]] == [400, 60]
    assert _files(gen)["images.00000001.faiss"] == base
    g = Gallery.load(root)
    assert set(g.images.ids().tolist()) == set(range(460))
    assert np.allclose(g.images.reconstruct(445), _unit(20, 3)[5], atol=1e-6)
    remove(root, list(range(30)))                   # 30 of 460 deleted: below 10 %, tombstones only
    assert json.loads((root / current_generation(root) / "manifest.json").read_text())["images"]["deleted"] == 30
    remove(root, list(range(30, 60)))               # 60 of 460: above 10 %, everything merged, deleted dropped
    manifest = json.loads((root / current_generation(root) / "manifest.json").read_text())
    assert manifest["images"]["segments"][0]["count"] == 400 and manifest["images"]["deleted"] == 0
    assert not (root / current_generation(root) / "images.deleted.npy").exists()
    assert set(Gallery.load(root).images.ids().tolist()) == set(range(60, 460))


def _format_1(root: Path, n=120) -> None:
    """An index directory as the code before segments wrote it: one FAISS file per side, format 1."""
    gen = root / "gen-00000001"
    gen.mkdir(parents=True)
    images = VectorIndex.create(DIM, "images", "cosine", "Flat")
    images.add(_unit(n, 0), np.arange(n))
    images.save(gen / "images.faiss")
    caps = VectorIndex.create(DIM, "captions", "cosine", "Flat")
    caps.add(_unit(10, 99), np.arange(10))
    caps.save(gen / "captions.faiss")
    meta = Metadata(gen / "metadata.sqlite")
    meta.add_images([(i, *row) for i, row in enumerate(_rows(range(n)))])
    meta.add_captions([(i, f"caption {i}", None) for i in range(10)])
    meta.close()
    write_json(gen / "manifest.json", {
        "format": "jointspace-index/1", "model_fingerprint": FP, "similarity": "cosine", "dim": DIM,
        "model_name": "", "created": 0.0, "updated": 0.0, "next_image_id": n, "next_caption_id": 10,
        "images": {"factory": "Flat", "nprobe": None, "count": n},
        "captions": {"factory": "Flat", "nprobe": None, "count": 10}})
    write_text(root / "CURRENT", "gen-00000001\n")


def test_an_index_written_before_segments_loads_and_updates(tmp_path):
    root = tmp_path / "index"
    _format_1(root)
    q = _unit(4, 3)
    vectors = dict(zip(range(120), _unit(120, 0)))
    g = Gallery.load(root)
    assert g.images.ntotal == 120 and g.generation == "gen-00000001"
    _same(g.search_images(q, 5), _exact(vectors, q, 5))
    assert _add(root, 30, 8) == list(range(120, 150))
    remove(root, [1])
    vectors |= dict(zip(range(120, 150), _unit(30, 8)))
    del vectors[1]
    manifest = json.loads((root / current_generation(root) / "manifest.json").read_text())
    assert manifest["format"] == "jointspace-index/2" and manifest["index_id"]
    assert [s["file"] for s in manifest["images"]["segments"]][0] == "images.faiss"
    _same(Gallery.load(root).search_images(q, 5), _exact(vectors, q, 5))
    (root / current_generation(root) / "manifest.json").write_text(json.dumps({**manifest, "format": "other/9"}))
    with pytest.raises(ValueError, match="not an index this version reads"):
        Gallery.load(root)


def test_a_reload_takes_unchanged_segments_as_they_are(tmp_path):
    root = tmp_path / "index"
    _build(root, n=100)
    first = Gallery.load(root)
    _add(root, 10, 1)
    second = Gallery.load(root, previous=first)
    assert second.images.segments[0][1] is first.images.segments[0][1]          # not read again
    assert second.images.ntotal == 110 and len(second.images.segments) == 2
    _build(root, n=100, seed=3)                  # a rebuild reuses the segment names, but not the index id
    third = Gallery.load(root, previous=second)
    assert third.images.segments[0][1] is not second.images.segments[0][1]
    assert np.allclose(third.images.reconstruct(0), _unit(100, 3)[0], atol=1e-6)


# --- kill -9 at every step of a writer --------------------------------------------------------------------------

# One process imports the index code once, then forks a writer per case (it has run no FAISS or torch work yet,
# so no thread pool is forked); each writer hooks one file-system call and SIGKILLs itself at its n-th use.
WRITERS = r"""
import json, os, shutil, signal, sys, traceback
import numpy as np
import faiss
import index.segments as segments
from index.changes import ChangeSet
from index.gallery import compact, remove, update

def unit(n, seed):
    x = np.random.default_rng(seed).standard_normal((n, 16)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)

def writer(root, point, nth, when):
    segments.MAX_SEGMENTS = 3               # the fourth add below merges the segments after the base
    module, name = {"write_index": (faiss, "write_index"), "link": (os, "link"), "rename": (os, "rename"),
                    "replace": (os, "replace"), "rmtree": (shutil, "rmtree")}[point]
    real, calls = getattr(module, name), [0]
    def wrapper(*args, **kwargs):
        calls[0] += 1
        if calls[0] == nth and when == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        out = real(*args, **kwargs)
        if calls[0] == nth and when == "after":
            os.kill(os.getpid(), signal.SIGKILL)
        return out
    setattr(module, name, wrapper)

    def say(**entry):
        print(json.dumps(entry), flush=True)

    def add(seed):
        say(op="begin-add", seed=seed)
        ids = update(root, "f" * 64, ChangeSet(image_vectors=unit(25, seed),
                                               image_rows=[(f"/w/{seed}/{i}.jpg", None) for i in range(25)]))
        say(op="add", ids=ids.image_ids)

    add(11)
    say(op="begin-remove")
    remove(root, [0, 1, 2, 3, 4])
    say(op="remove", ids=[0, 1, 2, 3, 4])
    add(12)
    add(13)                                  # four segments: merged
    say(op="begin-compact")
    compact(root)
    say(op="compact", ids=[])
    add(14)

for spec in sys.argv[1:]:
    root, point, nth, when = spec.split("|")
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        with open(root + ".log", "w") as log:
            os.dup2(log.fileno(), 1)
            try:
                writer(root, point, int(nth), when)
            except BaseException:
                traceback.print_exc()
                os._exit(1)
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"root": root, "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None}), flush=True)
"""

# (hooked call, its n-th call in the whole run, kill before or after it): each kills a different step of a
# different writer — the 1st add (segment written / manifest written / generation renamed / CURRENT replaced),
# the remove (links, before the old generation is collected), the add that merges segments, the compaction
# (merged segment written; CURRENT replaced), the last add (before CURRENT)
KILLS = [("write_index", 1, "before"), ("write_index", 1, "after"), ("replace", 1, "after"), ("rename", 1, "after"),
         ("replace", 2, "after"), ("link", 7, "after"), ("rmtree", 2, "before"), ("write_index", 3, "before"),
         ("write_index", 4, "after"), ("replace", 10, "after"), ("rename", 6, "after")]


@pytest.fixture(scope="module")
def killed_writers(tmp_path_factory):
    """Each case's index directory (a 60-vector index, then the writer killed at that step) and the writer's log."""
    work = tmp_path_factory.mktemp("killed")
    _build(work / "base", n=60)
    roots = []
    for point, nth, when in KILLS:
        roots.append(work / f"{point}-{nth}-{when}")
        shutil.copytree(work / "base", roots[-1])
    proc = subprocess.run([sys.executable, "-c", WRITERS, *[f"{r}|{p}|{n}|{w}" for r, (p, n, w) in zip(roots, KILLS)]],
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    signals = {json.loads(line)["root"]: json.loads(line)["signal"] for line in proc.stdout.splitlines()}
    return {kill: (root, signals[str(root)], Path(f"{root}.log").read_text()) for kill, root in zip(KILLS, roots)}


@pytest.mark.parametrize("kill", KILLS, ids=[f"{p}-{n}-{w}" for p, n, w in KILLS])
def test_a_writer_killed_at_any_step_leaves_a_loadable_index_with_every_acknowledged_change(killed_writers, kill):
    root, signal, output = killed_writers[kill]
    assert signal == 9, output                                  # really killed by SIGKILL at that step
    log = [json.loads(line) for line in output.splitlines()]
    added = [i for e in log if e["op"] == "add" for i in e["ids"]]
    removed = [i for e in log if e["op"] == "remove" for i in e["ids"]]
    pending = log[-1]["op"] if log and log[-1]["op"].startswith("begin") else None
    g = Gallery.load(root)
    ids = set(g.images.ids().tolist())
    assert set(added) <= ids and not set(removed) & ids                     # nothing acknowledged is lost
    assert set(g.meta.image_ids()) == ids and g.images.ntotal == len(ids)   # vectors and metadata agree
    unacknowledged = ids - set(range(60)) - set(added)
    assert len(unacknowledged) in ((0, 25) if pending == "begin-add" else (0,))     # a killed add: all or none
    if pending == "begin-remove":
        assert len(set(range(5)) & ids) in (0, 5)
    expected = dict(zip(range(60), _unit(60, 0)))
    for e in log:
        if e["op"] == "begin-add":
            expected |= {i: v for i, v in zip(range(max(expected) + 1, max(expected) + 26), _unit(25, e["seed"]))}
    live = {i: expected[i] for i in ids}
    q = _unit(3, 5)
    _same(g.search_images(q, 10), _exact(live, q, 10))
    g.close()
    # the next writer cleans up after the dead one and works
    _add(root, 5, 99)
    compact(root)
    assert not list(root.glob(".tmp-gen-*")) and Gallery.load(root).images.ntotal == len(ids) + 5


# --- sizing and memory mapping -----------------------------------------------------------------------------

def test_memory_budget_chooses_the_largest_type_that_fits():
    n, d = 1_000_000, 256
    assert factory_for_memory(n, d, parse_bytes("100GB")) == default_factory(n, d) == "IVF4096,SQ8"
    assert factory_for_memory(n, d, parse_bytes("320MB")) == "IVF4096,SQ8"        # 256 + 56 bytes a vector
    assert factory_for_memory(n, d, parse_bytes("250MB")) == "IVF4096,PQ128"
    assert factory_for_memory(n, d, parse_bytes("130MB")) == "IVF4096,PQ64"
    assert factory_for_memory(n, d, parse_bytes("100MB")) == "IVF4096,PQ32"
    with pytest.raises(ValueError, match="need at least .* more than the budget of 50.0 MB"):
        factory_for_memory(n, d, parse_bytes("50MB"))
    assert factory_for_memory(200_000, 256, parse_bytes("4GB")) == "IVF2048,Flat"   # the default, not larger
    assert factory_for_memory(200_000, 256, parse_bytes("100MB")) == "IVF2048,SQ8"
    assert factory_for_memory(10_000, 64, parse_bytes("4GB")) == "Flat"
    assert factory_for_memory(10_000, 64, parse_bytes("1.5MB")) == "IVF256,SQ8"
    assert factory_for_memory(10_000, 64, parse_bytes("1MB")) == "IVF256,PQ16"
    assert estimate_bytes("IVF4096,SQ8", n, d) == n * (256 + ID_BYTES) + 4096 * 256 * 4
    assert parse_bytes("4GB") == 4 * 10 ** 9 and parse_bytes("512MiB") == 512 * 2 ** 20 and parse_bytes("1e9") == 10 ** 9
    for bad in ("four", "4XB", "-1GB", "0"):
        with pytest.raises(ValueError, match="not a memory size"):
            parse_bytes(bad)


def test_training_sample_is_a_deterministic_sample_of_64_points_per_list():
    x = _unit(30_000, 0)
    s = training_sample(x, "IVF256,SQ8")
    assert len(s) == 64 * 256 and np.array_equal(s, training_sample(x, "IVF256,SQ8"))
    assert {tuple(r) for r in s[:50]} <= {tuple(r) for r in x}
    assert len(training_sample(x, "Flat")) == 10_000 and len(training_sample(x[:500], "IVF4,Flat")) == 500


@pytest.mark.parametrize("factory", ["Flat", "IVF8,SQ8", "IVF8,PQ4"])
def test_memory_mapped_loading_gives_identical_results(tmp_path, factory):
    root = tmp_path / "index"
    _build(root, n=2000, factory=factory)
    _add(root, 300, 1)
    remove(root, [5, 2100])
    q = _unit(20, 3)
    read, mapped = Gallery.load(root), Gallery.load(root, mmap=True)
    assert mapped.images.ntotal == read.images.ntotal == 2298
    for (_, a), (_, b) in zip(read.images.segments, mapped.images.segments):
        assert a.index.ntotal == b.index.ntotal
    assert mapped.search_images(q, 10) == read.search_images(q, 10)
    allowed = np.arange(0, 2300, 7)
    assert mapped.search_images(q, 10, allowed=allowed) == read.search_images(q, 10, allowed=allowed)
    if factory.startswith("IVF"):        # the inverted lists are a mapping of the file, not a copy in memory
        ivf = segments.faiss.extract_index_ivf(mapped.images.segments[0][1].index)
        assert type(segments.faiss.downcast_InvertedLists(ivf.invlists)).__name__ == "OnDiskInvertedLists"


def test_cli_build_with_a_memory_budget_and_compact(tiny_model_path, synth_small, tmp_path, capsys):
    from service.cli import main

    out = tmp_path / "index"
    assert main(["index", "build", "--model", str(tiny_model_path), "--data", str(synth_small), "--split", "test",
                 "--out", str(out), "--max-index-memory", "1MB", "--quiet", "--workers", "0"]) == 0
    manifest = json.loads((out / current_generation(out) / "manifest.json").read_text())
    assert manifest["images"]["factory"] == "Flat"
    capsys.readouterr()
    assert main(["index", "remove", "--index", str(out), "--ids", "0"]) == 0          # 1 of 20: a tombstone
    capsys.readouterr()
    assert main(["index", "compact", "--index", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["before"]["images"]["deleted"] == 1 and report["after"]["images"] == {"segments": 1, "deleted": 0}
    for args, message in ((["--max-index-memory", "lots"], "not a memory size"),
                          (["--max-index-memory", "1KB"], "more than the budget"),
                          (["--max-index-memory", "1GB", "--factory", "Flat"], "not both")):
        assert main(["index", "build", "--model", str(tiny_model_path), "--data", str(synth_small), "--split",
                     "test", "--out", str(tmp_path / "other"), "--quiet", "--workers", "0", *args]) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "other").exists() or not (tmp_path / "other" / "CURRENT").exists()
    shutil.rmtree(out)
