"""The shipped model's query bank and gallery-side test-time augmentation, measured: rows of
``benchmarks/results/querybank_dev.json`` (rendered into docs/results.md by benchmarks/tables.py).

    python benchmarks/querybank_dev.py sweep --data ../shared/datasets/flickr8k --work /tmp/qb
    python benchmarks/querybank_dev.py unseen --work /tmp/qb
    flock -x /tmp/jointspace-cpu.lock python benchmarks/querybank_dev.py timing --data ../shared/datasets/flickr8k

* ``sweep`` — Flickr8k dev retrieval under QB-Norm (inverted softmax, training/inference/querybank.py) against banks
  of Flickr8k training captions and images of several sizes, each a seeded sample exactly as a model's bank is
  drawn (training/inference/querybank.py), with and without test-time augmentation of the gallery (each dev image and its
  mirror image, backbone features averaged: ``index build --tta flip``; those and a closer centre crop and its
  mirror image: ``--tta flip-crop``). The ranking is the one a built index
  serves (tests/test_querybank.py checks that the folded FAISS search ranks as these metrics do). The shipped
  model's dev features (the four views of ``--tta flip-crop``, stored as float16), the dev and train caption embeddings and the bank images'
  embeddings (int8 rows, as a bank stores them) are written under ``--work`` and read from there when present.
* ``unseen`` — galleries the model never saw, through ``jointspace index build`` with its defaults and with
  ``--no-querybank``: the sample photos of ``make demo`` against their own captions (and the corpus's 10 other
  captions), and the test split of a generated synthetic set (``jointspace synth``).
* ``timing`` — seconds to embed the bank's captions (what the first ``index build`` with a model adds; later
  builds read them from the cache) and to embed gallery images with and without test-time augmentation. Run it
  under the exclusive lock.

A row with the same name is replaced. Select on dev only: the test split is never read here.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
from training.data.fileio import write_json  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "querybank_dev.json"
JOINTSPACE = [sys.executable, "-m", "service.cli"]
CAPTION_SIZES = (0, 1000, 2000, 5000, 10000, 30000)
IMAGE_SIZES = (0, 250, 500, 1000, 3000, 5000, 6000)
SEED = 0                      # the bank's sample seed (training/inference/querybank.py: captions seed, images seed + 1)
BETA = 20.0

# the sample gallery of `jointspace index samples` (index/samples.py): each photo's own caption lines
SAMPLE_CAPTIONS = {"astronaut.jpg": [0, 1], "cat.jpg": [2, 3], "coffee.jpg": [4, 5], "rocket.jpg": [6, 7],
                   "cameraman.jpg": [8, 9], "galaxies.jpg": [10, 11], "coins.jpg": [12], "grass.jpg": [13],
                   "gravel.jpg": [14], "brick_wall.jpg": [15], "clock.jpg": [16], "text.jpg": [17],
                   "temple.jpg": [18], "flower.jpg": [19]}


_AT_START: dict = {}


def stamp(note: str = "") -> dict:
    """Hardware, date and the commit of the code as it was when this run started."""
    from flickr8k_levers import commit, hardware

    if not _AT_START:
        _AT_START.update(date=dt.date.today().isoformat(), commit=commit())
    return {"hardware": hardware(note), **_AT_START}


def save(section: str, rows: list[dict]) -> None:
    data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    names = {r["name"] for r in rows}
    data[section] = [r for r in data.get(section, []) if r["name"] not in names] + rows
    write_json(RESULTS, data)


# --- sweep ------------------------------------------------------------------------------------------------------

def embeddings(model, data: str, work: Path) -> dict:
    """The arrays the sweep needs, computed once into ``work``."""
    import torch
    from torch.utils.data import DataLoader, Dataset

    from training.data.datasets import load_dataset
    from training.data.preprocess import ZOOM, MirroredViews, open_image
    from training.inference.embedding import embed_texts
    from training.inference.querybank import image_vectors
    from training.inference.querybank import BankDraw, make_bank, sample_indices

    work.mkdir(parents=True, exist_ok=True)
    dataset = load_dataset(data)
    dev, train = dataset.split("val").images, dataset.split("train").images
    if not (work / "dev_caps.npy").exists():
        np.save(work / "dev_caps.npy", embed_texts(model, [c for r in dev for c in r.captions]).numpy())
        np.save(work / "dev_cap2img.npy", np.array([i for i, r in enumerate(dev) for _ in r.captions]))
    if not (work / "train_caps.npy").exists():
        np.save(work / "train_caps.npy",
                embed_texts(model, [c for r in train for c in r.captions]).numpy().astype(np.float16))
    if not (work / "dev_feats4.npy").exists():    # (N, 4, D): the view, its mirror, the closer crop, its mirror
        views = MirroredViews(model.preprocess, zoom=ZOOM)

        class Views(Dataset):
            def __len__(self):
                return len(dev)

            def __getitem__(self, i):
                return views.pixels(open_image(dev[i].path))

        with torch.no_grad():
            feats = [model.image_features(model.preprocess.normalize(px), pool=False).half().numpy()
                     for px in DataLoader(Views(), batch_size=32, num_workers=1)]
        np.save(work / "dev_feats4.npy", np.concatenate(feats))
    if not (work / "train_img.npy").exists():      # the largest bank's images, as a bank stores them (dequantised)
        bank = make_bank(model, dataset.split("train"), BankDraw(captions=0, images=max(IMAGE_SIZES), beta=BETA,
                                                                  seed=SEED))
        np.save(work / "train_img.npy", image_vectors(bank))
        np.save(work / "train_img_idx.npy", np.array(sample_indices(len(train), max(IMAGE_SIZES), SEED + 1)))
    return {name: np.load(work / f"{name}.npy") for name in
            ("dev_caps", "dev_cap2img", "train_caps", "dev_feats4", "train_img", "train_img_idx")}


def qb_metrics(img, cap, cap_to_img, bank_img, bank_cap) -> dict:
    """R@K both ways, each direction corrected when its bank is not empty (QB-Norm eq. 3)."""
    import torch

    from training.evaluate import KS, ranks_from_scores, summarize
    from training.inference.querybank import item_offsets

    img, cap, cap_to_img = torch.from_numpy(img).float(), torch.from_numpy(cap).float(), torch.from_numpy(cap_to_img)
    off_img = item_offsets(torch.from_numpy(bank_cap).float(), img, BETA) if len(bank_cap) else torch.zeros(len(img))
    off_cap = item_offsets(torch.from_numpy(bank_img).float(), cap, BETA) if len(bank_img) else torch.zeros(len(cap))
    i2t, _ = ranks_from_scores(lambda rows: img[rows] @ cap.t() - off_cap.view(1, -1), len(img), cap_to_img)
    _, t2i = ranks_from_scores(lambda rows: img[rows] @ cap.t() - off_img[rows].view(-1, 1), len(img), cap_to_img)
    res = {"i2t": summarize(i2t), "t2i": summarize(t2i)}
    return {"i2t": [round(res["i2t"][f"r{k}"], 1) for k in KS], "t2i": [round(res["t2i"][f"r{k}"], 1) for k in KS],
            "rsum": round(sum(res[d][f"r{k}"] for d in ("i2t", "t2i") for k in KS), 1)}


def cmd_sweep(args) -> int:
    import torch

    from training.models.checkpoint import load_model
    from training.inference.pretrained import resolve
    from training.inference.querybank import sample_indices

    model = load_model(resolve(args.model)).eval()
    arr = embeddings(model, args.data, Path(args.work))
    with torch.no_grad():
        feats = torch.from_numpy(arr["dev_feats4"]).float()
        views = {"none": model.embed_features(feats[:, 0]).numpy(),
                 "flip": model.embed_features(feats[:, :2].mean(1)).numpy(),
                 "flip-crop": model.embed_features(feats.mean(1)).numpy()}
    # the bank images: the seeded sample of training images a bank of the largest size holds (all 6,000 of
    # Flickr8k's); a smaller image bank is the seeded sample of them that a bank of that size holds
    rows, note = [], args.note
    for n_img in IMAGE_SIZES:
        img_rows = sample_indices(len(arr["train_img"]), n_img, SEED + 1)
        for n_cap in CAPTION_SIZES:
            caps = arr["train_caps"][sample_indices(len(arr["train_caps"]), n_cap, SEED)]
            for tta, img in views.items():
                m = qb_metrics(img, arr["dev_caps"], arr["dev_cap2img"], arr["train_img"][img_rows], caps)
                rows.append({"name": f"captions {n_cap}, images {n_img}, tta {tta}", "bank_captions": n_cap,
                             "bank_images": n_img, "tta": tta, **m, **stamp(note)})
                print(json.dumps(rows[-1]), flush=True)
    save("sweep", rows)
    return 0


# --- unseen galleries, through index build -----------------------------------------------------------------------

def build_and_measure(model_path: str | None, images: list[Path], captions: list[str], truth: dict[int, list[int]],
                      out: Path, extra: list[str]) -> dict:
    """`jointspace index build` of ``images`` + ``captions`` (a listing file, so ids follow ``images``), then
    every own caption searched in the images and every image's stored vector in the captions."""
    import torch

    from index.embed import embed_text_queries
    from index.gallery import Gallery
    from training.evaluate import KS, summarize
    from training.models.checkpoint import load_model
    from training.inference.pretrained import resolve

    out.mkdir(parents=True, exist_ok=True)
    listing, corpus = out / "images.txt", out / "captions.txt"
    listing.write_text("".join(f"{p.resolve()}\n" for p in images))
    corpus.write_text("".join(f"{c}\n" for c in captions))
    model_args = ["--model", model_path] if model_path else []
    subprocess.run([*JOINTSPACE, "index", "build", *model_args, "--images", str(listing), "--captions", str(corpus),
                    "--out", str(out / "index"), "--workers", "0", "--quiet", *extra], cwd=REPO, check=True)
    model = load_model(resolve(model_path))
    gallery = Gallery.load(out / "index", model=model)
    try:
        own = [(c, i) for i, cs in truth.items() for c in cs]
        queries = embed_text_queries(model, [captions[c] for c, _ in own], progress=False)
        t2i = [[i for i, _ in row].index(img) + 1
               for (_, img), row in zip(own, gallery.search_images(queries, len(images)))]
        vectors = np.stack([gallery.image_vector(i) for i in truth])
        i2t = []
        for cs, row in zip(truth.values(), gallery.search_captions(vectors, len(captions))):
            ranked = [c for c, _ in row]
            i2t.append(min(ranked.index(c) for c in cs) + 1)
        corrected = "querybank" in gallery.manifest
    finally:
        gallery.close()
    res = {d: summarize(torch.tensor(r)) for d, r in (("i2t", i2t), ("t2i", t2i))}
    return {"i2t": [round(res["i2t"][f"r{k}"], 1) for k in KS], "t2i": [round(res["t2i"][f"r{k}"], 1) for k in KS],
            "rsum": round(sum(res[d][f"r{k}"] for d in ("i2t", "t2i") for k in KS), 1),
            "hubness_corrected": corrected, "queries": {"i2t": len(i2t), "t2i": len(t2i)}}


