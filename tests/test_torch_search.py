"""Exact search in torch (the GPU search without faiss-gpu), run here on the CPU: the same ids and scores as
FAISS's Flat index — filtered, with tombstones, across segments, in chunks, and deeper than faiss-gpu's 2,048."""
import numpy as np
import pytest
import torch

from index.faiss_index import VectorIndex
from index.changes import BuildOptions, ChangeSet, ModelFacts
from index.gallery import Gallery, build_from_vectors, remove, update
from index.torch_search import TorchFlatSearch, float16_fits

DIM = 24
FP = "f" * 64


def _unit(n, seed, dim=DIM):
    x = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _flat(n=3000, seed=0):
    index = VectorIndex.create(DIM, "images", "cosine", "Flat")
    ids = np.random.default_rng(seed + 1).permutation(10 * n)[:n]          # sparse, unordered ids
    index.add(_unit(n, seed), ids)
    return index, ids


def _same(a, b, atol=1e-5):
    (sa, ia), (sb, ib) = a, b
    assert ia.shape == ib.shape and (ia == ib).all()
    assert np.allclose(sa[ia >= 0], sb[ib >= 0], atol=atol)


def _same_hits(got, want):
    assert [[i for i, _ in h] for h in got] == [[i for i, _ in h] for h in want]
    assert np.allclose([[s for _, s in h] for h in got], [[s for _, s in h] for h in want], atol=1e-5)


def test_torch_backend_returns_faiss_flat_ids_and_scores():
    index, ids = _flat()
    q = _unit(9, 42)
    want = index.search(q, 25)
    assert index.backend == "faiss-cpu"
    index.to_device("cpu", "torch")
    assert index.backend == "torch-cpu-fp32"
    _same(index.search(q, 25), want)
    index.to_device("cpu", "faiss")
    assert index.backend == "faiss-cpu"


def test_torch_backend_filters_and_tombstones_inside_the_search():
    index, ids = _flat()
    q = _unit(5, 7)
    only = ids[::7]
    deleted = ids[:1500]
    want_only, want_excl = index.search(q, 40, ids=only), index.search(q, 40, exclude=deleted)
    index.to_device("cpu", "torch")
    _same(index.search(q, 40, ids=only), want_only)
    _same(index.search(q, 40, exclude=deleted), want_excl)
    assert not np.isin(index.search(q, 40, exclude=deleted)[1], deleted).any()
    # fewer ids pass than k: the rest is -1 padding, as FAISS pads
    scores, found = index.search(q, 10, ids=ids[:3])
    assert (found[:, :3] >= 0).all() and found.shape == (5, 3)


def test_chunked_search_equals_one_matmul_and_pages_go_deeper_than_faiss_gpu():
    vectors, ids = _unit(5000, 3), np.arange(5000) * 3
    q = _unit(4, 11)
    whole = TorchFlatSearch(vectors, ids, "cpu")
    chunked = TorchFlatSearch(vectors, ids, "cpu", scratch_bytes=4 * 4 * 700)     # 700 rows a chunk
    exclude = ids[1::2]
    _same(chunked.search(q, 3000), whole.search(q, 3000))                       # k > 2,048
    _same(chunked.search(q, 100, exclude=exclude), whole.search(q, 100, exclude=exclude))
    scores, found = whole.search(q, 3000)
    exact = q @ vectors.T
    assert np.allclose(scores, -np.sort(-exact, axis=1)[:, :3000], atol=1e-5)
    assert (np.diff(scores, axis=1) <= 1e-7).all()                              # best first


def test_float16_only_where_scores_stay_within_tolerance():
    assert float16_fits(torch.from_numpy(_unit(500, 1, dim=64))) == torch.float16
    # long vectors: float16 rounding is far above 1e-3 in the score
    assert float16_fits(torch.from_numpy(100 * _unit(500, 1, dim=64))) == torch.float32
    half = TorchFlatSearch(_unit(800, 2), np.arange(800), "cpu", dtype=torch.float16)
    full = TorchFlatSearch(_unit(800, 2), np.arange(800), "cpu")
    q = _unit(6, 5)
    assert half.name == "torch-cpu-fp16"
    assert np.abs(half.search(q, 10)[0] - full.search(q, 10)[0]).max() <= 1e-3


def test_torch_backend_needs_a_flat_index():
    index = VectorIndex.create(DIM, "images", "cosine", "IVF4,Flat", train_vectors=_unit(400, 0))
    with pytest.raises(ValueError, match="Flat indexes only"):
        index.to_device("cpu", "torch")
    with pytest.raises(ValueError, match="search backend must be one of"):
        index.to_device("cpu", "gpu")


