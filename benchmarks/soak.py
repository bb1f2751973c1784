"""Soak test of the HTTP service: mixed traffic for ten minutes while the index changes under it and the service
is killed once.

    python benchmarks/soak.py                          # 10 minutes, the demo architecture untrained
    python benchmarks/soak.py --seconds 120 --out /tmp/soak.json
    python benchmarks/soak.py --model run/model.pt     # a trained model (speed does not depend on the weights)

One ``jointspace serve`` (default settings but the port) over an index of a folder of generated photos (1024×768
JPEGs), driven by keep-alive clients with a think time, so that the service is busy but not overloaded:

* ``text``: sentence searches (``POST /v1/search/images``, JSON);
* ``upload``: a photo uploaded for caption search (``POST /v1/search/captions``, multipart);
* ``compose``: a photo uploaded with words to add (``POST /v1/search/images``, multipart);
* ``thumbnail``: ``GET /v1/images/{id}?size=256`` of ids from recent answers (404 once sync removed one);
* ``slow_upload``: a photo uploaded at 64 kB/s (above the default minimum body rate): answered, never shed;
* ``stalled_upload``: the headers of a 2 MB upload, then nothing: 408 after ``JOINTSPACE_BODY_TIMEOUT_S``;
* ``hostile_upload``: a file of tests/hostile_media.py's corpus uploaded for caption search (aspect extremes,
  huge declared sizes, truncated files, polyglots, videos, lying names): each must get its own status
  (``wrong_status`` counts those that did not);
* ``frame``: ``GET /v1/videos/{id}/frame`` of a 640×480 clip in the folder, at a random time, a random third of
  them at ``?size=128``, and ``GET /v1/videos/{id}`` with a random range (some invalid, some past the end).

The folder also holds hostile files that indexing must skip (the aspect-extreme PNGs, a truncated PNG, a header
claiming 10 G pixels): every sync lists them again, and the index never holds them.

``--sync-every`` seconds after the previous sync ended (or the start), two new photos are written to the folder
and one is deleted, then ``jointspace index sync`` runs; a change is *acknowledged* when sync exits 0. Halfway the service is killed with SIGKILL and
started again on the same port (as a supervisor would); the *kill window* runs from the kill until the new
process answers ``/readyz`` plus one second. Reported: per route, the requests, their status classes, p50/p99
latency of the answered ones; every 5xx and connection error outside the kill window (must be none); the
server's resident memory every 5 s; and whether the index afterwards holds exactly the acknowledged photos and
the service serves that generation.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.hostile_media import corpus, png, video  # noqa: E402
from tests.server_process import free_port, poll_readyz, wait_serving  # noqa: E402
from benchmarks.tables import current_commit  # noqa: E402
from training.data.fileio import write_json  # noqa: E402

ROUTES = ("text", "upload", "compose", "thumbnail", "slow_upload", "stalled_upload", "hostile_upload", "frame")
TEXTS = ["a red circle", "a dog on the beach", "two people walking", "a blue square above a green star",
         "a city street at night", "a small yellow triangle", "children playing in a park", "a mountain lake"]


# --- the photos ----------------------------------------------------------------------------------------------

def photo(path: Path, seed: int, size: tuple[int, int] = (1024, 768)) -> Path:
    """A photo-like JPEG: smooth colour fields plus grain."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (6, 8, 3), np.uint8)
    image = np.asarray(Image.fromarray(small).resize(size, Image.Resampling.BICUBIC), np.int16)
    image = np.clip(image + rng.integers(-12, 13, image.shape), 0, 255).astype(np.uint8)
    Image.fromarray(image).save(path, quality=88)
    return path


