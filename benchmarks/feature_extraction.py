"""The feature cache's extraction over real photos (training/data/features.py ``extract_features``), the pass that
``jointspace train``, ``jointspace concepts`` and a query bank make over a training split: the shipped config's three
backbones in eager PyTorch against the float32 CPU backend it now runs on (training/inference/backend.py
``extraction_tower``), for one view a photo (the evaluation view) and for the four views of ``image.train_views:
flip-crop``. Photos a second, decoding included, each variant into an empty cache folder, in one process and one
run; and how far the backend's features are from eager PyTorch's (largest difference relative to the largest
feature).

    python benchmarks/feature_extraction.py --data /path/to/flickr8k   # → benchmarks/results/feature_extraction.json
    python benchmarks/feature_extraction.py --data /path/to/flickr8k --photos 16 --out /tmp/fx.json   # smoke run

The backend's conversion is read from the graph cache (as a second run finds it); its first-call set-up is paid
before the clock starts, once, as a training run pays it once for all its photos.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.flickr8k_levers import write_result  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "feature_extraction.json"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="the Flickr8k folder (its training photos are read)")
    ap.add_argument("--photos", type=int, default=256, help="training photos, the first in the split's order")
    ap.add_argument("--note", default="")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)

    from training.data.datasets import load_dataset
    from training.data.features import Compute, extract_features
    from training.inference.backend import extraction_tower
    from training.inference.embedding import view_preprocess
    from training.inference.pretrained import resolve
    from training.models.checkpoint import load_model

    model = load_model(resolve("")).eval()
    paths = [r.path for r in load_dataset(args.data).split("train").images[:args.photos]]
    tower = extraction_tower(model)
    if tower is None:
        print("no float32 CPU backend loads here: nothing to compare", file=sys.stderr)
        return 1
    channels, side = model.preprocess.channels, model.preprocess.image_size
    tower(torch.zeros((2, channels, side, side), dtype=torch.uint8))        # the set-up, before the clock
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for views in ("none", "flip-crop"):
            pre = view_preprocess(model, views)
            out = {}
            for name, compute in (("eager PyTorch", Compute(progress=False)),
                                  ("float32 CPU backend", Compute(progress=False, tower=lambda _model: tower))):
                t0 = time.perf_counter()
                out[name] = np.array(extract_features(model, paths, cache_dir=Path(scratch) / f"{views}-{name}",
                                                      compute=compute, preprocess=pre, per_view=views != "none"))
                seconds = time.perf_counter() - t0
                rows.append({"views": 1 if views == "none" else getattr(pre, "crops", 1), "train_views": views,
                             "runs": name, "photos": len(paths), "seconds": round(seconds, 2),
                             "photos_per_s": round(len(paths) / seconds, 2)})
                print(json.dumps(rows[-1]), flush=True)
            eager, backend = out["eager PyTorch"], out["float32 CPU backend"]
            rows[-1]["max_rel_diff_vs_eager"] = float(np.abs(backend - eager).max() / np.abs(eager).max())
            rows[-1]["x_eager"] = round(rows[-2]["seconds"] / rows[-1]["seconds"], 2)
    write_result(args.out, f"extract_features over the first {len(paths)} Flickr8k training photos with the shipped "
                           f"model's three backbones, decoding included, each variant into an empty cache "
                           f"(python benchmarks/feature_extraction.py)", rows, args.note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
