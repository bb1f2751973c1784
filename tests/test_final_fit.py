"""The final fit (``train.fit_on: train+val``): the recipe chosen with val held out, then trained on train and val
together, every epoch run and the last one kept; what is fitted after training (the concept head's photos, the
query bank's draw) follows the model's ``fit_on``."""
import json

import pytest

from conftest import tiny_config
from service.cli import main as cli_main
from training.cli import _train_split
from training.config import load_config
from training.data.datasets import load_dataset
from training.inference.querybank import carried
from training.models.checkpoint import load_checkpoint, load_model
from training.trainer import Trainer
from training.train import train


def _quiet(*_args):
    pass


def test_splits_joins_splits_in_order_renumbered_and_keeps_the_original_ids(synth_small):
    data = load_dataset(synth_small)
    both = data.splits(("train", "val"))
    train, val = data.split("train"), data.split("val")
    assert both.n_images == train.n_images + val.n_images and both.name.endswith(":train+val")
    assert [r.split for r in both.images] == ["train"] * train.n_images + ["val"] * val.n_images
    assert [r.image_id for r in both.images] == list(range(both.n_images))
    assert [r.extra["orig_image_id"] for r in both.images] == \
        [r.extra["orig_image_id"] for r in (*train.images, *val.images)]
    assert data.split("val").name == data.splits(("val",)).name
    with pytest.raises(ValueError, match="unknown split 'dev2'"):
        data.splits(("train", "dev2"))


def test_final_fit_trains_on_train_and_val_and_keeps_the_last_epoch(synth_small, tmp_path):
    cfg = tiny_config(train={"epochs": 3, "fit_on": "train+val", "patience": 1})
    data = load_dataset(synth_small)
    trainer = Trainer(cfg, data, tmp_path / "t", progress=False, log=_quiet)
    n_train, n_val = data.split("train").n_images, data.split("val").n_images
    assert trainer.train_set.n_images == n_train + n_val and trainer.val_set.n_images == n_val
    assert len(trainer.train_cap_to_img) == trainer.train_set.n_captions     # every val caption is a training pair

    summary = train(cfg, synth_small, tmp_path / "run", progress=False, log=_quiet)
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    # patience 1 would stop a selected run at the first epoch without a val gain; a final fit runs every epoch
    assert [r["epoch"] for r in log] == [1, 2, 3] and all(r["val_seen"] and r["best"] for r in log)
    assert summary["best_val_rsum"] is None and summary["val_seen"] is True
    extra = load_checkpoint(tmp_path / "run" / "model.pt")["extra"]
    assert extra["epoch"] == 3 and extra["val_seen"] is True


def test_a_model_selected_on_val_is_unchanged(synth_small, tmp_path):
    summary = train(tiny_config(train={"epochs": 1}), synth_small, tmp_path, progress=False, log=_quiet)
    record = json.loads((tmp_path / "log.jsonl").read_text().splitlines()[0])
    assert "val_seen" not in record and "val_seen" not in summary
    assert summary["best_val_rsum"] == record["val"]["rsum"]


def test_fit_on_is_checked(tmp_path):
    with pytest.raises(ValueError, match="train.fit_on"):
        load_config(None, ["train.fit_on=trainval"])
    with pytest.raises(ValueError, match="plateau"):
        load_config(None, ["train.fit_on=train+val", "train.lr_schedule=plateau"])
    assert load_config(None).train.fit_on == "train"


def test_the_query_bank_is_drawn_from_the_photos_the_model_was_fitted_on(synth_small, tmp_path):
    data = load_dataset(synth_small)
    assert _train_split(str(synth_small)).n_images == data.split("train").n_images
    assert _train_split(str(synth_small), splits=("train", "val")).n_images == data.splits(("train", "val")).n_images
    every = data.splits(("train", "val")).n_captions
    val_only = {c for r in data.split("val").images for c in r.captions} - \
        {c for r in data.split("train").images for c in r.captions}
    assert val_only         # captions only val has: what tells the two draws apart
    for fit_on in ("train", "train+val"):
        run = tmp_path / fit_on
        train(tiny_config(train={"epochs": 1, "fit_on": fit_on}), synth_small, run, progress=False, log=_quiet)
        assert cli_main(["querybank", "--model", str(run / "model.pt"), "--data", str(synth_small),
                         "--captions", str(every), "--images", "0"]) == 0
        drawn = set(carried(load_model(run / "model.pt"))["captions"])
        assert bool(drawn & val_only) == (fit_on == "train+val")


def test_evaluate_warns_on_a_split_the_model_was_trained_on(synth_small, tmp_path, capsys):
    run = tmp_path / "run"
    train(tiny_config(train={"epochs": 1, "fit_on": "train+val"}), synth_small, run, progress=False, log=_quiet)
    for split, seen in (("val", True), ("test", False)):
        out = tmp_path / f"{split}.json"
        capsys.readouterr()
        assert cli_main(["evaluate", "--model", str(run / "model.pt"), "--data", str(synth_small), "--split", split,
                         "--quiet", "--no-generation", "--out", str(out)]) == 0
        warned = "was trained on the val split (train.fit_on: train+val)" in capsys.readouterr().err
        assert warned == seen and json.loads(out.read_text()).get("trained_on_split", False) == seen
