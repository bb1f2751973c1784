"""What shrinking while decoding does to ranking: Flickr8k dev R-sum of the shipped model, the full-size decode
against the decode the index uses (a JPEG at the smallest DCT scale that keeps the model's largest input side).

    python benchmarks/decode_ranking.py     # → benchmarks/results/decode_ranking.json

The 1,000 dev images are embedded through the index's path (``training.inference.embed.embed_image_files`` with
``index.embed.read_photo``), once decoded at full size and once shrunk while decoding, and ranked against the dev
captions with the project's metrics (``training.evaluate.full_evaluation``). This copy of Flickr8k is 224 × 224,
smaller than the shipped model's largest input (260 px), so nothing is shrunk there: each photo is also enlarged
(bicubic) to ``--sides`` squares and saved as a JPEG (quality 90) in a temporary folder, deleted afterwards. The
default, 2700, is decoded at 1/8 (the scale of a 12 MP photo) and ends in half a DCT block (337.5 pixels), the
least favourable geometry.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from index.embed import embed_texts, read_photo  # noqa: E402
from benchmarks.tables import current_commit  # noqa: E402
from training.data.datasets import load_dataset  # noqa: E402
from training.data.fileio import write_json  # noqa: E402
from training.data.preprocess import dct_scale  # noqa: E402
from training.inference.embed import embed_image_files  # noqa: E402
from training.evaluate import full_evaluation  # noqa: E402
from training.models.model import load_model  # noqa: E402

DATA = Path("/work/shared/datasets/flickr8k")
MODEL = ROOT / "training" / "pretrained" / "flickr8k.pt"


def read_full(path: str, min_side: int | None = None):
    """The reader before decoding shrank images: every file at full size."""
    return read_photo(path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--model", default=str(MODEL))
    ap.add_argument("--sides", type=int, nargs="*", default=[2700], help="enlarged square sides to test")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--reuse-full", help="a previous results file of the same model and sides: its full-decode rows "
                                          "are taken as they are (the full decode does not depend on the shrinking)")
    ap.add_argument("--hardware", default=f"CPU, {os.cpu_count()} cores, shared with other jobs")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "decode_ranking.json"))
    args = ap.parse_args()

    torch.manual_seed(0)
    model = load_model(args.model)
    split = load_dataset(args.data).split("val")
    paths = [r.path for r in split.images]
    captions = torch.from_numpy(embed_texts(model, [c for r in split.images for c in r.captions], progress=False))
    cap_to_img = torch.tensor([r.image_id for r in split.images for _ in r.captions], dtype=torch.long)
    side = model.preprocess.min_side

    def rank(files, read) -> dict:
        start = time.time()
        emb = embed_image_files(model, files, workers=args.workers, progress=False, read=read)
        assert emb.kept == list(range(len(files))), emb.skipped
        m = full_evaluation(torch.from_numpy(emb.vectors), captions, cap_to_img, model.similarity)
        out = {"i2t": [m["i2t"][k] for k in ("r1", "r5", "r10")], "t2i": [m["t2i"][k] for k in ("r1", "r5", "r10")],
               "rsum": m["rsum"], "seconds": time.time() - start}
        print(f"  {read.__name__}: R-sum {out['rsum']:.2f} ({out['seconds']:.0f} s)", flush=True)
        return out

    rows = []
    reused = [r["full"] for r in json.loads(Path(args.reuse_full).read_text())["rows"]] if args.reuse_full else None
    print(f"{len(paths)} dev images as stored ({Image.open(paths[0]).size[0]} px)", flush=True)
    full = reused[0] if reused else rank(paths, read_full)
    shrunk_pixels = [model.preprocess.pixels(read_photo(p, side)[0]) for p in paths]
    same = all(torch.equal(a, model.preprocess.pixels(read_full(p)[0])) for a, p in zip(shrunk_pixels, paths))
    rows.append({"images": "as stored, 224 × 224", "scale": "1 (smaller than the model's input)",
                 "full": full, "shrunk": full if same else rank(paths, read_photo), "identical_pixels": same})
    tmp = Path(tempfile.mkdtemp(prefix="decode-ranking-"))
    try:
        for big in args.sides:
            print(f"enlarged to {big} × {big}: JPEG DCT scale 1/{dct_scale((big, big), side)}", flush=True)
            files = []
            for p in paths:
                out = tmp / f"{Path(p).stem}.jpg"
                Image.open(p).convert("RGB").resize((big, big), Image.Resampling.BICUBIC).save(out, quality=90)
                files.append(out)
            rows.append({"images": f"enlarged to {big} × {big} (bicubic), JPEG quality 90",
                         "scale": f"1/{dct_scale((big, big), side)}",
                         "full": reused[len(rows)] if reused else rank(files, read_full),
                         "shrunk": rank(files, read_photo)})
            for f in files:
                f.unlink()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for r in rows:
        r["loss"] = r["full"]["rsum"] - r["shrunk"]["rsum"]
    write_json(Path(args.out), {
        "description": "Flickr8k dev R-sum of the shipped model (training/pretrained/flickr8k.pt) through the index's "
                       "image path, decoded at full size and shrunk while decoding (python "
                       "benchmarks/decode_ranking.py); the rule: shrink only where the loss is at most 0.5",
        "hardware": args.hardware, "date": dt.date.today().isoformat(), "commit": current_commit(),
        "python": platform.python_version(), "model_min_side": side, "rows": rows,
        "max_loss": max(r["loss"] for r in rows)})
    print(f"wrote {args.out}; largest loss {max(r['loss'] for r in rows):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