def test_segments_with_tombstones_search_alike_on_both_backends(tmp_path):
    root = tmp_path / "index"
    build_from_vectors(root, ModelFacts(FP, "cosine"), ChangeSet(
        image_vectors=_unit(400, 0), image_ids=np.arange(400), image_rows=[(f"/p/{i}.jpg", None) for i in range(400)],
        caption_vectors=_unit(30, 99), captions=[(f"caption {i}", None) for i in range(30)]),
        BuildOptions(factory="Flat"))
    update(root, FP, ChangeSet(image_vectors=_unit(300, 5), image_rows=[(f"/q/{i}.jpg", None) for i in range(300)]))
    remove(root, image_ids=list(range(0, 700, 29)))          # a few tombstones: no compaction
    q = _unit(8, 21)
    faiss_side = Gallery.load(root, backend="faiss")
    torch_side = Gallery.load(root, backend="torch")
    assert len(torch_side.images.segments) == 2 and len(torch_side.images.deleted) > 0
    assert torch_side.images.backend == "torch-cpu-fp32" and faiss_side.images.backend == "faiss-cpu"
    _same_hits(torch_side.search_images(q, 50), faiss_side.search_images(q, 50))
    allowed = np.arange(1, 700, 2)
    got = torch_side.search_images(q, 20, allowed=allowed, offset=5)
    _same_hits(got, faiss_side.search_images(q, 20, allowed=allowed, offset=5))
    assert all(i % 29 and i % 2 for hits in got for i, _ in hits)


def test_float16_search_keeps_recall_against_faiss_flat_at_an_unaligned_dimension():
    import faiss

    dim = 1000                                              # stored as 1008 columns, the last 8 zero
    vectors = _unit(20_000, 8, dim=dim)
    queries = vectors[:200] + 0.05 * _unit(200, 9, dim=dim)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    flat = faiss.IndexFlatIP(dim)
    flat.add(vectors)
    truth_s, truth = flat.search(queries, 10)
    half = TorchFlatSearch(vectors, np.arange(len(vectors)), "cpu", dtype=torch.float16)
    assert half.vectors.shape == (20_000, 1008) and not half.vectors[:, dim:].any()
    scores, found = half.search(queries, 10)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(found, truth)])
    assert recall >= 0.99
    # the candidates are scored again in float32: closer to FAISS than a float16 score's rounding (~5e-4 at 1)
    same = found == truth
    assert np.abs(scores[same] - truth_s[same]).max() <= 2e-4 and (np.diff(scores, axis=1) <= 0).all()
    one = half.search(queries[:1], 10)                      # batch 1 (a CUDA graph on a GPU): the same rows
    assert (one[1] == found[:1]).all() and np.allclose(one[0], scores[:1])
    full = TorchFlatSearch(vectors, np.arange(len(vectors)), "cpu")
    assert full.width == 1008
    _same(full.search(queries, 10), (truth_s, truth), atol=1e-5)


def test_results_come_back_packed_in_one_tensor():
    from index.torch_search import pack, unpack

    scores = torch.tensor([[0.5, -float("inf")], [1e-8, -3.25]])
    ids = torch.tensor([[2 ** 40 + 7, -1], [0, 123_456]])
    packed = pack(scores, ids)
    assert packed.dtype == torch.int32 and packed.shape == (2, 2, 3)
    back_s, back_i = unpack(packed.numpy())
    assert back_s.dtype == np.float32 and back_i.dtype == np.int64
    assert (back_i == ids.numpy()).all() and (back_s == scores.numpy()).all()


def test_float16_filtered_search_pads_as_faiss_does():
    vectors, ids = _unit(3000, 4), np.arange(3000) * 5
    half = TorchFlatSearch(vectors, ids, "cpu", dtype=torch.float16)
    full = TorchFlatSearch(vectors, ids, "cpu")
    q = _unit(3, 6)
    scores, found = half.search(q, 8, only=ids[:4])
    assert (found[:, :4] >= 0).all() and (found[:, 4:] == -1).all() and np.isneginf(scores[:, 4:]).all()
    assert (np.sort(found[:, :4], axis=1) == np.sort(full.search(q, 8, only=ids[:4])[1][:, :4], axis=1)).all()
    excl = half.search(q, 20, exclude=ids[::2])[1]
    assert not np.isin(excl, ids[::2]).any()
