"""What hostile media cost the service and the indexer: time and memory of the aspect-extreme PNGs, and of a flood
of full-size frames of an 8192 × 8192 video while small thumbnails are asked for.

    python benchmarks/hostile_media.py                 # → benchmarks/results/hostile_media_cpu.json
    python benchmarks/hostile_media.py --frame-seconds 10 --out /tmp/hostile.json

The shipped model (training/pretrained/flickr8k.pt), default settings (indexes built with ``--tta none``); the gallery is 8 generated 1024×768
photos (benchmarks/soak.py's) and, for the frames, one 8192 × 8192 H.264 clip (4 frames, 2 s). The PNGs are
tests/hostile_media.py's: 20000 × 2 (118 bytes) and 24,500,000 × 2 (48 KB), each also with a normal JPEG of the
same gallery as a control.

* **Upload**: ``jointspace serve`` over the photos; each file is sent to ``POST /v1/search/captions`` 3 times:
  its status, the longest wall time, and the server's largest growth in resident memory during one request (its
  peak RSS, ``VmHWM``, reset through ``/proc/PID/clear_refs`` before each request, minus its RSS just before).
* **Index time**: ``jointspace index build`` of the photos alone, and of the photos plus each file, each in its
  own process: wall time and peak RSS (``ru_maxrss`` of that process), the difference to the photos alone, and
  the skip reason it printed; and the index's reader alone on each file (``training.inference.embedding``'s dataset
  item with ``index.embed.read_photo``, what a build's worker runs per file) in this process: its time and the
  growth of this process's peak RSS (reset before).
* **Frames**: ``jointspace serve`` over the photos and the 8192² clip; ``--frame-clients`` (40) clients ask for
  full-size frames of it (``GET /v1/videos/{id}/frame?t=``, each answered JPEG scaled to the 8 MP frame limit)
  for ``--frame-seconds``, each asking again at once when answered, or after ``Retry-After`` when refused, while one client asks for a 128-px thumbnail of a photo every 0.25 s and
  another searches text every 0.5 s: the answers by status, the latencies, and the server's RSS sampled every 20
  ms (and its VmHWM) above its RSS before. Before that, one frame alone: its time and memory, beside the estimate
  the admission uses for it (service/decoding.py).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.soak import photo  # noqa: E402
from benchmarks.tables import current_commit  # noqa: E402
from tests.hostile_media import png, scan_bomb, video  # noqa: E402
from tests.server_process import spawn  # noqa: E402
from training.data.fileio import write_json  # noqa: E402

MODEL = ROOT / "training" / "pretrained" / "flickr8k.pt"
PNGS = {"20000 × 2 PNG": (20_000, 2), "24,500,000 × 2 PNG": (24_500_000, 2)}


def _status(pid: int, key: str) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _reset_peak(pid: int) -> None:
    with open(f"/proc/{pid}/clear_refs", "w") as fh:          # "5": reset the peak resident set size (VmHWM)
        fh.write("5")


def _jointspace(*args: str) -> tuple[float, float, str]:
    """``jointspace ARGS`` in a process of its own: (wall seconds, its peak RSS in MB, its stderr)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "service.cli", *args], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    err = proc.stderr.read() if proc.stderr else ""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise RuntimeError(f"jointspace {' '.join(args)} failed: {err[-2000:]}")
    return time.perf_counter() - start, usage.ru_maxrss / 1024, err


def gallery(work: Path) -> Path:
    folder = work / "photos"
    folder.mkdir()
    for i in range(8):
        photo(folder / f"photo_{i}.jpg", seed=i)
    return folder


# --- index time -------------------------------------------------------------------------------------------------

