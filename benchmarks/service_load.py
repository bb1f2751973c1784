"""Load benchmark of the HTTP service: throughput and p50/p99 latency with dynamic batching on and off, against
the raw limit (encoder forward + index search on the same batch sizes, in process, no HTTP).

    python benchmarks/service_load.py --model demo/run/model.pt --index demo/index
    python benchmarks/service_load.py --index demo/photos-index --backend eager    # make demo's index (the
                                                 # shipped model), the backbones in eager PyTorch
    python benchmarks/service_load.py            # no model or index given: the demo architecture, untrained, on a
                                                 # generated gallery (speed does not depend on the weights)

Any index serves: photos and videos (a video's moments are never read as an image: the image queries are the
gallery's photos, or a frame of each moment when it holds videos only), with or without captions (without, a few
fixed sentences are the text queries). ``--backend`` picks what runs the image backbones, in the servers and the
raw limit alike (default: the service's own choice, training/inference/backend.py).

Worker processes (``serve --workers``): ``--workers 1 2 --batching on`` runs one server per count (batching on)
instead of the on/off pair, and ``--baseline DIR`` one more server from another checkout's code (batching on, one
process), so that a change is compared with the code before it in one run:

    python benchmarks/service_load.py --workers 1 2 --batching on --baseline /path/to/main --concurrency 1 32 \
        --overload 0 --out benchmarks/results/serve_workers_cpu.json

By default it starts two ``jointspace serve`` subprocesses, batching on and off, and drives them with C concurrent keep-alive
clients (C = 1, 8, 32, 128), for text search (``POST /v1/search/images``) and image search (``POST
/v1/search/captions`` with an uploaded image); each cell alternates on/off ``--repeats`` times for ``--seconds``
(median throughput; pooled latencies), so that a drifting background load on a shared machine hits both alike.
It also measures the HTTP stack's own ceiling (``GET /healthz``, no work). The clients are a minimal asyncio HTTP/1.1
client, so that as little client CPU as possible competes with the server on the same machine. The mean batch
size per cell comes from the server's own ``jointspace_batch_size`` histogram.

Overload cell (``--overload 10``): text search on the batching server with ``--overload`` × the largest concurrency
(10 × 128 = 1280 keep-alive clients) for ``--overload-seconds``, the service's default load shedding on
(``JOINTSPACE_MAX_QUEUE``, ``JOINTSPACE_DEADLINE_MS``). Clients behave as the API asks: after a 503 they wait at
least its ``Retry-After`` before their next request — exactly that (``retry-after``), or with exponential backoff
and jitter over repeated refusals (``backoff``); one cell each. Reported: goodput (200 answers/s) against the best text cell of the
run, p50/p99 of the answered requests, the 503s (by the server's ``jointspace_shed_total``: refused on arrival or
dropped at their deadline), and the server's resident memory before, at its peak during, and after the cell.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from index.gallery import EmbedOptions, Gallery, build  # noqa: E402
from service.engine import Engine  # noqa: E402
from service.images import upload_to_pixels  # noqa: E402
from service.state import cpu_threads  # noqa: E402
from tests.server_process import spawn  # noqa: E402
from training.inference.threads import single_threaded_blas  # noqa: E402
from training.data.datasets import load_dataset  # noqa: E402
from training.inference.backend import BACKENDS, attached, use_backend  # noqa: E402
from training.models.model import build_model  # noqa: E402
from training.models.checkpoint import load_model, save_model  # noqa: E402


# --- a minimal keep-alive HTTP/1.1 client ------------------------------------------------------------------

class Connection:
    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader = self.writer = None

    async def open(self):
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def request(self, raw: bytes) -> tuple[int, bytes]:
        status, head = await self.request_with_head(raw)
        return status, self.body

    async def request_with_head(self, raw: bytes) -> tuple[int, bytes]:
        """Sends ``raw``; returns the status and the response head (the body is kept in ``self.body``)."""
        self.writer.write(raw)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
        self.body = await self.reader.readexactly(length)
        return status, head

    def close(self):
        self.writer.close()


def http_request(method: str, path: str, body: bytes, content_type: str, host: str = "127.0.0.1") -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def text_requests(texts: list[str], k: int) -> list[bytes]:
    return [http_request("POST", "/v1/search/images", json.dumps({"text": t, "k": k}).encode(), "application/json")
            for t in texts]


def image_requests(images: list[tuple[str, bytes]], k: int) -> list[bytes]:
    """Image search requests, one per ``(file name, bytes)`` of :func:`query_images`."""
    out = []
    for name, data in images:
        boundary = "jointspacebench"
        body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"k\"\r\n\r\n{k}\r\n"
                f"--{boundary}\r\nContent-Disposition: form-data; name=\"image\"; filename=\"{name}\"\r\n"
                f"Content-Type: application/octet-stream\r\n\r\n").encode() + data + \
            f"\r\n--{boundary}--\r\n".encode()
        out.append(http_request("POST", "/v1/search/captions", body, f"multipart/form-data; boundary={boundary}"))
    return out


FALLBACK_TEXTS = ["a dog runs on the grass", "a man rides a bicycle", "two children play on a beach", "a cat"]


def query_texts(gallery: Gallery, limit: int = 2000) -> list[str]:
    """The text queries: the index's own captions (up to ``limit``), else (an index without captions) a few
    everyday sentences."""
    texts = [row.text for row in gallery.meta.captions(gallery.meta.caption_ids()[:limit]).values()]
    return texts or list(FALLBACK_TEXTS)


def query_images(gallery: Gallery, limit: int = 256) -> list[tuple[str, bytes]]:
    """The image queries, ``(file name, bytes)``: the gallery's photos (up to ``limit``); a gallery of videos only
    gives a JPEG of each moment's first frame instead. A video's rows (its moments) are never read as an image."""
    import io

    from index.video_decode import frame_at

    rows = gallery.meta.all_images()
    photos = [Path(r.path) for r in rows if r.video_id is None][:limit]
    if photos:
        return [(p.name, p.read_bytes()) for p in photos]
    out = []
    for r in rows[:limit]:
        frame = io.BytesIO()
        at = r.t_frame if r.t_frame is not None else r.t_start or 0.0
        frame_at(r.path, at).save(frame, "JPEG", quality=90)
        out.append((f"{Path(r.path).stem}-{at:.1f}s.jpg", frame.getvalue()))
    return out


async def drive(port: int, requests: list[bytes], concurrency: int, seconds: float, warmup: float = 0.5):
    """``concurrency`` clients, each sending one request after another; returns (req/s, latencies, errors)."""
    conns = [Connection("127.0.0.1", port) for _ in range(concurrency)]
    await asyncio.gather(*(c.open() for c in conns))
    latencies: list[float] = []
    errors = 0
    t_measure = time.perf_counter() + warmup
    t_end = t_measure + seconds

    async def client(i: int, conn: Connection):
        nonlocal errors
        n = i
        while True:
            start = time.perf_counter()
            if start >= t_end:
                return
            status, _ = await conn.request(requests[n % len(requests)])
            n += concurrency
            done = time.perf_counter()
            if start >= t_measure:
                latencies.append(done - start)
                errors += status != 200

    await asyncio.gather(*(client(i, c) for i, c in enumerate(conns)))
    for c in conns:
        c.close()
    return len(latencies) / seconds, np.array(latencies), errors


BACKOFF_CAP_S = 16.0


def retry_wait(retry_after: float, refusals: int, policy: str, rng) -> float:
    """How long a client waits after its ``refusals``-th 503 in a row. ``retry-after``: exactly what the answer
    says. ``backoff``: at least that, doubled for each further refusal in a row (capped at 16 s), with 0–50 %
    jitter — the usual client retry policy (exponential backoff with jitter, honouring Retry-After)."""
    if policy == "retry-after":
        return retry_after
    return min(BACKOFF_CAP_S, retry_after * 2 ** (refusals - 1)) * rng.uniform(1.0, 1.5)


async def drive_overload(port: int, requests: list[bytes], concurrency: int, seconds: float, pid: int,
                         policy: str = "retry-after", warmup: float = 1.0) -> dict:
    """``concurrency`` clients; a 503 makes its client wait (``retry_wait``) before the next request. Returns
    goodput, status counts, latencies of the answered requests and the server's RSS samples."""
    import random
    conns = [Connection("127.0.0.1", port) for _ in range(concurrency)]
    for start in range(0, concurrency, 256):                 # do not flood the accept queue all at once
        await asyncio.gather(*(c.open() for c in conns[start:start + 256]))
    ok: list[float] = []
    statuses: dict[int, int] = {}
    resets = [0]
    rss: list[int] = []
    t_measure = time.perf_counter() + warmup
    t_end = t_measure + seconds

    async def sample():
        while time.perf_counter() < t_end:
            rss.append(resident_bytes(pid))
            await asyncio.sleep(0.25)

    async def client(i: int, conn: Connection):
        n, refusals, rng = i, 0, random.Random(i)
        while True:
            start = time.perf_counter()
            if start >= t_end:
                return
            try:
                status, head = await conn.request_with_head(requests[n % len(requests)])
            except (ConnectionError, asyncio.IncompleteReadError):
                resets[0] += 1                          # the connection was closed under us: count it, reconnect
                conn.close()
                await conn.open()
                continue
            n += concurrency
            done = time.perf_counter()
            if start >= t_measure:
                statuses[status] = statuses.get(status, 0) + 1
                if status == 200:
                    ok.append(done - start)
            if status == 503:
                refusals += 1
                retry = re.search(rb"(?i)retry-after: *(\d+)", head)
                wait = retry_wait(float(retry.group(1)) if retry else 1.0, refusals, policy, rng)
                await asyncio.sleep(min(wait, max(t_end - time.perf_counter(), 0)))
            else:
                refusals = 0

    await asyncio.gather(sample(), *(client(i, c) for i, c in enumerate(conns)))
    for c in conns:
        c.close()
    lat = np.array(ok)
    return {"goodput_rps": len(ok) / seconds, "statuses": {str(k): v for k, v in sorted(statuses.items())},
            "connection_resets": resets[0],
            "p50_ms": float(np.percentile(lat, 50) * 1e3) if lat.size else float("nan"),
            "p99_ms": float(np.percentile(lat, 99) * 1e3) if lat.size else float("nan"),
            "max_ms": float(lat.max() * 1e3) if lat.size else float("nan"), "rss_samples": rss}


