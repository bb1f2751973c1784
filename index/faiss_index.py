"""One FAISS index of embeddings with int64 ids: made from a factory string, searched, updated by id, saved.

The index type is FAISS's own vocabulary, a factory string (``"Flat"``, ``"IVF1024,Flat"``,
``"IVF4096,PQ64"``, ``"HNSW32"``). Without one, :func:`default_factory` picks by gallery size:

==========================  =========================  ===========================================
vectors                     factory                    why
==========================  =========================  ===========================================
n < 50,000                  ``Flat``                   exact; a query costs n·d multiply-adds
50,000 ≤ n < 1,000,000      ``IVF{nlist},Flat``        nlist ≈ 4·√n lists, ``nprobe`` = nlist/16:
                                                       about 1/16 of the gallery is scanned
n ≥ 1,000,000               ``IVF{nlist},SQ8``         8-bit scalar quantisation: 4× smaller than
                                                       float32
==========================  =========================  ===========================================

Measured latency and recall of these choices: docs/benchmarks.md (``index_recall_cpu``) and docs/scale.md
(``scale_index``), from benchmarks/results/.

Product quantisation (``IVF…,PQ{d/4}``, 16× smaller) is not a default: on generated clustered 256-d vectors it
found only 54% of the exact top-10 at nprobe = nlist/16 (``benchmarks/index_recall.py``); use it by factory
string when memory matters more than recall. HNSW is never the default because FAISS's HNSW cannot remove
vectors (``index remove`` would fail); it can still be asked for by factory string.
``benchmarks/index_recall.py`` measures the recall of each choice against exact search.

Memory budget (``index build --max-index-memory 4GB``, :func:`factory_for_memory`): the default above when its
estimated size fits, else the next smaller type that does — ``IVF{nlist},Flat`` → ``IVF{nlist},SQ8`` →
``IVF{nlist},PQ{m}`` with m = d/2, d/4, … — and an error naming the smallest size possible when none does. The
estimate (:func:`estimate_bytes`) is codes + ids + the id → position hash table that removal needs + the coarse
quantizer and codebooks. IVF and PQ types are trained on a sample (:func:`training_sample`, 64 points per list),
not on every vector.

Ids: ``Flat``/``HNSW``/… are wrapped in ``IndexIDMap2`` (ids + reconstruction by id); IVF indexes carry ids
natively and get a hash-table direct map, so every type supports ``add``/``remove``/``reconstruct`` by id
(HNSW: no remove).

Similarity: a ``cosine`` model's embeddings are unit vectors, so its score is FAISS's inner product. An
``order`` model's score (STT eq. 9, −‖max(0, c − i)‖²) is no inner product or distance FAISS knows, so such an
index must be ``Flat``: FAISS only stores the vectors, and :meth:`VectorIndex.search` scores every stored
vector exactly with the similarity itself, in torch (blocks of queries; fine for the gallery sizes that order
models are used with). Nothing is ever ranked with a metric other than the model's own.
"""
from __future__ import annotations

import math
import re
import warnings
from pathlib import Path

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:        # torch is imported where a search needs it: a CPU search of a FAISS index runs without it
    import torch

    from .torch_search import TorchFlatSearch

try:
    import faiss
except ImportError as err:  # pragma: no cover - depends on the install
    raise ImportError("jointspace's index needs FAISS: pip install 'jointspace[cpu]' (faiss-cpu) or "
                      "'jointspace[gpu]' (faiss-gpu)") from err

FLAT_LIMIT = 50_000          # below: exact Flat
SQ_FROM = 1_000_000          # from here: IVF with 8-bit scalar quantisation
TRAIN_PER_LIST = 64          # training sample: this many points per inverted list (FAISS warns below 39)
ID_BYTES = 56                # per vector: its int64 id + its entry in the id hash table (measured: 50-55 bytes)
GPU_MAX_K = 2048             # faiss-gpu returns at most this many results a query: deeper pages search the CPU index
SEARCH_BACKENDS = ("auto", "faiss", "torch")
ROLES = ("images", "captions")
SIMILARITIES = ("cosine", "order")


