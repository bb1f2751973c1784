"""Exact inner-product search as chunked matmul + top-k in torch: what a ``Flat`` index is searched with on a CUDA
device when FAISS has no GPU support (faiss-cpu beside a CUDA build of torch).

The stored vectors live on the device, in float16 when that keeps every score within ``FP16_TOLERANCE`` of the
float32 score (checked on the device itself when the vectors are loaded, with a sample of the stored vectors as
queries), else in float32. A search multiplies the queries by one chunk of the gallery at a time, so its scratch
memory is ``queries × chunk`` scores whatever the gallery's size, and keeps a running best ``k``. The ids it may
return are restricted inside the search, as FAISS's ID selectors do: ``only`` (a filter's ids) and ``exclude``
(an index's deleted ids, its tombstones) are masks over the stored rows. ``k`` has no upper limit (faiss-gpu
allows at most 2,048).

Results are FAISS's: best-first ``(scores (q, k), ids (q, k))`` as float32 and int64 numpy arrays, rows with
fewer than ``k`` results padded with id ``-1``.
"""
from __future__ import annotations

import numpy as np
import torch

FP16_TOLERANCE = 1e-3           # largest score error float16 storage may cause, else float32
SCRATCH_BYTES = 256 * 2 ** 20   # one chunk's score matrix (queries × rows, float32) at most this large
CHECK_QUERIES = 256             # stored vectors used as queries for the float16 check …
CHECK_ROWS = 65_536             # … against at most this many stored vectors


class TorchFlatSearch:
    """The vectors of one ``Flat`` index, with their ids, searched on ``device``."""

    def __init__(self, vectors: np.ndarray, ids: np.ndarray, device: str | torch.device,
                 dtype: torch.dtype | None = None, scratch_bytes: int = SCRATCH_BYTES):
        if len(vectors) != len(ids):
            raise ValueError(f"{len(vectors)} vectors but {len(ids)} ids")
        self.device = torch.device(device)
        self.dim = int(vectors.shape[1]) if vectors.ndim == 2 else 0
        full = torch.from_numpy(np.ascontiguousarray(vectors, dtype=np.float32)).to(self.device)
        if dtype is None:
            dtype = float16_fits(full) if self.device.type == "cuda" else torch.float32
        self.dtype = dtype
        self.vectors = full.to(dtype)
        self.ids = torch.from_numpy(np.ascontiguousarray(ids, dtype=np.int64)).to(self.device)
        self.scratch_bytes = scratch_bytes

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

    @torch.inference_mode()
    def search(self, queries: np.ndarray, k: int, only: np.ndarray | None = None,
               exclude: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        n_q = len(queries)
        k = max(0, min(int(k), self.ntotal))
        if k == 0 or n_q == 0:
            return np.zeros((n_q, k), np.float32), np.full((n_q, k), -1, np.int64)
        q = torch.from_numpy(np.ascontiguousarray(queries, dtype=np.float32)).to(self.device).to(self.dtype)
        keep = self._mask(only, exclude)
        chunk = max(k, self.scratch_bytes // (4 * n_q))
        best_s = torch.full((n_q, 0), float("-inf"), device=self.device)
        best_i = torch.zeros((n_q, 0), dtype=torch.long, device=self.device)
        for start in range(0, self.ntotal, chunk):
            scores = (q @ self.vectors[start:start + chunk].T).float()
            if keep is not None:
                scores.masked_fill_(~keep[start:start + chunk], float("-inf"))
            top = scores.topk(min(k, scores.shape[1]), dim=1)
            best_s = torch.cat([best_s, top.values], 1)
            best_i = torch.cat([best_i, top.indices + start], 1)
            if best_s.shape[1] > k:
                merged = best_s.topk(k, dim=1)
                best_s, best_i = merged.values, best_i.gather(1, merged.indices)
        found = self.ids[best_i]
        found = torch.where(torch.isneginf(best_s), torch.full_like(found, -1), found)
        return best_s.cpu().numpy().astype(np.float32), found.cpu().numpy()


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
