"""What numpy's and FAISS's BLAS threads cost the model: the service's text search at one batch, in process, with
their pools as they load (a thread per core each) and with one thread each (``single_threaded_blas``, what a
``serve`` worker does at start: training/inference/threads.py). ``benchmarks/results/blas_threads_cpu.json``,
rendered into docs/benchmarks.md by benchmarks/tables.py.

    python benchmarks/blas_threads.py --index demo/photos-index --out benchmarks/results/blas_threads_cpu.json

Each measurement is its own process (a pool's threads cannot be taken back once they spin), the two settings
taking turns ``--rounds`` times for each torch thread count of ``--torch-threads`` (default: every core, as
a process of torch's defaults runs, and the service's own CPU default, every core but one); a process times
``--reps`` searches of ``--batch`` sentences (``Engine.search_texts``: the text tower, the index search and the
relevance of every hit) after one unmeasured. The median of the rounds is reported.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SETTINGS = ("as loaded", "one thread")
SUBJECTS = ("a dog", "two children", "a red car", "a man with a camera", "a cat", "a woman", "a bike", "a boat")
PLACES = ("on the beach", "in a park", "on a snowy mountain", "in the street", "near a lake", "in a kitchen")


def measure(model: str, index: str, setting: str, torch_threads: int, batch: int, reps: int) -> dict:
    """One process's part: ``reps`` text searches of ``batch`` sentences, milliseconds each (mean)."""
    import torch

    from index.gallery import Gallery
    from service.engine import Engine
    from training.inference.pretrained import resolve
    from training.inference.threads import blas_pools, single_threaded_blas
    from training.models.checkpoint import load_model

    torch.set_num_threads(torch_threads)
    net = load_model(resolve(model or None), "cpu").eval()
    engine = Engine(net, Gallery.load(Path(index), model=net, device="cpu"))
    if setting == "one thread":
        single_threaded_blas()
    texts = [f"{s} {p}" for p in PLACES for s in SUBJECTS]
    items = [(texts[i % len(texts)], 10) for i in range(batch)]
    engine.search_texts(items)
    start = time.perf_counter()
    for _ in range(reps):
        engine.search_texts(items)
    ms = (time.perf_counter() - start) / reps * 1000
    return {"ms": ms, "pools": {Path(p["filepath"]).name: p["num_threads"] for p in blas_pools()}}


def main() -> None:
    from service.state import cpu_threads

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="", help="model file (default: the shipped model)")
    ap.add_argument("--index", default="demo/photos-index")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--torch-threads", type=int, nargs="+",
                    default=sorted({os.cpu_count() or 1, cpu_threads(0)}, reverse=True))
    ap.add_argument("--hardware", default="")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--child", choices=SETTINGS, help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.model, args.index, args.child, args.threads, args.batch, args.reps)))
        return
    rows = []
    for threads in args.torch_threads:
        runs: dict[str, list[float]] = {s: [] for s in SETTINGS}
        pools: dict[str, dict] = {}
        for _ in range(args.rounds):
            for setting in SETTINGS:
                out = subprocess.run([sys.executable, __file__, "--child", setting, "--threads", str(threads),
                                      "--model", args.model, "--index", args.index, "--batch", str(args.batch),
                                      "--reps", str(args.reps)], cwd=REPO, check=True, capture_output=True, text=True)
                part = json.loads(out.stdout.strip().splitlines()[-1])
                runs[setting].append(part["ms"])
                pools[setting] = part["pools"]
        for setting in SETTINGS:
            ms = statistics.median(runs[setting])
            rows.append({"torch_threads": threads, "blas": setting, "pools": pools[setting], "ms": ms,
                         "queries_per_s": args.batch * 1000 / ms, "runs_ms": runs[setting]})
            print(f"torch threads {threads}, BLAS pools {setting}: {ms:.1f} ms a batch of {args.batch} "
                  f"(runs {', '.join(f'{x:.0f}' for x in runs[setting])})", flush=True)
    if args.out:
        from training.data.fileio import write_json

        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                text=True).stdout.strip()
        write_json(args.out, {"rows": rows, "batch": args.batch, "reps": args.reps, "rounds": args.rounds,
                              "index": args.index, "model": args.model or "the shipped model",
                              "cpus": os.cpu_count(), "hardware": args.hardware,
                              "date": dt.date.today().isoformat(), "commit": commit,
                              "command": "python benchmarks/blas_threads.py " + " ".join(sys.argv[1:])})


if __name__ == "__main__":
    main()
