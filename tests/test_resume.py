"""``jointspace train --resume``: an interrupted run continues from ``last.pt`` and ends as if never stopped;
``last.pt`` is unpickled with ``weights_only=True``."""
import json
from pathlib import Path

import pytest
import torch

from conftest import STT_DECODER, tiny_config


class Interrupt(Exception):
    pass


def stop_after(epoch_text):
    def log(message):
        if str(message).startswith(epoch_text):
            raise Interrupt(message)
    return log


def records(run):
    out = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    for r in out:
        r.pop("elapsed_s")
    return out


def test_an_interrupted_run_resumes_to_the_uninterrupted_result(synth_small, tmp_path):
    from training.models.checkpoint import load_checkpoint
    from training.train import load_train_state, train

    # dropout (global RNG), a step schedule that changes the lr mid-run, and a shuffling sampler all carry state
    cfg = tiny_config(decoder={**STT_DECODER, "dropout": 0.3},
                      train={"epochs": 3, "lr_decay_epochs": 2, "sampling": "image", "patience": 5})
    quiet = lambda *_: None  # noqa: E731
    straight = train(cfg, synth_small, tmp_path / "straight", progress=False, log=quiet)
    with pytest.raises(Interrupt):
        train(cfg, synth_small, tmp_path / "cut", progress=False, log=stop_after("[main 1/3]"))
    assert load_train_state(tmp_path / "cut")["epoch"] == 1
    resumed = train(cfg, synth_small, tmp_path / "cut", progress=False, log=quiet, resume=True)
    assert resumed["epochs_run"] == straight["epochs_run"] == 3
    assert records(tmp_path / "cut") == records(tmp_path / "straight")
    a = load_checkpoint(tmp_path / "straight" / "model.pt")["state_dict"]
    b = load_checkpoint(tmp_path / "cut" / "model.pt")["state_dict"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    la, lb = (load_train_state(tmp_path / r)["model"] for r in ("straight", "cut"))
    assert all(torch.equal(la[k], lb[k]) for k in la)       # the last epoch's weights too, not only the best
    # a finished run resumed trains nothing more
    again = train(cfg, synth_small, tmp_path / "cut", progress=False, log=quiet, resume=True)
    assert again["epochs_run"] == 3 and records(tmp_path / "cut") == records(tmp_path / "straight")


def test_a_run_with_a_cross_batch_memory_uses_it_and_resumes_to_the_uninterrupted_result(synth_small, tmp_path):
    """loss.memory (XBM): the memory changes training after the warm-up epoch, and since every epoch starts with
    it empty, a run cut after epoch 2 ends as the straight run does."""
    from training.train import load_train_state, train

    def cfg(memory):
        return tiny_config(loss={"name": "max_violation", "warmup_epochs": 1, "memory": memory},
                           train={"epochs": 3, "batch_size": 8, "patience": 5})

    quiet = lambda *_: None  # noqa: E731
    straight = train(cfg(48), synth_small, tmp_path / "straight", progress=False, log=quiet)
    train(cfg(0), synth_small, tmp_path / "without", progress=False, log=quiet)
    with pytest.raises(Interrupt):
        train(cfg(48), synth_small, tmp_path / "cut", progress=False, log=stop_after("[main 2/3]"))
    resumed = train(cfg(48), synth_small, tmp_path / "cut", progress=False, log=quiet, resume=True)
    assert resumed["epochs_run"] == straight["epochs_run"] == 3
    assert records(tmp_path / "cut") == records(tmp_path / "straight")
    la, lb, lw = (load_train_state(tmp_path / r)["model"] for r in ("straight", "cut", "without"))
    assert all(torch.equal(la[k], lb[k]) for k in la)
    warm_only = [records(tmp_path / r)[0]["loss"] for r in ("straight", "without")]
    assert warm_only[0] == warm_only[1]                     # epoch 1 is the warm-up: no memory yet
    assert any(not torch.equal(la[k], lw[k]) for k in la)   # afterwards the memory's negatives change the updates


def test_an_interrupted_self_critical_stage_resumes_to_the_uninterrupted_result(synth_small, tmp_path):
    """One eq. 12 epoch, then 6 SCST updates validated every 2; cut after update 4 and resumed."""
    from training.models.checkpoint import load_checkpoint
    from training.train import load_train_state, train

    cfg = tiny_config(decoder={**STT_DECODER, "dropout": 0.3}, train={"epochs": 1, "sampling": "image"},
                      scst={"steps": 6, "eval_every": 2, "images_per_batch": 4, "samples": 3})
    quiet = lambda *_: None  # noqa: E731
    straight = train(cfg, synth_small, tmp_path / "straight", progress=False, log=quiet)
    with pytest.raises(Interrupt):
        train(cfg, synth_small, tmp_path / "cut", progress=False, log=stop_after("[scst 4/6]"))
    state = load_train_state(tmp_path / "cut")
    assert state["stage"] == "scst" and state["scst"]["step"] == 4
    resumed = train(cfg, synth_small, tmp_path / "cut", progress=False, log=quiet, resume=True)
    assert resumed["scst_best_val_cider"] == straight["scst_best_val_cider"]
    got, want = records(tmp_path / "cut"), records(tmp_path / "straight")
    assert [r.get("step") for r in got] == [None, 0, 2, 4, 6] and got == want
    a = load_checkpoint(tmp_path / "straight" / "model.pt")["state_dict"]
    b = load_checkpoint(tmp_path / "cut" / "model.pt")["state_dict"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    la, lb = (load_train_state(tmp_path / r)["model"] for r in ("straight", "cut"))
    assert all(torch.equal(la[k], lb[k]) for k in la)       # the weights after update 6, not only the best


def test_resume_cli_refuses_what_it_cannot_do(synth_small, tmp_path, capsys):
    from service.cli import main

    assert main(["train", "--data", str(synth_small), "--out", str(tmp_path / "none"), "--resume"]) == 2
    assert "nothing to resume" in capsys.readouterr().err
    assert main(["train", "--config", "configs/demo.yaml", "--data", str(synth_small), "--out", str(tmp_path),
                 "--resume"]) == 2
    assert "drop --config" in capsys.readouterr().err
    assert main(["train", "--data", str(synth_small), "--out", str(tmp_path)]) == 2
    assert "--config is required" in capsys.readouterr().err


class _Payload:
    """What a crafted last.pt would run when unpickled without weights_only."""

    def __reduce__(self):
        return (Path.touch, (Path(_Payload.target),))


def test_a_state_file_holding_other_objects_is_refused_never_run(tmp_path):
    """last.pt is read with weights_only=True and numpy's random state allowed: tensors, plain values and numpy
    arrays load; any other pickled object is refused before it could run."""
    import random

    import numpy as np

    from training.run_state import STATE_FORMAT, load_train_state

    run = tmp_path / "run"
    run.mkdir()
    torch.save({"format": STATE_FORMAT, "model": {"w": torch.ones(2)}, "numpy": np.random.get_state(),
                "python": random.getstate(), "history": [{"epoch": 1, "loss": 0.5}]}, run / "last.pt")
    state = load_train_state(run)
    assert state["numpy"][0] == "MT19937" and torch.equal(state["model"]["w"], torch.ones(2))
    _Payload.target = str(tmp_path / "ran")
    torch.save({"format": STATE_FORMAT, "model": {}, "extra": _Payload()}, run / "last.pt")
    with pytest.raises(ValueError, match="holds objects a training state does not"):
        load_train_state(run)
    assert not (tmp_path / "ran").exists()
