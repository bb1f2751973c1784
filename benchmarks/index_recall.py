"""Recall of the index types against exact search, on generated clustered unit vectors (embeddings cluster by
content; uniform random vectors would be the pessimistic extreme).

    python benchmarks/index_recall.py --n 100000 --dim 256

Prints, per factory string: build time, per-query search time (batched), and recall@10 = the fraction of the
exact top-10 that the index returns, next to the choice ``default_factory`` makes for this size.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from index.faiss_index import VectorIndex, default_factory, default_nlist  # noqa: E402


def clustered(n: int, dim: int, seed: int, centers: int = 1000, spread: float = 0.35) -> np.ndarray:
    rng = np.random.default_rng(seed)
    c = np.random.default_rng(12345).standard_normal((centers, dim)).astype(np.float32)   # shared centres
    x = c[rng.integers(0, centers, n)] + spread * rng.standard_normal((n, dim)).astype(np.float32) * np.sqrt(
        2.0)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--queries", type=int, default=500)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--factories", nargs="*", help="default: Flat, the default choice, IVF-SQ8, IVF-PQ, HNSW32")
    args = ap.parse_args()

    x, q = clustered(args.n, args.dim, 0), clustered(args.queries, args.dim, 1)
    nlist = default_nlist(args.n)
    pq_m = next(m for m in range(args.dim // 4, 0, -1) if args.dim % m == 0)
    factories = args.factories or ["Flat", default_factory(args.n, args.dim), f"IVF{nlist},SQ8",
                                   f"IVF{nlist},PQ{pq_m}", "HNSW32"]
    factories = list(dict.fromkeys(factories))
    exact = None
    print(f"n={args.n} dim={args.dim} queries={args.queries} k={args.k}; default_factory → "
          f"{default_factory(args.n, args.dim)}")
    print("| factory | nprobe | build s | search ms/query | recall@10 |")
    print("|---|---:|---:|---:|---:|")
    for factory in ["Flat"] + [f for f in factories if f != "Flat"]:
        t0 = time.perf_counter()
        index = VectorIndex.create(args.dim, "images", "cosine", factory, train_vectors=x)
        index.add(x, np.arange(args.n))
        build_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        _, ids = index.search(q, args.k)
        ms = (time.perf_counter() - t0) * 1e3 / len(q)
        if exact is None:
            exact = ids
        recall = np.mean([len(set(a) & set(e)) / args.k for a, e in zip(ids, exact)])
        print(f"| {factory} | {index.nprobe or '-'} | {build_s:.1f} | {ms:.3f} | {recall:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
