"""Train a config on Flickr8k and record its dev retrieval, wall time and peak memory as a row of
``benchmarks/results/flickr8k_dev.json`` (rendered into docs/results.md by benchmarks/tables.py).

    python benchmarks/flickr8k_levers.py --name shipped --lever "the shipped config" \
        --config configs/flickr8k.yaml --data ../shared/datasets/flickr8k --out runs/f8k [--set KEY=VALUE ...]
    python benchmarks/flickr8k_levers.py --name ensemble --lever "..." --model runs/e.pt --data ...   # no training

Training runs in a child process; its wall time includes feature extraction (from a cold cache with
``--cold-cache``: a fresh JOINTSPACE_CACHE directory) and its peak memory is the largest resident set of the
child processes. The dev metrics come from ``jointspace evaluate --split val`` on the kept checkpoint. A row
with the same name is replaced. Select on dev only: the test split is never read here.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "flickr8k_dev.json"
JOINTSPACE = [sys.executable, "-m", "service.cli"]


def hardware(note: str = "") -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    text = f"{os.cpu_count()} cores ({cpu}, {platform.machine()}), no GPU"
    return f"{text}; {note}" if note else text


def commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, check=True).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write_result(path: str | Path, description: str, rows: list[dict], note: str = "", **facts) -> None:
    """A benchmark's results file, written whole (training/data/fileio.py ``write_json``): its ``description``, where and
    when it was measured (:func:`hardware` with ``note``, the date, :func:`commit`), the torch version and its
    threads, any other ``facts``, then the ``rows``."""
    import torch

    from training.data.fileio import write_json

    result = {"description": description, "hardware": hardware(note), "date": dt.date.today().isoformat(),
              "commit": commit(), "torch": torch.__version__, "threads": torch.get_num_threads(), **facts,
              "rows": rows}
    write_json(path, result)
    print(f"wrote {path}")


def run(cmd: list[str], env: dict | None = None) -> float:
    print("$", " ".join(cmd), flush=True)
    start = time.time()
    subprocess.run(cmd, cwd=REPO, env=env, check=True)
    return time.time() - start


def load_rows() -> dict:
    if RESULTS.exists():
        return json.loads(RESULTS.read_text())
    return {"rows": []}


def save_row(row: dict) -> None:
    from training.data.fileio import write_json

    data = load_rows()
    data["rows"] = [r for r in data["rows"] if r["name"] != row["name"]] + [row]
    write_json(RESULTS, data)


def served_metrics(model_path: Path, index_dir: Path, data: str) -> dict:
    """R@1/5/10 both ways as the service ranks: every dev caption searched in the built index's images, every
    dev image's stored vector searched in its captions (the index built from the dev split, ids = positions)."""
    import numpy as np

    sys.path.insert(0, str(REPO))
    from index.embed import embed_text_queries
    from index.gallery import Gallery
    from training.data.datasets import load_dataset
    from training.models.checkpoint import load_model

    model = load_model(model_path)
    records = load_dataset(data).split("val").images
    captions = [(c, pos) for pos, r in enumerate(records) for c in r.captions]
    cap_to_img = np.array([pos for _, pos in captions])
    gallery = Gallery.load(index_dir, model=model)
    try:
        queries = embed_text_queries(model, [c for c, _ in captions], progress=False)
        t2i = [[i for i, _ in row].index(int(cap_to_img[q])) + 1
               for q, row in enumerate(gallery.search_images(queries, len(records)))]
        vectors = np.stack([gallery.image_vector(i) for i in range(len(records))])
        i2t = []
        for q, row in enumerate(gallery.search_captions(vectors, len(captions))):
            rank = {c: n for n, (c, _) in enumerate(row)}
            i2t.append(min(rank[c] for c in np.flatnonzero(cap_to_img == q)) + 1)
    finally:
        gallery.close()
    res = {d: {f"r{k}": round(100.0 * float(np.mean(np.array(r) <= k)), 4) for k in (1, 5, 10)}
           for d, r in (("i2t", i2t), ("t2i", t2i))}
    res["rsum"] = round(sum(v for d in ("i2t", "t2i") for v in res[d].values()), 4)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", required=True, help="the row's name (a row with this name is replaced)")
    ap.add_argument("--lever", required=True, help="what this row changes, in a few words")
    ap.add_argument("--config", help="config to train (with --out)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--out", help="run directory")
    ap.add_argument("--model", help="evaluate this model.pt instead of training (e.g. an ensemble)")
    ap.add_argument("--from-log", metavar="RUN",
                    help="record a finished `jointspace train` run from its log.jsonl instead: the validation of its "
                         "best epoch (the model before its concept head, as the trainer selected it) and its elapsed "
                         "seconds as the wall time")
    ap.add_argument("--data", required=True, help="the Flickr8k folder")
    ap.add_argument("--cold-cache", action="store_true", help="train with an empty feature cache")
    ap.add_argument("--querybank-norm", action="store_true", help="record the querybank-normalised metrics")
    ap.add_argument("--note", default="", help="appended to the hardware column (e.g. 'cores shared')")
    ap.add_argument("--through-index", action="store_true",
                    help="rank through a built FAISS index (jointspace index build of the dev split, with its "
                         "defaults: the model's own query bank when it carries one; with --querybank-norm, built "
                         "with --querybank over the train split) instead of evaluate")
    ap.add_argument("--index-option", action="append", default=[], metavar="OPTION",
                    help="with --through-index: an option for index build, e.g. --index-option=--no-querybank or "
                         "--index-option=--tta --index-option=flip (repeatable)")
    args = ap.parse_args(argv)
    if sum(map(bool, (args.model, args.config, args.from_log))) != 1:
        ap.error("give --config (and --out) to train, --model to evaluate, or --from-log RUN")
    if args.from_log:
        return from_log(args)
    if args.config and not args.out:
        ap.error("--config needs --out")
    scratch: list[str] = []        # a cold feature cache, a built index: removed when the row is written
    for sig in (signal.SIGTERM, signal.SIGHUP):   # killed: still clean up (subprocess.run kills the child)
        signal.signal(sig, _exit_on_signal)
    try:
        return measure(args, scratch)
    finally:
        for path in scratch:
            shutil.rmtree(path, ignore_errors=True)