def cmd_unseen(args) -> int:
    from index.samples import CAPTIONS, write_samples
    from training.data.datasets import load_dataset
    from training.data.synth import generate

    work = Path(args.work or tempfile.mkdtemp(prefix="jointspace-unseen-"))
    photos = write_samples(work / "samples", near_duplicate=False)
    names = list(SAMPLE_CAPTIONS)
    galleries = [("make demo sample photos (14 photos, 30 captions)", [photos / n for n in names],
                  CAPTIONS.splitlines(), {i: SAMPLE_CAPTIONS[n] for i, n in enumerate(names)})]
    synth = work / "synth"
    if not (synth / "dataset.json").exists():
        generate(synth, n_images=args.synth_images, seed=0, progress=False)
    test = load_dataset(synth).split("test").images
    caps = [c for r in test for c in r.captions]
    truth, at = {}, 0
    for i, r in enumerate(test):
        truth[i] = list(range(at, at + len(r.captions)))
        at += len(r.captions)
    galleries.append((f"synthetic shapes, test split ({len(test)} images, {len(caps)} captions)",
                      [r.path for r in test], caps, truth))
    rows = []
    for gallery, images, captions, own in galleries:
        for label, extra in (("index build (default: the model's query bank, --tta flip-crop)", []),
                             ("index build --tta flip", ["--tta", "flip"]),
                             ("index build --no-querybank", ["--no-querybank"]),
                             ("index build --no-querybank --tta flip", ["--no-querybank", "--tta", "flip"]),
                             ("index build --no-querybank --tta none", ["--no-querybank", "--tta", "none"])):
            t0 = time.time()
            m = build_and_measure(args.model, images, captions, own, work / f"g{len(rows)}", extra)
            rows.append({"name": f"{gallery}: {label}", "gallery": gallery, "build": label, **m,
                         "seconds": round(time.time() - t0, 1), **stamp(args.note)})
            print(json.dumps(rows[-1]), flush=True)
    save("unseen", rows)
    return 0