def jointspace(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    return subprocess.run([sys.executable, "-m", "service.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, check=check)


def setup(work: Path, model: Path | None, photos: int) -> tuple[Path, Path, Path]:
    """(model, photo folder, index): the demo architecture untrained when no model is given."""
    import torch

    from training.config import load_config
    from training.data.vocab import Vocabulary
    from training.models.model import build_model
    from training.models.checkpoint import save_model

    folder = work / "photos"
    folder.mkdir()
    for i in range(photos):
        photo(folder / f"photo_{i:04d}.jpg", seed=i)
    video(folder / "clip.mp4", size=(640, 480), frames=16, fps=4.0)
    for name, data in (("wide.png", png(20_000, 2)), ("widest.png", png(24_500_000, 2)),
                       ("claims.png", png(100_000, 100_000, truncate=True)), ("cut.png", png(64, 48)[:60])):
        (folder / name).write_bytes(data)             # skipped by every build and sync
    captions = work / "captions.txt"
    captions.write_text("\n".join(f"{t} number {i}" for i in range(40) for t in TEXTS) + "\n")
    if model is None:
        torch.manual_seed(0)
        vocab = Vocabulary.build(captions.read_text().splitlines(), min_count=1)
        model = work / "model.pt"
        save_model(build_model(load_config(REPO / "configs" / "demo.yaml"), vocab), model)
    index = work / "index"
    jointspace("index", "build", "--images", str(folder), "--captions", str(captions), "--out", str(index),
               "--model", str(model), "--quiet", "--workers", "0")
    return model, folder, index


# --- the server ----------------------------------------------------------------------------------------------

class Server:
    def __init__(self, model: Path, index: Path, port: int):
        self.model, self.index, self.port = model, index, port
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 180.0) -> float:
        """Starts ``jointspace serve`` and waits until /readyz is 200; the monotonic time it became ready."""
        env = {**os.environ, "PYTHONPATH": str(REPO), "JOINTSPACE_RELOAD_INTERVAL_S": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--model", str(self.model),
                                      "--index", str(self.index), "--port", str(self.port), "--log-level",
                                      "warning"], cwd=REPO, env=env, stdout=subprocess.DEVNULL)
        return wait_serving(self.proc, self.port, timeout, poll=0.1)

    def rss_mb(self) -> float | None:
        try:
            with open(f"/proc/{self.proc.pid}/status") as fh:
                for line in fh:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) / 1024
        except (OSError, AttributeError):
            pass
        return None

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


# --- the clients ---------------------------------------------------------------------------------------------