def from_log(args: argparse.Namespace) -> int:
    """A row from a finished run's log.jsonl: its best epoch's validation metrics and the last epoch's elapsed
    seconds (feature extraction included, from whatever cache the run found), dated by the log's last write."""
    run_dir = Path(args.from_log)
    if _val_seen(run_dir):
        raise SystemExit(f"{run_dir} trained on dev (train.fit_on: train+val): its dev numbers measure nothing")
    lines = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines() if line.strip()]
    epochs = [e for e in lines if "val" in e]
    best = max(epochs, key=lambda e: e["val"]["rsum"])
    when = dt.date.fromtimestamp((run_dir / "log.jsonl").stat().st_mtime).isoformat()
    row = {"name": args.name, "lever": args.lever, "config": f"the run {run_dir.name} (its config.yaml)",
           "i2t": [round(best["val"]["i2t"][k], 1) for k in ("r1", "r5", "r10")],
           "t2i": [round(best["val"]["t2i"][k], 1) for k in ("r1", "r5", "r10")],
           "rsum": round(best["val"]["rsum"], 2), "wall_min": round(epochs[-1]["elapsed_s"] / 60, 1),
           "peak_gib": None, "hardware": hardware(args.note), "date": when, "commit": commit()}
    save_row(row)
    print(json.dumps(row))
    return 0


