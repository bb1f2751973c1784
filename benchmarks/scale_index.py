"""A large gallery index: build time and peak memory for N generated vectors, the time to add 1,000 vectors to it
as a new segment and as a full rewrite (measured in the same run), and search latency and recall@10 against
exact search, with the index read into memory and memory-mapped.

    python benchmarks/scale_index.py --n 1000000 --dim 256 --max-index-memory 4GB \\
        --out benchmarks/results/scale_index.json

The vectors are generated clustered unit vectors (as benchmarks/index_recall.py), written to a .npy file in
--work and memory-mapped; the index directory is a real one (``index.gallery.build_from_vectors`` /
``update``: segments, metadata, generations), with a made-up model fingerprint and one metadata row per
vector. The build runs in a child process so its peak resident memory is its own (it includes the input vectors'
mapped pages it touched). Recall@10: the fraction of the exact top 10 (brute force over every live vector)
that the search returns, over --queries queries searched one at a time.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from index.faiss_index import parse_bytes  # noqa: E402
from index.changes import BuildOptions, ChangeSet, ModelFacts  # noqa: E402
from index.gallery import Gallery, build_from_vectors, update  # noqa: E402
from index.generations import current_generation  # noqa: E402
from index.metadata import Metadata  # noqa: E402
from benchmarks.tables import current_commit  # noqa: E402
from training.data.fileio import write_json  # noqa: E402

FP = "benchmark-" + "0" * 54       # a made-up model fingerprint: the index is never used with a model


def clustered(path: Path, n: int, dim: int, seed: int, centers: int = 1000, spread: float = 0.35) -> np.ndarray:
    """``n`` unit vectors around shared centres (benchmarks/index_recall.py's distribution), generated in chunks
    into a .npy file, returned memory-mapped."""
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, dim))
    c = np.random.default_rng(12345).standard_normal((centers, dim)).astype(np.float32)
    rng = np.random.default_rng(seed)
    for start in range(0, n, 100_000):
        m = min(100_000, n - start)
        x = c[rng.integers(0, centers, m)] + spread * np.sqrt(2.0) * rng.standard_normal((m, dim), np.float32)
        out[start:start + m] = x / np.linalg.norm(x, axis=1, keepdims=True)
    out.flush()
    return np.load(path, mmap_mode="r")


def rss_mb() -> float:
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3      # Linux: KiB


def phase_build(args) -> int:
    """Child process: builds the index from the mapped vectors; prints seconds, factory and peak RSS."""
    x = np.load(Path(args.work) / "vectors.npy", mmap_mode="r")
    rows = [(f"/gallery/{i // 1000:04d}/{i}.jpg", None) for i in range(len(x))]
    start_rss = rss_mb()
    t0 = time.perf_counter()
    build_from_vectors(args.index, ModelFacts(FP, "cosine"),
                       ChangeSet(image_vectors=x, image_ids=np.arange(len(x)), image_rows=rows),
                       BuildOptions(max_memory=parse_bytes(args.max_index_memory)))
    seconds = time.perf_counter() - t0
    factory = json.loads((Path(args.index) / current_generation(Path(args.index)) / "manifest.json").read_text())
    print(json.dumps({"seconds": seconds, "factory": factory["images"]["factory"], "peak_rss_mb": peak_rss_mb(),
                      "start_rss_mb": start_rss}))
    return 0


def segment_file(root: Path) -> tuple[Path, list[dict]]:
    gen = root / current_generation(root)
    segs = json.loads((gen / "manifest.json").read_text())["images"]["segments"]
    return gen, segs


def exact_top(x: np.ndarray, extra: np.ndarray, q: np.ndarray, k: int) -> np.ndarray:
    """Ids of the exact top ``k`` (inner product) over ``x`` (ids 0…) then ``extra`` (the ids after)."""
    best_s = np.full((len(q), 0), -np.inf, np.float32)
    best_i = np.zeros((len(q), 0), np.int64)
    for start in range(0, len(x), 200_000):
        block = np.asarray(x[start:start + 200_000])
        s = q @ block.T
        best_s = np.concatenate([best_s, s], 1)
        best_i = np.concatenate([best_i, np.broadcast_to(np.arange(start, start + len(block)), s.shape)], 1)
        keep = np.argsort(-best_s, 1)[:, :k]
        best_s, best_i = np.take_along_axis(best_s, keep, 1), np.take_along_axis(best_i, keep, 1)
    s = q @ extra.T
    best_s = np.concatenate([best_s, s], 1)
    best_i = np.concatenate([best_i, np.broadcast_to(np.arange(len(x), len(x) + len(extra)), s.shape)], 1)
    keep = np.argsort(-best_s, 1)[:, :k]
    return np.take_along_axis(best_i, keep, 1)


def measure_search(root: Path, q: np.ndarray, exact: np.ndarray, mmap: bool, k: int = 10) -> dict:
    before = rss_mb()
    t0 = time.perf_counter()
    gallery = Gallery.load(root, mmap=mmap)
    load_s = time.perf_counter() - t0
    loaded = rss_mb() - before
    gallery.search_images(q[:5], k)                  # warm up
    times, found = [], []
    for row in q:
        t0 = time.perf_counter()
        hits = gallery.search_images(row[None], k)[0]
        times.append((time.perf_counter() - t0) * 1e3)
        found.append([i for i, _ in hits])
    recall = float(np.mean([len(set(f) & set(e.tolist())) / k for f, e in zip(found, exact)]))
    out = {"mode": "memory-mapped" if mmap else "read into memory", "segments": len(gallery.images.segments),
           "load_s": round(load_s, 2), "load_rss_mb": round(loaded, 1),
           "p50_ms": round(float(np.percentile(times, 50)), 3), "p99_ms": round(float(np.percentile(times, 99)), 3),
           "recall10": round(recall, 3), "nprobe": gallery.images.nprobe}
    gallery.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--add", type=int, default=1000, help="vectors added to the built index")
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--max-index-memory", default="4GB")
    ap.add_argument("--work", default="/tmp/jointspace-scale-index", help="scratch folder (deleted at the end)")
    ap.add_argument("--out", help="results JSON")
    ap.add_argument("--hardware", default="CPU, 2 cores, shared with other jobs")
    ap.add_argument("--phase", choices=["all", "build"], default="all", help=argparse.SUPPRESS)
    ap.add_argument("--index", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.phase == "build":
        return phase_build(args)

    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    root = work / "index"
    t0 = time.perf_counter()
    x = clustered(work / "vectors.npy", args.n, args.dim, seed=0)
    print(f"generated {args.n} x {args.dim} in {time.perf_counter() - t0:.1f} s", flush=True)

    child = subprocess.run([sys.executable, __file__, "--phase", "build", "--work", str(work), "--index", str(root),
                            "--max-index-memory", args.max_index_memory], capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
    if child.returncode:
        print(child.stderr, file=sys.stderr)
        return 1
    built = json.loads(child.stdout.strip().splitlines()[-1])
    print("build:", built, flush=True)
    rows = [{"step": f"build {args.n:,} vectors", "factory": built["factory"], "seconds": round(built["seconds"], 1),
             "peak_rss_mb": round(built["peak_rss_mb"]), "start_rss_mb": round(built["start_rss_mb"]),
             "vector_mb_written": None,
             "note": "peak RSS: the build process, with the input vectors' mapped pages and the metadata rows"}]

    gen, segs = segment_file(root)
    base = gen / segs[0]["file"]
    base_stat = (base.stat().st_ino, base.stat().st_mtime_ns)
    index_mb = sum((gen / s["file"]).stat().st_size for s in segs) / 1e6
    rows[0]["vector_mb_written"] = round(index_mb, 1)
    added = [clustered(work / f"add{i}.npy", args.add, args.dim, seed=10 + i) for i in range(2)]

    t0 = time.perf_counter()
    meta = Metadata(gen / "metadata.sqlite", readonly=True)
    meta.copy_to(work / "metadata-copy.sqlite").close()
    meta.close()
    meta_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    update(root, FP, ChangeSet(image_vectors=np.asarray(added[0]),
                               image_rows=[(f"/new/a{i}.jpg", None) for i in range(args.add)], compact="none"))
    seg_s = time.perf_counter() - t0
    gen, segs = segment_file(root)
    untouched = (base.name == segs[0]["file"]
                 and ((gen / segs[0]["file"]).stat().st_ino, (gen / segs[0]["file"]).stat().st_mtime_ns) == base_stat)
    rows.append({"step": f"add {args.add:,} as a new segment", "factory": built["factory"], "seconds": round(seg_s, 2),
                 "peak_rss_mb": None, "vector_mb_written": round((gen / segs[-1]["file"]).stat().st_size / 1e6, 2),
                 "note": "stored segment untouched (same inode and mtime)" if untouched else "STORED SEGMENT CHANGED"})
    print(rows[-1], flush=True)

    q_all = np.asarray(clustered(work / "queries.npy", args.queries, args.dim, seed=1))
    exact = exact_top(x, np.asarray(added[0]), q_all, 10)
    search = [{**measure_search(root, q_all, exact, mmap=False), "state": "base + 1 segment"},
              {**measure_search(root, q_all, exact, mmap=True), "state": "base + 1 segment"}]
    for r in search:
        print(r, flush=True)

    t0 = time.perf_counter()
    update(root, FP, ChangeSet(image_vectors=np.asarray(added[1]),
                               image_rows=[(f"/new/b{i}.jpg", None) for i in range(args.add)], compact="all"))
    full_s = time.perf_counter() - t0
    gen, segs = segment_file(root)
    rows.append({"step": f"add {args.add:,} as a full rewrite", "factory": built["factory"],
                 "seconds": round(full_s, 2), "peak_rss_mb": None,
                 "vector_mb_written": round(sum((gen / s["file"]).stat().st_size for s in segs) / 1e6, 1),
                 "note": "every segment merged into one (what every update did before segments)"})
    rows.append({"step": f"metadata copy ({args.n:,} rows)", "factory": "", "seconds": round(meta_s, 2),
                 "peak_rss_mb": None, "vector_mb_written": None,
                 "note": "part of both adds above: every update still copies the SQLite metadata whole"})
    print(rows[-2:], flush=True)

    result = {"description": f"{args.n:,} generated clustered unit vectors ({args.dim}-d, so that 1M fit the "
                             f"machine), index type chosen for --max-index-memory {args.max_index_memory} "
                             f"({index_mb:.0f} MB on disk); {args.queries} queries one at a time, recall@10 "
                             f"against exact search (python benchmarks/scale_index.py --n {args.n} --dim "
                             f"{args.dim} --max-index-memory {args.max_index_memory})",
              "hardware": args.hardware, "date": date.today().isoformat(),
              "commit": current_commit(),
              "n": args.n, "dim": args.dim, "rows": rows, "search": search}
    if args.out:
        write_json(args.out, result)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