class Soak:
    def __init__(self, args, server: Server, folder: Path, index: Path, uploads: list[bytes], hostile: list):
        self.args, self.server, self.folder, self.index, self.uploads = args, server, folder, index, uploads
        self.hostile = hostile                                              # tests/hostile_media.py's cases
        self.wrong_status: list[tuple[str, int, int]] = []                  # (file, expected, got)
        self.records: list[tuple[str, float, float, int | None]] = []      # route, start, end, status (None: error)
        self.rss: list[tuple[float, float, int]] = []                       # seconds, MB, server life
        self.syncs: list[dict] = []
        self.ids: list[int] = [0]
        self.kill_at: float | None = None
        self.ready_again: float | None = None
        self.life = 0
        self.acknowledged = {p.resolve() for p in folder.glob("*.jpg")}
        self.t0 = time.monotonic()
        self.stop = asyncio.Event()
        self.rng = random.Random(0)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"

    def note(self, route: str, start: float, status: int | None) -> None:
        self.records.append((route, start - self.t0, time.monotonic() - self.t0, status))

    async def client(self, route: str, think: float) -> None:
        import httpx

        async with httpx.AsyncClient(timeout=60) as c:
            while not self.stop.is_set():
                start = time.monotonic()
                try:
                    r = await self.request(c, route)
                    self.note(route, start, r.status_code)
                    if r.status_code == 200 and route == "text":
                        self.ids = [hit["id"] for hit in r.json()["results"]] or self.ids
                except httpx.HTTPError:
                    self.note(route, start, None)
                    await asyncio.sleep(0.2)
                await asyncio.sleep(think * self.rng.uniform(0.5, 1.5))

    async def request(self, c, route: str):
        if route == "text":
            return await c.post(f"{self.base}/v1/search/images", json={"text": self.rng.choice(TEXTS), "k": 10})
        if route == "hostile_upload":
            case = self.rng.choice(self.hostile)
            r = await c.post(f"{self.base}/v1/search/captions",
                             files={"image": (case.name, case.data, "application/octet-stream")})
            if r.status_code != case.upload and r.status_code < 500:
                self.wrong_status.append((case.name, case.upload, r.status_code))
            return r
        if route == "frame":
            if self.rng.random() < 0.25:
                first = self.rng.choice([0, 100, 10 ** 9])
                spec = self.rng.choice([f"bytes={first}-{first + 999}", f"bytes={first + 5}-{first}",
                                        "bytes=-500", f"bytes=0-{'9' * 400}"])
                return await c.get(f"{self.base}/v1/videos/0", headers={"Range": spec})
            params = {"t": round(self.rng.uniform(0, 4), 2)}
            if self.rng.random() < 0.33:
                params["size"] = 128
            return await c.get(f"{self.base}/v1/videos/0/frame", params=params)
        image = self.rng.choice(self.uploads)
        if route == "upload":
            return await c.post(f"{self.base}/v1/search/captions", files={"image": ("p.jpg", image, "image/jpeg")},
                                data={"k": "5"})
        if route == "compose":
            return await c.post(f"{self.base}/v1/search/images", files={"image": ("p.jpg", image, "image/jpeg")},
                                data={"add": "a dog", "k": "5"})
        return await c.get(f"{self.base}/v1/images/{self.rng.choice(self.ids)}?size=256")

    async def raw_upload(self, route: str, rate: float | None) -> None:
        """A multipart upload over a raw socket: at ``rate`` bytes/s, or (None) headers and then nothing."""
        while not self.stop.is_set():
            start = time.monotonic()
            status = None
            boundary = "soak-boundary"
            body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"image\"; filename=\"p.jpg\"\r\n\r\n"
                    .encode() + self.rng.choice(self.uploads) + f"\r\n--{boundary}--\r\n".encode())
            length = len(body) if rate else 2_000_000
            head = (f"POST /v1/search/captions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {length}\r\n"
                    f"Content-Type: multipart/form-data; boundary={boundary}\r\n\r\n").encode()
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.server.port)
                try:
                    writer.write(head)
                    if rate:
                        step = int(rate / 10)
                        for i in range(0, len(body), step):
                            writer.write(body[i:i + step])
                            await writer.drain()
                            await asyncio.sleep(0.1)
                    line = await asyncio.wait_for(reader.readline(), 120)
                    status = int(line.split()[1]) if line else None
                finally:
                    writer.close()
            except (TimeoutError, OSError, ValueError, IndexError):
                await asyncio.sleep(0.2)
            self.note(route, start, status)
            await asyncio.sleep(0.5)

    async def sampler(self) -> None:
        while not self.stop.is_set():
            rss = self.server.rss_mb()
            if rss is not None:
                self.rss.append((round(time.monotonic() - self.t0, 1), round(rss, 1), self.life))
            await asyncio.sleep(5)

    async def syncer(self) -> None:
        n = 0
        while True:
            try:
                await asyncio.wait_for(self.stop.wait(), self.args.sync_every)
                return
            except TimeoutError:
                pass
            n += 1
            added = [photo(self.folder / f"new_{n:03d}_{j}.jpg", seed=10_000 + 10 * n + j) for j in range(2)]
            present = sorted(self.folder.glob("*.jpg"))
            removed = self.rng.choice([p for p in present if p not in added])
            removed.unlink()
            start = time.monotonic()
            result = await asyncio.to_thread(jointspace, "index", "sync", "--images", str(self.folder), "--index",
                                             str(self.index), "--model", str(self.server.model), "--quiet",
                                             "--workers", "0", check=False)
            ok = result.returncode == 0
            if ok:              # acknowledged: the folder's state as of this sync is what the index must hold
                self.acknowledged = (self.acknowledged | {p.resolve() for p in added}) - {removed.resolve()}
            self.syncs.append({"at_s": round(start - self.t0, 1), "seconds": round(time.monotonic() - start, 2),
                               "ok": ok, "report": result.stdout.strip().splitlines()[-1:] if ok else
                               result.stderr.strip().splitlines()[-3:]})

    async def killer(self) -> None:
        try:
            await asyncio.wait_for(self.stop.wait(), self.args.seconds / 2)
            return
        except TimeoutError:
            pass
        self.kill_at = time.monotonic() - self.t0
        self.server.kill()
        self.life += 1
        self.ready_again = await asyncio.to_thread(self.server.start) - self.t0

    async def run(self) -> None:
        think = self.args.think_ms / 1000
        tasks = [asyncio.create_task(self.client(route, think)) for route, n in
                 (("text", 4), ("upload", 1), ("compose", 1), ("thumbnail", 2), ("hostile_upload", 1),
                  ("frame", 1)) for _ in range(n)]
        tasks += [asyncio.create_task(self.raw_upload("slow_upload", 64_000)),
                  asyncio.create_task(self.raw_upload("stalled_upload", None)),
                  asyncio.create_task(self.sampler()), asyncio.create_task(self.syncer()),
                  asyncio.create_task(self.killer())]
        await asyncio.sleep(self.args.seconds)
        self.stop.set()
        await asyncio.gather(*tasks)


