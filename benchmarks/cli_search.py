"""The terminal's commands, measured as a user runs them: ``benchmarks/results/cli_search.json`` (rendered into
docs/search.md by benchmarks/tables.py).

    python benchmarks/cli_search.py --work /tmp/cli_search --repeats 5

Each command runs as its own process (``python -m service.cli ...``, what the ``jointspace`` script runs), and is
timed from start to exit (wall seconds) with its peak resident memory (``ru_maxrss`` of that child, from
``os.wait4``: what ``/usr/bin/time`` reports). The galleries:

* ``demo``: the demo gallery (``--index``, default demo/photos-index, as ``make demo`` builds it: 14 photos and 3
  videos, the shipped model's query bank);
* ``10k``: 10,000 photos as synthetic unit vectors of the shipped model's dimension, folded with the demo index's
  query bank (its reference sets too), written as an index directory is (``index.gallery.build_from_vectors``),
  under the shipped model's fingerprint: the search reads it as it reads a real one.

Rows: ``index search --text`` on both (the first run with an empty cache converts the model's text tower,
training/inference/text_tower.py, and is reported on its own; the others read it back), with
``--sort newest``, ``--mode hybrid`` and ``--subtract``; ``index search --image`` (a photo as the query: the whole
model); ``index info`` and ``index duplicates``; an unknown ``--index``. The median and the largest of
``--repeats`` runs are kept.

What a user meets after ``make demo``: ``index build`` of the demo's photos (``--samples``, as the Makefile builds
them) with an empty ``$JOINTSPACE_CACHE`` (it converts the backbones' backend, embeds the query bank's captions and
prepares the text tower), then the first ``index search --text`` on that index with that cache. What the
preparation adds to a build: builds with the text tower prepared and builds with it removed from the cache, taking
turns (``--build-repeats`` each), and the seconds the build itself reports for it.
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
from training.data.fileio import write_json  # noqa: E402
RESULTS = REPO / "benchmarks" / "results" / "cli_search.json"
JOINTSPACE = [sys.executable, "-m", "service.cli"]
# what a row must stay within (seconds, MB), where the project set a target
TARGETS = {("search --text", "demo"): (1.5, 600), ("search --text", "10k"): (2.0, None),
           ("search --text, unknown --index", "unknown"): (0.5, None)}


def run(argv: list[str], env: dict) -> dict:
    """One process: its wall seconds, peak RSS (MB), exit code and what it wrote on stderr (``stderr``: the tail;
    ``stderr_all``)."""
    with open(os.devnull, "wb") as out, open(Path(env["JOINTSPACE_BENCH_ERR"]), "wb") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen([*JOINTSPACE, *argv], stdout=out, stderr=err, env=env, cwd=REPO)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    err_text = Path(env["JOINTSPACE_BENCH_ERR"]).read_text(errors="replace")
    return {"seconds": seconds, "peak_rss_mb": usage.ru_maxrss / 1024, "code": proc.returncode,
            "stderr": err_text[-300:], "stderr_all": err_text}


def build_rows(args, work: Path, env: dict) -> tuple[list[dict], dict]:
    """``index build`` of the demo's photos from an empty cache, the first text search after it, and builds with
    and without the text tower prepared (module docstring): rows, and the preparation's cost."""
    samples = Path(args.samples)
    cache = work / "cache-build"
    shutil.rmtree(cache, ignore_errors=True)
    env = {**env, "JOINTSPACE_CACHE": str(cache)}
    built = work / "built-index"

    def build() -> dict:
        shutil.rmtree(built, ignore_errors=True)
        r = run(["index", "build", "--images", str(samples / "photos"), "--captions", str(samples / "captions.txt"),
                 "--out", str(built), "--workers", "0"], env)
        if r["code"] != 0:
            raise SystemExit(f"index build: exit {r['code']}: {r['stderr']}")
        found = re.search(r"text encoder for terminal searches: prepared in ([0-9.]+) s", r["stderr_all"])
        r["prepared_s"] = float(found.group(1)) if found else None
        return r

    def row(name: str, gallery: str, runs: list[dict], **extra) -> dict:
        seconds, rss = [r["seconds"] for r in runs], [r["peak_rss_mb"] for r in runs]
        print(f"{name:55s} {gallery:8s} median {statistics.median(seconds):6.2f} s  max {max(seconds):6.2f} s  "
              f"peak RSS {max(rss):7.0f} MB", flush=True)
        return {"command": name, "gallery": gallery, "runs": len(runs), "median_s": statistics.median(seconds),
                "max_s": max(seconds), "median_rss_mb": statistics.median(rss), "max_rss_mb": max(rss),
                "target_s": None, "target_rss_mb": None, **extra}

    cold = build()
    if cold["prepared_s"] is None:
        raise SystemExit(f"index build did not prepare the text tower: {cold['stderr']}")
    first = run(["index", "search", "--index", str(built), "--text", "a cat"], env)
    if first["code"] != 0 or "preparing" in first["stderr_all"]:
        raise SystemExit(f"the first search after index build: exit {first['code']}, converted: {first['stderr']}")
    rows = [row("build, empty cache (prepares the text tower)", "demo", [cold]),
            row("search --text, first after index build (empty cache before it)", "demo", [first],
                target_s=TARGETS[("search --text", "demo")][0], target_rss_mb=TARGETS[("search --text", "demo")][1])]
    prepared, unprepared = [], []
    for _ in range(args.build_repeats):          # taking turns: a drifting load hits both alike
        prepared.append(build())
        shutil.rmtree(cache / "text", ignore_errors=True)
        unprepared.append(build())
    rows += [row("build, text tower prepared already", "demo", prepared),
             row("build, text tower not prepared (prepares it)", "demo", unprepared)]
    cost = {"build_added_s": statistics.median(r["seconds"] for r in unprepared)
            - statistics.median(r["seconds"] for r in prepared),
            "build_reported_s": statistics.median(r["prepared_s"] for r in unprepared),
            "build_reported_cold_s": cold["prepared_s"], "build_repeats": args.build_repeats}
    print(f"the preparation adds {cost['build_added_s']:.2f} s to index build (the build says "
          f"{cost['build_reported_s']:.2f} s)", flush=True)
    return rows, cost


