"""Exact inner-product search as chunked matmul + top-k in torch: what a ``Flat`` index is searched with on a CUDA
device when FAISS has no GPU support (faiss-cpu beside a CUDA build of torch).

The stored vectors live on the device, in float16 when that keeps every score within ``FP16_TOLERANCE`` of the
float32 score (checked on the device itself when the vectors are loaded, with a sample of the stored vectors as
queries), else in float32, each row zero-padded to a multiple of :data:`ALIGN` dimensions (aligned rows for the
matrix units; zeros change no score). A search multiplies the queries by one chunk of the gallery at a time, so its
scratch memory is ``queries × chunk`` scores whatever the gallery's size, and keeps a running best ``k``. Float16
storage scores and ranks in float16 on the device (half the bytes of float32 scores), keeping :data:`RERANK` more
candidates than asked, which are then scored again in float32 against the float32 query and the best ``k`` of them
kept. The ids it may return are restricted inside the search, as FAISS's ID selectors do: ``only`` (a filter's
ids) and ``exclude`` (an index's deleted ids, its tombstones) are masks over the stored rows. ``k`` has no upper
limit (faiss-gpu allows at most 2,048).

On a GPU the queries go up through a pinned host buffer, and the results come back in one device-to-host copy
(scores and ids packed into one tensor) into another; an unfiltered search of one query (the service at batch 1)
replays a CUDA graph captured for its ``k`` (:data:`GRAPH_KS` of them kept), so the host launches one graph
instead of a dozen kernels.

Results are FAISS's: best-first ``(scores (q, k), ids (q, k))`` as float32 and int64 numpy arrays, rows with
fewer than ``k`` results padded with id ``-1``.
"""
from __future__ import annotations

import threading

import numpy as np
import torch

FP16_TOLERANCE = 1e-3           # largest score error float16 storage may cause, else float32
SCRATCH_BYTES = 256 * 2 ** 20   # one chunk's score matrix (queries × rows, float32) at most this large
CHECK_QUERIES = 256             # stored vectors used as queries for the float16 check …
CHECK_ROWS = 65_536             # … against at most this many stored vectors
ALIGN = 16                      # stored dimensions padded with zeros to a multiple of this
RERANK = 16                     # float16 storage: candidates kept beyond k, scored again in float32
GRAPH_KS = 4                    # CUDA graphs kept (one per k of a batch-1 search)