def index_time(work: Path, photos: Path, files: dict[str, bytes], label: str = "8 photos",
               tag: str = "") -> list[dict]:
    """``index build`` of ``photos`` alone, then with each file added (named ``extra`` with its format's suffix)."""
    rows = []
    base_s, base_mb, _ = _jointspace("index", "build", "--images", str(photos), "--out", str(work / f"i0{tag}"),
                                     "--model", str(MODEL), "--quiet", "--workers", "0", "--no-videos", "--tta",
                                     "none")
    rows.append({"file": f"{label} alone", "wall_s": round(base_s, 2), "peak_rss_mb": round(base_mb)})
    for n, (name, data) in enumerate(files.items(), 1):
        folder = work / f"photos{tag}_{n}"
        shutil.copytree(photos, folder)
        extra = "extra.jpg" if data.startswith(b"\xff\xd8") else "extra.png"
        (folder / extra).write_bytes(data)
        wall, peak, err = _jointspace("index", "build", "--images", str(folder), "--out", str(work / f"i{tag}{n}"),
                                      "--model", str(MODEL), "--quiet", "--workers", "0", "--no-videos", "--tta",
                                      "none")
        reason = next((line.split(": ", 1)[1] for line in err.splitlines() if extra in line), "")
        rows.append({"file": f"{label} + {name}", "wall_s": round(wall, 2), "peak_rss_mb": round(peak),
                     "extra_s": round(wall - base_s, 2), "extra_rss_mb": round(peak - base_mb),
                     "skip_reason": reason})
    return rows


def reader_alone(work: Path, files: dict[str, bytes]) -> list[dict]:
    from index.embed import read_photo
    from training.data.preprocess import embed_side
    from training.inference.embedding import _Decoded
    from training.models.checkpoint import load_model

    model = load_model(MODEL)
    rows = []
    for name, data in files.items():
        path = work / ("alone.jpg" if data.startswith(b"\xff\xd8") else "alone.png")
        path.write_bytes(data)
        item = _Decoded([path], model.preprocess, read_photo)
        item[0]                                                           # warm the code path
        _reset_peak(os.getpid())
        before = _status(os.getpid(), "VmRSS")
        start = time.perf_counter()
        _, pixels, reason = item[0]
        seconds = time.perf_counter() - start
        rows.append({"file": name, "seconds": round(seconds, 4), "rss_growth_mb": round(_status(os.getpid(),
                     "VmHWM") - before, 1), "skip_reason": reason or "", "embed_side": embed_side(model.preprocess)})
    return rows


# --- uploads ----------------------------------------------------------------------------------------------------

def uploads(index: Path, files: dict[str, bytes], repeats: int = 3) -> list[dict]:
    import httpx

    proc, port = spawn(["--model", str(MODEL), "--index", str(index), "--log-level", "warning"],
                       env={"JOINTSPACE_RELOAD_INTERVAL_S": "0"}, timeout=300)
    rows = []
    try:
        url = f"http://127.0.0.1:{port}/v1/search/captions"
        with httpx.Client(timeout=120) as c:
            c.post(url, files={"image": ("w.jpg", next(iter(files.values())), "image/jpeg")})      # warm
            for name, data in files.items():
                seconds, growth, statuses, detail = [], [], [], ""
                for _ in range(repeats):
                    _reset_peak(proc.pid)
                    before = _status(proc.pid, "VmRSS")
                    start = time.perf_counter()
                    r = c.post(url, files={"image": ("x", data, "application/octet-stream")})
                    seconds.append(time.perf_counter() - start)
                    growth.append(_status(proc.pid, "VmHWM") - before)
                    statuses.append(r.status_code)
                    detail = r.json().get("detail", "") if r.status_code != 200 else ""
                rows.append({"file": name, "bytes": len(data), "statuses": sorted(set(statuses)),
                             "max_s": round(max(seconds), 3), "max_rss_growth_mb": round(max(growth), 1),
                             "detail": detail})
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return rows


# --- frames of an 8192² video -------------------------------------------------------------------------------------

