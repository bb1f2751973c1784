"""``index build`` throughput per inference backend and ``--tta`` mode, eager PyTorch and the others in one run, with
each build's peak memory; and Flickr8k dev as served per backend.

    python benchmarks/backend_throughput.py                # → benchmarks/results/backend_throughput.json
    python benchmarks/backend_throughput.py --baseline /tmp/base   # also a checkout of an older commit, eager
    python benchmarks/backend_throughput.py --photos 4 --rounds 1 --tta flip-crop --out /tmp/bt.json   # smoke run
    python benchmarks/backend_throughput.py ranking --data ../shared/datasets/flickr8k   # dev R-sum per backend

Throughput (the default command): ``--photos`` JPEGs of ``--megapixels`` each (default 40 of 1 MP, quality 90)
are generated from ``make demo``'s sample photos (index/samples.py): each sample scaled to cover a 4:3 frame of
that size, a little more each time it comes round again, and cut at its own offset. For every round, ``--tta``
mode and backend (``eager`` first, then ``openvino``, ``openvino-bf16`` where the CPU has native bf16, and
``onnxruntime``), a fresh child process runs ``jointspace index build`` with its defaults (the model's query bank,
its decoding workers, its batch size) plus ``--backend`` and ``--tta``, in process (``service.cli.main``), on the
shipped model. A row keeps the seconds of that call (loading the model, reading the backend's graph from the
cache, embedding, writing the index: ``photos/s``), the seconds spent embedding the photos alone, the whole
process's seconds (with Python's and torch's imports) and the process's peak resident memory (``os.wait4``).
Each checkout has a ``JOINTSPACE_CACHE`` of its own, empty at first; before the first round one build per backend
fills the caches every later build reads: the backend's converted graph (the time of that conversion, as a new
user's first build spends it, is reported apart from the rows) and the query bank's caption vectors. The modes and
backends take turns within a round, so a drifting background load hits them alike; the table gives each
configuration's median over the rounds. ``--baseline DIR`` adds eager rows of the code in ``DIR`` (e.g.
``git worktree add /tmp/base 6d5a208``): the same build, the same photos, in the same run; with
``--baseline-backends`` the baseline runs every backend this checkout runs, and each row is compared with the
baseline's row of its own backend.

Ranking (``ranking``): the dev split of ``--data`` embedded as ``index build`` embeds a gallery (its decoding,
``--tta``, default ``flip-crop``) on each backend, the captions with the text tower, scored with the model's own
query bank as a built index serves them (QB-Norm, benchmarks/querybank_dev.py's metrics); a backend's R-sum is
compared with eager's. Rows with the same backend and mode are replaced; each command keeps the other's rows.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import runpy
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import cast

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "backend_throughput.json"
BACKENDS = ("eager", "openvino", "openvino-bf16", "onnxruntime")
# the --tta names read from their file (torch-free, importing nothing of the project): importing a package of this
# checkout here would fix which checkout a child (--code) imports
TTA: tuple[str, ...] = runpy.run_path(str(ROOT / "training" / "inference" / "names.py"))["TTA"]


# --- the photos -------------------------------------------------------------------------------------------------

def make_photos(out: Path, count: int, megapixels: float) -> list[Path]:
    """``count`` JPEGs of ``megapixels`` each (4:3, quality 90) cut from the demo's sample photos."""
    from PIL import Image

    from index.samples import write_samples

    samples = sorted(write_samples(out / "samples", near_duplicate=False).glob("*.jpg"))
    width = int(round(math.sqrt(megapixels * 1e6 * 4 / 3)))
    height = int(round(width * 3 / 4))
    folder = out / "photos"
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        with Image.open(samples[i % len(samples)]) as im:
            source = im.convert("RGB")
        scale = max(width / source.width, height / source.height) * (1 + 0.15 * (i // len(samples)))
        big = source.resize((math.ceil(source.width * scale), math.ceil(source.height * scale)), Image.BICUBIC)
        left = (big.width - width) * ((i * 37) % 101) // 100
        top = (big.height - height) * ((i * 53) % 101) // 100
        path = folder / f"photo{i:03d}.jpg"
        big.crop((left, top, left + width, top + height)).save(path, "JPEG", quality=90)
        paths.append(path)
    return paths


# --- one build in a child process -------------------------------------------------------------------------------

def child(args) -> int:
    """``index build`` in this process (the code of ``--code``), timed; one JSON line on stdout."""
    start = time.perf_counter()
    sys.path.insert(0, str(args.code))
    import index.gallery as gallery_module
    import training
    from service.cli import main

    for package in (gallery_module, training):      # a package imported earlier would mix two checkouts' code
        if not Path(cast(str, package.__file__)).resolve().is_relative_to(Path(args.code).resolve()):
            raise RuntimeError(f"{package.__name__} was imported from {package.__file__}, not from {args.code}")

    timings = {"embed_s": 0.0, "backend_s": 0.0}

    def timed(name, fn):
        def run(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                timings[name] += time.perf_counter() - t0
        return run

    # the photos' embedding: index/gallery.py's own step where it has one (it reads their text meanwhile), else the
    # embed_image_files it calls (older code)
    step = "_embed_photos" if hasattr(gallery_module, "_embed_photos") else "embed_image_files"
    setattr(gallery_module, step, timed("embed_s", getattr(gallery_module, step)))
    used = {"backend": "eager", "converted": False}
    try:
        import training.inference.backend as backend_module
    except ImportError:              # code from before the backends: eager
        backend_module = None
    if backend_module is not None:
        use_backend = backend_module.use_backend

        def spy(model, *a, **k):
            name = use_backend(model, *a, **k)
            found = backend_module.backend_of(model)
            used.update(backend=name, converted=bool(found and found.converted))
            return name
        backend_module.use_backend = timed("backend_s", spy)
    imported = time.perf_counter() - start
    argv = ["index", "build", "--images", str(args.gallery), "--out", str(args.index_out), "--quiet", "--tta", args.tta]
    if args.backend:
        argv += ["--backend", args.backend]
    t0 = time.perf_counter()
    code = main(argv)
    seconds = time.perf_counter() - t0
    print(json.dumps({"code": code, "seconds": seconds, "import_s": imported, **timings, **used}), flush=True)
    return code


def build_once(images: Path, out: Path, tta: str, backend: str | None, code: Path = ROOT,
               cache: Path | None = None) -> dict:
    """One child build: its JSON line, the process's wall seconds and its peak resident memory. ``cache``: its
    ``JOINTSPACE_CACHE`` (default: the user's)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "child", "--gallery", str(images), "--index-out", str(out),
           "--tta", tta, "--code", str(code)] + (["--backend", backend] if backend else [])
    env = {**os.environ, **({"JOINTSPACE_CACHE": str(cache)} if cache is not None else {})}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=code, env=env)
    stdout = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"the build failed ({' '.join(cmd)}): exit {proc.returncode}")
    return {**json.loads(lines[-1]), "process_s": wall, "peak_rss_mb": usage.ru_maxrss / 1024}


# --- the results file ----------------------------------------------------------------------------------------------

def stamp(note: str) -> dict:
    from benchmarks.tables import current_commit
    from flickr8k_levers import hardware

    import torch
    versions = {"torch": torch.__version__, "python": platform.python_version()}
    for package in ("openvino", "onnxruntime"):
        try:
            versions[package] = __import__(package).__version__
        except ImportError:
            pass
    return {"hardware": hardware(note), "date": dt.date.today().isoformat(), "commit": current_commit(),
            "versions": versions}


def save(path: Path, section: dict, key: str) -> None:
    """Writes ``section`` under ``key`` of the results file, keeping its other sections."""
    data = json.loads(path.read_text()) if path.exists() else {}
    data[key] = section
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def summary(rows: list[dict]) -> list[dict]:
    """Each configuration's medians over the rounds, with its speed-up on eager (and on the baseline) at its mode."""
    import numpy as np

    out = []
    for key in dict.fromkeys((r["code"], r["backend"], r["tta"]) for r in rows):
        mine = [r for r in rows if (r["code"], r["backend"], r["tta"]) == key]
        out.append({"code": key[0], "backend": key[1], "tta": key[2], "used": mine[0]["used"],
                    "photos_per_s": float(np.median([r["photos_per_s"] for r in mine])),
                    "embed_photos_per_s": float(np.median([r["embed_photos_per_s"] for r in mine])),
                    "seconds": float(np.median([r["seconds"] for r in mine])),
                    "peak_rss_mb": float(max(r["peak_rss_mb"] for r in mine)), "rounds": len(mine)})

    def find(code: str, backend: str, tta: str) -> dict | None:
        return next((r for r in out if (r["code"], r["backend"], r["tta"]) == (code, backend, tta)), None)

    for row in out:
        for name, code in (("vs_eager", "this"), ("vs_baseline", "baseline")):
            # against eager; against the baseline's own row of this backend when it ran one, else its eager row
            ref = find(code, "eager", row["tta"]) if name == "vs_eager" else \
                find(code, row["backend"], row["tta"]) or find(code, "eager", row["tta"])
            row[name] = row["photos_per_s"] / ref["photos_per_s"] if ref else None
    return out


# --- throughput -------------------------------------------------------------------------------------------------

def throughput(args) -> int:
    import shutil

    from training.inference.backend import native_bf16

    backends = [b for b in args.backends if b != "openvino-bf16" or native_bf16()]
    if "eager" in backends:
        backends.remove("eager")
        backends.insert(0, "eager")
    work = Path(tempfile.mkdtemp(prefix="jointspace-backends-"))
    try:
        photos = make_photos(work, args.photos, args.megapixels)
        images = photos[0].parent
        codes = [("this", ROOT)] + ([("baseline", Path(args.baseline).resolve())] if args.baseline else [])
        print(f"{len(photos)} photos of {args.megapixels:g} MP in {images}; backends {', '.join(backends)}; "
              f"--tta {', '.join(args.tta)}" + (f"; baseline code {args.baseline}" if args.baseline else ""),
              flush=True)
        # each checkout in a cache of its own, empty at first: its first build of each backend converts the tower
        # as a new user's does (timed apart, not in the rows) and fills the query bank's cache
        caches = {label: work / f"cache-{label}" for label, _ in codes}
        conversion = []
        for label, code in codes:
            for backend in backends if label == "this" or args.baseline_backends else [None]:
                first = build_once(images, work / "index", "none", backend, code, caches[label])
                conversion.append({"code": label, "backend": backend or "eager", "used": first["backend"],
                                   "converted": first["converted"], "backend_s": first["backend_s"],
                                   "first_build_s": first["seconds"]})
                print(f"first build, {label} {backend or 'eager'}: {first['seconds']:.1f} s (backend "
                      f"{first['backend']}, {'converted' if first['converted'] else 'read'} in "
                      f"{first['backend_s']:.1f} s)", flush=True)
        rows = []
        for round_ in range(1, args.rounds + 1):
            for tta in args.tta:
                for label, code in codes:
                    for backend in backends if label == "this" or args.baseline_backends else [None]:
                        out = work / f"index-{label}-{backend}-{tta}"
                        r = build_once(images, out, tta, backend, code, caches[label])
                        shutil.rmtree(out, ignore_errors=True)
                        rows.append({"round": round_, "code": label, "backend": backend or "eager", "tta": tta,
                                     "used": r["backend"], "photos": len(photos), "seconds": r["seconds"],
                                     "photos_per_s": len(photos) / r["seconds"], "embed_s": r["embed_s"],
                                     "embed_photos_per_s": len(photos) / r["embed_s"] if r["embed_s"] else None,
                                     "backend_s": r["backend_s"], "process_s": r["process_s"],
                                     "peak_rss_mb": r["peak_rss_mb"], "load_1min": os.getloadavg()[0]})
                        print(f"round {round_} --tta {tta:9s} {label} {backend or 'eager':14s} "
                              f"{rows[-1]['photos_per_s']:6.2f} photos/s (embedding {rows[-1]['embed_s']:.1f} s of "
                              f"{r['seconds']:.1f} s; process {r['process_s']:.1f} s) peak RSS "
                              f"{r['peak_rss_mb']:.0f} MB (backend {r['backend']})", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {"description": f"jointspace index build with its defaults on {len(photos)} generated "
                             f"{args.megapixels:g} MP JPEGs (the shipped model) per backend and --tta mode "
                             f"(python benchmarks/backend_throughput.py --photos {args.photos} --megapixels "
                             f"{args.megapixels:g} --rounds {args.rounds}"
                             f"{' --baseline … --baseline-backends' if args.baseline and args.baseline_backends else ''})",
              **stamp(args.note), "photos": len(photos), "megapixels": args.megapixels, "rounds": args.rounds,
              "baseline": args.baseline_label or (str(args.baseline) if args.baseline else None),
              "baseline_backends": bool(args.baseline and args.baseline_backends),
              "conversion": conversion, "rows": rows, "summary": summary(rows)}
    save(Path(args.out), result, "throughput")
    for s in result["summary"]:
        print(f"--tta {s['tta']:9s} {s['code']:8s} {s['backend']:14s} {s['photos_per_s']:6.2f} photos/s"
              + (f"  ×{s['vs_eager']:.2f} eager" if s["vs_eager"] else "")
              + (f"  ×{s['vs_baseline']:.2f} baseline" if s["vs_baseline"] else "")
              + f"  peak RSS {s['peak_rss_mb']:.0f} MB")
    return 0


# --- ranking ---------------------------------------------------------------------------------------------------

def ranking(args) -> int:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import numpy as np
    import torch

    import querybank_dev
    from index.embed import embed_photos, embed_sentences
    from index.qbnorm import model_bank
    from training.data.datasets import load_dataset
    from training.inference.backend import attached, use_backend
    from training.inference.pretrained import resolve
    from training.models.checkpoint import load_model

    dev = load_dataset(args.data).split("val").images[:args.images or None]
    paths = [r.path for r in dev]
    model = load_model(resolve(args.model))
    captions = embed_sentences(model, [c for r in dev for c in r.captions], progress=False)
    cap_to_img = np.array([i for i, r in enumerate(dev) for _ in r.captions])
    bank = model_bank(model, progress=False)
    empty = np.zeros((0, captions.shape[1]), np.float32)
    querybank_dev.BETA = bank.beta if bank is not None else querybank_dev.BETA
    data = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
    rows = [r for r in data.get("ranking", {}).get("rows", [])
            if (r["backend"], r["tta"], r["images"]) not in {(b, args.tta, len(dev)) for b in args.backends}]
    for backend in args.backends:
        use_backend(model, backend)
        with torch.no_grad():
            emb = embed_photos(model, paths, progress=False, tta=args.tta)
        assert len(emb.kept) == len(paths), emb.skipped
        m = querybank_dev.qb_metrics(emb.vectors, captions, cap_to_img,
                                     bank.images.astype(np.float32) if bank is not None and bank.images is not None
                                     else empty,
                                     bank.captions if bank is not None and bank.captions is not None else empty)
        rows.append({"backend": backend, "used": attached(model), "tta": args.tta, "images": len(dev), **m})
        print(json.dumps(rows[-1]), flush=True)
    for r in rows:
        eager = next((e for e in rows if (e["backend"], e["tta"], e["images"]) == ("eager", r["tta"], r["images"])),
                     None)
        r["rsum_vs_eager"] = round(r["rsum"] - eager["rsum"], 1) if eager else None
    save(Path(args.out), {"description": f"Flickr8k dev as served ({len(dev)} images, --tta {args.tta}, the model's "
                                         f"query bank) per backend (python benchmarks/backend_throughput.py ranking)",
                          **stamp(args.note), "rows": rows}, "ranking")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", nargs="?", default="throughput", choices=["throughput", "ranking", "child"])
    ap.add_argument("--photos", type=int, default=40)
    ap.add_argument("--megapixels", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tta", nargs="+", default=list(TTA), choices=TTA,
                    help="modes (throughput), or the one mode of ranking (its first)")
    ap.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    ap.add_argument("--baseline", help="a checkout of other code (e.g. an older commit's worktree): its eager rows too")
    ap.add_argument("--baseline-label", help="what the results call the baseline (default: its path)")
    ap.add_argument("--baseline-backends", action="store_true",
                    help="the baseline runs every backend of --backends, not eager alone")
    ap.add_argument("--data", default="../shared/datasets/flickr8k", help="ranking: the captioned data set")
    ap.add_argument("--images", type=int, default=0, help="ranking: the first N dev images (0: all)")
    ap.add_argument("--model", help="ranking: model.pt (default: the shipped model)")
    ap.add_argument("--note", default="", help="said with the hardware (e.g. 'shared with other jobs')")
    ap.add_argument("--out", default=str(RESULTS))
    # the child's own (one build)
    ap.add_argument("--gallery", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--index-out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--code", type=Path, default=ROOT, help=argparse.SUPPRESS)
    ap.add_argument("--backend", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.command == "child":
        args.tta = args.tta[0]
        return child(args)
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    if args.command == "ranking":
        args.tta = args.tta[-1] if args.tta == list(TTA) else args.tta[0]      # default: flip-crop, as served
        return ranking(args)
    return throughput(args)


if __name__ == "__main__":
    sys.exit(main())
