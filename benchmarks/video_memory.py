"""Memory while indexing a long video: peak RSS of ``index.video_embed.embed_videos`` over one generated 1080p video,
1 minute and 1 hour long, in one run — the frames are sampled and embedded as they are decoded, so the peak must
not grow with the duration (only the moments' vectors do: 4 KB a sampled frame for a 1024-d model).

The videos are written by PyAV (H.264, ``preset=ultrafast``): a moving square and a slowly changing background at
``--fps`` frames a second, so decoding works through every frame of the stream. Each duration is indexed in its
own process (``python benchmarks/video_memory.py --child ...``), whose peak RSS (``ru_maxrss``) is what is
recorded, with the process's RSS after loading the model, before reading the video, as the baseline, and the
largest RSS in each quarter of the indexing time (sampled every 0.5 s): flat quarters mean the memory does not
grow with the hours read.

    python benchmarks/video_memory.py      # → benchmarks/results/video_memory_cpu.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.tables import current_commit  # noqa: E402
from training.data.fileio import write_json  # noqa: E402

MODEL = ROOT / "training" / "pretrained" / "flickr8k.pt"


def frames(seconds: int, fps: int, width: int, height: int):
    """Frames of a square crossing a background whose colour drifts: cheap to draw, not trivial to encode."""
    ys = np.linspace(0, 1, height, dtype=np.float32)[:, None]
    xs = np.linspace(0, 1, width, dtype=np.float32)[None, :]
    ramp = (ys * 0.5 + xs * 0.5)
    for i in range(seconds * fps):
        t = i / fps
        base = np.empty((height, width, 3), np.uint8)
        for c, phase in enumerate((0.0, 2.1, 4.2)):
            base[..., c] = (96 + 80 * np.sin(t / 30 + phase) * ramp).astype(np.uint8)
        x = int((t * 97) % (width - 200))
        y = int((t * 53) % (height - 200))
        base[y:y + 200, x:x + 200] = (230, 40, 40)
        yield base


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def child(args) -> int:
    """Loads the model, indexes one video, prints one JSON line."""
    import torch

    from index.moments import Sampling
    from index.video_embed import embed_videos
    from training.models.checkpoint import load_model

    torch.set_num_threads(os.cpu_count() or 1)
    model = load_model(args.model)
    before = rss_mb()
    samples: list[tuple[float, float]] = []
    stop = threading.Event()

    def sample():
        while not stop.wait(0.5):
            samples.append((time.perf_counter(), rss_mb()))

    start = time.perf_counter()
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out = embed_videos(model, [args.video], Sampling(rate=args.rate, max_frames=args.max_frames), workers=args.workers,
                       progress=False)
    wall = time.perf_counter() - start
    stop.set()
    sampler.join()
    quarters = [max((r for t, r in samples if q <= 4 * (t - start) / wall < q + 1), default=None)
                for q in range(4)]
    assert out.kept == [0], out.skipped
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(json.dumps({"rss_after_model_mb": round(before, 1), "peak_rss_mb": round(peak, 1),
                      "worker_peak_rss_mb": round(kids, 1), "frames": out.frames,
                      "rss_by_quarter_mb": [None if r is None else round(r, 1) for r in quarters],
                      "moments": len(out.segments[0]), "wall_s": round(wall, 2)}), flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(MODEL))
    ap.add_argument("--durations", type=int, nargs="*", default=[60, 3600], help="video lengths in seconds")
    ap.add_argument("--fps", type=int, default=2, help="frame rate of the written videos")
    ap.add_argument("--size", default="1920x1080")
    ap.add_argument("--rate", type=float, default=1.0, help="frames sampled a second (index build's default)")
    ap.add_argument("--max-frames", type=int, default=3600, help="index build's default")
    ap.add_argument("--workers", type=int, default=1, help="decoding workers (processes)")
    ap.add_argument("--hardware", default=f"CPU, {os.cpu_count()} cores ({platform.processor() or platform.machine()})")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "video_memory_cpu.json"))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--video", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    from index.video_writer import write_video

    width, height = (int(v) for v in args.size.split("x"))
    rows = []
    with tempfile.TemporaryDirectory(prefix="video-memory-") as tmp:
        for seconds in args.durations:
            path = Path(tmp) / f"{seconds}s.mp4"
            start = time.perf_counter()
            write_video(path, frames(seconds, args.fps, width, height), fps=args.fps,
                        codec_options={"preset": "ultrafast"})
            written = time.perf_counter() - start
            print(f"{seconds} s at {width}×{height}, {args.fps} fps: {path.stat().st_size / 1e6:.1f} MB written in "
                  f"{written:.0f} s", flush=True)
            cmd = [sys.executable, __file__, "--child", "--video", str(path), "--model", args.model,
                   "--rate", str(args.rate), "--max-frames", str(args.max_frames), "--workers", str(args.workers)]
            run = subprocess.run(cmd, check=True, capture_output=True, text=True)
            row = json.loads(run.stdout.strip().splitlines()[-1])
            row.update(seconds=seconds, width=width, height=height, fps=args.fps,
                       file_mb=round(path.stat().st_size / 1e6, 1))
            print(f"  {json.dumps(row)}", flush=True)
            rows.append(row)
            path.unlink()
    short, long = rows[0], rows[-1]
    write_json(Path(args.out), {
        "description": "peak RSS of index.video_embed.embed_videos over one generated video (H.264, ultrafast), per "
                       "duration, each in its own process (python benchmarks/video_memory.py)",
        "hardware": args.hardware, "date": time.strftime("%Y-%m-%d"), "commit": current_commit(),
        "python": platform.python_version(), "model": Path(args.model).name,
        "sampling": {"rate": args.rate, "max_frames": args.max_frames}, "workers": args.workers, "rows": rows,
        "peak_growth_mb": round(long["peak_rss_mb"] - short["peak_rss_mb"], 1),
        "peak_ratio": round(long["peak_rss_mb"] / short["peak_rss_mb"], 3)})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