class TorchFlatSearch:
    """The vectors of one ``Flat`` index, with their ids, searched on ``device``."""

    def __init__(self, vectors: np.ndarray, ids: np.ndarray, device: str | torch.device,
                 dtype: torch.dtype | None = None, scratch_bytes: int = SCRATCH_BYTES, graphs: bool = True):
        if len(vectors) != len(ids):
            raise ValueError(f"{len(vectors)} vectors but {len(ids)} ids")
        self.device = torch.device(device)
        self.dim = int(vectors.shape[1]) if vectors.ndim == 2 else 0
        self.width = -(-self.dim // ALIGN) * ALIGN                 # the stored rows' length, zero-padded
        full = torch.from_numpy(np.ascontiguousarray(vectors, dtype=np.float32)).to(self.device)
        if dtype is None:
            dtype = float16_fits(full) if self.device.type == "cuda" else torch.float32
        self.dtype = dtype
        self.vectors = torch.zeros(len(full), self.width, dtype=dtype, device=self.device)
        self.vectors[:, :self.dim] = full.to(dtype)
        del full
        self.ids = torch.from_numpy(np.ascontiguousarray(ids, dtype=np.int64)).to(self.device)
        self.scratch_bytes = scratch_bytes
        self.cuda = self.device.type == "cuda"
        self.graphs = graphs and self.cuda
        self._graphs: dict[int, tuple] = {}       # k → (CUDA graph, its query, its packed results)
        self._up: torch.Tensor | None = None      # pinned staging of the queries (float32, width columns)
        self._down: torch.Tensor | None = None    # pinned landing of the packed results
        self._lock = threading.Lock()             # the pinned buffers and graphs serve one search at a time

    @property
    def ntotal(self) -> int:
        return len(self.ids)

    @property
    def name(self) -> str:
        return f"torch-{self.device.type}-{'fp16' if self.dtype == torch.float16 else 'fp32'}"

    def _mask(self, only: np.ndarray | None, exclude: np.ndarray | None) -> torch.Tensor | None:
        """Rows that may be returned (None: all)."""
        keep = None
        if only is not None:
            keep = torch.isin(self.ids, torch.from_numpy(np.asarray(only, dtype=np.int64)).to(self.device))
        if exclude is not None and len(exclude):
            out = ~torch.isin(self.ids, torch.from_numpy(np.asarray(exclude, dtype=np.int64)).to(self.device))
            keep = out if keep is None else keep & out
        return keep

    def _queries(self, queries: np.ndarray) -> torch.Tensor:
        """``(q, dim)`` float32 → ``(q, width)`` float32 on the device, zero-padded; on a GPU through a pinned
        buffer (an asynchronous copy)."""
        host = torch.from_numpy(np.ascontiguousarray(queries, dtype=np.float32))
        if not self.cuda:
            return torch.nn.functional.pad(host, (0, self.width - self.dim))
        if self._up is None or self._up.shape[0] < len(host):
            self._up = torch.zeros(max(len(host), 64), self.width, dtype=torch.float32, pin_memory=True)
        stage = self._up[:len(host)]
        stage[:, :self.dim] = host                # the padding columns stay zero
        return stage.to(self.device, non_blocking=True)

    def _topk(self, q: torch.Tensor, k: int, keep: torch.Tensor | None) -> torch.Tensor:
        """The best ``k`` for the float32 queries ``q (n, width)`` on the device, packed as :func:`unpack` reads
        them; no host sync, so that a CUDA graph can hold it."""
        n_q = q.shape[0]
        half = self.dtype == torch.float16
        depth = min(self.ntotal, k + RERANK) if half else k          # float16: candidates, scored again below
        qs = q.to(self.dtype)
        chunk = max(depth, self.scratch_bytes // (4 * n_q))
        best_s = torch.full((n_q, 0), float("-inf"), dtype=self.dtype, device=self.device)
        best_i = torch.zeros((n_q, 0), dtype=torch.long, device=self.device)
        for start in range(0, self.ntotal, chunk):
            scores = qs @ self.vectors[start:start + chunk].T          # float16 storage: float16 scores
            if keep is not None:
                scores.masked_fill_(~keep[start:start + chunk], float("-inf"))
            top = scores.topk(min(depth, scores.shape[1]), dim=1)
            best_s = torch.cat([best_s, top.values], 1)
            best_i = torch.cat([best_i, top.indices + start], 1)
            if best_s.shape[1] > depth:
                merged = best_s.topk(depth, dim=1)
                best_s, best_i = merged.values, best_i.gather(1, merged.indices)
        scores32 = best_s.float()
        if half:                          # the candidates scored in float32, the best k of them kept
            exact = (self.vectors[best_i].float() @ q.unsqueeze(-1)).squeeze(-1)
            exact = torch.where(torch.isneginf(scores32), scores32, exact)
            top = exact.topk(k, dim=1)
            scores32, best_i = top.values, best_i.gather(1, top.indices)
        found = self.ids[best_i]
        found = torch.where(torch.isneginf(scores32), torch.full_like(found, -1), found)
        return pack(scores32, found)

    def _graph(self, k: int) -> tuple:
        """The CUDA graph of an unfiltered search of one query for ``k``: captured on first use (after two eager
        runs on a side stream, as torch.cuda.graphs asks), its static query and output kept with it."""
        entry = self._graphs.get(k)
        if entry is None:
            static_q = torch.zeros(1, self.width, dtype=torch.float32, device=self.device)
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(2):
                    self._topk(static_q, k, None)
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_out = self._topk(static_q, k, None)
            if len(self._graphs) >= GRAPH_KS:
                self._graphs.pop(next(iter(self._graphs)))
            entry = self._graphs[k] = (graph, static_q, static_out)
        return entry

    def _fetch(self, packed: torch.Tensor) -> np.ndarray:
        """The packed results on the host: on a GPU one asynchronous copy into a pinned buffer, then a wait."""
        if not self.cuda:
            return packed.numpy()
        if self._down is None or self._down.numel() < packed.numel():
            self._down = torch.empty(max(packed.numel(), 4096), dtype=packed.dtype, pin_memory=True)
        land = self._down[:packed.numel()].view(packed.shape)
        land.copy_(packed, non_blocking=True)
        torch.cuda.current_stream(self.device).synchronize()
        return land.numpy().copy()

    @torch.inference_mode()
    def search(self, queries: np.ndarray, k: int, only: np.ndarray | None = None,
               exclude: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        n_q = len(queries)
        k = max(0, min(int(k), self.ntotal))
        if k == 0 or n_q == 0:
            return np.zeros((n_q, k), np.float32), np.full((n_q, k), -1, np.int64)
        with self._lock:
            q = self._queries(queries)
            keep = self._mask(only, exclude)
            if self.graphs and n_q == 1 and keep is None:
                graph, static_q, packed = self._graph(k)
                static_q.copy_(q)
                graph.replay()
            else:
                packed = self._topk(q, k, keep)
            return unpack(self._fetch(packed))


def pack(scores: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """float32 scores and int64 ids ``(q, k)`` as one int32 tensor ``(q, k, 3)`` (the ids' two words, then the
    score's bits): what one device-to-host copy brings back."""
    return torch.cat([ids.contiguous().view(torch.int32).view(*ids.shape, 2),
                      scores.contiguous().view(torch.int32).unsqueeze(-1)], dim=-1)


def unpack(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`pack`'s ``(q, k, 3)`` int32 on the host → ``(scores float32 (q, k), ids int64 (q, k))``."""
    ids = np.ascontiguousarray(packed[..., :2]).view(np.int64)[..., 0]
    scores = np.ascontiguousarray(packed[..., 2]).view(np.float32)
    return scores, ids


def float16_fits(vectors: torch.Tensor, tolerance: float = FP16_TOLERANCE, sample: int = CHECK_QUERIES) -> torch.dtype:
    """float16 when scoring ``vectors`` (on their device) in float16 stays within ``tolerance`` of float32 for a
    sample of the stored vectors as queries against a sample of them, else float32."""
    if not len(vectors):
        return torch.float32
    queries = vectors[::max(1, len(vectors) // sample)][:sample]
    rows = vectors[::max(1, len(vectors) // CHECK_ROWS)][:CHECK_ROWS]
    exact = queries @ rows.T
    half = (queries.half() @ rows.half().T).float()
    return torch.float16 if float((exact - half).abs().max()) <= tolerance else torch.float32
