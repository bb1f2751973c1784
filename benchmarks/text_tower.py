"""The text tower's speed: sentences per second through ``embed_texts`` (tokenisation, padding, the forward pass,
the normalised vectors back on the host), the shipped model (MiniLM + GPO), at batch sizes 1, 32 and 128, for this
checkout and (``--baseline DIR``: another checkout, e.g. the commit before a change) for that one, in one run.

    python benchmarks/text_tower.py --baseline /path/to/other/checkout    # → benchmarks/results/text_tower_cpu.json

Each checkout runs in its own process (its code on the path), the two alternated for ``--rounds`` rounds; a cell is
the median of the rounds. Sentences are Flickr8k-like captions of 3 to 30 words.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WORDS = ("a dog runs on the beach with a red ball while two children in blue coats watch from the old wooden pier "
         "near the lake at sunset").split()


def sentences(n: int) -> list[str]:
    return [" ".join(WORDS[i % 7:i % 7 + 3 + (i * 7) % 24]) for i in range(n)]


def measure(batches: list[int], seconds: float) -> dict:
    """In this process (the checkout on sys.path first): sentences/s of ``embed_texts`` per batch size."""
    import torch

    from training.inference import pretrained
    from training.inference.embedding import embed_texts
    from training.models.checkpoint import load_model

    model = load_model(pretrained.model_path()).eval()
    texts = sentences(4096)
    out = {}
    for batch in batches:
        embed_texts(model, texts[:batch], batch_size=batch).cpu()
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds or n == 0:
            at = (n * batch) % (len(texts) - batch)
            embed_texts(model, texts[at:at + batch], batch_size=batch).cpu()
            n += 1
        out[str(batch)] = n * batch / (time.perf_counter() - start)
    return {"sentences_per_s": out, "threads": torch.get_num_threads()}


def _commit(repo: Path) -> str:
    proc = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return proc.stdout.strip() + ("+dirty" if dirty else "")


def _run(repo: Path, batches: list[int], seconds: float) -> dict:
    code = (f"import json, sys; sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); sys.path.insert(0, {str(repo)!r}); "
            f"from text_tower import measure; print(json.dumps(measure({batches!r}, {seconds!r})))")
    env = {**os.environ, "PYTHONPATH": str(repo)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=repo, env=env, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", type=Path, help="another checkout measured the same way, alternated with this one")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32, 128])
    ap.add_argument("--seconds", type=float, default=3.0, help="per batch size, per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "text_tower_cpu.json")
    args = ap.parse_args()
    trees = {"this": ROOT, **({"baseline": args.baseline.resolve()} if args.baseline else {})}
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    for r in range(args.rounds):
        for name, repo in trees.items():
            runs[name].append(_run(repo, args.batches, args.seconds))
            print(f"round {r + 1} {name}: {runs[name][-1]['sentences_per_s']}", flush=True)
    rows = []
    for name, repo in trees.items():
        for batch in args.batches:
            values = [run["sentences_per_s"][str(batch)] for run in runs[name]]
            rows.append({"checkout": name, "commit": _commit(repo), "batch": batch,
                         "sentences_per_s": statistics.median(values), "rounds": values})
    result = {"hardware": f"{len(os.sched_getaffinity(0))}-core {platform.machine()} CPU, no GPU",
              "date": dt.date.today().isoformat(), "commit": _commit(ROOT), "model": "training/pretrained/flickr8k.pt",
              "seconds": args.seconds, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