async def _flood(base: str, pid: int, video_id: int, duration: float, photo_ids: list[int], clients: int,
                 seconds: float) -> dict:
    import httpx

    frames: list[tuple[int, float]] = []
    thumbs: list[tuple[int, float]] = []
    texts: list[tuple[int, float]] = []
    rss: list[float] = []
    stop = asyncio.Event()
    rng = random.Random(0)

    async def frame_client(c):
        while not stop.is_set():
            start = time.perf_counter()
            r = await c.get(f"/v1/videos/{video_id}/frame", params={"t": round(rng.uniform(0, duration), 2)})
            frames.append((r.status_code, time.perf_counter() - start))
            if r.status_code == 503:                        # as a client should: again after Retry-After
                await asyncio.sleep(float(r.headers.get("retry-after", 1)))

    async def every(period, fn, out):
        while not stop.is_set():
            start = time.perf_counter()
            r = await fn()
            out.append((r.status_code, time.perf_counter() - start))
            await asyncio.sleep(max(0.0, period - (time.perf_counter() - start)))

    async def sampler():
        while not stop.is_set():
            rss.append(_status(pid, "VmRSS"))
            await asyncio.sleep(0.02)

    limits = httpx.Limits(max_connections=clients + 8)
    async with httpx.AsyncClient(base_url=base, timeout=300, limits=limits) as c:
        _reset_peak(pid)
        before = _status(pid, "VmRSS")
        n = iter(range(10 ** 9))
        tasks = [asyncio.create_task(frame_client(c)) for _ in range(clients)]
        tasks += [asyncio.create_task(every(0.25, lambda: c.get(
                      f"/v1/images/{photo_ids[next(n) % len(photo_ids)]}", params={"size": 128}), thumbs)),
                  asyncio.create_task(every(0.5, lambda: c.post("/v1/search/images", json={"text": "a red car",
                                                                                           "k": 5}), texts)),
                  asyncio.create_task(sampler())]
        await asyncio.sleep(seconds)
        stop.set()
        await asyncio.gather(*tasks)
        peak = _status(pid, "VmHWM")

    def summary(answers):
        ok = [s for st, s in answers if st == 200]
        statuses: dict[str, int] = {}
        for st, _ in answers:
            statuses[str(st)] = statuses.get(str(st), 0) + 1
        return {"statuses": statuses, "p50_s": round(float(np.percentile(ok, 50)), 3) if ok else None,
                "max_s": round(max(ok), 3) if ok else None}

    return {"rss_before_mb": round(before), "rss_peak_sampled_mb": round(max(rss)), "vmhwm_mb": round(peak),
            "growth_mb": round(max(peak, max(rss)) - before), "frames": summary(frames),
            "thumbnails_128px": summary(thumbs), "text_search": summary(texts)}