def _val_seen(run_dir: Path) -> bool:
    """Whether the run in ``run_dir`` trained on its validation split (its log marks those epochs)."""
    log = run_dir / "log.jsonl"
    return log.is_file() and any(json.loads(line).get("val_seen") for line in log.read_text().splitlines() if line)


def _exit_on_signal(signum: int, _frame) -> None:
    raise SystemExit(128 + signum)


def measure(args: argparse.Namespace, scratch: list[str]) -> int:
    env = dict(os.environ)
    wall = peak = None
    at_start = commit()            # the code that runs is the code at the start
    if args.config:
        if args.cold_cache:
            env["JOINTSPACE_CACHE"] = tempfile.mkdtemp(prefix="jointspace-cold-")
            scratch.append(env["JOINTSPACE_CACHE"])
        sets = [x for kv in args.overrides for x in ("--set", kv)]
        seconds = run([*JOINTSPACE, "train", "--config", args.config, "--data", args.data, "--out", args.out,
                       "--quiet", *sets], env)
        wall = round(seconds / 60, 1)
        peak = round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024 ** 2, 2)   # KiB → GiB
        model = Path(args.out) / "model.pt"
        config = args.config + "".join(f" --set {kv}" for kv in args.overrides)
    else:
        model = Path(args.model)
        config = f"model {args.model}"
    if args.config and _val_seen(Path(args.out)):
        # a final fit (train.fit_on: train+val) trained on dev: its dev ranking measures nothing, so the row has
        # the recipe's wall time and peak only; its dev numbers are its train-only twin's row
        row = {"name": args.name, "lever": args.lever, "config": config, "i2t": None, "t2i": None, "rsum": None,
               "wall_min": wall, "peak_gib": peak, "hardware": hardware(args.note),
               "date": dt.date.today().isoformat(), "commit": at_start}
        save_row(row)
        print(json.dumps(row))
        return 0
    # the metrics file beside a trained run's model; for a given model (the shipped one lives in the checkout), in
    # a scratch folder
    folder = model.parent if args.out else Path(tempfile.mkdtemp(prefix="jointspace-levers-"))
    if not args.out:
        scratch.append(str(folder))
    out = folder / (model.stem + "_dev.json")
    if args.through_index:
        out = folder / (model.stem + ("_dev_index_qb.json" if args.querybank_norm else "_dev_index.json"))
        scratch.append(tempfile.mkdtemp(prefix="jointspace-index-"))
        index_dir = Path(scratch[-1]) / "index"
        seconds = run([*JOINTSPACE, "index", "build", "--model", str(model), "--data", args.data, "--split", "val",
                       "--out", str(index_dir), "--quiet", *(["--querybank", args.data] if args.querybank_norm else []),
                       *args.index_option], env)
        metrics = served_metrics(model, index_dir, args.data)
        metrics["index_build_s"] = round(seconds, 1)
        out.write_text(json.dumps(metrics, indent=2) + "\n")
        args.querybank_norm = False          # the index's own scores are the metrics
    else:
        run([*JOINTSPACE, "evaluate", "--model", str(model), "--data", args.data, "--split", "val", "--quiet",
             "--no-generation", "--out", str(out), "--plot", str(out.with_suffix(".png")),
             *(["--querybank-norm"] if args.querybank_norm else [])], env)
    result = json.loads(out.read_text())
    metrics = result["qbnorm"] if args.querybank_norm else result
    row = {"name": args.name, "lever": args.lever, "config": config,
           "i2t": [round(metrics["i2t"][k], 1) for k in ("r1", "r5", "r10")],
           "t2i": [round(metrics["t2i"][k], 1) for k in ("r1", "r5", "r10")],
           "rsum": round(metrics["rsum"], 1), "wall_min": wall, "peak_gib": peak,
           **({"index_build_min": round(metrics["index_build_s"] / 60, 1)} if "index_build_s" in metrics else {}),
           "hardware": hardware(args.note), "date": dt.date.today().isoformat(), "commit": at_start}
    save_row(row)
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
