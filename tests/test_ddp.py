"""Multi-process training (DistributedDataParallel, gloo on CPU; docs/scale.md#ddp-training).

Two processes with gathered negatives and a global batch of 16 (8 per process) train as one process with a
batch of 16: the same weights after every epoch up to float32 rounding, also across a DDP run cut after its
first epoch and resumed. Only rank 0 writes the run directory.
"""
import json
import subprocess
import sys

import pytest
import torch

from conftest import tiny_config

# The two runs compute the same sums in a different order: per-process partial sums of the gradients,
# averaged over the processes, against one sum over the whole batch (and the text encoder pads each
# process's captions to its own longest one). Those float32 rounding differences (about 1e-7 relative)
# go through 6 Adam updates of lr 1e-3; Adam divides by the gradient's running RMS, so a rounding change
# in a small gradient can move a weight by a few times 1e-7. 1e-5 (absolute, on weights of order 0.1-1)
# leaves room for that and is still 100 times smaller than the difference a different batch makes
# (checked below with 8 captions per step, what each process would see without gathering).
TOL = 1e-5


def ddp_config(**train):
    # max_violation: the hardest negative in the batch, the loss that gathering is for. The backbone is frozen
    # (BatchNorm in eval mode): in training mode it normalises with each process's share of the batch.
    return tiny_config(loss={"name": "max_violation", "margin": 0.2},
                       train={"epochs": 2, "max_steps_per_epoch": 3, "batch_size": 16, "freeze": ["backbone"],
                              "gather_negatives": True, "device": "cpu", "patience": 5, **train})


def jointspace(*args):
    return subprocess.run([sys.executable, "-m", "service.cli", *args], capture_output=True, text=True,
                          timeout=300)


def weights(run):
    from training.train import load_train_state

    return load_train_state(run)["model"]


def max_diff(a, b):
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a if a[k].is_floating_point())


def records(run):
    return [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]


def test_two_processes_with_gathered_negatives_train_as_one_process_and_resume(synth_small, tmp_path):
    from training.config import dump_config
    from training.train import load_train_state, train

    quiet = lambda *_: None  # noqa: E731
    cfg = ddp_config()
    (tmp_path / "cfg.yaml").write_text(dump_config(cfg))
    train(ddp_config(epochs=1), synth_small, tmp_path / "one_1", progress=False, log=quiet)
    train(cfg, synth_small, tmp_path / "one", progress=False, log=quiet)
    train(ddp_config(batch_size=8, max_steps_per_epoch=6), synth_small, tmp_path / "b8", progress=False, log=quiet)

    # two processes, the first epoch only; then --resume for the second
    ddp = tmp_path / "ddp"
    common = ["--data", str(synth_small), "--out", str(ddp), "--nproc", "2", "--quiet"]
    done = jointspace("train", "--config", str(tmp_path / "cfg.yaml"), "--set", "train.epochs=1", *common)
    assert done.returncode == 0, done.stderr[-3000:]
    state = load_train_state(ddp)
    assert state["world_size"] == 2 and len(state["rng_ranks"]) == 2 and state["epoch"] == 1
    assert max_diff(weights(ddp), weights(tmp_path / "one_1")) < TOL
    assert len(records(ddp)) == 1 and sorted(p.name for p in ddp.iterdir()) == [
        "config.yaml", "last.pt", "log.jsonl", "model.pt"]

    done = jointspace("train", "--resume", "--set", "train.epochs=2", *common)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resuming" in done.stdout and "[main 2/2]" in done.stdout and done.stdout.count("[main 2/2]") == 1
    got, want = records(ddp), records(tmp_path / "one")
    assert [(r["stage"], r["epoch"], r["lr"]) for r in got] == [(r["stage"], r["epoch"], r["lr"]) for r in want]
    assert all(abs(g["loss"] - w["loss"]) <= 1e-4 * abs(w["loss"]) for g, w in zip(got, want))
    final, reference = weights(ddp), weights(tmp_path / "one")
    assert max_diff(final, reference) < TOL
    # the tolerance discriminates: a different batch composition (8 captions per update) lands 100x farther away,
    # and the weights moved during the second epoch by far more than the tolerance
    assert max_diff(weights(tmp_path / "b8"), reference) > 100 * TOL
    assert max_diff(reference, weights(tmp_path / "one_1")) > 100 * TOL


def test_sharded_batches_are_the_one_process_batches_split_in_rank_order():
    from torch.utils.data import BatchSampler, RandomSampler

    from training.distributed import ShardedBatches

    def batches(generator_seed, rank=None):
        sampler = RandomSampler(range(37), generator=torch.Generator().manual_seed(generator_seed))
        full = BatchSampler(sampler, 12, drop_last=True)
        return list(full) if rank is None else list(ShardedBatches(full, rank, 3))

    whole = batches(5)
    shards = [batches(5, rank) for rank in range(3)]
    assert len(whole) == 3 and all(len(s) == 3 for s in shards)
    assert [sum((s[i] for s in shards), []) for i in range(3)] == whole
    assert all(len(b) == 4 for s in shards for b in s)
    with pytest.raises(ValueError, match="multiple"):
        ShardedBatches(BatchSampler(range(10), 5, drop_last=True), 0, 2)


def test_train_nproc_refuses_what_several_processes_cannot_train(synth_small, tmp_path, capsys, monkeypatch):
    from service.cli import main

    base = ["train", "--config", "configs/demo.yaml", "--data", str(synth_small), "--out", str(tmp_path / "r"),
            "--nproc", "2"]
    cases = [(["--set", "train.batch_size=15"], "multiple of the 2 processes"),
             (["--set", "scst.steps=5", "--set", "decoder.enabled=true"], "runs in one process"),
             (["--set", "train.gather_negatives=true", "--set", "decoder.enabled=true"], "retrieval trainer"),
             (["--set", "loss.distill_from=[teacher.pt]"], "loss.distill_from runs in one process")]
    for extra, message in cases:
        assert main(base + extra) == 2
        assert message in capsys.readouterr().err
    assert main(base[:-1] + ["0"]) == 2
    assert "--nproc must be at least 1" in capsys.readouterr().err
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(base) == 2
    assert "already one of several" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
