"""What an ensemble costs where it is served: rows of ``benchmarks/results/ensemble_cost.json`` (rendered into
docs/results.md by benchmarks/tables.py), one per model file given.

    flock -x /tmp/jointspace-cpu.lock python benchmarks/ensemble_cost.py \\
        --model "shipped model=training/pretrained/flickr8k.pt" --model "seeds 0+1=runs/ens01.pt" ...

For each model: its members and embedding width (an index stores 4 bytes a dimension for each photo and caption),
the file's size, the seconds to load it, and the time to embed one sentence (one request's text) and one photo
from decoded pixels (one upload), the median of ``--repeats`` calls after two warm-up calls, plus sentences and
photos a second at a batch of 32 and 16 (what the batched service reaches at most). Seeds of one recipe share the
CNNs' run (training/models/ensemble.py, ``feature_twins``), so only the text side grows with the members. Run it
under the exclusive lock: nothing else may share the cores while it times.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
RESULTS = REPO / "benchmarks" / "results" / "ensemble_cost.json"
SENTENCE = "a brown dog jumps into the water to fetch a stick"


def _median_ms(fn, repeats: int) -> float:
    fn(), fn()                                      # warm-up: first calls allocate
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def _per_second(fn, n: int, repeats: int) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(repeats):
        fn()
    return n * repeats / (time.perf_counter() - t)


def measure(name: str, path: Path, repeats: int) -> dict:
    import numpy as np
    import torch
    from PIL import Image

    from training.inference.embedding import embed_pixels, embed_texts
    from training.models.checkpoint import load_model
    from training.models.ensemble import EnsembleEmbedding

    t = time.perf_counter()
    model = load_model(path).eval()
    load_s = time.perf_counter() - t
    members = len(model.models) if isinstance(model, EnsembleEmbedding) else 1
    photo = Image.fromarray(np.random.default_rng(0).integers(0, 256, (480, 640, 3), dtype=np.uint8))   # speed only
    one = model.preprocess.pixels(photo)[None]
    with torch.no_grad():
        text_ms = _median_ms(lambda: embed_texts(model, [SENTENCE]), repeats)
        image_ms = _median_ms(lambda: embed_pixels(model, one), repeats)
        texts_s = _per_second(lambda: embed_texts(model, [SENTENCE] * 32), 32, max(2, repeats // 4))
        images_s = _per_second(lambda: embed_pixels(model, one.repeat(16, 1, 1, 1, 1)), 16, max(2, repeats // 8))
    dim = int(model.cfg.model.embed_dim)
    return {"name": name, "model": str(path), "members": members, "embed_dim": dim,
            "index_bytes_per_item": 4 * dim, "file_mb": round(path.stat().st_size / 1e6, 1),
            "load_s": round(load_s, 2), "text_ms": round(text_ms, 1), "image_ms": round(image_ms, 1),
            "texts_per_s": round(texts_s, 1), "images_per_s": round(images_s, 1)}


def main(argv=None) -> int:
    import torch

    from flickr8k_levers import commit, hardware
    from training.data.fileio import write_json

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", action="append", required=True, metavar="NAME=PATH",
                   help="a row's name and its model.pt (repeatable)")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--note", default="", help="added to the hardware column")
    args = p.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    rows = []
    for spec in args.model:
        name, _, path = spec.partition("=")
        if not path or not Path(path).is_file():
            p.error(f"--model wants NAME=PATH of an existing file, got {spec!r}")
        rows.append(measure(name, Path(path), args.repeats))
        print(json.dumps(rows[-1]), flush=True)
    data = {"rows": rows, "hardware": hardware(args.note), "date": dt.date.today().isoformat(), "commit": commit(),
            "torch_threads": torch.get_num_threads(), "repeats": args.repeats}
    write_json(RESULTS, data)
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