def frames(work: Path, photos: Path, clients: int, seconds: float) -> dict:
    import httpx

    from index.video_decode import frame_cost
    from service.settings import Settings

    folder = work / "with_video"
    shutil.copytree(photos, folder)
    start = time.perf_counter()
    video(folder / "huge.mp4", size=(8192, 8192), frames=4, fps=2.0, options={"preset": "ultrafast"})
    encode_s = time.perf_counter() - start
    index = work / "video_index"
    _jointspace("index", "build", "--images", str(folder), "--out", str(index), "--model", str(MODEL), "--quiet",
                "--workers", "0", "--tta", "none")
    proc, port = spawn(["--model", str(MODEL), "--index", str(index), "--log-level", "warning"],
                       env={"JOINTSPACE_RELOAD_INTERVAL_S": "0"}, timeout=300)
    settings = Settings()
    try:
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, timeout=300) as c:
            hits = c.post("/v1/search/images", json={"text": "a photo", "k": 20, "media": "photo"}).json()["results"]
            photo_ids = [h["id"] for h in hits]
            found = c.post("/v1/search/images", json={"text": "a photo", "k": 1, "media": "video"}).json()
            video_id = found["results"][0]["video_id"]
            for pid in photo_ids[:2]:
                c.get(f"/v1/images/{pid}", params={"size": 128})                  # warm
            _reset_peak(proc.pid)
            before = _status(proc.pid, "VmRSS")
            t0 = time.perf_counter()
            one = c.get(f"/v1/videos/{video_id}/frame", params={"t": 1.0})
            alone = {"status": one.status_code, "seconds": round(time.perf_counter() - t0, 2),
                     "rss_growth_mb": round(_status(proc.pid, "VmHWM") - before),
                     "estimate_mb": round(frame_cost((8192, 8192), None, settings.max_frame_pixels) / 2 ** 20),
                     "jpeg_bytes": len(one.content)}
        flood = asyncio.run(_flood(base, proc.pid, video_id, 2.0, photo_ids, clients, seconds))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return {"video": "8192 × 8192 H.264, 4 frames, 2 s", "encode_s": round(encode_s, 1), "clients": clients,
            "seconds": seconds, "one_frame_alone": alone, **flood,
            "settings": {"thumbnail_workers": settings.thumbnail_workers, "max_thumbnails": settings.max_thumbnails,
                         "media_memory_mb": settings.media_memory_bytes // 2 ** 20,
                         "max_frame_pixels": settings.max_frame_pixels}}


# --- round 3: scan bombs and decode bombs at upload; near-duplicates of 20,000 photos ----------------------------

async def _beside(base: str, bomb: bytes, control: bytes, thumb_ids: list[int], seconds: float) -> dict:
    """Two clients upload ``bomb`` without pause for ``seconds`` while one asks for a 128-px thumbnail every
    0.25 s and one uploads ``control`` every 0.5 s."""
    import httpx

    bombs: list[tuple[int, float]] = []
    thumbs: list[tuple[int, float]] = []
    normal: list[tuple[int, float]] = []
    stop = asyncio.Event()

    async def bomber(c):
        while not stop.is_set():
            start = time.perf_counter()
            r = await c.post("/v1/search/captions", files={"image": ("x.jpg", bomb, "image/jpeg")})
            bombs.append((r.status_code, time.perf_counter() - start))

    async def every(period, fn, out):
        n = 0
        while not stop.is_set():
            start = time.perf_counter()
            r = await fn(n)
            n += 1
            out.append((r.status_code, time.perf_counter() - start))
            await asyncio.sleep(max(0.0, period - (time.perf_counter() - start)))

    async with httpx.AsyncClient(base_url=base, timeout=120) as c:
        tasks = [asyncio.create_task(bomber(c)) for _ in range(2)]
        tasks += [asyncio.create_task(every(0.25, lambda n: c.get(f"/v1/images/{thumb_ids[n % len(thumb_ids)]}",
                                                                   params={"size": 128}), thumbs)),
                  asyncio.create_task(every(0.5, lambda n: c.post("/v1/search/captions", files={
                      "image": ("c.jpg", control, "image/jpeg")}), normal))]
        await asyncio.sleep(seconds)
        stop.set()
        await asyncio.gather(*tasks)

    def summary(answers):
        statuses: dict[str, int] = {}
        for st, _ in answers:
            statuses[str(st)] = statuses.get(str(st), 0) + 1
        times = [s for _, s in answers]
        return {"statuses": statuses, "p50_s": round(float(np.percentile(times, 50)), 3) if times else None,
                "max_s": round(max(times), 3) if times else None}

    return {"seconds": seconds, "two_scan_bomb_clients": summary(bombs), "thumbnails_128px": summary(thumbs),
            "normal_uploads": summary(normal)}


