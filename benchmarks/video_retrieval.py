"""Text → video and text → moment retrieval on generated clips, and how fast videos are indexed.

The test set: synthetic scenes (training/data/synth.py, ``random_scenes``) rendered as short MP4 clips written by
PyAV, several scenes one after another in a clip, each shown for 3 to 7 seconds with its shapes drifting together
(so the spatial relations of its captions stay true); a scene's span is a ground-truth moment and its five
captions the queries. The clips are indexed through ``index.gallery.build`` like any folder of videos, once per
moment setting (fixed windows of several lengths, and cuts where adjacent frames' embeddings differ), and
searched through the index.

Measured per setting, over every caption of every scene:

* text → moment R@1/5/10: a hit is a moment of the right clip overlapping the scene by temporal IoU ≥ 0.5;
* tIoU: the temporal IoU of the top moment (0 when it is from another clip), and of the best-ranked moment of the
  right clip (how well the moment is placed once the clip is found);
* text → video R@1/5/10: clips ranked by their own vector (the mean of all their frames, W2VV §III-D) and by their
  best moment's score.

Speed (the default setting): ``index.video_embed.embed_videos`` over all clips with 2 decoding workers — video-seconds
indexed per wall-second and sampled frames per second — and decoding alone (``sample_frames``, one process).

    python benchmarks/video_retrieval.py --model run/model.pt --out benchmarks/results/video_cpu.json

Run it alone (``flock -x``): the speed numbers are wall times.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from index.embed import embed_sentences  # noqa: E402
from index.people import text_queries  # noqa: E402
from index.changes import BuildOptions  # noqa: E402
from index.gallery import EmbedOptions, Gallery, build  # noqa: E402
from index.query import ImageFilter  # noqa: E402
from index.moments import Sampling  # noqa: E402
from index.video_decode import sample_frames  # noqa: E402
from index.video_embed import embed_videos  # noqa: E402
from index.video_writer import write_video  # noqa: E402
from training.data.synth import random_scenes, render  # noqa: E402
from benchmarks.tables import current_commit  # noqa: E402
from training.data.fileio import write_json  # noqa: E402


def drift(scene, offset: tuple[float, float]):
    """The scene with every object moved by ``offset`` (fractions of the side), kept inside the frame."""
    lo_x = max(o.radius - o.x for o in scene.objects)
    hi_x = min(1 - o.radius - o.x for o in scene.objects)
    lo_y = max(o.radius - o.y for o in scene.objects)
    hi_y = min(1 - o.radius - o.y for o in scene.objects)
    dx = min(max(offset[0], lo_x), hi_x) if lo_x <= hi_x else 0.0
    dy = min(max(offset[1], lo_y), hi_y) if lo_y <= hi_y else 0.0
    return replace(scene, objects=tuple(replace(o, x=o.x + dx, y=o.y + dy) for o in scene.objects))


def make_clips(folder: Path, clips: int, scenes_per_clip: int, fps: int, size: int, seed: int) -> list[dict]:
    """Writes ``clips`` MP4 files; returns per clip its path, duration and scenes (start, end, captions)."""
    rng = np.random.default_rng(seed)
    pool = random_scenes(clips * scenes_per_clip, seed)
    truth = []
    for c in range(clips):
        path = folder / f"clip{c:03d}.mp4"
        spans, frames, t = [], [], 0.0
        for s in range(scenes_per_clip):
            scene, captions = pool[c * scenes_per_clip + s]
            seconds = int(rng.integers(3, 8))
            velocity = rng.uniform(-0.02, 0.02, 2)                   # fraction of the side per second
            for i in range(seconds * fps):
                moved = drift(scene, tuple(velocity * (i / fps - seconds / 2)))
                frames.append(np.asarray(render(moved, size)))
            spans.append({"start": t, "end": t + seconds, "captions": captions})
            t += seconds
        write_video(path, frames, fps=fps)
        truth.append({"path": str(path.resolve()), "duration": t, "scenes": spans})
    return truth


def tiou(a: tuple[float, float], b: tuple[float, float]) -> float:
    inter = max(0.0, min(a[1], b[1]) - max(a[0], b[0]))
    union = max(a[1], b[1]) - min(a[0], b[0])
    return inter / union if union > 0 else 0.0


def evaluate(index_dir: Path, model, truth: list[dict], k: int = 10) -> dict:
    gallery = Gallery.load(index_dir, model=model)
    try:
        rows = {r.id: r for r in gallery.meta.all_images()}
        video_of_path = {v.path: v.id for v in gallery.meta.all_videos()}
        clip_of_video = {video_of_path[c["path"]]: n for n, c in enumerate(truth)}
        moments = gallery.allowed_ids(ImageFilter(media="video"))
        queries, targets = [], []
        for n, clip in enumerate(truth):
            for span in clip["scenes"]:
                for caption in span["captions"]:
                    queries.append(caption)
                    targets.append((n, (span["start"], span["end"])))
        q = embed_sentences(model, queries, progress=False)
        hits = gallery.search_images(text_queries(q, queries), len(moments), allowed=moments)
        ids, blobs = gallery.meta.video_vectors()
        video_vectors = np.stack([np.frombuffer(b, np.float32) for b in blobs])
        video_scores = q @ video_vectors.T
        moment_r, video_r, best_r = np.zeros(3), np.zeros(3), np.zeros(3)
        top_iou, placed_iou = [], []
        for (clip, span), ranked, scores in zip(targets, hits, video_scores):
            right = [n for n, (i, _) in enumerate(ranked)
                     if clip_of_video[rows[i].video_id] == clip and tiou((rows[i].t_start, rows[i].t_end), span) >= 0.5]
            first = right[0] if right else len(ranked)
            moment_r += [first < 1, first < 5, first < 10]
            top = rows[ranked[0][0]]
            top_iou.append(tiou((top.t_start, top.t_end), span) if clip_of_video[top.video_id] == clip else 0.0)
            own = next(rows[i] for i, _ in ranked if clip_of_video[rows[i].video_id] == clip)
            placed_iou.append(tiou((own.t_start, own.t_end), span))
            order = [clip_of_video[ids[j]] for j in np.argsort(-scores, kind="stable")]
            rank = order.index(clip)
            video_r += [rank < 1, rank < 5, rank < 10]
            seen: list[int] = []                                  # clips in the order of their best moment
            for i, _ in ranked:
                c = clip_of_video[rows[i].video_id]
                if c not in seen:
                    seen.append(c)
            rank = seen.index(clip)
            best_r += [rank < 1, rank < 5, rank < 10]
        n = len(queries)
        return {"queries": n, "moments": len(moments),
                "moment_r": [round(100 * v / n, 1) for v in moment_r],
                "top_tiou": round(float(np.mean(top_iou)), 3), "placed_tiou": round(float(np.mean(placed_iou)), 3),
                "video_r_mean": [round(100 * v / n, 1) for v in video_r],
                "video_r_best_moment": [round(100 * v / n, 1) for v in best_r]}
    finally:
        gallery.close()


def speed(model, paths: list[str], seconds: float, workers: int) -> dict:
    import torch

    start = time.perf_counter()
    emb = embed_videos(model, paths, Sampling(), workers=workers, progress=False)
    wall = time.perf_counter() - start
    start = time.perf_counter()
    frames = sum(1 for p in paths for _ in sample_frames(p))
    decode = time.perf_counter() - start
    return {"workers": workers, "torch_threads": torch.get_num_threads(), "video_seconds": round(seconds, 1),
            "frames": emb.frames, "wall_s": round(wall, 2), "video_s_per_s": round(seconds / wall, 1),
            "frames_per_s": round(emb.frames / wall, 1), "decode_frames": frames,
            "decode_frames_per_s": round(frames / decode, 1)}


def main(argv=None) -> int:
    from training.models.checkpoint import load_model

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="model.pt (one trained on the synthetic set: configs/demo.yaml)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "video_cpu.json"))
    p.add_argument("--clips", type=int, default=40)
    p.add_argument("--scenes", type=int, default=4, help="scenes per clip")
    p.add_argument("--fps", type=int, default=8, help="frame rate of the written clips")
    p.add_argument("--size", type=int, default=128, help="frame side in pixels")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--model-note", default="configs/demo.yaml on the synthetic set",
                   help="how the model was trained, for the results file")
    p.add_argument("--hardware", default=f"CPU, {os.cpu_count()} cores ({platform.processor() or platform.machine()})")
    args = p.parse_args(argv)
    model = load_model(args.model).eval()
    settings = [("fixed 2 s", Sampling(window=2.0)), ("fixed 3 s", Sampling(window=3.0)),
                ("fixed 5 s", Sampling(window=5.0)), ("fixed 10 s", Sampling(window=10.0)),
                ("cut 0.1, at most 10 s", Sampling(window=10.0, cut=0.1)),
                ("cut 0.2, at most 10 s", Sampling(window=10.0, cut=0.2)),
                ("cut 0.3, at most 10 s", Sampling(window=10.0, cut=0.3))]
    with tempfile.TemporaryDirectory(prefix="jointspace-video-") as tmp:
        folder = Path(tmp) / "clips"
        folder.mkdir()
        t0 = time.perf_counter()
        truth = make_clips(folder, args.clips, args.scenes, args.fps, args.size, args.seed)
        print(f"wrote {len(truth)} clips in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        paths = [c["path"] for c in truth]
        rows = []
        for name, sampling in settings:
            index = Path(tmp) / "index"
            build(index, model, [], video_paths=paths, options=BuildOptions(image_root=folder),
                  embedding=EmbedOptions(sampling=sampling, progress=False, workers=args.workers))
            row = {"setting": name, "window": sampling.window, "cut": sampling.cut, **evaluate(index, model, truth)}
            print(json.dumps(row), file=sys.stderr)
            rows.append(row)
        run = speed(model, paths, sum(c["duration"] for c in truth), args.workers)
        print(json.dumps(run), file=sys.stderr)
    commit = current_commit()
    result = {"description": f"{args.clips} generated clips ({args.scenes} synthetic scenes each, 3-7 s a scene, "
                             f"{args.size} px, {args.fps} fps, H.264 by PyAV), frames sampled at 1/s; model: "
                             f"{args.model_note}",
              "scenes": args.clips * args.scenes, "rows": rows, "speed": run, "hardware": args.hardware,
              "date": time.strftime("%Y-%m-%d"), "commit": commit}
    write_json(args.out, result)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
