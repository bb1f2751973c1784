"""The projections under mixed precision, and the pairing-leak probe of benchmarks/pairing_leak_check.py."""
import importlib.util
from pathlib import Path

import torch
from torch import nn

from training.config import load_config
from training.models.config_schema import ModelSection
from training.models.projection import Float32BatchNorm1d, build_projection

ROOT = Path(__file__).resolve().parents[1]


def load_probe():
    spec = importlib.util.spec_from_file_location("pairing_leak_check", ROOT / "benchmarks" / "pairing_leak_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_float32_batchnorm_normalises_in_float32_under_autocast():
    torch.manual_seed(0)
    ours, plain = Float32BatchNorm1d(8), nn.BatchNorm1d(8)
    plain.load_state_dict(ours.state_dict())
    x = (torch.randn(16, 8) * 3 + 1).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = ours(x)
    assert out.dtype == torch.float32
    assert torch.equal(out, plain(x.float()))
    assert torch.equal(ours.running_mean, plain.running_mean) and torch.equal(ours.running_var, plain.running_var)
    assert ours.running_mean.dtype == torch.float32


def test_two_branch_checkpoints_with_plain_batchnorm_still_load():
    cfg = {"embed_dim": 6, "projection_hidden": 10, "projection_dropout": 0.5}
    old = nn.Sequential(nn.Linear(4, 10), nn.ReLU(), nn.Dropout(0.5), nn.Linear(10, 6), nn.BatchNorm1d(6))
    new = build_projection(ModelSection.model_validate(cfg), 4, "two_branch")
    new.load_state_dict(old.state_dict(), strict=True)
    old.eval(), new.eval()
    x = torch.randn(3, 4)
    assert torch.equal(old(x), new(x))


class PositionTagged(nn.Module):
    """A deliberately broken branch, as a buggy kernel could be: adds a vector chosen by the row's batch
    position, the same table in both branches."""

    def __init__(self, inner: nn.Module, batch: int, dim: int):
        super().__init__()
        self.inner = inner
        self.register_buffer("tag", torch.randn(batch, dim, generator=torch.Generator().manual_seed(7)))

    def forward(self, x):
        return self.inner(x) + self.tag[:x.shape[0]]


def test_the_probe_catches_a_position_leak_and_passes_the_two_branch_projection():
    probe = load_probe()
    cfg = load_config(ROOT / "configs" / "zoo" / "twobranch_k10.yaml",
                      overrides=["model.embed_dim=32", "model.projection_hidden=64", "train.lr=0.01"])
    batch, img_dim, txt_dim, cpu = cfg.train.batch_size, 24, 12, torch.device("cpu")
    torch.manual_seed(0)
    honest = probe.unpaired_training(cfg, build_projection(cfg.model, img_dim),
                                     build_projection(cfg.model, txt_dim), 120, batch, img_dim, txt_dim,
                                     amp=False, device=cpu, seed=3)
    torch.manual_seed(0)
    leaky = probe.unpaired_training(cfg, PositionTagged(build_projection(cfg.model, img_dim), batch, 32),
                                    PositionTagged(build_projection(cfg.model, txt_dim), batch, 32), 120,
                                    batch, img_dim, txt_dim, amp=False, device=cpu, seed=3)
    floor = probe.equal_similarity_loss(cfg, batch)          # margin · k · B · (1 + λ) for K-hardest
    assert abs(floor - 0.1 * 10 * batch * 1.1) < 1e-3
    def last(ls): return sum(ls[-20:]) / 20
    assert last(honest) > 0.9 * floor                  # nothing to learn from unpaired inputs
    assert last(leaky) < 0.2 * floor                   # the batch position alone pairs them
    assert probe.order_equivariance_error(build_projection(cfg.model, img_dim), img_dim, batch, False, cpu) < 1e-5
