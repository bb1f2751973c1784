"""The first minutes of a new user, measured against another checkout in one run: ``make demo``'s steps from an
empty cache (write the sample gallery, ``index build`` it, ``serve`` it until ``/readyz``), then one query at a
time on the served gallery (text → photos and photo → captions, p50 over sequential requests).

    python benchmarks/demo_ready.py --baseline /tmp/base --baseline-label 6d5a208

Each checkout runs its own code (``python -m service.cli`` with that checkout first on PYTHONPATH, in that
checkout) with its own shipped model, in a fresh folder with a fresh ``JOINTSPACE_CACHE``: what ``make demo``
does right after ``make install``. The checkouts alternate (A B A B ...) so that a drift of the machine falls on
both. The service's photo query is one of the gallery's photos, uploaded (``POST /v1/search/captions``); the text
query a sentence (``POST /v1/search/images``). Writes ``benchmarks/results/demo_ready.json`` (rendered into
docs/benchmarks.md by benchmarks/tables.py).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.flickr8k_levers import commit, hardware  # noqa: E402
from training.data.fileio import write_json  # noqa: E402
from tests.server_process import free_port, wait_serving  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "demo_ready.json"
TEXTS = ["a cup of coffee", "a cat", "a man with a camera", "a rocket", "a red flower", "an old clock"]


def _run(tree: Path, env: dict, *args: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "service.cli", *args], cwd=tree, env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def _env(tree: Path, cache: Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(tree), "JOINTSPACE_CACHE": str(cache), "PYTHONUNBUFFERED": "1"}


def one_round(tree: Path, queries: int) -> dict:
    import httpx

    with tempfile.TemporaryDirectory(prefix="jointspace-demo-ready-") as tmp:
        work = Path(tmp)
        env = _env(tree, work / "cache")
        row = {"samples_s": _run(tree, env, "index", "samples", "--out", str(work / "samples"))}
        row["build_s"] = _run(tree, env, "index", "build", "--images", str(work / "samples" / "photos"),
                              "--captions", str(work / "samples" / "captions.txt"), "--out",
                              str(work / "photos-index"), "--workers", "0", "--quiet")
        port = free_port()
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--index", str(work / "photos-index"),
                                 "--port", str(port)], cwd=tree, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            base = f"http://127.0.0.1:{port}"
            wait_serving(proc, port, timeout=600, poll=0.1)
            row["serve_to_ready_s"] = time.perf_counter() - start
            row["ready_s"] = row["samples_s"] + row["build_s"] + row["serve_to_ready_s"]
            photos = sorted(p for p in (work / "samples" / "photos").iterdir() if p.suffix.lower() == ".jpg")
            with httpx.Client(base_url=base, timeout=60) as client:
                text_ms, image_ms = [], []
                for i in range(queries + 2):                 # the first two of each: not counted (first use)
                    t = time.perf_counter()
                    r = client.post("/v1/search/images", json={"text": TEXTS[i % len(TEXTS)], "k": 10})
                    if i >= 2:
                        text_ms.append(1000 * (time.perf_counter() - t))
                    r.raise_for_status()
                    photo = photos[i % len(photos)]
                    t = time.perf_counter()
                    r = client.post("/v1/search/captions", files={"image": (photo.name, photo.read_bytes())},
                                    data={"k": "10"})
                    if i >= 2:
                        image_ms.append(1000 * (time.perf_counter() - t))
                    r.raise_for_status()
            row["text_p50_ms"], row["image_p50_ms"] = statistics.median(text_ms), statistics.median(image_ms)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", type=Path, required=True, help="another checkout (e.g. a git worktree)")
    ap.add_argument("--baseline-label", default="baseline")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--queries", type=int, default=30, help="sequential queries of each kind per round")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    trees = {args.baseline_label: args.baseline.resolve(), "this checkout": REPO}
    rounds: dict[str, list[dict]] = {label: [] for label in trees}
    for r in range(args.rounds):
        for label, tree in trees.items():
            row = one_round(tree, args.queries)
            rounds[label].append(row)
            print(f"round {r + 1} {label}: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()), flush=True)
    rows = []
    for label, got in rounds.items():
        rows.append({"checkout": label, **{k: statistics.median(x[k] for x in got) for k in got[0]},
                     "rounds": len(got)})
    base, this = rows
    result = {"rows": rows, "ready_speedup": base["ready_s"] / this["ready_s"],
              "image_p50_ratio": this["image_p50_ms"] / base["image_p50_ms"],
              "text_p50_ratio": this["text_p50_ms"] / base["text_p50_ms"],
              "queries": args.queries, "hardware": hardware(), "date": dt.date.today().isoformat(),
              "commit": commit(), "baseline": args.baseline_label}
    write_json(args.out, result)
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
