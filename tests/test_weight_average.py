"""``train.ema``: an exponential moving average of the trained weights is what validation sees and what the run
keeps, training goes on from the raw weights, and an interrupted run resumes to the uninterrupted result."""
import json

import pytest
import torch

from conftest import tiny_config
from test_resume import Interrupt, records, stop_after


def test_the_average_follows_its_formula_and_is_swapped_in_and_out():
    from training.optim import WeightAverage

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    net[1].bias.requires_grad_(False)                       # frozen: not averaged, never touched
    frozen = net[1].bias.detach().clone()
    avg = WeightAverage(net, decay=0.9)
    expected = {n: p.detach().clone() for n, p in net.named_parameters() if p.requires_grad}
    for step in range(1, 31):
        with torch.no_grad():
            for p in net.parameters():
                if p.requires_grad:
                    p.add_(torch.randn_like(p))
        avg.update(net)
        keep = min(0.9, (1 + step) / (10 + step))
        for n, p in net.named_parameters():
            if n in expected:
                expected[n] = keep * expected[n] + (1 - keep) * p.detach()
    assert set(avg.shadow) == set(expected) and "1.bias" not in avg.shadow
    raw = {n: p.detach().clone() for n, p in net.named_parameters()}
    with avg.applied(net):
        for n, p in net.named_parameters():
            want = expected.get(n, frozen)
            assert torch.allclose(p, want, atol=1e-6), n
    for n, p in net.named_parameters():                      # the raw weights are back, bit for bit
        assert torch.equal(p, raw[n])
    with pytest.raises(RuntimeError), avg.applied(net):      # also when the body fails
        raise RuntimeError("boom")
    assert all(torch.equal(p, raw[n]) for n, p in net.named_parameters())
    again = WeightAverage(net, decay=0.9)
    again.load_state_dict(avg.state_dict())
    assert again.updates == 30 and all(torch.equal(again.shadow[n], avg.shadow[n]) for n in avg.shadow)
    with pytest.raises(ValueError, match="decay"):
        WeightAverage(net, decay=1.0)


def test_a_run_with_weight_averaging_keeps_the_average_and_resumes_to_the_uninterrupted_result(synth_small,
                                                                                               tmp_path):
    from training.config import load_config
    from training.models.checkpoint import load_checkpoint
    from training.train import load_train_state, train

    def cfg(ema):
        return tiny_config(train={"epochs": 3, "patience": 5, "ema": ema})

    quiet = lambda *_: None  # noqa: E731
    straight = train(cfg(0.9), synth_small, tmp_path / "straight", progress=False, log=quiet)
    train(cfg(0.0), synth_small, tmp_path / "plain", progress=False, log=quiet)
    # the raw weights follow the same path with and without the average: it only changes what is validated and kept
    last, plain = (load_train_state(tmp_path / r) for r in ("straight", "plain"))
    assert all(torch.equal(last["model"][k], plain["model"][k]) for k in plain["model"])
    kept = load_checkpoint(tmp_path / "straight" / "model.pt")["state_dict"]
    shadow = last["weight_average"]["shadow"]
    assert last["weight_average"]["updates"] > 0 and shadow
    assert any(not torch.equal(kept[k], last["model"][k]) for k in shadow)
    # one epoch: its checkpoint is the one kept, and it holds the average, not the raw weights
    train(cfg(0.9).model_copy(update={"train": cfg(0.9).train.model_copy(update={"epochs": 1})}), synth_small,
          tmp_path / "one", progress=False, log=quiet)
    one, kept = load_train_state(tmp_path / "one"), load_checkpoint(tmp_path / "one" / "model.pt")["state_dict"]
    assert all(torch.equal(kept[k], v) for k, v in one["weight_average"]["shadow"].items())
    assert any(not torch.equal(kept[k], one["model"][k]) for k in one["weight_average"]["shadow"])
    assert [r["val"] for r in records(tmp_path / "straight")] != [r["val"] for r in records(tmp_path / "plain")]
    assert load_config(tmp_path / "straight" / "config.yaml").train.ema == 0.9

    with pytest.raises(Interrupt):
        train(cfg(0.9), synth_small, tmp_path / "cut", progress=False, log=stop_after("[main 2/3]"))
    resumed = train(cfg(0.9), synth_small, tmp_path / "cut", progress=False, log=quiet, resume=True)
    assert resumed["epochs_run"] == straight["epochs_run"] == 3
    assert records(tmp_path / "cut") == records(tmp_path / "straight")
    a = load_checkpoint(tmp_path / "straight" / "model.pt")["state_dict"]
    b = load_checkpoint(tmp_path / "cut" / "model.pt")["state_dict"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert json.dumps(straight["best_val_rsum"]) == json.dumps(resumed["best_val_rsum"])


def test_the_decay_is_checked_by_name():
    from training.models.config_schema import ConfigError

    with pytest.raises(ConfigError, match="ema"):
        tiny_config(train={"ema": 1.0})
