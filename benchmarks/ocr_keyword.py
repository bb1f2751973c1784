"""Text in photos and keyword search, measured (index/ocr.py, index/keywords.py, index/hybrid.py):

- the OCR gate's recall on generated text photos (benchmarks/text_photos.py: signs, receipts, screenshots at three
  font sizes and three small rotations) and the share of real photos it passes (the ImageNet samples of
  ../shared/datasets/imagenet-samples, and the demo's sample photos, index/samples.py), hence its precision on the
  benchmark's mix;
- OCR time per photo read and its share of index build time (the same gallery built with and without OCR, the shipped
  model, in-process, one view per photo: --tta none);
- keyword recall@1/@5 of the text photos by their own words (a sign by its street, a receipt by its items, a
  screenshot by its two lines), and the same queries in vector and hybrid mode.

    python benchmarks/ocr_keyword.py --text 60 --distractors 120      # writes benchmarks/results/ocr_keyword.json

Timings run on whatever else the machine runs (the results file says so in its note).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

RESULTS = REPO / "benchmarks" / "results" / "ocr_keyword.json"
IMAGENET = REPO.parent / "shared" / "datasets" / "imagenet-samples" / "images"

from benchmarks.flickr8k_levers import commit, hardware  # noqa: E402
from training.data.fileio import write_json  # noqa: E402


def recall(ranks: list[int | None], k: int) -> float:
    return sum(1 for r in ranks if r is not None and r < k) / max(len(ranks), 1)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--text", type=int, default=60, help="generated text photos")
    p.add_argument("--distractors", type=int, default=120, help="ImageNet sample photos mixed in")
    p.add_argument("--gate-negatives", type=int, default=1000, help="ImageNet samples the gate's pass rate is "
                                                                   "measured on")
    p.add_argument("--note", default="other workers shared the 2 CPU cores during the run: timings are noisy")
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)

    import numpy as np

    from training.inference.pretrained import model_file
    from index.embed import embed_sentences
    from index.changes import BuildOptions
    from index.gallery import EmbedOptions, Gallery, build
    import index.hybrid as hybrid
    from index.hybrid import TextPaging, search_text
    from index.embed import view_preprocess
    from index.ocr import GATE, OcrConfig, grey_thumbnail, read_rows, text_likelihood
    from training.data.preprocess import decode_image
    from index.samples import write_samples
    from text_photos import generate
    from training.models.checkpoint import load_model

    work = Path(tempfile.mkdtemp(prefix="ocr_keyword_"))
    photos = work / "photos"
    texts = generate(photos / "text", args.text, seed=0)
    negatives = sorted(IMAGENET.glob("*.jpg"))
    rng = random.Random(0)
    distractors = rng.sample(negatives, min(args.distractors, len(negatives)))
    (photos / "other").mkdir(parents=True)
    for n, src in enumerate(distractors):
        (photos / "other" / f"photo_{n:04d}.jpg").write_bytes(src.read_bytes())
    demo = work / "demo"
    write_samples(demo, near_duplicate=False)
    demo_photos = sorted(p for p in (demo / "photos").glob("*") if p.is_file())

    # the gate, scored as the indexer scores it: on the photo it decoded to embed (index/embed.py read_photo,
    # decoded down to the shipped model's four views' side); the timing is the gate's alone, after the decode
    min_side = view_preprocess(load_model(model_file(None)), "flip-crop").min_side
    gate_seconds = [0.0]

    def likelihood_of(path) -> float:
        image = decode_image(Path(path), min_side=min_side).image
        t0 = time.perf_counter()
        score = text_likelihood(grey_thumbnail(image))
        gate_seconds[0] += time.perf_counter() - t0
        return score

    text_scores = [likelihood_of(t.path) for t in texts]
    gate_negatives = negatives[:args.gate_negatives]
    neg_scores = [likelihood_of(p) for p in gate_negatives]
    gate_ms = gate_seconds[0] / (len(text_scores) + len(neg_scores)) * 1000
    demo_scores = [likelihood_of(p) for p in demo_photos]
    passed_text = sum(s >= GATE for s in text_scores)
    passed_neg = sum(s >= GATE for s in neg_scores)
    passed_demo = sum(s >= GATE for s in demo_scores)
    mix_neg = [likelihood_of(p) for p in distractors]
    passed_mix = sum(s >= GATE for s in mix_neg)
    gate = {"threshold": GATE, "ms_per_photo": round(gate_ms, 2),
            "timing": "on the photo the indexer decoded to embed (its thumbnail and score; not the decode)",
            "recall_text_photos": round(passed_text / len(texts), 3),
            "by_kind": {kind: round(sum(s >= GATE for t, s in zip(texts, text_scores) if t.kind == kind)
                                    / max(1, sum(t.kind == kind for t in texts)), 3)
                        for kind in ("sign", "receipt", "screenshot")},
            "imagenet_pass_rate": round(passed_neg / max(1, len(neg_scores)), 3), "imagenet_photos": len(neg_scores),
            "demo_pass_rate": round(passed_demo / max(1, len(demo_scores)), 3), "demo_photos": len(demo_scores),
            "precision_on_mix": round(passed_text / max(1, passed_text + passed_mix), 3)}
    print(json.dumps({"gate": gate}, indent=1))

    # OCR time per photo read, and its share of one index build (timed inside that build: two builds on a shared
    # machine differ by more than OCR takes)
    import index.changes as changes_module     # where an update reads its photos' text (read_texts)

    model = load_model(model_file(None))
    paths = sorted(str(p) for p in photos.rglob("*.jpg"))
    spent: dict = {}

    def timed_read_rows(rows, config, workers=None):
        t0 = time.perf_counter()
        out = read_rows(rows, config, workers)
        spent["ocr_s"], spent["read"] = time.perf_counter() - t0, out
        return out

    changes_module.read_rows = timed_read_rows
    t0 = time.perf_counter()
    build(work / "with_ocr", model, paths, options=BuildOptions(image_root=photos, ocr=OcrConfig(), tta="none"),
          embedding=EmbedOptions(progress=False))
    build_s = time.perf_counter() - t0
    changes_module.read_rows = read_rows
    read, ocr_s = spent["read"], spent["ocr_s"]
    n_read = sum(1 for r in read.values() if r.read)
    build_times = {"photos": len(paths), "read_by_ocr": n_read, "ocr_s": round(ocr_s, 2),
                   "ocr_s_per_photo_read": round(ocr_s / max(1, n_read), 3),
                   "ocr_workers": min(8, os.cpu_count() or 1), "build_s_with_ocr": round(build_s, 2),
                   "ocr_share_of_build": round(ocr_s / build_s, 3)}
    print(json.dumps({"build": build_times}, indent=1))

    # recall by the photos' own words, per mode
    gallery = Gallery.load(work / "with_ocr", model=model)
    by_path = {r.path: r.id for r in gallery.meta.all_images()}
    queries = [(" ".join(t.words), by_path[str(Path(t.path).resolve())], t) for t in texts]
    vectors = np.asarray(embed_sentences(model, [q for q, _, _ in queries]))
    def ranks_of(mode: str) -> list[int | None]:
        ranks: list[int | None] = []
        for (text, target, _), vector in zip(queries, vectors):
            ids = [i for i, _ in search_text(gallery, vector[None, :], text, mode, TextPaging(k=10)).hits]
            ranks.append(ids.index(target) if target in ids else None)
        return ranks

    modes = {}
    for mode in ("vector", "keyword", "hybrid"):
        ranks = ranks_of(mode)
        modes[mode] = {"recall1": round(recall(ranks, 1), 3), "recall5": round(recall(ranks, 5), 3),
                       "by_kind_recall1": {kind: round(recall([r for r, (_, _, t) in zip(ranks, queries)
                                                               if t.kind == kind], 1), 3)
                                           for kind in ("sign", "receipt", "screenshot")}}
        print(mode, modes[mode])
    # the fusion's constant and the keyword list's weight (the defaults: RRF_K = 60, equal weights)
    defaults = (hybrid.RRF_K, dict(hybrid.WEIGHTS))
    sweep = []
    for rrf_k in (60, 20):
        for keyword_weight in (1.0, 2.0, 3.0):
            hybrid.RRF_K, hybrid.WEIGHTS = rrf_k, {"vector": 1.0, "keyword": keyword_weight}
            ranks = ranks_of("hybrid")
            sweep.append({"rrf_k": rrf_k, "keyword_weight": keyword_weight, "recall1": round(recall(ranks, 1), 3),
                          "recall5": round(recall(ranks, 5), 3)})
            print("hybrid", sweep[-1])
    hybrid.RRF_K, hybrid.WEIGHTS = defaults
    gallery.close()
    words_read = {}
    for t in texts:
        got = read.get(str(Path(t.path).resolve()))
        have = {w.text.lower() for w in got.words if w.confidence >= OcrConfig().min_confidence} if got else set()
        words_read.setdefault(str(t.size), []).append(len(set(t.words) & have) / len(t.words))
    result = {
        "hardware": hardware(args.note), "date": dt.date.today().isoformat(), "commit": commit(),
        "note": args.note, "tesseract": _tesseract_version(),
        "set": {"text_photos": len(texts), "distractors": len(distractors), "kinds": "sign, receipt, screenshot",
                "font_px": [18, 28, 44], "angles_deg": [0, -3, 4], "canvas": "640x480", "model": "shipped",
                "tta": "none"},
        "gate": gate, "build": build_times,
        "words_read_by_font_px": {k: round(float(np.mean(v)), 3) for k, v in words_read.items()},
        "modes": modes, "hybrid_sweep": sweep,
    }
    write_json(args.out, result)
    print(f"wrote {args.out}")
    return 0


def _tesseract_version() -> str:
    import subprocess

    out = subprocess.run(["tesseract", "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=True)
    return out.stdout.decode(errors="replace").split()[1]


if __name__ == "__main__":
    sys.exit(main())
