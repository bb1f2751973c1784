"""The image tower alone — the shipped model's three backbones over uint8 views (normalised in the tower), what an
inference backend runs (training/inference/backend.py) — per way of running it, in one process and one run: eager
PyTorch, ``torch.compile`` (TorchInductor's CPU code, the baseline a backend has to beat), OpenVINO in float32 and
in bf16 (where the CPU has native bf16) and ONNX Runtime. Views per second at a fixed batch, the first call's seconds
(``torch.compile`` compiles there; the backends' conversions are cached beforehand, as ``index build`` finds them
after its first run) and how far each one's features are from eager PyTorch's (least cosine over the batch).

    python benchmarks/tower_throughput.py                 # → benchmarks/results/tower_throughput.json
    python benchmarks/tower_throughput.py --rounds 1 --batches 2 --out /tmp/tower.json    # smoke run

Each round times every variant in turn (``--batches`` calls at ``--batch`` views), so a drifting background load
hits them alike; a variant's views/s is its median over the rounds. No photo is decoded: the views are random uint8
pixels, as the backends' own conversion check uses (speed does not depend on the pixels); every variant takes them
as a backend does and normalises them in the tower (``ImageTower``).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, cast

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.flickr8k_levers import write_result  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "tower_throughput.json"


def variants(model, names: list[str]) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """name → a function from uint8 views to backbone features; a backend that does not load is left out
    (and said)."""
    from training.inference import backend as backend_module
    from training.inference.backend import ImageTower, backend_of, use_backend

    tower = ImageTower(model).eval()
    out: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {}
    for name in names:
        if name == "eager":
            out[name] = tower
        elif name == "torch.compile":
            out[name] = torch.compile(tower)
        elif name == "openvino, one request":       # the batch as one request on every thread (no CPU streams)
            used = use_backend(model, "openvino")
            backend = backend_of(model)
            if used != "openvino" or backend is None:
                print(f"{name}: not loaded here (fell back to {used}); left out", flush=True)
                continue
            runner = cast(Any, backend.run)                  # the backend's _OpenVINO, its config; its graph as stored
            request = backend_module._CORE.compile_model(str(backend.path / "tower.xml"), "CPU", {
                **runner.config, "PERFORMANCE_HINT": "LATENCY"}).create_infer_request()
            out[name] = lambda x, request=request: torch.from_numpy(
                np.array(request.infer({0: np.ascontiguousarray(x.numpy())})[0]))
            use_backend(model, "eager")
        else:
            used = use_backend(model, name)
            backend = backend_of(model)
            if used != name or backend is None:
                print(f"{name}: not loaded here (fell back to {used}); left out", flush=True)
                continue
            run = backend.run
            out[name] = lambda x, run=run: torch.from_numpy(np.asarray(run(np.ascontiguousarray(x.numpy()))))
            use_backend(model, "eager")          # detach: the next variant is loaded on its own
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=16, help="views a call (index build's default: 4 photos × 4 views)")
    ap.add_argument("--batches", type=int, default=6, help="timed calls a variant per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", nargs="+",
                    default=["eager", "torch.compile", "openvino", "openvino, one request", "openvino-bf16",
                             "onnxruntime"])
    ap.add_argument("--note", default="")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)

    from training.inference.backend import _input_shape
    from training.inference.pretrained import resolve
    from training.models.checkpoint import load_model

    model = load_model(resolve("")).eval()
    channels, side = _input_shape(model)
    views = torch.randint(0, 256, (args.batch, channels, side, side), dtype=torch.uint8,
                          generator=torch.Generator().manual_seed(0))
    runs = variants(model, args.variants)
    first: dict[str, float] = {}
    features: dict[str, torch.Tensor] = {}
    with torch.inference_mode():
        for name, fn in runs.items():
            t0 = time.perf_counter()
            features[name] = fn(views).float()
            first[name] = time.perf_counter() - t0
            fn(views)                                    # a second warm call
            print(f"{name}: first call {first[name]:.1f} s", flush=True)
        speed: dict[str, list[float]] = {name: [] for name in runs}
        for r in range(args.rounds):
            for name, fn in runs.items():
                t0 = time.perf_counter()
                for _ in range(args.batches):
                    fn(views)
                speed[name].append(args.batch * args.batches / (time.perf_counter() - t0))
            print(f"round {r + 1}: " + ", ".join(f"{n} {v[-1]:.1f}" for n, v in speed.items()) + " views/s", flush=True)
    eager = features.get("eager")
    rows = []
    for name in runs:
        cosine = (None if eager is None else
                  round(float(torch.nn.functional.cosine_similarity(features[name], eager, dim=-1).min()), 6))
        rows.append({"variant": name, "views_per_s": round(statistics.median(speed[name]), 2),
                     "rounds": [round(v, 2) for v in speed[name]], "first_call_s": round(first[name], 2),
                     "min_cosine_vs_eager": cosine})
    base = next((r["views_per_s"] for r in rows if r["variant"] == "eager"), None)
    for row in rows:
        row["x_eager"] = round(row["views_per_s"] / base, 2) if base else None
        print(json.dumps(row), flush=True)
    write_result(args.out, f"the shipped model's image tower (three backbones) over {args.batch} uint8 views a call, "
                           f"{args.batches} calls a round, median of {args.rounds} rounds "
                           f"(python benchmarks/tower_throughput.py)", rows, args.note, batch=args.batch,
                 input=[channels, side, side])
    return 0


if __name__ == "__main__":
    sys.exit(main())
