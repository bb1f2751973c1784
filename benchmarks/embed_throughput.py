"""Gallery embedding throughput: the in-process engine against Ray Data actors (1 and 2), on one machine, in one run.

    python benchmarks/embed_throughput.py --images 200 --repeat 2    # → benchmarks/results/embed_throughput.json

The first ``--images`` Flickr8k photos (sorted by name) are embedded with the shipped model
(training/pretrained/flickr8k.pt) three ways, in turn, ``--repeat`` rounds:

* in-process: what ``jointspace index build`` does by default (``embed_photos``: the model in this process,
  ``--workers`` DataLoader processes decoding, torch's default threads);
* Ray with 1 and with 2 actors (``embed_with_ray``, ``--engine ray``): a local Ray with as many CPUs as the
  machine has, one CPU and one torch thread per actor, shards of ``--shard-size`` images written to a fresh
  shard directory.

A row's time runs from the call to every vector being in hand and includes loading the model (in this process,
or in every actor from the bytes the driver ships) and, for Ray, starting the actors and writing the shards; it
leaves out starting Ray itself, which is reported once (``ray_init_s``): a running cluster pays it once, a local
one per command. Each row records the machine's 1-minute load average when it ended (``load_1min``: other jobs
share the cores). Ray is started before the first round and stays up, idle, while the in-process engine runs.
The photos are read once before (every run reads them from the page cache). The FAISS index build that follows
is the same for both engines and is not timed here.
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from index.embed import embed_photos  # noqa: E402
from index.ray_embed import RayOptions, embed_with_ray, local_init_kwargs  # noqa: E402
from index.scan import find_images  # noqa: E402
from training.data.fileio import write_json  # noqa: E402
from training.models.checkpoint import load_model  # noqa: E402
from benchmarks.tables import current_commit  # noqa: E402

DATA = ROOT.parent / "shared" / "datasets" / "flickr8k" / "images"
MODEL = ROOT / "training" / "pretrained" / "flickr8k.pt"


def _row(round_: int, engine: str, workers: str, n: int, seconds: float, diff: float) -> dict:
    print(f"round {round_}, {engine}, {workers}: {n} images in {seconds:.1f} s (largest difference {diff:.1e})",
          flush=True)
    return {"round": round_, "engine": engine, "workers": workers, "seconds": seconds, "images_per_s": n / seconds,
            "max_abs_diff": diff, "load_1min": os.getloadavg()[0]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(DATA), help="a folder of photos (default: Flickr8k's images)")
    ap.add_argument("--images", type=int, default=300, help="how many of them (the first, by name)")
    ap.add_argument("--model", default=str(MODEL))
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2, help="DataLoader processes of the in-process engine")
    ap.add_argument("--shard-size", type=int, default=25)
    ap.add_argument("--repeat", type=int, default=2, help="rounds: each engine is measured once per round")
    ap.add_argument("--hardware", default=f"CPU, {os.cpu_count()} cores, shared with other jobs",
                    help="what the results file says the numbers were measured on")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "embed_throughput.json"))
    args = ap.parse_args()

    paths = find_images(args.data)[:args.images]
    n = len(paths)
    model_bytes = Path(args.model).read_bytes()
    for p in paths:                      # every engine reads the photos from the page cache, the first one too
        p.read_bytes()
    rows: list[dict] = []
    model = load_model(args.model)
    import ray

    t0 = time.perf_counter()
    ray.init(**local_init_kwargs(os.cpu_count() or 2), logging_level="WARNING")
    ray_init_s = time.perf_counter() - t0
    print(f"ray.init: {ray_init_s:.1f} s", flush=True)
    reference = None
    try:
        for round_ in range(1, args.repeat + 1):      # the engines take turns: a change of load hits all of them
            t0 = time.perf_counter()
            fresh = load_model(args.model)
            emb = embed_photos(fresh, paths, batch_size=args.batch_size, workers=args.workers, progress=False)
            seconds = time.perf_counter() - t0
            reference = reference or emb
            rows.append(_row(round_, "in-process", f"1 process, {args.workers} decoding", n, seconds,
                             float(np.abs(emb.vectors - reference.vectors).max())))
            for actors in (1, 2):
                with tempfile.TemporaryDirectory(prefix="embed-throughput-") as shard_dir:
                    t0 = time.perf_counter()
                    run = embed_with_ray(model, model_bytes, paths, shard_dir,
                                         RayOptions(shard_size=args.shard_size, workers=actors,
                                                    batch_size=args.batch_size, progress=False),
                                         log=lambda _: None)
                    seconds = time.perf_counter() - t0
                assert run.embeddings.kept == reference.kept and len(run.embedded) == -(-n // args.shard_size)
                rows.append(_row(round_, "ray", f"{actors} actor{'s' if actors > 1 else ''}", n, seconds,
                                 float(np.abs(run.embeddings.vectors - reference.vectors).max())))
    finally:
        ray.shutdown()

    write_json(args.out, {
        "description": f"{n} Flickr8k photos embedded with the shipped model ({Path(args.model).name}), batch "
                       f"{args.batch_size}, Ray shards of {args.shard_size} (python benchmarks/embed_throughput.py "
                       f"--images {args.images} --repeat {args.repeat}); time includes loading the model, not starting Ray",
        "hardware": args.hardware, "date": dt.date.today().isoformat(), "commit": current_commit(),
        "python": platform.python_version(), "ray": ray.__version__, "images": n, "ray_init_s": ray_init_s,
        "rows": rows,
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