def make_10k(work: Path, demo: Path, n: int) -> Path:
    """``n`` synthetic photos' vectors, folded with the demo index's query bank, as an index directory."""
    import numpy as np

    from index.changes import BuildOptions, ChangeSet, ModelFacts
    from index.gallery import build_from_vectors
    from index.generations import read_manifest
    from index.qbnorm import bank_for

    root = work / "index-10k"
    manifest = read_manifest(demo)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, int(manifest["dim"])), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    rows = [(f"/gallery/{i // 500:03d}/{i:05d}.jpg", None) for i in range(n)]
    build_from_vectors(root, ModelFacts(manifest["model_fingerprint"], manifest["similarity"]),
                       ChangeSet(image_vectors=x, image_ids=np.arange(n), image_rows=rows),
                       BuildOptions(querybank=bank_for(demo, manifest)))
    return root


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--index", default=str(REPO / "demo" / "photos-index"), help="the demo gallery's index")
    ap.add_argument("--photo", default=str(REPO / "demo" / "samples" / "photos" / "cat.jpg"),
                    help="the photo of the --image row")
    ap.add_argument("--work", required=True, help="scratch folder (the 10k index, the text tower cache)")
    ap.add_argument("--photos", type=int, default=10_000, help="photos of the synthetic index (default 10,000)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--samples", default=str(REPO / "demo" / "samples"),
                    help="make demo's sample folder (photos/, captions.txt): the build rows' photos")
    ap.add_argument("--build-repeats", type=int, default=3, help="builds with and without the text tower prepared")
    ap.add_argument("--note", default="", help="said with the hardware (e.g. 'quiet')")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--make-10k", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    demo = Path(args.index)
    if args.make_10k:
        make_10k(work, demo, args.photos)
        return 0
    big = work / "index-10k"
    if not (big / "CURRENT").exists():
        # in a child: a process started by this one begins with this one's resident pages in its peak (fork), so
        # this one stays small (no numpy, no index code)
        subprocess.run([sys.executable, __file__, "--make-10k", "--work", str(work), "--index", str(demo),
                        "--photos", str(args.photos)], check=True)
    cache = work / "cache"
    shutil.rmtree(cache, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), "JOINTSPACE_CACHE": str(cache),
           "JOINTSPACE_BENCH_ERR": str(work / "stderr.txt")}
    cases = [
        ("search --text, first run (converts the text tower)", "demo", 1,
         ["index", "search", "--index", str(demo), "--text", "a cat"]),
        ("search --text", "demo", args.repeats, ["index", "search", "--index", str(demo), "--text", "a cat"]),
        ("search --text --sort newest", "demo", args.repeats,
         ["index", "search", "--index", str(demo), "--text", "a cat", "--sort", "newest"]),
        ("search --text --mode hybrid", "demo", args.repeats,
         ["index", "search", "--index", str(demo), "--text", "a clock", "--mode", "hybrid"]),
        ("search --text --subtract", "demo", args.repeats,
         ["index", "search", "--index", str(demo), "--text", "a cat", "--subtract", "sofa"]),
        ("search --text", "10k", args.repeats, ["index", "search", "--index", str(big), "--text", "a cat"]),
        ("search --text --sort newest", "10k", args.repeats,
         ["index", "search", "--index", str(big), "--text", "a cat", "--sort", "newest"]),
        ("search --image (the whole model)", "demo", max(1, args.repeats // 2),
         ["index", "search", "--index", str(demo), "--image", args.photo]),
        ("info", "demo", args.repeats, ["index", "info", "--index", str(demo)]),
        ("duplicates", "demo", args.repeats, ["index", "duplicates", "--index", str(demo)]),
        ("search --text, unknown --index", "unknown", args.repeats,
         ["index", "search", "--index", str(work / "no-such-index"), "--text", "a cat"]),
    ]
    rows = []
    for name, gallery, repeats, argv_ in cases:
        runs = [run(argv_, env) for _ in range(repeats)]
        expected = 2 if gallery == "unknown" else 0
        bad = [r for r in runs if r["code"] != expected]
        if bad:
            raise SystemExit(f"{name} ({gallery}): exit {bad[0]['code']}: {bad[0]['stderr']}")
        seconds = [r["seconds"] for r in runs]
        rss = [r["peak_rss_mb"] for r in runs]
        target_s, target_mb = TARGETS.get((name, gallery), (None, None))
        rows.append({"command": name, "gallery": gallery, "runs": repeats, "median_s": statistics.median(seconds),
                     "max_s": max(seconds), "median_rss_mb": statistics.median(rss), "max_rss_mb": max(rss),
                     "target_s": target_s, "target_rss_mb": target_mb})
        print(f"{name:55s} {gallery:8s} median {statistics.median(seconds):6.2f} s  max {max(seconds):6.2f} s  "
              f"peak RSS {max(rss):7.0f} MB", flush=True)
    build, cost = build_rows(args, work, env)
    rows = rows[:1] + build + rows[1:]
    from flickr8k_levers import hardware
    from tables import current_commit

    out = {"description": f"jointspace index commands as processes, {args.repeats} runs each, builds "
                          f"{args.build_repeats} (python benchmarks/cli_search.py --repeats {args.repeats} "
                          f"--build-repeats {args.build_repeats})",
           "hardware": hardware(args.note), "date": dt.date.today().isoformat(), "commit": current_commit(),
           "python": platform.python_version(), "photos_10k": args.photos, "load_1min": os.getloadavg()[0],
           "text_tower_preparation": cost, "rows": rows}
    write_json(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