def _concurrently(url: str, pid: int, files: list[bytes]) -> dict:
    """``files`` uploaded at once, one connection each: their statuses and the server's peak RSS growth."""
    import httpx

    async def run():
        async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=len(files) + 2)) as c:
            return await asyncio.gather(*(c.post(url, files={"image": ("x", data, "application/octet-stream")})
                                          for data in files))

    _reset_peak(pid)
    before = _status(pid, "VmRSS")
    start = time.perf_counter()
    answers = asyncio.run(run())
    statuses: dict[str, int] = {}
    for r in answers:
        statuses[str(r.status_code)] = statuses.get(str(r.status_code), 0) + 1
    return {"statuses": statuses, "wall_s": round(time.perf_counter() - start, 2),
            "peak_rss_growth_mb": round(_status(pid, "VmHWM") - before), "detail": sorted(
                {r.json().get("detail", "")[:160] for r in answers if r.status_code != 200})}


def round3_uploads(index: Path, control: bytes, bomb: bytes, side: int, seconds: float) -> dict:
    """The scan bomb and the decode bombs sent to ``jointspace serve`` over the 8 photos."""
    import httpx

    from tests.hostile_media import DECODE_BOMBS, decode_bomb

    bombs = {kind: decode_bomb(kind, side) for kind in DECODE_BOMBS}
    proc, port = spawn(["--model", str(MODEL), "--index", str(index), "--log-level", "warning"],
                       env={"JOINTSPACE_RELOAD_INTERVAL_S": "0"}, timeout=300)
    base = f"http://127.0.0.1:{port}"
    url = f"{base}/v1/search/captions"
    try:
        with httpx.Client(base_url=base, timeout=300) as c:
            c.post(url, files={"image": ("w.jpg", control, "image/jpeg")})                      # warm
            hits = c.post("/v1/search/images", json={"text": "a photo", "k": 8}).json()["results"]
            thumb_ids = [h["id"] for h in hits]
            for i in thumb_ids[:2]:
                c.get(f"/v1/images/{i}", params={"size": 128})
            alone = []
            named = {"scan bomb": bomb, **bombs}
            for name, data in named.items():
                _reset_peak(proc.pid)
                before = _status(proc.pid, "VmRSS")
                start = time.perf_counter()
                r = c.post(url, files={"image": ("x", data, "application/octet-stream")})
                alone.append({"file": name, "bytes": len(data), "status": r.status_code,
                              "seconds": round(time.perf_counter() - start, 3),
                              "rss_growth_mb": round(_status(proc.pid, "VmHWM") - before, 1),
                              "detail": r.json().get("detail", "") if r.status_code != 200 else ""})
        beside = asyncio.run(_beside(base, bomb, control, thumb_ids, seconds))
        eight = [bombs[k] for k in ("lossless WebP", "lossy WebP", "AVIF", "float TIFF")] * 2
        concurrent = {"eight WebP/AVIF/TIFF bombs (2 lossless WebP, 2 lossy WebP, 2 AVIF, 2 float TIFF)":
                      _concurrently(url, proc.pid, eight),
                      "eight 16-bit PNG bombs": _concurrently(url, proc.pid, [bombs["16-bit PNG"]] * 8)}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return {"side": side, "alone": alone, "beside_two_scan_bombs": beside, "concurrent": concurrent}