def default_nlist(n: int) -> int:
    """≈ 4·√n inverted lists (a power of two), at most n/39 so every list gets enough training points."""
    nlist = 2 ** round(math.log2(max(4 * math.sqrt(max(n, 1)), 1)))
    return int(max(1, min(nlist, n // 39)))


def default_factory(n: int, dim: int) -> str:
    """The factory string for ``n`` vectors of ``dim`` dimensions (thresholds in the module docstring)."""
    if n < FLAT_LIMIT:
        return "Flat"
    nlist = default_nlist(n)
    return f"IVF{nlist},Flat" if n < SQ_FROM else f"IVF{nlist},SQ8"


def estimate_bytes(factory: str, n: int, dim: int) -> int:
    """Estimated memory of ``n`` vectors of ``dim`` dimensions in an index of type ``factory`` (one of the types
    :func:`factory_for_memory` chooses: ``Flat``, ``IVF{nlist},Flat|SQ8|PQ{m}``)."""
    m = re.fullmatch(r"(?:IVF(\d+),)?(Flat|SQ8|PQ(\d+))", factory)
    if m is None:
        raise ValueError(f"no memory estimate for factory {factory!r} (known: Flat, IVF<n>,Flat|SQ8|PQ<m>)")
    nlist, codec, pq_m = m.group(1), m.group(2), m.group(3)
    code = 4 * dim if codec == "Flat" else dim if codec == "SQ8" else int(pq_m)
    fixed = 4 * dim * int(nlist or 0) + (256 * 4 * dim if pq_m else 0)      # coarse centroids, PQ codebooks
    return n * (code + ID_BYTES) + fixed


def factory_for_memory(n: int, dim: int, budget: int) -> str:
    """The factory string for ``n`` vectors within ``budget`` bytes: :func:`default_factory` when it fits, else
    the first of IVF-Flat, IVF-SQ8, IVF-PQ(d/2), IVF-PQ(d/4), … that does; ValueError when none does."""
    nlist = default_nlist(n)
    ladder = ["Flat", f"IVF{nlist},Flat", f"IVF{nlist},SQ8"]
    m = dim // 2
    while m >= 4:
        if dim % m == 0:
            ladder.append(f"IVF{nlist},PQ{m}")
        m //= 2
    ladder = ladder[ladder.index(default_factory(n, dim)):]       # never a larger type than the default
    for factory in ladder:
        if estimate_bytes(factory, n, dim) <= budget:
            return factory
    smallest = min(estimate_bytes(f, n, dim) for f in ladder)
    raise ValueError(f"{n} vectors of {dim} dimensions need at least {format_bytes(smallest)} in any index type "
                     f"tried ({', '.join(ladder)}; ids alone take {ID_BYTES} bytes a vector), more than the "
                     f"budget of {format_bytes(budget)}")


def training_sample(vectors: np.ndarray, factory: str, seed: int = 0) -> np.ndarray:
    """The rows an index of type ``factory`` is trained on: all of them for a small gallery, else a random
    sample of ``TRAIN_PER_LIST`` per inverted list (at least 10,000, enough for 256 PQ centroids)."""
    m = re.search(r"IVF(\d+)", factory)
    size = max(TRAIN_PER_LIST * int(m.group(1)), 10_000) if m else 10_000
    if len(vectors) <= size:
        return vectors
    rows = np.sort(np.random.default_rng(seed).choice(len(vectors), size, replace=False))
    return vectors[rows]


_UNITS = {"": 1, "b": 1, "kb": 10 ** 3, "mb": 10 ** 6, "gb": 10 ** 9, "tb": 10 ** 12,
          "kib": 2 ** 10, "mib": 2 ** 20, "gib": 2 ** 30, "tib": 2 ** 40}


def parse_bytes(text: str) -> int:
    """``"4GB"`` → 4·10⁹, ``"512MiB"`` → 512·2²⁰, ``"1e9"`` → 10⁹; ValueError for anything else."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-z]*)\s*", str(text).lower())
    if m is None or m.group(2) not in _UNITS or float(m.group(1)) <= 0:
        raise ValueError(f"not a memory size: {text!r} (examples: 4GB, 512MB, 2GiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def format_bytes(n: int) -> str:
    return f"{n / 10 ** 9:.2f} GB" if n >= 10 ** 9 else f"{n / 10 ** 6:.1f} MB"


def default_nprobe(index: "faiss.Index") -> int | None:
    ivf = faiss.try_extract_index_ivf(index)
    return None if ivf is None else max(1, ivf.nlist // 16)


class VectorIndex:
    """The embeddings of one side of the gallery (``role`` = images or captions) under one factory string."""

    def __init__(self, index: "faiss.Index", role: str, similarity: str, factory: str, nprobe: int | None = None):
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, not {role!r}")
        if similarity not in SIMILARITIES:
            raise ValueError(f"no index support for similarity {similarity!r} (supported: {SIMILARITIES})")
        self.index, self.role, self.similarity, self.factory = index, role, similarity, factory
        self.nprobe = nprobe
        if nprobe is not None:
            faiss.ParameterSpace().set_index_parameter(index, "nprobe", int(nprobe))
        self._search_index = index          # a GPU copy after to_device("cuda")
        self._torch: TorchFlatSearch | None = None     # the torch search (to_device), else None
        self._device: str | torch.device = "cpu"
        self._backend_setting = "auto"
        self._exact: tuple[np.ndarray, torch.Tensor] | None = None   # order similarity: (ids, vectors)

    # --- construction -------------------------------------------------------------------------------------
    @classmethod
    def create(cls, dim: int, role: str, similarity: str, factory: str | None = None,
               train_vectors: np.ndarray | None = None, nprobe: int | None = None) -> "VectorIndex":
        """An empty index; IVF/PQ types are trained on ``train_vectors`` (the vectors about to be added)."""
        n_train = 0 if train_vectors is None else len(train_vectors)
        factory = factory or default_factory(n_train, dim)
        if similarity == "order" and factory != "Flat":
            raise ValueError(f"an 'order' similarity model needs an exact 'Flat' index (its score, STT eq. 9, is "
                             f"not an inner product FAISS could approximate); got factory {factory!r}")
        try:
            index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
        except RuntimeError as err:
            raise ValueError(f"invalid FAISS factory string {factory!r}: {_faiss_message(err)}") from None
        ivf = faiss.try_extract_index_ivf(index)
        if ivf is not None:
            ivf.set_direct_map_type(faiss.DirectMap.Hashtable)     # reconstruct and remove by id
        else:
            index = faiss.IndexIDMap2(index)
        if not index.is_trained:
            if n_train < getattr(ivf, "nlist", 1):
                raise ValueError(f"factory {factory!r} must be trained on at least {getattr(ivf, 'nlist', 1)} "
                                 f"vectors, got {n_train}; use 'Flat' for a gallery this small")
            index.train(_f32(train_vectors))
        if nprobe is None:
            nprobe = default_nprobe(index)
        return cls(index, role, similarity, factory, nprobe)

    @classmethod
    def load(cls, path: str | Path, role: str, similarity: str, factory: str, nprobe: int | None,
             mmap: bool = False) -> "VectorIndex":
        """``mmap``: map the file instead of reading it (IVF: inverted lists, ``IO_FLAG_MMAP``; others: the
        stored codes, ``IO_FLAG_MMAP_IFC``); pages are read on demand and the index is read-only."""
        flags = 0
        if mmap:
            flags = faiss.IO_FLAG_MMAP if "IVF" in factory else faiss.IO_FLAG_MMAP_IFC
        return cls(faiss.read_index(str(path), flags), role, similarity, factory, nprobe)

    def save(self, path: str | Path) -> None:
        faiss.write_index(self.index, str(path))

    def to_device(self, device: str | torch.device, backend: str = "auto") -> "VectorIndex":
        """Where searches run. ``backend`` ``auto``: on a CUDA ``device``, FAISS's GPU index
        (``index_cpu_to_gpu``) when FAISS has GPU support, else a ``Flat`` index as chunked matmul + top-k in
        torch on the GPU (:class:`~index.torch_search.TorchFlatSearch`), else (IVF, PQ, … with faiss-cpu) the
        CPU index; on the CPU, the CPU index. ``faiss``: FAISS only (GPU when it can). ``torch``: the torch
        search on ``device``, for ``Flat`` indexes. The CPU index stays the one that is updated and saved. Same
        results within float tolerance; :attr:`backend` names the one in use."""
        if backend not in SEARCH_BACKENDS:
            raise ValueError(f"search backend must be one of {SEARCH_BACKENDS}, not {backend!r}")
        self._device, self._backend_setting = device, backend
        self._search_index, self._torch = self.index, None
        if self.similarity == "order":       # scored in torch by the similarity itself (_search_exact)
            return self
        if backend != "torch" and str(device) == "cpu":      # the CPU index, without importing torch
            return self
        import torch

        dev = torch.device(device)
        flat = self._flat()
        faiss_gpu = hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0
        if backend == "torch" or (backend == "auto" and dev.type == "cuda" and not faiss_gpu and flat is not None):
            if flat is None:
                raise ValueError(f"the torch search backend searches Flat indexes only, not {self.factory!r}")
            vectors = flat.reconstruct_n(0, flat.ntotal) if flat.ntotal else np.zeros((0, self.dim), np.float32)
            from .torch_search import TorchFlatSearch

            self._torch = TorchFlatSearch(vectors, self.ids(), dev)
            return self
        if dev.type != "cuda":
            return self
        if not faiss_gpu:
            warnings.warn(f"FAISS has no GPU support here (faiss-cpu, or no GPU visible to FAISS): the "
                          f"{self.factory!r} index is searched on the CPU (install jointspace[gpu] for GPU search; "
                          f"Flat indexes are searched on the GPU in torch)", RuntimeWarning, stacklevel=2)
            return self
        if dev.index is None and faiss.get_num_gpus() > 1:
            # every GPU of the host holds a shard (IndexShards); not run by the test suite (no multi-GPU host)
            options = faiss.GpuMultipleClonerOptions()
            options.shard = True
            self._search_index = faiss.index_cpu_to_all_gpus(self.index, co=options)
        else:
            self._gpu_resources = faiss.StandardGpuResources()
            self._search_index = faiss.index_cpu_to_gpu(self._gpu_resources, dev.index or 0, self.index)
        if self.nprobe is not None:
            faiss.GpuParameterSpace().set_index_parameter(self._search_index, "nprobe", int(self.nprobe))
        return self

    @property
    def backend(self) -> str:
        """What searches run on: ``faiss-cpu``, ``faiss-gpu``, ``torch-cuda-fp16``, ``torch-cpu-fp32``, …"""
        if self._torch is not None:
            return self._torch.name
        return "faiss-cpu" if self._search_index is self.index else "faiss-gpu"

    def _flat(self):
        """The ``IndexFlat`` inside a ``Flat`` index's id map; None for any other type."""
        if not isinstance(self.index, faiss.IndexIDMap2):
            return None
        inner = faiss.downcast_index(self.index.index)
        return inner if isinstance(inner, faiss.IndexFlat) else None

    # --- updates ------------------------------------------------------------------------------------------
    def add(self, vectors: np.ndarray, ids: np.ndarray) -> None:
        vectors, ids = _f32(vectors), np.ascontiguousarray(ids, dtype=np.int64)
        if vectors.shape[0] != ids.shape[0]:
            raise ValueError(f"{vectors.shape[0]} vectors but {ids.shape[0]} ids")
        if vectors.shape[0]:
            if vectors.shape[1] != self.dim:
                raise ValueError(f"vectors have {vectors.shape[1]} dimensions, the index {self.dim}")
            self.index.add_with_ids(vectors, ids)
        self._changed()

    def remove(self, ids) -> int:
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        try:
            removed = int(self.index.remove_ids(ids))
        except RuntimeError as err:
            raise ValueError(f"a {self.factory!r} index cannot remove vectors ({_faiss_message(err)}); "
                             f"rebuild it, or build with a factory that can (Flat, IVF…)") from None
        self._changed()
        return removed

    def _changed(self) -> None:
        self._exact = None
        if self._search_index is not self.index or self._torch is not None:
            self.to_device(self._device, self._backend_setting)

    # --- reads --------------------------------------------------------------------------------------------
    @property
    def dim(self) -> int:
        return self.index.d

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    def reconstruct(self, id_: int) -> np.ndarray:
        """The stored vector of ``id_`` (approximate for PQ indexes); KeyError when absent."""
        try:
            return self.index.reconstruct(int(id_))
        except RuntimeError:
            raise KeyError(id_) from None

    def reconstruct_many(self, ids) -> np.ndarray:
        """The stored vectors of ``ids`` ``(n, dim)``, in their order, in one FAISS call; KeyError naming the first
        absent id. (:meth:`reconstruct` of each, faster.)"""
        ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        if not len(ids):
            return np.zeros((0, self.dim), dtype=np.float32)
        try:
            return self.index.reconstruct_batch(ids)
        except RuntimeError:
            for id_ in ids:                      # which one is absent
                self.reconstruct(int(id_))
            raise

    def ids(self) -> np.ndarray:
        if isinstance(self.index, faiss.IndexIDMap2):
            return faiss.vector_to_array(self.index.id_map).astype(np.int64)
        ivf = faiss.extract_index_ivf(self.index)
        invlists = ivf.invlists
        out = [faiss.rev_swig_ptr(invlists.get_ids(lst), invlists.list_size(lst)).copy()
               for lst in range(ivf.nlist) if invlists.list_size(lst)]
        return np.sort(np.concatenate(out)) if out else np.zeros(0, np.int64)

    def search(self, queries: np.ndarray, k: int, ids: np.ndarray | None = None,
               exclude: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Best-first ``(scores (q, k'), ids (q, k'))`` of the stored vectors for each query (queries are of
        the other role), ``k' = min(k, ntotal)``. ``ids``: search only among these (FAISS's ``IDSelectorBatch``
        inside the search, so the best ``k`` of the subset come back, not the best ``k`` overall filtered
        afterwards). ``exclude``: never return these (deleted ids, ``IDSelectorNot``; without ``ids`` only). A row
        with fewer results than ``k'`` (fewer ids pass, or IVF probed too few lists) is padded with id ``-1``."""
        queries = _f32(queries)
        limit = self.ntotal if ids is None else min(self.ntotal, len(ids))
        k = min(int(k), limit)
        if k <= 0 or len(queries) == 0:
            return np.zeros((len(queries), 0), np.float32), np.zeros((len(queries), 0), np.int64)
        if ids is not None:
            exclude = None
        elif exclude is not None and len(exclude) == 0:
            exclude = None
        if self.similarity == "order":
            return self._search_exact(queries, k, ids, exclude)
        if self._torch is not None:
            return self._torch.search(queries, k, only=ids, exclude=exclude)
        if ids is None and exclude is None:
            # a page deeper than faiss-gpu returns is searched on the CPU index
            return (self._search_index if k <= GPU_MAX_K else self.index).search(queries, k)
        if exclude is not None and self._search_index is not self.index and k + len(exclude) <= GPU_MAX_K:
            # a GPU index takes no selector: ask for k more than may be excluded, then drop the excluded
            scores, found = self._search_index.search(queries, k + len(exclude))
            return _drop(scores, found, exclude, k)
        batch = faiss.IDSelectorBatch(np.ascontiguousarray(ids if ids is not None else exclude, dtype=np.int64))
        selector = batch if ids is not None else faiss.IDSelectorNot(batch)
        if faiss.try_extract_index_ivf(self.index) is not None:
            params = faiss.SearchParametersIVF(sel=selector, nprobe=int(self.nprobe or 1))
        else:
            params = faiss.SearchParameters(sel=selector)
        # the CPU index: FAISS's GPU indexes take no ID selector
        return self.index.search(queries, k, params=params)

    def _search_exact(self, queries: np.ndarray, k: int, only: np.ndarray | None = None,
                      exclude: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        import torch

        from training.models.factory import build_similarity

        if self._exact is None:
            ids = self.ids()
            flat = self.index.index
            vectors = flat.reconstruct_n(0, flat.ntotal) if flat.ntotal else np.zeros((0, self.dim), np.float32)
            self._exact = (ids, torch.from_numpy(vectors))
        ids, stored = self._exact
        sim = build_similarity(self.similarity)
        q = torch.from_numpy(queries)
        # STT eq. 9 is asymmetric: S(image, caption) — the stored side decides the argument order
        scores = sim(stored, q).t() if self.role == "images" else sim(q, stored)
        if only is not None:
            scores = scores.masked_fill(~torch.from_numpy(np.isin(ids, only)), float("-inf"))
        if exclude is not None:
            scores = scores.masked_fill(torch.from_numpy(np.isin(ids, exclude)), float("-inf"))
        top = scores.topk(k, dim=1)
        found = ids[top.indices.numpy()]
        values = top.values.numpy().astype(np.float32)
        if only is not None or exclude is not None:
            found = np.where(np.isneginf(values), -1, found)        # masked: padding, as FAISS pads
        return values, found


def _drop(scores: np.ndarray, ids: np.ndarray, exclude: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The best ``k`` of each row whose id is not in ``exclude`` (rows are best-first; ``-1`` pads)."""
    out_s = np.full((len(ids), k), -np.inf, np.float32)
    out_i = np.full((len(ids), k), -1, np.int64)
    for row, (srow, irow) in enumerate(zip(scores, ids)):
        keep = (irow >= 0) & ~np.isin(irow, exclude)
        n = min(k, int(keep.sum()))
        out_s[row, :n], out_i[row, :n] = srow[keep][:n], irow[keep][:n]
    return out_s, out_i


def _f32(x) -> np.ndarray:
    if hasattr(x, "detach"):                      # a torch tensor
        x = x.detach().float().cpu().numpy()
    return np.ascontiguousarray(x, dtype=np.float32)


def _faiss_message(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return next((line.split("Error:", 1)[-1].strip() for line in text if "rror" in line), text[-1] if text else "")
