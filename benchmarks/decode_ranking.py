"""What shrinking while decoding does to ranking: Flickr8k dev R-sum of the shipped model, the full-size decode
against the decode shrunk to at least twice the model's largest input side (a JPEG at a DCT scale, then
``Image.reduce``; ``training.data.preprocess.decode_image``).

    python benchmarks/decode_ranking.py     # → benchmarks/results/decode_ranking.json

The 1,000 dev images are embedded through the index's path (``training.inference.embedding.embed_image_files`` with
``index.embed.read_photo``), once decoded at full size and once shrunk while decoding, and ranked against the dev
captions with the project's metrics (``training.evaluate.full_evaluation``). This copy of Flickr8k is 224 × 224,
smaller than the shipped model's largest input (260 px), so nothing is shrunk there: each photo is also enlarged
(bicubic) to each of ``--sides`` (squares) and saved as a JPEG (quality 90) in a temporary folder, deleted
afterwards. The defaults decode at 1/2 (1400), 1/4 (2100) and 1/4 (3000, the shorter side of a 12 MP photo).

The rule, fixed before the run: images to embed are shrunk while decoding (``SHRINK_TO_EMBED``) when the loss,
averaged over the enlarged sides, is at most 0.5 R-sum. One side alone does not decide it: a change of a fraction
of a grey level flips a few near-tied ranks either way. How far apart two equally valid decodes land is measured
beside it — the *null spread*, the range of the full-decode R-sums over the sides (the same photos, enlarged to
different sizes and decoded in full).

    python benchmarks/decode_ranking.py --compare torch --sides 1400 2100 --both-resizes
                                                   # → benchmarks/results/decode_ranking_torch.json

``--compare torch`` ranks the same photos through the index's path (``index.embed.decode_photos``) twice: decoded
by Pillow in the workers (``--decode pil``, what a CPU runs) and by torch (``--decode torch``: ``decode_jpeg`` and
the antialiased resize and crops in torch, ``training/inference/tensor_views.py``, what a CUDA device runs by
default; here on the CPU, the same code). Both under the backend ``auto`` picks on this machine. The target: each
row's R-sums within 0.5 of each other. Beside the ranking, the two paths' pixels are compared on every photo
(mean and largest absolute difference, 0-255). ``--both-resizes`` also ranks the enlarged photos with the torch
path's other way of resizing a large photo (``tensor_views.REDUCE_LIKE_PIL``); the rule, fixed before the run
(``RESIZE_RULE``), keeps the way with the smaller mean |R-sum difference| to the PIL path.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence

import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from index.embed import PhotoDecoding, decode_photos, embed_sentences, read_photo  # noqa: E402
from benchmarks.tables import current_commit  # noqa: E402
from training.data.datasets import load_dataset  # noqa: E402
from training.data.fileio import write_json  # noqa: E402
from training.data.preprocess import dct_scale  # noqa: E402
from training.inference.embedding import FileReading, embed_image_files  # noqa: E402
from training.evaluate import full_evaluation  # noqa: E402
from training.models.checkpoint import load_model  # noqa: E402
from training.ranking import KS  # noqa: E402

DATA = ROOT.parent / "shared" / "datasets" / "flickr8k"
MODEL = ROOT / "training" / "pretrained" / "flickr8k.pt"
MAX_LOSS = 0.5
BOOTSTRAP_DRAWS = 1000      # paired_interval's resamples of the dev images
RULE = ("images to embed are shrunk while decoding when the mean loss over the enlarged sides is at most "
        f"{MAX_LOSS} R-sum")
RESIZE_RULE = ("the torch path box-reduces a large photo like the PIL path (REDUCE_LIKE_PIL) when that gives the "
               "smaller mean |R-sum difference| to the PIL path over the enlarged sides")


def read_full(path: str, min_side: int | None = None):
    """The full-size decode, whatever the shipped policy."""
    return read_photo(path)


def shrinking(side: int):
    """A reader that shrinks while decoding down to ``side`` (what ``SHRINK_TO_EMBED`` switches on), whatever the
    shipped policy: the loader passes ``embed_side(...)``, None while the policy is off."""
    def read_shrunk(path: str, min_side: int | None = None):
        return read_photo(path, side)
    return read_shrunk


def enlarge(paths: list[str], big: int, tmp: Path) -> list[Path]:
    """The photos enlarged (bicubic) to ``big`` × ``big`` and saved as JPEGs (quality 90) in ``tmp``."""
    files = []
    for p in paths:
        out = tmp / f"{Path(p).stem}.jpg"
        Image.open(p).convert("RGB").resize((big, big), Image.Resampling.BICUBIC).save(out, quality=90)
        files.append(out)
    return files


class DevCaptions(NamedTuple):
    """What the dev images are ranked against: the captions' embeddings, the image of each, the model's
    similarity."""
    vectors: torch.Tensor
    image_of: torch.Tensor
    similarity: Any


def rank(label: str, files: Sequence, embed: Callable[[Sequence], Any], dev: DevCaptions
         ) -> tuple[dict, tuple[torch.Tensor, torch.Tensor]]:
    """R@1/5/10 both ways and the R-sum (``full_evaluation``) of ``files`` embedded by ``embed(files)`` (every one
    kept) against ``dev``, and the seconds that took, printed as ``label``; with the ranks they come from:
    ``(i2t (images,), t2i (captions,))``, 1-based (for :func:`paired_interval`)."""
    start = time.time()
    emb = embed(files)
    assert emb.kept == list(range(len(files))), emb.skipped
    m = full_evaluation(torch.from_numpy(emb.vectors), dev.vectors, dev.image_of, dev.similarity)
    out = {"i2t": [m["i2t"][k] for k in ("r1", "r5", "r10")], "t2i": [m["t2i"][k] for k in ("r1", "r5", "r10")],
           "rsum": m["rsum"], "seconds": time.time() - start}
    print(f"  {label}: R-sum {out['rsum']:.2f} ({out['seconds']:.0f} s)", flush=True)
    return out, (m["_ranks"]["i2t"], m["_ranks"]["t2i"])


def paired_interval(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor],
                    image_of: torch.Tensor, draws: int = BOOTSTRAP_DRAWS, seed: int = 0) -> list[float]:
    """The 95 % interval of R-sum(a) − R-sum(b), two rankings of the same images (``(i2t, t2i)`` ranks), over the
    queries drawn again with replacement — each dev image with its captions, their ranks as on the whole set (a
    paired bootstrap of the queries): how far apart the two land by which queries the set happens to hold, against
    which a difference is read."""
    n = len(a[0])
    counts = torch.bincount(image_of, minlength=n).double()                      # captions per image

    def per_image(ranks: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        i2t = torch.stack([(ranks[0] <= k).double() for k in KS], 1)                        # (n, 3)
        t2i = torch.stack([torch.zeros(n, dtype=torch.float64).index_add_(0, image_of, (ranks[1] <= k).double())
                           for k in KS], 1)                                                  # (n, 3): hits per image
        return i2t, t2i

    (ai, at), (bi, bt) = per_image(a), per_image(b)
    g = torch.Generator().manual_seed(seed)
    weights = torch.stack([torch.bincount(torch.randint(n, (n,), generator=g), minlength=n) for _ in range(draws)]
                          ).double()                                                         # (draws, n)
    diff = 100 * ((weights @ (ai - bi)).sum(1) / weights.sum(1) + (weights @ (at - bt)).sum(1) / (weights @ counts))
    low, high = torch.quantile(diff, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return [round(low, 3), round(high, 3)]


def pixel_difference(model, files) -> dict:
    """Mean and largest absolute difference (0-255) between the PIL and the torch path's pixels of ``files``."""
    from training.inference.tensor_views import encoded_jpeg, encoded_pixels

    pre, total, count, largest = model.preprocess, 0.0, 0, 0
    for f in files:
        data = Path(f).read_bytes()
        pil = pre.pixels(read_photo(f, pre.min_side)[0]).int()
        encoded = encoded_jpeg(data, pre.min_side)
        assert encoded is not None, f
        diff = (encoded_pixels(pre, [encoded], "cpu")[0].int() - pil).abs()
        total, count, largest = total + diff.sum().item(), count + diff.numel(), max(largest, int(diff.max()))
    return {"mean_abs": round(total / count, 4), "max_abs": largest}