# --- timing --------------------------------------------------------------------------------------------------------

def cmd_timing(args) -> int:
    import torch

    from training.data.datasets import load_dataset
    from training.inference.embedding import embed_texts
    from training.models.checkpoint import load_model
    from training.inference.pretrained import resolve
    from training.inference.querybank import sample_indices

    from index.embed import embed_photos

    model = load_model(resolve(args.model)).eval()
    train = load_dataset(args.data).split("train")
    texts = [c for r in train.images for c in r.captions]
    rows = []
    for n in args.caption_sizes:
        batch = [texts[i] for i in sample_indices(len(texts), n, SEED)]
        t0 = time.perf_counter()
        embed_texts(model, batch)
        rows.append({"name": f"embed {n} bank captions", "what": "bank captions", "n": n,
                     "seconds": round(time.perf_counter() - t0, 2), "threads": torch.get_num_threads(),
                     **stamp(args.note)})
        print(json.dumps(rows[-1]), flush=True)
    paths = [r.path for r in load_dataset(args.data).split("val").images[:args.images]]
    embed_photos(model, paths[:8], workers=0, progress=False)           # warm-up
    for tta in ("none", "flip", "flip-crop"):
        t0 = time.perf_counter()
        embed_photos(model, paths, workers=1, progress=False, tta=tta, batch_size=32)
        seconds = time.perf_counter() - t0
        rows.append({"name": f"embed {len(paths)} gallery images, tta {tta}", "what": f"gallery images, tta {tta}",
                     "n": len(paths), "seconds": round(seconds, 2), "per_image_ms": round(1000 * seconds / len(paths)),
                     "threads": torch.get_num_threads(), **stamp(args.note)})
        print(json.dumps(rows[-1]), flush=True)
    save("timing", rows)
    return 0


def main(argv: list[str] | None = None) -> int:
    stamp()                                      # the commit at the start
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sweep")
    s.add_argument("--data", required=True, help="the Flickr8k folder")
    s.add_argument("--work", required=True, help="folder for the embeddings (kept; read when present)")
    u = sub.add_parser("unseen")
    u.add_argument("--work", help="folder for the galleries and indexes (default: a new temporary one)")
    u.add_argument("--synth-images", type=int, default=1000, help="synthetic set size (test split: a tenth)")
    t = sub.add_parser("timing")
    t.add_argument("--data", required=True, help="the Flickr8k folder")
    t.add_argument("--caption-sizes", type=int, nargs="+", default=[1000, 5000, 10000])
    t.add_argument("--images", type=int, default=64, help="dev images embedded per setting")
    for p in (s, u, t):
        p.add_argument("--model", help="model.pt (default: the shipped model)")
        p.add_argument("--note", default="", help="appended to the hardware column")
    args = ap.parse_args(argv)
    return {"sweep": cmd_sweep, "unseen": cmd_unseen, "timing": cmd_timing}[args.cmd](args)


if __name__ == "__main__":
    raise SystemExit(main())
