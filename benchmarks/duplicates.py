"""Near-duplicate groups, measured: ``benchmarks/results/duplicates.json`` (rendered into docs/index.md by
benchmarks/tables.py).

    python benchmarks/duplicates.py --imagenet ../shared/datasets/imagenet-samples --work /tmp/dup \
        --edited 200 --note "2 cores shared with other jobs"

The distinct photos are the ImageNet sample photos (one per class, so no two show the same scene). ``--edited`` of
them (a seeded choice) get generated copies, each kind once: ``copy`` (the same bytes in another folder),
``jpeg`` (re-compressed at quality 50), ``resize`` (half the size), ``crop`` (the central 80 % of each side),
``colour`` (brightness +8 %, saturation +15 %) and ``crop+jpeg`` (a crop of 90 % re-compressed at quality 60).
The whole set is indexed as a user indexes a folder (``jointspace index build`` with its defaults), then:

* per threshold of a sweep: pair precision (of the pairs at or above it, the share that are a photo and its edit
  or two edits of one photo) and pair recall per edit kind (of the photo–edit pairs, the share at or above it);
* at the chosen threshold (index/duplicates.py ``DEFAULT_THRESHOLD``): the groups as ``index duplicates`` makes
  them — how many of the edited photos share one group with all their copies and with no other photo, how many
  distinct photos are grouped with another, the groups' kinds — and the perceptual-hash distance of each edit kind
  to its photo (index/phash.py; ``HASH_DISTANCE`` separates re-encodes from near shots);
* the time to group: the built index (``gallery_groups``: vectors read from the index, pairs, components, kinds)
  and random vectors of the model's dimension at larger sizes (``find_groups``: the neighbour search).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from training.data.fileio import write_json  # noqa: E402
RESULTS = REPO / "benchmarks" / "results" / "duplicates.json"
JOINTSPACE = [sys.executable, "-m", "service.cli"]
EDITS = ("copy", "jpeg", "resize", "crop", "colour", "crop+jpeg")
SWEEP = [round(0.70 + 0.01 * i, 2) for i in range(30)]


def edit(src: Path, kind: str, dst: Path) -> None:
    from PIL import Image, ImageEnhance

    if kind == "copy":
        shutil.copyfile(src, dst)
        return
    with Image.open(src) as im:
        image = im.convert("RGB")
    w, h = image.size
    quality = 90
    if kind == "jpeg":
        quality = 50
    elif kind == "resize":
        image = image.resize((max(1, w // 2), max(1, h // 2)), Image.Resampling.LANCZOS)
    elif kind in ("crop", "crop+jpeg"):
        keep = 0.8 if kind == "crop" else 0.9
        dx, dy = round(w * (1 - keep) / 2), round(h * (1 - keep) / 2)
        image = image.crop((dx, dy, w - dx, h - dy))
        quality = 90 if kind == "crop" else 60
    elif kind == "colour":
        image = ImageEnhance.Color(ImageEnhance.Brightness(image).enhance(1.08)).enhance(1.15)
    image.save(dst, "JPEG", quality=quality)


def make_set(imagenet: Path, photos: Path, edited: int, seed: int) -> dict[str, tuple[str, str]]:
    """Writes the photo set; returns file name → (source photo, edit kind or 'original')."""
    files = sorted(p for p in (imagenet / "images").iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
    chosen = set(random.Random(seed).sample(range(len(files)), edited))
    truth: dict[str, tuple[str, str]] = {}
    (photos / "originals").mkdir(parents=True, exist_ok=True)
    for kind in EDITS:
        (photos / kind).mkdir(exist_ok=True)
    for i, src in enumerate(files):
        shutil.copyfile(src, photos / "originals" / src.name)
        truth[f"originals/{src.name}"] = (src.name, "original")
        if i in chosen:
            for kind in EDITS:
                name = f"{kind}/{src.stem}.jpg" if kind != "copy" else f"copy/{src.name}"
                edit(src, kind, photos / name)
                truth[name] = (src.name, kind)
    return truth


def measure(args) -> dict:
    from index.duplicates import DEFAULT_THRESHOLD, HASH_DISTANCE, find_groups, gallery_groups
    from index.gallery import Gallery
    from index.phash import distances
    from index.qbnorm import unfold

    work = Path(args.work)
    photos, out = work / "photos", work / "index"
    truth_file = work / "truth.json"
    build_s = None
    if not (args.reuse and truth_file.exists() and out.exists()):
        if photos.exists():
            shutil.rmtree(photos)
        truth = make_set(Path(args.imagenet), photos, args.edited, args.seed)
        truth_file.write_text(json.dumps(truth))
        start = time.perf_counter()
        subprocess.run([*JOINTSPACE, "index", "build", "--model", args.model, "--images", str(photos), "--out",
                        str(out), "--quiet"], check=True, cwd=REPO, stdout=subprocess.DEVNULL)
        build_s = round(time.perf_counter() - start, 1)
    truth = {k: tuple(v) for k, v in json.loads(truth_file.read_text()).items()}
    gallery = Gallery.load(out)
    rows = [r for r in gallery.meta.all_images() if r.video_id is None]
    names = [str(Path(r.path).relative_to(photos.resolve())) for r in rows]
    source = np.asarray([truth[n][0] for n in names])
    kind = np.asarray([truth[n][1] for n in names])
    vectors = np.stack([unfold(gallery.manifest, "images", gallery.images.reconstruct(r.id)) for r in rows])
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    sims = unit @ unit.T
    upper = np.triu_indices(len(rows), 1)
    pair_sims, same = sims[upper], (source[:, None] == source[None, :])[upper]
    originals = {s: i for i, (s, k) in enumerate(zip(source, kind)) if k == "original"}
    edit_pairs = {k: np.asarray([sims[originals[s], i] for i, (s, kk) in enumerate(zip(source, kind)) if kk == k])
                  for k in EDITS}
    sweep = []
    for t in SWEEP:
        above = pair_sims >= t
        sweep.append({"threshold": t, "pairs_above": int(above.sum()),
                      "precision": float(same[above].mean()) if above.any() else None,
                      "recall": {k: float((v >= t).mean()) for k, v in edit_pairs.items()},
                      "recall_all": float((pair_sims[same] >= t).mean())})
    # at the chosen threshold, as index duplicates groups them
    start = time.perf_counter()
    groups = gallery_groups(gallery, DEFAULT_THRESHOLD)
    group_s = time.perf_counter() - start
    by_id = {r.id: i for i, r in enumerate(rows)}
    group_of = {}
    for g_i, g in enumerate(groups.groups):
        for i in g.ids:
            group_of[by_id[i]] = g_i
    edited_sources = sorted({s for s, k in zip(source, kind) if k != "original"})
    complete = exact = 0
    for s in edited_sources:
        members = [i for i in range(len(rows)) if source[i] == s]
        labels = {group_of.get(i, -1 - i) for i in members}
        if len(labels) == 1:
            complete += 1
            if len(groups.groups[labels.pop()].ids) == len(members):
                exact += 1
    distinct = [i for i in range(len(rows)) if kind[i] == "original" and source[i] not in set(edited_sources)]
    wrongly = sum(1 for i in distinct if i in group_of)
    mixed = sum(1 for g in groups.groups if len({source[by_id[i]] for i in g.ids}) > 1)
    hashes = np.asarray([r.phash for r in rows], dtype=np.int64)
    hash_dist = {}
    for k in EDITS:
        d = np.asarray([int(distances(hashes[originals[s]], hashes[i])) for i, (s, kk) in
                        enumerate(zip(source, kind)) if kk == k])
        hash_dist[k] = {"median": float(np.median(d)), "max": int(d.max()),
                        "within": float((d <= HASH_DISTANCE).mean())}
    distinct_hashes = hashes[[originals[s] for s in sorted(originals)]]
    between = distances(distinct_hashes[:, None], distinct_hashes[None, :])[np.triu_indices(len(distinct_hashes), 1)]
    false_pairs = [(a, b) for a, b in zip(*upper) if sims[a, b] >= DEFAULT_THRESHOLD and source[a] != source[b]]
    kinds = {k: sum(1 for g in groups.groups if g.kind == k) for k in ("identical", "re-encode", "near")}
    chosen = next(r for r in sweep if r["threshold"] == round(DEFAULT_THRESHOLD, 2))
    # time to group random vectors of the model's dimension (no pairs: the matrix product and the scan)
    rng = np.random.default_rng(0)
    scale = []
    for n in args.sizes:
        v = rng.standard_normal((n, vectors.shape[1])).astype(np.float32)
        start = time.perf_counter()
        find_groups(np.arange(n), v, DEFAULT_THRESHOLD)
        scale.append({"photos": n, "seconds": round(time.perf_counter() - start, 3)})
    gallery.close()
    return {
        "threshold": DEFAULT_THRESHOLD, "hash_distance": HASH_DISTANCE, "model": Path(args.model).name,
        "tta": "flip-crop (index build's default)", "rule": "the lowest threshold of the sweep at which pair "
        "precision is 1.0, plus 0.02", "photos": len(rows), "distinct": len(originals),
        "edited": len(edited_sources), "edits": list(EDITS), "build_seconds": build_s,
        "at_threshold": {
            "pair_precision": chosen["precision"], "pair_recall": chosen["recall"],
            "pair_recall_all": chosen["recall_all"],
            "false_pairs": len(false_pairs),
            "false_pair_hash_distance_min": min((int(distances(hashes[a], hashes[b])) for a, b in false_pairs),
                                                default=None),
            "groups": len(groups.groups), "group_kinds": kinds,
            "edited_in_one_group": complete, "edited_in_exactly_their_group": exact,
            "distinct_grouped": wrongly, "distinct_ungrouped_of": len(distinct), "mixed_groups": mixed,
            "hash_distance": hash_dist,
            "distinct_hash_distance": {"min": int(between.min()), "p01": float(np.percentile(between, 1)),
                                       "within": float((between <= HASH_DISTANCE).mean())}},
        "sweep": sweep,
        "group_seconds": {"index": round(group_s, 3), "photos": len(rows), "random_vectors": scale},
    }


def main(argv=None) -> int:
    from benchmarks.flickr8k_levers import commit, hardware
    from training.inference.pretrained import resolve

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--imagenet", default=str(REPO.parent / "shared" / "datasets" / "imagenet-samples"))
    ap.add_argument("--model", default=None, help="model.pt (default: the shipped model)")
    ap.add_argument("--work", required=True, help="scratch folder: the photo set and its index")
    ap.add_argument("--edited", type=int, default=200, help="photos that get edited copies (default 200)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[10_000, 30_000],
                    help="random-vector gallery sizes to time grouping at (default 10000,30000)")
    ap.add_argument("--reuse", action="store_true", help="keep the photo set and index of an earlier run in --work")
    ap.add_argument("--note", default="", help="appended to the hardware (e.g. 'cores shared with other jobs')")
    args = ap.parse_args(argv)
    args.model = str(resolve(args.model))
    result = measure(args)
    result.update(hardware=hardware(args.note), date=dt.date.today().isoformat(), commit=commit())
    write_json(RESULTS, result)
    print(json.dumps(result["at_threshold"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