def resident_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def shed_counts(port: int) -> dict[str, float]:
    import httpx

    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return {f"{m.group(1)}/{m.group(2)}": float(m.group(3)) for m in
            re.finditer(r'jointspace_shed_total\{batcher="([^"]+)",reason="([^"]+)"\} (\S+)', text)}


def batch_counts(port: int) -> dict[str, tuple[float, float]]:
    import httpx

    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    out = {}
    for name in ("text", "image"):
        count = re.search(rf'jointspace_batch_size_count{{batcher="{name}"}} (\S+)', text)
        total = re.search(rf'jointspace_batch_size_sum{{batcher="{name}"}} (\S+)', text)
        out[name] = (float(count.group(1)) if count else 0.0, float(total.group(1)) if total else 0.0)
    return out


# --- the server ----------------------------------------------------------------------------------------------

def ratio(a: float, b: float, fmt: str) -> str:
    return format(a / b, fmt) if b else "—"


def start_server(model: Path, index: Path, batching: bool, max_batch: int, max_wait_ms: float,
                 backend: str | None = None, workers: int = 1, checkout: Path | None = None) -> tuple:
    """``jointspace serve`` with these settings; ``workers``: ``serve --workers`` (1: one process, the flag not
    passed, so that a checkout without it runs too); ``checkout``: another checkout's code (default this one)."""
    args = ["--model", str(model), "--index", str(index), "--max-batch", str(max_batch), "--max-wait-ms",
            str(max_wait_ms), "--log-level", "warning"] + ([] if batching else ["--no-batching"]) + \
        (["--backend", backend] if backend else []) + (["--workers", str(workers)] if workers != 1 else [])
    return spawn(args, repo=checkout or REPO)


