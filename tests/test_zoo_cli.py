"""``jointspace evaluate`` writes the new metrics; ``jointspace compose`` ranks images for image ± words;
training honours the optimiser and learning-rate schedule settings (W2VV §III-B, BiR §6.3)."""
import json

import pytest
import torch

from service.cli import main
from training.config import ConfigError, load_config
from training.train import build_optimizer, build_scheduler, train

from conftest import tiny_config


@pytest.fixture(scope="module")
def w2vv_run(synth_small, tmp_path_factory):
    """A W2VV model (no projection, MSE, RMSprop, plateau schedule) trained 2 epochs on the small CNN."""
    out = tmp_path_factory.mktemp("w2vv")
    cfg = tiny_config(text={"encoder": "w2vv", "word_dim": 16, "hidden": 24, "options": {"out_dim": 64}},
                      model={"projection": "none", "embed_dim": 64}, loss={"name": "mse"},
                      train={"epochs": 2, "optimizer": "rmsprop", "lr": 1e-3, "lr_schedule": "plateau"})
    train(cfg, synth_small, out, progress=False, log=lambda *_: None)
    return out / "model.pt"


def test_evaluate_cli_writes_bir_and_w2vv_metrics(w2vv_run, synth_small, tmp_path, capsys):
    out = tmp_path / "eval.json"
    assert main(["evaluate", "--model", str(w2vv_run), "--data", str(synth_small), "--split", "test",
                 "--out", str(out), "--workers", "0", "--quiet"]) == 0
    result = json.loads(out.read_text())
    assert set(result["rk_variants"]) == {"i2t", "t2i"}
    assert set(result["rk_variants"]["i2t"]) == {"1st_txt", "rnd_txt", "avg_txt", "any_txt"}
    assert 0 <= result["rprecision5"] <= 100 and 0 < result["mir"]["i2t"] <= 1
    # any_txt is the usual image→text recall
    assert result["rk_variants"]["i2t"]["any_txt"]["r5"] == pytest.approx(result["i2t"]["r5"], abs=1e-3)
    assert "MIR" in capsys.readouterr().out


def test_compose_cli_ranks_images(w2vv_run, synth_small, tmp_path, capsys):
    data = json.loads((synth_small / "dataset.json").read_text())
    query = synth_small / next(i for i in data["images"] if i["split"] == "val")["filename"]
    query = next(synth_small.rglob(query.name))
    out = tmp_path / "ranking.json"
    assert main(["compose", "--model", str(w2vv_run), "--image", str(query), "--add", "red circle",
                 "--subtract", "blue square", "--data", str(synth_small), "--split", "val", "--top", "3",
                 "--out", str(out), "--quiet"]) == 0
    ranking = json.loads(out.read_text())["ranking"]
    assert [r["rank"] for r in ranking] == [1, 2, 3]
    assert ranking[0]["score"] >= ranking[1]["score"] >= ranking[2]["score"]
    assert main(["compose", "--model", str(w2vv_run), "--image", str(query), "--add", " ",
                 "--data", str(synth_small)]) == 2          # an empty word is a clear error


def test_plateau_schedule_halves_after_three_flat_epochs():
    t = tiny_config(train={"lr_schedule": "plateau", "lr_decay_factor": 0.5, "lr_plateau_patience": 3}).train
    opt = build_optimizer(t.model_copy(update={"optimizer": "rmsprop"}), [torch.nn.Parameter(torch.zeros(1))], 1e-4)
    assert opt.defaults["alpha"] == 0.9 and opt.defaults["eps"] == 1e-6           # W2VV §III-B
    sched = build_scheduler(t, opt)
    lrs = []
    for rsum in [10, 11, 11, 11, 11, 12]:
        sched.step(rsum)
        lrs.append(opt.param_groups[0]["lr"])
    assert lrs == pytest.approx([1e-4, 1e-4, 1e-4, 1e-4, 5e-5, 5e-5])


def test_plateau_patience_below_one_is_rejected():
    # torch's patience is ours - 1: 0 would drop the lr after every epoch, improving or not
    for bad in (0, -1, 1.5):
        with pytest.raises(ConfigError, match="lr_plateau_patience"):
            load_config(None, overrides=[f"train.lr_plateau_patience={bad}"])
    t = tiny_config(train={"lr_schedule": "plateau", "lr_decay_factor": 0.5, "lr_plateau_patience": 1}).train
    opt = build_optimizer(t, [torch.nn.Parameter(torch.zeros(1))], 1e-4)
    sched = build_scheduler(t, opt)
    lrs = []
    for rsum in [10, 11, 12, 12, 13]:
        sched.step(rsum)
        lrs.append(opt.param_groups[0]["lr"])
    assert lrs == pytest.approx([1e-4, 1e-4, 1e-4, 5e-5, 5e-5])     # only the flat epoch drops it


def test_linear_schedule_reaches_final_factor():
    t = tiny_config(train={"lr_schedule": "linear", "lr_decay_epochs": 4, "lr_final_factor": 0.01}).train
    opt = build_optimizer(t.model_copy(update={"optimizer": "sgd"}), [torch.nn.Parameter(torch.zeros(1))], 1e-3)
    assert isinstance(opt, torch.optim.SGD) and opt.defaults["momentum"] == 0
    sched = build_scheduler(t, opt)
    lrs = [opt.param_groups[0]["lr"]]
    for _ in range(6):
        opt.step()
        sched.step()
        lrs.append(opt.param_groups[0]["lr"])
    assert lrs == pytest.approx([1e-3, 0.7525e-3, 0.505e-3, 0.2575e-3, 1e-5, 1e-5, 1e-5])
