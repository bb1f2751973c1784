"""The model zoo table: train and evaluate several configs on one data set, one row per config.

``run_zoo`` trains each config into ``OUT/<config stem>/`` (``model.pt``, ``log.jsonl``, ``metrics.json``,
``recall.png``), evaluates the best checkpoint on ``split`` and rewrites ``OUT/zoo.md``, ``OUT/zoo.csv`` and
``OUT/zoo.png`` after every run, so an interrupted zoo leaves a valid partial table. A run whose
``metrics.json`` records the same config text and overrides is not trained again (re-running the same
command finishes an interrupted zoo).
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
from pathlib import Path
from typing import Sequence

import numpy as np

from training.data.datasets import load_dataset
from training.data.fileio import atomic_path, write_json, write_text
from training.inference.device import resolve_device
from training.models.checkpoint import load_model
from .config import load_config
from .evaluate import evaluate_model, plot_recall, public
from .train import train

COLUMNS = ["model", "i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10", "rsum", "mir_i2t", "mir_t2i",
           "rprecision5", "train_s", "epochs"]


def data_identity(dataset) -> list:
    """What a zoo result depends on in the data: its name, and every split's images and captions in order."""
    return [dataset.name, [(str(r.path), r.split, r.captions) for r in dataset.images]]


def _run_key(config_path: Path, overrides: Sequence[str], split: str, data: list) -> str:
    h = hashlib.sha256(config_path.read_bytes())
    h.update(json.dumps([list(overrides), split, data]).encode())
    return h.hexdigest()


def row_of(name: str, metrics: dict) -> dict:
    return {"model": name,
            **{f"{d}_r{k}": round(metrics[d][f"r{k}"], 1) for d in ("i2t", "t2i") for k in (1, 5, 10)},
            "rsum": round(metrics["rsum"], 1), "mir_i2t": round(metrics["mir"]["i2t"], 4),
            "mir_t2i": round(metrics["mir"]["t2i"], 4), "rprecision5": round(metrics.get("rprecision5", 0.0), 2),
            "train_s": round(metrics["train"]["train_seconds"] + metrics["train"].get("fit_seconds", 0.0)),
            "epochs": metrics["train"]["epochs_run"]}


def run_zoo(data: str | Path, configs: Sequence[str | Path], out: str | Path, overrides: Sequence[str] = (),
            split: str = "val", progress: bool = True, log=print, fresh: bool = False) -> list[dict]:
    out = Path(out)
    dataset = load_dataset(data)
    evaluation_set = dataset.split(split)
    if evaluation_set.n_images == 0:
        raise ValueError(f"{data} has no '{split}' split to evaluate on")
    names = [Path(c).stem for c in configs]
    if len(set(names)) != len(names):
        raise ValueError(f"zoo configs need distinct file names, got {names}")
    rows: list[dict] = []
    identity = data_identity(dataset)            # another data set (or a changed one) is not "already done"
    for config_path, name in zip(map(Path, configs), names):
        cfg = load_config(config_path, overrides)     # fail on a bad config before any training
        run_dir = out / name
        metrics_path = run_dir / "metrics.json"
        key = _run_key(config_path, overrides, split, identity)
        if not fresh and metrics_path.exists():
            done = json.loads(metrics_path.read_text())
            if done.get("run_key") == key:
                log(f"zoo: {name} already done ({metrics_path})")
                rows.append(row_of(name, done))
                write_tables(rows, out)
                continue
        log(f"zoo: training {name} ({config_path})")
        summary = train(cfg, dataset, run_dir, progress=progress, log=log)
        device = resolve_device(cfg.train.device)
        model = load_model(run_dir / "model.pt", device)
        result = evaluate_model(model, evaluation_set, device=device, workers=cfg.train.workers,
                                progress=progress, amp=device.type == "cuda")
        metrics = {**public(result), "split": split, "config": str(config_path), "overrides": list(overrides),
                   "run_key": key, "train": summary, "model_fingerprint": model.fingerprint}
        write_json(metrics_path, metrics)
        plot_recall(result, run_dir / "recall.png", title=f"{name} on {split}")
        rows.append(row_of(name, metrics))
        write_tables(rows, out)
    return rows


def write_tables(rows: list[dict], out: Path) -> None:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS)
    writer.writeheader()
    writer.writerows(rows)
    write_text(out / "zoo.csv", buf.getvalue())
    write_text(out / "zoo.md", markdown_table(rows))
    plot_zoo(rows, out / "zoo.png")


def markdown_table(rows: list[dict]) -> str:
    head = ("| model | i2t R@1 | i2t R@5 | i2t R@10 | t2i R@1 | t2i R@5 | t2i R@10 | R-sum | MIR i2t | MIR t2i "
            "| rPrec(5) | train s | epochs |")
    lines = [head, "|" + "---|" * len(COLUMNS)]
    for r in rows:
        lines.append("| " + " | ".join(str(r[c]) for c in COLUMNS) + " |")
    return "\n".join(lines) + "\n"


def plot_zoo(rows: list[dict], path: Path) -> None:
    """Grouped bars: R@1/5/10 of each model, image→text and text→image side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(2 * max(4.0, 0.7 * len(rows) + 1.5), 4.5), dpi=110, sharey=True)
    x = np.arange(len(rows))
    for ax, d, title in ((axes[0], "i2t", "image → text"), (axes[1], "t2i", "text → image")):
        for j, k in enumerate((1, 5, 10)):
            ax.bar(x + (j - 1) * 0.27, [r[f"{d}_r{k}"] for r in rows], 0.27, label=f"R@{k}")
        ax.set_xticks(x, [r["model"] for r in rows], rotation=30, ha="right", fontsize=8)
        ax.set_title(title)
        ax.set_ylim(0, 100)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("Recall@K (%)")
    axes[0].legend()
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
