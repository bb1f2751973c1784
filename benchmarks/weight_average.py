"""Weight averaging (``train.ema``) on the shipped Flickr8k recipe, measured against the raw weights of the same
run: rows of ``benchmarks/results/weight_average.json`` (rendered into docs/results.md by benchmarks/tables.py).

    python benchmarks/weight_average.py run --data ../shared/datasets/flickr8k --work runs/ema
    python benchmarks/weight_average.py record --data ../shared/datasets/flickr8k --work runs/ema

``run`` trains configs/flickr8k.yaml with ``train.ema=0.998`` from the feature cache. An average never changes the
raw weights' path (training goes on from them), so one run measures both: after every epoch the trainer validates
the average as it always does, and this script validates the raw weights too, and averages of decay 0.995 and 0.999
kept beside it; each variant's best checkpoint is written as ``model_<variant>.pt`` (the average's own as
``model.pt``) and every epoch's dev R-sums go to ``variants.jsonl``. The averages are recorded by replacing the
trainer's averaging class with one that also updates the other decays. The extra validations lengthen the run,
so its wall time is not the recipe's.

``record`` measures each variant's best checkpoint with ``jointspace evaluate --split val --querybank-norm`` (raw
cosine, and querybank-normalised with Flickr8k train as the bank) and writes the rows. Select on dev only: the
test split is never read here.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
from training.data.fileio import write_json  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "weight_average.json"
DECAY = 0.998                 # the run's own train.ema
EXTRA = (0.995, 0.999)        # averages kept beside it


def cmd_run(args) -> int:
    import torch

    import training.trainer as trainer
    from flickr8k_levers import commit
    from training.config import load_config
    from training.models.checkpoint import save_model
    from training.optim import WeightAverage, weights_swapped

    class Recorded(WeightAverage):
        """The run's average, also updating averages of the ``EXTRA`` decays and keeping the raw weights it swaps
        out for validation."""
        current: Recorded | None = None

        def __init__(self, model, decay):
            super().__init__(model, decay)
            self.extras = {d: WeightAverage(model, d) for d in EXTRA}
            self.raw: dict = {}
            Recorded.current = self

        def update(self, model):
            super().update(model)
            for extra in self.extras.values():
                extra.update(model)

        def applied(self, model):
            self.raw = {n: p.detach().clone() for n, p in model.named_parameters() if n in self.shadow}
            return super().applied(model)

    trainer.WeightAverage = Recorded            # type: ignore[misc]
    work, best = Path(args.work), {}
    started = {"date": dt.date.today().isoformat(), "commit": commit()}

    class Measured(trainer.Trainer):
        def validate(self, source):
            res = super().validate(source)      # the run's average (DECAY): swapped in by the trainer
            average = Recorded.current
            assert average is not None
            row = {"epoch": len(self.history) + 1, f"ema{DECAY}": res["rsum"]}
            variants = {"raw": average.raw, **{f"ema{d}": e.shadow for d, e in average.extras.items()}}
            for tag, weights in variants.items():
                with weights_swapped(self.model, weights):
                    r = super().validate(source)
                    row[tag] = r["rsum"]
                    if r["rsum"] > best.get(tag, float("-inf")):
                        best[tag] = r["rsum"]
                        save_model(self.model, work / f"model_{tag}.pt", extra={"val": r, "epoch": row["epoch"]})
            row["t"] = round(time.time(), 1)
            with open(work / "variants.jsonl", "a") as fh:
                fh.write(json.dumps(row) + "\n")
            print("variants", row, flush=True)
            return res

    cfg = load_config(REPO / "configs" / "flickr8k.yaml", overrides=[f"train.ema={DECAY}"])
    t0 = time.time()
    summary = Measured(cfg, args.data, work, progress=False).run()
    (work / "run.json").write_text(json.dumps({**summary, "wall_s": round(time.time() - t0, 1), **started,
                                               "threads": torch.get_num_threads()}) + "\n")
    return 0


def cmd_record(args) -> int:
    from flickr8k_levers import hardware
    from flickr8k_seeds import dev_metrics

    work = Path(args.work)
    epochs = [json.loads(line) for line in (work / "variants.jsonl").read_text().splitlines()]
    run = json.loads((work / "run.json").read_text())
    rows = []
    for tag, model in (("raw", work / "model_raw.pt"), (f"ema{DECAY}", work / "model.pt"),
                       *((f"ema{d}", work / f"model_ema{d}.pt") for d in EXTRA)):
        curve = [e[tag] for e in epochs]
        same = [r["variant"] for r in rows if r["val_rsum_by_epoch"] == curve and r["variant"] != "raw"]
        # while (1 + n) / (10 + n) < decay the warm-up sets the average (WeightAverage), so in a short run averages
        # of different decays are the same weights: one that validated as another at every epoch is not evaluated
        metrics = {"same_as": same[0]} if same else dev_metrics(model, args.data)
        rows.append({"variant": tag, **metrics, "val_rsum_by_epoch": curve})
        print(json.dumps(rows[-1]), flush=True)
    data = {"rows": rows, "epochs": len(epochs), "wall_min": round(run["wall_s"] / 60, 1),
            "hardware": hardware(args.note), "date": run["date"], "commit": run["commit"]}
    write_json(RESULTS, data)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("run", "record"):
        p = sub.add_parser(name)
        p.add_argument("--data", required=True, help="the Flickr8k folder")
        p.add_argument("--work", required=True, help="the run directory")
        p.add_argument("--note", default="", help="appended to the hardware column")
    args = ap.parse_args(argv)
    return {"run": cmd_run, "record": cmd_record}[args.cmd](args)


if __name__ == "__main__":
    raise SystemExit(main())