# --- the report ----------------------------------------------------------------------------------------------

def summarise(soak: Soak, grace: float = 1.0) -> dict:
    window = (soak.kill_at, (soak.ready_again or soak.kill_at or 0) + grace) if soak.kill_at is not None else None

    def in_window(start: float, end: float) -> bool:
        return window is not None and start <= window[1] and end >= window[0]

    rows = []
    outside_5xx, outside_errors = [], []
    for route in ROUTES:
        records = [r for r in soak.records if r[0] == route]
        answered = np.array([end - start for _, start, end, status in records if status is not None and
                             status < 500 and not in_window(start, end)])
        classes = {"2xx": 0, "4xx": 0, "5xx": 0, "errors": 0}
        statuses: dict[str, int] = {}
        for _, start, end, status in records:
            key = "errors" if status is None else f"{status // 100}xx"
            classes[key] = classes.get(key, 0) + 1
            statuses[str(status)] = statuses.get(str(status), 0) + 1
            if not in_window(start, end):
                if status is None:
                    outside_errors.append((route, round(start, 2)))
                elif status >= 500:
                    outside_5xx.append((route, status, round(start, 2)))
        outside = [status for _, start, end, status in records if not in_window(start, end)]
        rows.append({"route": route, "requests": len(records), **classes, "statuses": statuses,
                     "outside_5xx": sum(1 for s in outside if s is not None and s >= 500),
                     "outside_errors": sum(1 for s in outside if s is None),
                     "p50_ms": float(np.percentile(answered, 50) * 1e3) if answered.size else None,
                     "p99_ms": float(np.percentile(answered, 99) * 1e3) if answered.size else None})
    return {"rows": rows, "kill_window_s": [round(w, 2) for w in window] if window else None,
            "outside_kill_window": {"5xx": len(outside_5xx), "connection_errors": len(outside_errors),
                                    "examples": (outside_5xx + outside_errors)[:10]}}