def server_configs(args) -> list[dict]:
    """The servers the cells alternate between: one per ``--workers`` count and ``--batching`` mode, and with
    ``--baseline`` one more from that checkout (batching on, one process)."""
    configs = [{"batching": on == "on", "workers": w, "checkout": None}
               for w in args.workers for on in args.batching]
    if args.baseline is not None:
        configs.append({"batching": True, "workers": 1, "checkout": str(args.baseline)})
    return configs


def label(config: dict) -> str:
    return (f"{'baseline ' if config['checkout'] else ''}workers={config['workers']} "
            f"batching={'on' if config['batching'] else 'off'}")


def tree_rss_mb(pid: int) -> float:
    """The resident memory of a process and every process below it (``serve --workers``: the parent and its
    workers), in MB, from /proc (0 where there is none)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo.extend(children.get(p, []))
        try:
            status = Path(f"/proc/{p}/status").read_text()
        except OSError:
            continue
        total += next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    return total / 1024


def commit_of(checkout: Path) -> str | None:
    done = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True)
    return done.stdout.strip() or None


def overload_cell(args, server: tuple, requests: list[bytes], rows: list[dict], policy: str) -> dict:
    """The overload cell on the batching server (see the module docstring), clients retrying by ``policy``."""
    from service.settings import Settings

    settings = Settings()                               # what the server process read: defaults + JOINTSPACE_* env
    proc, port = server
    base = max(args.concurrency)
    concurrency = args.overload * base
    best = max((r for r in rows if r["route"] == "text" and r["batching"]), key=lambda r: r["rps"])
    before_shed, rss_before = shed_counts(port), resident_bytes(proc.pid)
    result = asyncio.run(drive_overload(port, requests, concurrency, args.overload_seconds, proc.pid, policy))
    time.sleep(2.0)                                     # let the last answers and sleeping clients drain
    after_shed, rss_after = shed_counts(port), resident_bytes(proc.pid)
    shed = {k: v - before_shed.get(k, 0.0) for k, v in after_shed.items() if v - before_shed.get(k, 0.0)}
    samples = result.pop("rss_samples")
    return {"route": "text", "client_retry": policy, "factor": args.overload, "base_concurrency": base,
            "concurrency": concurrency,
            "seconds": args.overload_seconds, **result, "best_rps": best["rps"], "best_concurrency": best["concurrency"],
            "goodput_vs_best": result["goodput_rps"] / best["rps"] if best["rps"] else float("nan"), "shed": shed,
            "rss_before_mb": rss_before / 2 ** 20, "rss_peak_mb": max(samples, default=0) / 2 ** 20,
            "rss_after_mb": rss_after / 2 ** 20,
            "server_settings": {k: getattr(settings, k) for k in ("max_queue", "deadline_ms", "retry_after_s")}}


# --- raw limit -----------------------------------------------------------------------------------------------

def raw_limit(engine: Engine, items: list, batch: int, seconds: float, search) -> float:
    """Items per second of ``search`` (forward + index search) on batches of ``batch`` items, in process."""
    batches = [items[i:i + batch] for i in range(0, len(items) - batch + 1, batch)] or [items[:batch]]
    search(batches[0])                                   # warm-up
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        search(batches[n % len(batches)])
        n += 1
    return n * batch / (time.perf_counter() - start)


# --- setup when no model is given ------------------------------------------------------------------------------

def baseline_model_and_index(checkout: Path, work: Path, images: int) -> tuple[Path, Path]:
    """The same untrained demo model and generated gallery as :func:`default_model_and_index`, made by the code of
    ``checkout`` (its own ``benchmarks/service_load.py``), so that its server reads files written in its own format
    (a model file stores its config, and a checkout refuses keys it does not know)."""
    code = ("import sys, pathlib; sys.path.insert(0, 'benchmarks'); import service_load; "
            f"service_load.default_model_and_index(pathlib.Path({str(work)!r}), {images})")
    path = os.pathsep.join(p for p in (str(checkout), os.environ.get("PYTHONPATH", "")) if p)
    subprocess.run([sys.executable, "-c", code], cwd=checkout, env={**os.environ, "PYTHONPATH": path}, check=True)
    return work / "model.pt", work / "index"


def default_model_and_index(work: Path, images: int) -> tuple[Path, Path, Path]:
    from training.config import load_config
    from training.data.synth import generate
    from training.data.vocab import Vocabulary

    data = generate(work / "data", n_images=images, seed=0, image_size=64, progress=False)
    dataset = load_dataset(data)
    cfg = load_config(REPO / "configs" / "demo.yaml")
    torch.manual_seed(0)
    vocab = Vocabulary.build((c for r in dataset.split("train").images for c in r.captions), min_count=1)
    save_model(build_model(cfg, vocab), work / "model.pt")
    model = load_model(work / "model.pt")
    records = dataset.images
    build(work / "index", model, [r.path for r in records], [(c, i) for i, r in enumerate(records) for c in r.captions],
          embedding=EmbedOptions(progress=False))
    return work / "model.pt", work / "index", data


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path)
    ap.add_argument("--index", type=Path)
    ap.add_argument("--data", type=Path, help="data set whose captions are the text queries (default: the "
                                              "index's own captions)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 128])
    ap.add_argument("--seconds", type=float, default=2.0, help="measured seconds per cell and repeat")
    ap.add_argument("--repeats", type=int, default=3, help="alternating on/off repeats per cell (median taken)")
    ap.add_argument("--raw-seconds", type=float, default=1.0)
    ap.add_argument("--warmup-seconds", type=float, default=2.0, help="unmeasured requests per route and server first")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--max-batch", type=int, default=128)
    ap.add_argument("--max-wait-ms", type=float, default=2.0)
    ap.add_argument("--routes", nargs="+", default=["text", "image"], choices=["text", "image"])
    ap.add_argument("--overload", type=int, default=10, help="the overload cell's clients, as a multiple of the "
                                                             "largest --concurrency (0: no overload cell)")
    ap.add_argument("--overload-seconds", type=float, default=10.0)
    ap.add_argument("--overload-clients", nargs="+", default=["retry-after", "backoff"],
                    choices=["retry-after", "backoff"], help="how the overload cell's clients retry after a 503: "
                    "wait exactly Retry-After, or exponential backoff with jitter from Retry-After (one cell each)")
    ap.add_argument("--out", type=Path, help="write all numbers as JSON here")
    ap.add_argument("--workers", type=int, nargs="+", default=[1],
                    help="serve --workers counts to run a server with, each (default: 1, one process)")
    ap.add_argument("--batching", nargs="+", default=["on", "off"], choices=["on", "off"],
                    help="batching modes to run a server with, each (default: both)")
    ap.add_argument("--baseline", type=Path, help="another checkout (e.g. the main branch's): one more server, "
                                                  "batching on, one process, runs its code beside these")
    ap.add_argument("--hardware", help="the machine, in words, recorded in the --out file with the date and commit")
    ap.add_argument("--backend", choices=BACKENDS,
                    help="what runs the image backbones, in the servers and the raw limit (default: the service's, "
                         "auto or JOINTSPACE_BACKEND; training/inference/backend.py)")
    args = ap.parse_args(argv)

    tmp = tempfile.TemporaryDirectory(prefix="jointspace-bench-")
    baseline_files = None
    if args.model is None and args.index is None:
        args.model, args.index, _ = default_model_and_index(Path(tmp.name), 600)
        if args.baseline is not None:   # the baseline's own model file and index: an older checkout cannot read a
            baseline_files = baseline_model_and_index(args.baseline, Path(tmp.name) / "baseline", 600)  # newer config
    elif args.model is None:                            # an index alone: built with the shipped model (make demo's)
        from training.inference.pretrained import resolve

        args.model = resolve(None)
    model = load_model(args.model)
    gallery = Gallery.load(args.index, model=model)
    texts = query_texts(gallery)
    images = query_images(gallery)          # photos, or frames of a gallery of videos: never a video read as an image
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        torch.set_num_threads(cpu_threads(0))           # the server's own default: the same compute budget
    single_threaded_blas()                              # and its BLAS pools (training/inference/threads.py)
    print(f"model {args.model} ({model.cfg.name}), index {args.index}: {gallery.images.ntotal} images "
          f"({gallery.images.factory}), {gallery.captions.ntotal} captions, {len(images)} query images; device {device}; "
          f"{os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}, {platform.processor() or platform.machine()}",
          flush=True)

    # raw limit first, while no server competes for the CPU
    use_backend(model.to(device), args.backend)         # as the servers do
    engine = Engine(model, Gallery.load(args.index, model=model, device=device))
    pixels = [upload_to_pixels(data, 50_000_000, model.preprocess) for _, data in images]
    raw = {"text": {}, "image": {}}
    for c in args.concurrency:
        if "text" in args.routes:
            raw["text"][c] = float(np.median([raw_limit(engine, [(t, args.k) for t in texts], c, args.raw_seconds,
                                                        engine.search_texts) for _ in range(args.repeats)]))
        if "image" in args.routes:
            items = [(p, args.k) for p in pixels] * max(1, (2 * c) // len(pixels) + 1)
            raw["image"][c] = float(np.median([raw_limit(engine, items, c, args.raw_seconds, engine.search_pixels)
                                               for _ in range(args.repeats)]))
        print(f"raw limit at batch {c}: " + ", ".join(f"{r} {raw[r][c]:.0f}/s" for r in args.routes), flush=True)
    print(f"image backend (raw limit; the servers choose alike): {attached(model)}", flush=True)
    del engine

    payloads = {"text": text_requests(texts, args.k), "image": image_requests(images, args.k)}
    # Both servers run side by side and the cells alternate on/off, each repeated ``--repeats`` times: on a shared
    # machine the background load drifts, and this way both modes see the same drift. Throughput is the median
    # over the repeats; latency percentiles pool every request of the cell.
    configs = server_configs(args)
    servers: list = []
    ready_s: list[float] = []       # each server's start → /readyz, the servers started one after another
    memory_mb: list[float] = []     # each server's process tree's resident memory once every cell has run
    rows = []
    ceiling = {}
    overload = None
    try:
        for c in configs:     # inside the try: a server that fails to start stops the ones already running
            checkout = Path(c["checkout"]) if c["checkout"] else None
            model_file, index_dir = args.model, args.index
            if checkout is not None and baseline_files is not None:
                model_file, index_dir = baseline_files
            started = time.perf_counter()
            servers.append(start_server(model_file, index_dir, c["batching"], args.max_batch, args.max_wait_ms,
                                        args.backend, c["workers"], checkout))
            ready_s.append(time.perf_counter() - started)
        port_on = servers[0][1]
        health = [b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"]
        for c in args.concurrency:     # the HTTP stack's own ceiling: GET /healthz does no work at all
            ceiling[c] = float(np.median([asyncio.run(drive(port_on, health, c, 1.0))[0]
                                          for _ in range(args.repeats)]))
        print("HTTP ceiling (GET /healthz): " + ", ".join(f"c={c} {v:.0f}/s" for c, v in ceiling.items()), flush=True)
        for route in args.routes:      # warm-up, not measured: a server's first requests of a route pay for lazy
            for _, port in servers:    # initialisation (on CUDA, kernel selection took seconds: cells with 0 answers)
                asyncio.run(drive(port, payloads[route], 4, args.warmup_seconds))
        for route in args.routes:
            for c in args.concurrency:
                cell = [{"rps": [], "lat": [], "errors": 0, "batches": [0.0, 0.0]} for _ in configs]
                for _ in range(args.repeats):
                    for i, (_, port) in enumerate(servers):
                        before = batch_counts(port)[route]
                        rps, lat, errors = asyncio.run(drive(port, payloads[route], c, args.seconds))
                        after = batch_counts(port)[route]
                        cell[i]["rps"].append(rps)
                        cell[i]["lat"].append(lat)
                        cell[i]["errors"] += int(errors)
                        cell[i]["batches"][0] += after[0] - before[0]
                        cell[i]["batches"][1] += after[1] - before[1]
                for i, config in enumerate(configs):
                    lat = np.concatenate(cell[i]["lat"])
                    pct = (lambda q: float(np.percentile(lat, q) * 1e3)) if lat.size else (lambda q: float("nan"))
                    row = {"route": route, "concurrency": c, **config, "rps": float(np.median(cell[i]["rps"])),
                           "rps_repeats": cell[i]["rps"], "p50_ms": pct(50), "p99_ms": pct(99),
                           "mean_batch": cell[i]["batches"][1] / max(cell[i]["batches"][0], 1),
                           "errors": cell[i]["errors"], "raw_limit": raw[route][c]}
                    rows.append(row)
                    name = (f"batching={'on ' if config['batching'] else 'off'}" if len(args.workers) == 1
                            and args.baseline is None else label(config))
                    print(f"{route:5s} c={c:<4d} {name} {row['rps']:8.1f} req/s "
                          f"(repeats {', '.join(f'{x:.0f}' for x in row['rps_repeats'])})  p50 {row['p50_ms']:7.1f} ms"
                          f"  p99 {row['p99_ms']:7.1f} ms  mean batch {row['mean_batch']:5.1f}  errors {row['errors']}",
                          flush=True)
        on = next((i for i, c in enumerate(configs) if c["batching"] and not c["checkout"]), None)
        if args.overload and "text" in args.routes and on is not None:
            overload = [overload_cell(args, servers[on], payloads["text"], rows, policy)
                        for policy in args.overload_clients]
        memory_mb = [tree_rss_mb(proc.pid) for proc, _ in servers]
    finally:
        for proc, _ in servers:
            proc.terminate()
            proc.wait(timeout=60)

    print()
    if [(c["workers"], c["batching"], c["checkout"]) for c in configs] != [(1, True, None), (1, False, None)]:
        print("| route | concurrency | server | req/s | p50 ms | p99 ms | mean batch | raw limit |")
        print("|---|---:|---|---:|---:|---:|---:|---:|")
        for r in rows:
            print(f"| {r['route']} | {r['concurrency']} | {label(r)} | {r['rps']:.0f} | {r['p50_ms']:.1f} | "
                  f"{r['p99_ms']:.1f} | {r['mean_batch']:.1f} | {r['raw_limit']:.0f} |")
    else:
        on_off_table(args, rows, ceiling)
    print_overload(overload)
    servers_out = [{**config, "ready_s": ready, "rss_mb": mb}
                   for config, ready, mb in zip(configs, ready_s, memory_mb or [None] * len(configs))]
    for row in servers_out:
        print(f"{label(row)}: start → ready {row['ready_s']:.1f} s, resident memory after the run "
              f"{row['rss_mb'] or 0:.0f} MB")
    if any(r["errors"] for r in rows):
        print("WARNING: some requests did not answer 200 (see the errors column of the JSON)")
    if args.out:
        args.out.write_text(json.dumps({"rows": rows, "servers": servers_out, "raw": raw, "http_ceiling": ceiling,
                                        "device": device,
                                        "backend": attached(model), "cpus": os.cpu_count(), "overload": overload,
                                        "baseline_commit": commit_of(args.baseline) if args.baseline else None,
                                        "hardware": args.hardware, "date": time.strftime("%Y-%m-%d", time.gmtime()),
                                        "commit": commit_of(REPO),
                                        "command": shlex.join(["python", "benchmarks/service_load.py",
                                                               *(argv if argv is not None else sys.argv[1:])])},
                                       indent=2))
    tmp.cleanup()
    return 0


def on_off_table(args, rows: list[dict], ceiling: dict) -> None:
    """The table of batching on against off (one process each)."""
    print("| route | concurrency | batching on: req/s | p50 ms | p99 ms | mean batch | batching off: req/s | p50 ms "
          "| p99 ms | on/off | raw limit (items/s, batch = concurrency) | on/raw | HTTP ceiling (GET /healthz, req/s) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for route in args.routes:
        for c in args.concurrency:
            on = next(r for r in rows if r["route"] == route and r["concurrency"] == c and r["batching"])
            off = next(r for r in rows if r["route"] == route and r["concurrency"] == c and not r["batching"])
            print(f"| {route} | {c} | {on['rps']:.0f} | {on['p50_ms']:.1f} | {on['p99_ms']:.1f} | "
                  f"{on['mean_batch']:.1f} | {off['rps']:.0f} | {off['p50_ms']:.1f} | {off['p99_ms']:.1f} | "
                  f"{ratio(on['rps'], off['rps'], '.2f')}× | {on['raw_limit']:.0f} | "
                  f"{ratio(on['rps'], on['raw_limit'], '.0%')} | "
                  f"{ceiling[c]:.0f} |")


def print_overload(overload: list[dict] | None) -> None:
    for o in overload or []:
        print(f"\noverload: {o['concurrency']} clients ({o['factor']}× {o['base_concurrency']}; retrying by "
              f"{o['client_retry']}), text search, "
              f"{o['seconds']:.0f} s: goodput {o['goodput_rps']:.0f} req/s = {o['goodput_vs_best']:.0%} of the best text "
              f"cell ({o['best_rps']:.0f} req/s at c={o['best_concurrency']}); answered p50 {o['p50_ms']:.0f} ms, "
              f"p99 {o['p99_ms']:.0f} ms, max {o['max_ms']:.0f} ms; statuses {o['statuses']}, connection resets "
              f"{o['connection_resets']}; shed by the server "
              f"{o['shed']}; RSS before {o['rss_before_mb']:.0f} MB, peak {o['rss_peak_mb']:.0f} MB, after "
              f"{o['rss_after_mb']:.0f} MB")


if __name__ == "__main__":
    sys.exit(main())