def _vectors(kind: str, n: int, dim: int) -> np.ndarray:
    """``n`` unit vectors: ``clustered`` (benchmarks/scale_index.py's distribution, 1000 centres) with 500 planted
    groups of 4 near-copies (cosine about 0.97), or ``alike`` (every photo within cosine 0.999 of one vector: one
    group of all of them at any threshold)."""
    rng = np.random.default_rng(0)
    if kind == "alike":
        x = np.ones((n, dim), np.float32) + 0.03 * rng.standard_normal((n, dim), np.float32)
    else:
        centres = rng.standard_normal((1000, dim)).astype(np.float32)
        x = centres[rng.integers(0, 1000, n)] + 0.35 * np.sqrt(2.0) * rng.standard_normal((n, dim), np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        for g in range(500):                                     # rows 4g+1 .. 4g+3 become copies of row 4g
            noise = 0.25 * rng.standard_normal((3, dim), np.float32) / np.sqrt(dim)
            x[4 * g + 1:4 * g + 4] = x[4 * g] + noise
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _recall(x: np.ndarray, queries: int = 500) -> dict:
    """The pairs :func:`index.duplicates.nearest` finds against exact search: of each sampled photo's exact
    ``NEIGHBOURS`` nearest at or above a threshold, the share found."""
    from index.duplicates import FLOOR, NEIGHBOURS, nearest

    found = nearest(x)
    pairs = set(zip(found.left.tolist(), found.right.tolist()))
    rows = np.random.default_rng(1).choice(len(x), queries, replace=False)
    sims = x[rows] @ x.T
    sims[np.arange(queries), rows] = -2
    top = np.argsort(-sims, axis=1)[:, :NEIGHBOURS]
    out = {}
    for t in (FLOOR, 0.85):
        want = [(int(r), int(j)) for r, row, s in zip(rows, top, sims) for j in row if s[j] >= t]
        hit = sum((min(r, j), max(r, j)) in pairs for r, j in want)
        out[f"{t:g}"] = {"exact_pairs": len(want), "found": round(hit / len(want), 4) if want else None}
    return {"exact_method": found.exact, "sampled_photos": queries, "recall": out}


def duplicates(work: Path, n: int) -> list[dict]:
    """``GET /v1/duplicates`` of ``jointspace serve`` over an index of ``n`` synthetic photo vectors (the shipped
    model's dimension and fingerprint; no files), at the floor, the default and the top threshold: each answer's
    time, and the server's peak RSS over its RSS once the index is served (before the first request)."""
    import httpx

    from index.changes import ChangeSet, ModelFacts
    from index.duplicates import DEFAULT_THRESHOLD, FLOOR
    from index.gallery import build_from_vectors
    from training.models.checkpoint import load_model

    model = load_model(MODEL)
    fingerprint, dim = model.fingerprint, model.cfg.model.embed_dim
    del model
    rows = []
    for kind in ("clustered", "alike"):
        x = _vectors(kind, n, dim)
        index = work / f"dup_{kind}"
        paths = [(f"/gallery/{i // 1000:03d}/{i}.jpg", None) for i in range(n)]
        build_from_vectors(index, ModelFacts(fingerprint, "cosine"),
                           ChangeSet(image_vectors=x, image_ids=np.arange(n), image_rows=paths))
        proc, port = spawn(["--model", str(MODEL), "--index", str(index), "--log-level", "warning"],
                           env={"JOINTSPACE_RELOAD_INTERVAL_S": "0"}, timeout=300)
        answers = []
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600) as c:
                _reset_peak(proc.pid)
                before = _status(proc.pid, "VmRSS")
                for t in (FLOOR, DEFAULT_THRESHOLD, 1.0, FLOOR):
                    start = time.perf_counter()
                    r = c.get("/v1/duplicates", params={"threshold": t, "limit": 20})
                    body = r.json()
                    answers.append({"threshold": t, "status": r.status_code,
                                    "seconds": round(time.perf_counter() - start, 3), "groups": body.get("total"),
                                    "largest": max((len(g["images"]) for g in body.get("groups", [])), default=0)})
                growth = _status(proc.pid, "VmHWM") - before
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        row = {"photos": n, "vectors": kind, "dim": dim, "rss_served_mb": round(before),
               "peak_growth_mb": round(growth), "answers": answers}
        if kind == "clustered":
            row["neighbours"] = _recall(x)
        rows.append(row)
    return rows