def write_results(args, path: str, model, rows: list[dict], summary: dict, **versions) -> None:
    """The results file ``args.out``: the ranking through the index's image ``path`` (what the description says of
    it), its provenance, ``versions`` (of the libraries that matter), the rows and the summary."""
    write_json(Path(args.out), {
        "description": "Flickr8k dev R-sum of the shipped model (training/pretrained/flickr8k.pt) through the index's "
                       + path,
        "hardware": args.hardware, "date": dt.date.today().isoformat(), "commit": current_commit(),
        "python": platform.python_version(), **versions, "model_min_side": model.preprocess.min_side, "rows": rows,
        "summary": summary})
    print(f"wrote {args.out}; {json.dumps(summary)}")


def compare_decodes(args, model, paths, dev: DevCaptions) -> int:
    """``--compare torch``: the index's path with the PIL and with the torch decode, row by row."""
    from training.inference import tensor_views as views
    from training.inference.backend import use_backend

    backend = use_backend(model, None, prepare="throughput")
    shipped = views.REDUCE_LIKE_PIL

    def decoded(decode: str) -> Callable[[Sequence], Any]:
        return lambda files: embed_image_files(model, files, progress=False, decoding=decode_photos(
            model.preprocess, files, 64, args.workers, "cpu", how=PhotoDecoding(decode=decode)))

    rows = []
    sets = [("as stored, 224 × 224", 224, None)] + [(f"enlarged to {b} × {b} (bicubic), JPEG quality 90", b, b)
                                                     for b in args.sides]
    tmp = Path(tempfile.mkdtemp(prefix="decode-ranking-"))
    try:
        for label, side, big in sets:
            print(label, flush=True)
            files = list(paths) if big is None else enlarge(paths, big, tmp)
            pil, pil_ranks = rank("pil", files, decoded("pil"), dev)
            mine, mine_ranks = rank("torch", files, decoded("torch"), dev)
            rows.append({"images": label, "side": side, "pixels": pixel_difference(model, files), "pil": pil,
                         "torch": mine, "difference": round(pil["rsum"] - mine["rsum"], 4),
                         "difference_95": paired_interval(pil_ranks, mine_ranks, dev.image_of)})
            if big is not None and args.both_resizes:      # the other way of resizing a large photo, for the rule
                views.REDUCE_LIKE_PIL = not shipped
                try:
                    other, other_ranks = rank("torch", files, decoded("torch"), dev)
                finally:
                    views.REDUCE_LIKE_PIL = shipped
                rows[-1]["torch_other"] = {**other, "reduce_like_pil": not shipped,
                                           "difference": round(pil["rsum"] - other["rsum"], 4),
                                           "difference_95": paired_interval(pil_ranks, other_ranks, dev.image_of)}
            for f in files if big is not None else ():
                f.unlink()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    worst = max(abs(r["difference"]) for r in rows)
    summary = {"target": f"each row's R-sums within {MAX_LOSS}", "largest_difference": worst,
               "met": worst <= MAX_LOSS, "reduce_like_pil": shipped}
    others = [r for r in rows if "torch_other" in r]
    if others:
        mine = statistics.fmean(abs(r["difference"]) for r in others)
        theirs = statistics.fmean(abs(r["torch_other"]["difference"]) for r in others)
        summary.update({"rule": RESIZE_RULE, "mean_abs_difference": round(mine, 4),
                        "mean_abs_difference_other": round(theirs, 4),
                        "reduce_like_pil_wins": (mine <= theirs) == shipped})
    write_results(args, "image path, decoded by Pillow in the workers and by torch (decode_jpeg, antialiased resize and "
                        "crops in torch, run on the CPU) (python benchmarks/decode_ranking.py --compare torch)",
                  model, rows, summary, torch=torch.__version__, backend=backend)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--model", default=str(MODEL))
    ap.add_argument("--sides", type=int, nargs="*", default=[1400, 2100, 3000], help="enlarged square sides to test")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--compare", choices=["shrink", "torch"], default="shrink",
                    help="shrink: full against shrunk decode (the default); torch: the PIL against the torch decode")
    ap.add_argument("--both-resizes", action="store_true",
                    help="with --compare torch: also rank the enlarged photos with the other REDUCE_LIKE_PIL")
    ap.add_argument("--hardware", default=f"CPU, {os.cpu_count()} cores, shared with other jobs")
    ap.add_argument("--out", help="results file (default: benchmarks/results/decode_ranking.json, "
                                  "decode_ranking_torch.json with --compare torch)")
    args = ap.parse_args()
    args.out = args.out or str(ROOT / "benchmarks" / "results" / (
        "decode_ranking_torch.json" if args.compare == "torch" else "decode_ranking.json"))

    torch.manual_seed(0)
    model = load_model(args.model)
    split = load_dataset(args.data).split("val")
    paths = [r.path for r in split.images]
    dev = DevCaptions(
        torch.from_numpy(embed_sentences(model, [c for r in split.images for c in r.captions], progress=False)),
        torch.tensor([r.image_id for r in split.images for _ in r.captions], dtype=torch.long), model.similarity)
    if args.compare == "torch":
        return compare_decodes(args, model, paths, dev)
    side = model.preprocess.min_side
    read_shrunk = shrinking(side)

    def ranked(files, read) -> tuple[dict, tuple[torch.Tensor, torch.Tensor]]:
        return rank(read.__name__, files, lambda fs: embed_image_files(
            model, fs, FileReading(workers=args.workers, read=read), progress=False), dev)

    rows = []
    print(f"{len(paths)} dev images as stored ({Image.open(paths[0]).size[0]} px)", flush=True)
    full, full_ranks = ranked(paths, read_full)
    same = all(torch.equal(model.preprocess.pixels(read_shrunk(p)[0]), model.preprocess.pixels(read_full(p)[0]))
               for p in paths)
    shrunk, shrunk_ranks = (full, full_ranks) if same else ranked(paths, read_shrunk)
    rows.append({"images": "as stored, 224 × 224", "side": 224, "scale": "1 (smaller than the model's input)",
                 "full": full, "shrunk": shrunk, "identical_pixels": same,
                 "loss_95": paired_interval(full_ranks, shrunk_ranks, dev.image_of)})
    tmp = Path(tempfile.mkdtemp(prefix="decode-ranking-"))
    try:
        for big in args.sides:
            print(f"enlarged to {big} × {big}: JPEG DCT scale 1/{dct_scale((big, big), side)}", flush=True)
            files = enlarge(paths, big, tmp)
            (full, full_ranks), (shrunk, shrunk_ranks) = ranked(files, read_full), ranked(files, read_shrunk)
            rows.append({"images": f"enlarged to {big} × {big} (bicubic), JPEG quality 90", "side": big,
                         "scale": f"1/{dct_scale((big, big), side)}", "full": full, "shrunk": shrunk,
                         "loss_95": paired_interval(full_ranks, shrunk_ranks, dev.image_of)})
            for f in files:
                f.unlink()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for r in rows:
        r["loss"] = round(r["full"]["rsum"] - r["shrunk"]["rsum"], 4)
    enlarged = rows[1:]
    losses = [r["loss"] for r in enlarged]
    fulls = [r["full"]["rsum"] for r in enlarged]
    mean_loss = statistics.fmean(losses) if losses else 0.0
    summary = {
        "rule": RULE, "mean_loss": round(mean_loss, 4),
        "sd_loss": round(statistics.stdev(losses), 4) if len(losses) > 1 else None,
        "null_spread": round(max(fulls) - min(fulls), 4) if fulls else None,
        "shrink_to_embed": mean_loss <= MAX_LOSS}
    write_results(args, "image path, decoded at full size and shrunk while decoding, the photos enlarged to several "
                        "sides (python benchmarks/decode_ranking.py)", model, rows, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
