"""What the relevance's name term (index/relevance.py) costs the text route: the service's text search in process
(``Engine.search_texts``: the text tower, the index search and the relevance of every hit), with the image index's
reference sentences as loaded (the name term on) and with the same sentences but no names (``names=0``: the term
off), taking turns in one process. ``benchmarks/results/name_term_cost_cpu.json``, rendered into docs/index.md by
benchmarks/tables.py.

    python benchmarks/name_term_cost.py --index /tmp/ov/imagenet-shipped --out benchmarks/results/name_term_cost_cpu.json

The index is loaded twice, once with its reference sentences as stored and once with the same sentences carrying no
names; after one unmeasured search each (which fills its photos' cached floors), each round times ``--reps`` × 5
searches of one sentence and ``--reps`` of ``--batch`` sentences for each setting, in turns; the median of
``--rounds`` rounds is reported, and the ratio of the two medians. numpy's and FAISS's BLAS pools run on one thread, as in a ``serve`` worker.
"""
from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks.blas_threads import PLACES, SUBJECTS  # noqa: E402
from benchmarks.flickr8k_levers import commit, hardware  # noqa: E402
from training.data.fileio import write_json  # noqa: E402

SETTINGS = ("without the name term", "with the name term")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(REPO / "training" / "pretrained" / "flickr8k.pt"))
    ap.add_argument("--index", required=True, help="an image index built with the model's bank (reference sentences)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "name_term_cost_cpu.json"))
    args = ap.parse_args(argv)
    from index.gallery import Gallery
    from index.relevance import Descriptions
    from service.engine import Engine
    from training.inference.threads import single_threaded_blas
    from training.models.checkpoint import load_model

    single_threaded_blas()
    model = load_model(args.model, "cpu").eval()
    galleries = {s: Gallery.load(Path(args.index), model=model, device="cpu") for s in SETTINGS}
    named = galleries[SETTINGS[1]].references["images"].descriptions
    if named is None or not len(named.names):
        raise SystemExit(f"{args.index}: its image index has no class sentences (build it with the model's bank)")
    # the same gallery twice, one whose reference sentences carry no names (each keeps its own photos' floors)
    galleries[SETTINGS[0]].references["images"].descriptions = Descriptions(named.sentences, named.nulls, named.photos,
                                                                            names=0)
    engines = {s: Engine(model, g, None) for s, g in galleries.items()}
    texts = ([f"{s} {p}" for s in SUBJECTS for p in PLACES] * (args.batch // 48 + 1))[:args.batch]
    for engine in engines.values():
        engine.search_texts([(t, 10) for t in texts])                   # the floors of every hit, once
    runs: dict[tuple[str, int], list[float]] = {(s, n): [] for s in SETTINGS for n in (1, args.batch)}
    for r in range(args.rounds):
        for setting in SETTINGS if r % 2 == 0 else reversed(SETTINGS):
            for n, items in ((1, [(texts[r % len(texts)], 10)]), (args.batch, [(t, 10) for t in texts])):
                reps = args.reps * (5 if n == 1 else 1)
                start = time.perf_counter()
                for _ in range(reps):
                    engines[setting].search_texts(items)
                runs[setting, n].append((time.perf_counter() - start) / reps * 1000)
        print(f"round {r + 1}/{args.rounds}", flush=True)
    for g in galleries.values():
        g.close()
    rows = [{"setting": s, "batch": n, "ms": round(statistics.median(runs[s, n]), 3),
             "runs_ms": [round(x, 3) for x in runs[s, n]]} for s in SETTINGS for n in (1, args.batch)]
    for row in rows:
        base = statistics.median(runs[SETTINGS[0], row["batch"]])
        row["ratio"] = round(row["ms"] / base, 3)
    write_json(Path(args.out), {"index": args.index, "model": args.model, "rows": rows, "rounds": args.rounds,
                                "hardware": hardware(), "date": dt.date.today().isoformat(), "commit": commit()})
    for row in rows:
        print(row["setting"], row["batch"], row["ms"], row["ratio"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