def verify(soak: Soak) -> dict:
    """The index holds exactly the acknowledged photos, and the service serves that generation."""
    import httpx

    from index.gallery import Gallery
    from index.generations import current_generation

    gallery = Gallery.load(soak.index)
    indexed = {Path(row.path).resolve() for row in gallery.meta.all_images() if row.video_id is None}
    generation = current_generation(soak.index)
    with httpx.Client(base_url=soak.base, timeout=10) as client:
        ready = poll_readyz(client, until=lambda r: r.json().get("index_generation") == generation, timeout=30,
                            poll=0.5).json()
    return {"acknowledged_photos": len(soak.acknowledged), "indexed_photos": len(indexed),
            "missing": sorted(p.name for p in soak.acknowledged - indexed),
            "unexpected": sorted(p.name for p in indexed - soak.acknowledged),
            "served_generation_is_latest": ready.get("index_generation") == generation,
            "served_images": ready.get("images")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=600.0, help="how long the traffic runs (default 10 minutes)")
    ap.add_argument("--sync-every", type=float, default=30.0, help="seconds from the end of one index sync to the next")
    ap.add_argument("--think-ms", type=float, default=100.0, help="mean pause of a client between requests")
    ap.add_argument("--photos", type=int, default=40, help="photos in the folder at the start")
    ap.add_argument("--model", type=Path, help="model.pt (default: the demo architecture, untrained)")
    ap.add_argument("--hardware", default="CPU, 2 cores, shared with other jobs")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "soak_cpu.json")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="jointspace-soak-") as tmp:
        work = Path(tmp)
        model, folder, index = setup(work, args.model, args.photos)
        uploads = [photo(work / f"upload_{i}.jpg", seed=90_000 + i).read_bytes() for i in range(4)]
        hostile = corpus(work / "hostile")
        server = Server(model, index, free_port())
        server.start()
        soak = Soak(args, server, folder, index, uploads, hostile)
        try:
            asyncio.run(soak.run())
            time.sleep(args.sync_every / 10)
            check = verify(soak)
        finally:
            server.stop()
    summary = summarise(soak)
    commit = current_commit()
    rss = [mb for _, mb, _ in soak.rss]
    result = {
        "description": f"python benchmarks/soak.py --seconds {args.seconds:g} --sync-every {args.sync_every:g}: "
                       f"mixed traffic, index sync every {args.sync_every:g} s, one kill -9 of the service halfway",
        "hardware": args.hardware, "date": date.today().isoformat(), "commit": commit,
        "python": platform.python_version(), "seconds": args.seconds, "think_ms": args.think_ms,
        **summary, "hostile_wrong_status": soak.wrong_status[:20], "hostile_wrong_status_count": len(soak.wrong_status),
        "syncs": soak.syncs, "kill_at_s": soak.kill_at, "ready_again_s": soak.ready_again,
        "rss_mb": {"first": rss[0] if rss else None, "peak": max(rss, default=None), "last": rss[-1] if rss else None,
                   "samples": soak.rss},
        "index_check": check,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, result)
    for row in summary["rows"]:
        print(f"{row['route']:15s} {row['requests']:6d} requests  2xx {row['2xx']:6d}  4xx {row['4xx']:5d}  "
              f"5xx {row['5xx']:3d}  errors {row['errors']:3d}  p50 {row['p50_ms'] or 0:8.1f} ms  "
              f"p99 {row['p99_ms'] or 0:8.1f} ms")
    print(f"kill window {summary['kill_window_s']} s; outside it: {summary['outside_kill_window']}")
    print(f"syncs: {sum(s['ok'] for s in soak.syncs)}/{len(soak.syncs)} ok; RSS MB first/peak/last "
          f"{result['rss_mb']['first']}/{result['rss_mb']['peak']}/{result['rss_mb']['last']}")
    print(f"index: {check}")
    print(f"hostile uploads answered another status than their own: {len(soak.wrong_status)}")
    bad = summary["outside_kill_window"]["5xx"] or summary["outside_kill_window"]["connection_errors"] \
        or check["missing"] or check["unexpected"] or not check["served_generation_is_latest"] or soak.wrong_status
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