def _limits() -> dict:
    from index.duplicates import EXACT_UP_TO, FLOOR, NEIGHBOURS
    from service.settings import Settings
    from training.data.jpeg_scans import MAX_SCANS

    settings = Settings()
    return {"max_scans": MAX_SCANS, "decode_memory_mb": settings.decode_memory_bytes // 2 ** 20,
            "duplicate_floor": FLOOR, "duplicate_neighbours": NEIGHBOURS, "duplicate_exact_up_to": EXACT_UP_TO}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frame-clients", type=int, default=40)
    ap.add_argument("--frame-seconds", type=float, default=20.0)
    ap.add_argument("--bomb-seconds", type=float, default=10.0, help="how long two clients send scan bombs")
    ap.add_argument("--bomb-side", type=int, default=7000, help="side of the decode bombs")
    ap.add_argument("--scans", type=int, default=6000, help="scans of the scan bomb (7000 × 7000)")
    ap.add_argument("--duplicate-photos", type=int, default=20_000)
    ap.add_argument("--demo-photos", type=Path, default=ROOT / "demo" / "samples" / "photos",
                    help="the demo's photos, indexed alone and with the scan bomb")
    ap.add_argument("--hardware", default="CPU, 2 cores (shared machine, run under the exclusive lock)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "hostile_media_cpu.json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="jointspace-hostile-") as tmp:
        work = Path(tmp)
        photos = gallery(work)
        files = {name: png(*size) for name, size in PNGS.items()}
        bomb = scan_bomb(7000, 7000, args.scans)
        bomb_name = f"7000² progressive JPEG of {args.scans:,} scans"
        control = {"a 1024×768 JPEG (control)": (photos / "photo_0.jpg").read_bytes()}
        print("index time ...", flush=True)
        indexing = index_time(work, photos, {**files, bomb_name: bomb})
        demo = index_time(work, args.demo_photos, {bomb_name: bomb}, label="the demo's photos", tag="demo") \
            if args.demo_photos.is_dir() else []
        reader = reader_alone(work, {**files, bomb_name: bomb})
        print("uploads ...", flush=True)
        upload = uploads(work / "i0", {**control, **files, bomb_name: bomb})
        print("round 3 uploads ...", flush=True)
        round3 = round3_uploads(work / "i0", control["a 1024×768 JPEG (control)"], bomb, args.bomb_side,
                                args.bomb_seconds)
        print("duplicates ...", flush=True)
        dups = duplicates(work, args.duplicate_photos)
        print("frames ...", flush=True)
        flood = frames(work, photos, args.frame_clients, args.frame_seconds)
    result = {"description": "python benchmarks/hostile_media.py: the aspect-extreme PNGs at upload and at index "
                             "time, and full-size frames of an 8192² video under load",
              "hardware": args.hardware, "date": date.today().isoformat(), "commit": current_commit(),
              "python": platform.python_version(), "model": str(MODEL.relative_to(ROOT)),
              "upload": upload, "index": indexing, "index_demo": demo, "index_reader": reader,
              "round3": round3, "duplicates": dups, "frames": flood,
              "limits": _limits()}
    write_json(args.out, result)
    for row in upload:
        print(f"upload {row['file']:28s} {row['statuses']} {row['max_s']:.3f} s  +{row['max_rss_growth_mb']} MB")
    for row in round3["alone"]:
        print(f"round3 {row['file']:28s} {row['status']} {row['seconds']:.3f} s  +{row['rss_growth_mb']} MB")
    print(round3["beside_two_scan_bombs"])
    print(round3["concurrent"])
    for row in dups:
        print(f"duplicates {row['vectors']}: +{row['peak_growth_mb']} MB", row["answers"], row.get("neighbours"))
    for row in reader:
        print(f"reader {row['file']:28s} {row['seconds']:.4f} s  +{row['rss_growth_mb']} MB  {row['skip_reason']}")
    for row in indexing:
        print(f"index  {row['file']:36s} {row['wall_s']:.2f} s  peak {row['peak_rss_mb']} MB  "
              f"{row.get('skip_reason', '')}")
    print({k: v for k, v in flood.items() if k != "settings"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
