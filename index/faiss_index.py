"""One FAISS index of embeddings with int64 ids: made from a factory string, searched, updated by id, saved.

The index type is FAISS's own vocabulary, a factory string (``"Flat"``, ``"IVF1024,Flat"``,
``"IVF4096,PQ64"``, ``"HNSW32"``). Without one, :func:`default_factory` picks by gallery size:

==========================  =========================  ===========================================
vectors                     factory                    why
==========================  =========================  ===========================================
n < 50,000                  ``Flat``                   exact; a query costs n·d multiply-adds (measured
                                                       5.7 ms at 100k × 256 on the shared dev CPU)
50,000 ≤ n < 1,000,000      ``IVF{nlist},Flat``        nlist ≈ 4·√n lists, ``nprobe`` = nlist/16:
                                                       about 1/16 of the gallery is scanned
n ≥ 1,000,000               ``IVF{nlist},SQ8``         8-bit scalar quantisation: 4× smaller than
                                                       float32 (97% recall@10 in the benchmark)
==========================  =========================  ===========================================

Product quantisation (``IVF…,PQ{d/4}``, 16× smaller) is not a default: on generated clustered 256-d vectors it
found only 54% of the exact top-10 at nprobe = nlist/16 (``benchmarks/index_recall.py``); use it by factory
string when memory matters more than recall. HNSW is never the default because FAISS's HNSW cannot remove
vectors (``index remove`` would fail); it can still be asked for by factory string.
``benchmarks/index_recall.py`` measures the recall of each choice against exact search.

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
import warnings
from pathlib import Path

import numpy as np
import torch

from training.similarity import build_similarity

try:
    import faiss
except ImportError as err:  # pragma: no cover - depends on the install
    raise ImportError("jointspace's index needs FAISS: pip install 'jointspace[cpu]' (faiss-cpu) or "
                      "'jointspace[gpu]' (faiss-gpu)") from err

FLAT_LIMIT = 50_000          # below: exact Flat
SQ_FROM = 1_000_000          # from here: IVF with 8-bit scalar quantisation
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
    def load(cls, path: str | Path, role: str, similarity: str, factory: str, nprobe: int | None) -> "VectorIndex":
        return cls(faiss.read_index(str(path)), role, similarity, factory, nprobe)

    def save(self, path: str | Path) -> None:
        faiss.write_index(self.index, str(path))

    def to_device(self, device: str | torch.device) -> "VectorIndex":
        """Search on the GPU (``index_cpu_to_gpu``) when ``device`` is CUDA and FAISS has GPU support; the CPU
        index stays the one that is updated and saved. Same results within float tolerance."""
        if torch.device(device).type != "cuda" or self.similarity == "order":
            self._search_index = self.index      # order: scored in torch on the model's device instead
            return self
        if not hasattr(faiss, "StandardGpuResources") or faiss.get_num_gpus() == 0:
            warnings.warn("FAISS has no GPU support here (faiss-cpu, or no GPU visible to FAISS): the index is "
                          "searched on the CPU (install jointspace[gpu] for GPU search)", RuntimeWarning, stacklevel=2)
            self._search_index = self.index
            return self
        self._gpu_resources = faiss.StandardGpuResources()
        self._search_index = faiss.index_cpu_to_gpu(self._gpu_resources, torch.device(device).index or 0,
                                                     self.index)
        if self.nprobe is not None:
            faiss.GpuParameterSpace().set_index_parameter(self._search_index, "nprobe", int(self.nprobe))
        self._device = device
        return self

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
        if self._search_index is not self.index:
            self.to_device(self._device)

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

    def ids(self) -> np.ndarray:
        if isinstance(self.index, faiss.IndexIDMap2):
            return faiss.vector_to_array(self.index.id_map).astype(np.int64)
        ivf = faiss.extract_index_ivf(self.index)
        invlists = ivf.invlists
        out = [faiss.rev_swig_ptr(invlists.get_ids(lst), invlists.list_size(lst)).copy()
               for lst in range(ivf.nlist) if invlists.list_size(lst)]
        return np.sort(np.concatenate(out)) if out else np.zeros(0, np.int64)

    def search(self, queries: np.ndarray, k: int, ids: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Best-first ``(scores (q, k'), ids (q, k'))`` of the stored vectors for each query (queries are of
        the other role), ``k' = min(k, ntotal)``. ``ids``: search only among these (FAISS's ``IDSelectorBatch``
        inside the search, so the best ``k`` of the subset come back, not the best ``k`` overall filtered
        afterwards). A row with fewer results than ``k'`` (fewer ids pass, or IVF probed too few lists) is padded
        with id ``-1``."""
        queries = _f32(queries)
        limit = self.ntotal if ids is None else min(self.ntotal, len(ids))
        k = min(int(k), limit)
        if k <= 0 or len(queries) == 0:
            return np.zeros((len(queries), 0), np.float32), np.zeros((len(queries), 0), np.int64)
        if self.similarity == "order":
            return self._search_exact(queries, k, ids)
        if ids is None:
            return self._search_index.search(queries, k)
        selector = faiss.IDSelectorBatch(np.ascontiguousarray(ids, dtype=np.int64))
        if faiss.try_extract_index_ivf(self.index) is not None:
            params = faiss.SearchParametersIVF(sel=selector, nprobe=int(self.nprobe or 1))
        else:
            params = faiss.SearchParameters(sel=selector)
        # the CPU index: FAISS's GPU indexes take no ID selector
        return self.index.search(queries, k, params=params)

    def _search_exact(self, queries: np.ndarray, k: int,
                      only: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
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
        top = scores.topk(k, dim=1)
        return top.values.numpy().astype(np.float32), ids[top.indices.numpy()]


def _f32(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().float().cpu().numpy()
    return np.ascontiguousarray(x, dtype=np.float32)


def _faiss_message(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return next((line.split("Error:", 1)[-1].strip() for line in text if "rror" in line), text[-1] if text else "")
