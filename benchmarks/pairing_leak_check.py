"""Can a model's training forward pass match image i to caption i when the pairs carry no information?

Trains a zoo config's projections and loss on *unpaired* random inputs: every step draws fresh image features
and fresh captions, independent of each other, so no model can rank "its" caption first. For the losses that
sum a fixed number of hinges per anchor (``sum``, ``max_violation``, ``khardest``) the expected loss of such
a model cannot fall below its value when every similarity is equal (the "floor": each hinge is then the margin,
and the positive is exchangeable with the negatives, so the mean hinge over the candidates is at least m). A
loss well below the floor means the training forward pass leaks the batch position between the two branches (a
row-index-dependent kernel, shared random masks, …): the shortcut that a collapse in training shows as a
near-zero loss while validation stays at chance.

    python benchmarks/pairing_leak_check.py [--config configs/zoo/twobranch_k10.yaml] [--device cuda]

Variants, each from the same initial weights and the same random stream: float32; bf16 autocast with the
projection's BatchNorm in float32 (``Float32BatchNorm1d``, what training runs); bf16 autocast with a plain
``nn.BatchNorm1d`` (whatever the device's autocast does with it). It also reports whether the train-mode
projection is equivariant to the batch order (rows permuted in, rows permuted out; dropout off for that check).
Prints one Markdown table; "last / floor" near or above 1 is healthy, far below 1 is a leak.
"""
from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from training.config import load_config  # noqa: E402
from training.models.config_schema import RunConfig  # noqa: E402
from training.models.factory import build_loss, build_similarity  # noqa: E402
from training.models.projection import Float32BatchNorm1d, build_projection  # noqa: E402


def plain_bn(module: nn.Module) -> nn.Module:
    """``module`` with every Float32BatchNorm1d replaced in place by a plain nn.BatchNorm1d (same state)."""
    for name, child in list(module.named_children()):
        if isinstance(child, Float32BatchNorm1d):
            bn = nn.BatchNorm1d(child.num_features, child.eps, child.momentum).to(child.weight.device)
            bn.load_state_dict(child.state_dict())
            setattr(module, name, bn)
        else:
            plain_bn(child)
    return module


BOUNDED_LOSSES = ("sum", "max_violation", "khardest")


def equal_similarity_loss(cfg: RunConfig, batch: int) -> float:
    """The floor: the configured loss on a batch whose similarities are all equal."""
    return build_loss(cfg.loss)(torch.zeros(batch, batch)).item()


def unpaired_training(cfg: RunConfig, img_proj: nn.Module, txt_proj: nn.Module, steps: int, batch: int,
                      img_dim: int, txt_dim: int, amp: bool, device: torch.device, seed: int) -> list[float]:
    """Losses of ``steps`` optimiser steps on independent random images and captions."""
    similarity = build_similarity(cfg.model.similarity)
    loss_fn = build_loss(cfg.loss)
    params = list(img_proj.parameters()) + list(txt_proj.parameters())
    opt = torch.optim.Adam(params, lr=cfg.train.lr)
    img_proj.train(), txt_proj.train()
    g = torch.Generator(device="cpu").manual_seed(seed)
    losses = []
    for _ in range(steps):
        images = torch.randn(batch, img_dim, generator=g).relu().to(device)   # like pooled CNN features
        captions = torch.randn(batch, txt_dim, generator=g).mul(0.4).to(device)  # like mean word vectors
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            sim = similarity(similarity.normalize(img_proj(images)), similarity.normalize(txt_proj(captions)))
            loss = loss_fn(sim)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def order_equivariance_error(proj: nn.Module, dim: int, batch: int, amp: bool, device: torch.device) -> float:
    """max |f(x)[perm] − f(x[perm])| in train mode with dropout off (batch statistics on, as in training)."""
    proj = copy.deepcopy(proj).train()
    for m in proj.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
    g = torch.Generator(device="cpu").manual_seed(1)
    x = torch.randn(batch, dim, generator=g).relu().to(device)
    perm = torch.randperm(batch, generator=g).to(device)
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
        a, b = proj(x)[perm].float(), proj(x[perm]).float()
    return (a - b).abs().max().item()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/zoo/twobranch_k10.yaml")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--image-dim", type=int, default=1280, help="EfficientNet-Lite0 pooled features")
    ap.add_argument("--text-dim", type=int, default=None, help="default: the config's text.word_dim")
    args = ap.parse_args()
    device = torch.device(args.device)
    cfg = load_config(args.config)
    batch, txt_dim = cfg.train.batch_size, args.text_dim or cfg.text.word_dim
    if cfg.loss.name not in BOUNDED_LOSSES:
        ap.error(f"loss '{cfg.loss.name}' selects its triplets, so it has no floor; use a config whose loss "
                 f"is one of {', '.join(BOUNDED_LOSSES)} (e.g. with --config and the same model section)")
    torch.manual_seed(0)
    img0 = build_projection(cfg.model, args.image_dim).to(device)
    txt0 = build_projection(cfg.model, txt_dim).to(device)
    floor = equal_similarity_loss(cfg, batch)
    print(f"{args.config} on {device}: batch {batch}, {args.steps} steps of unpaired random inputs; "
          f"floor (all similarities equal) {floor:.1f}")
    print("| variant | loss, first 20 steps | loss, last 20 steps | last / floor | batch-order error |")
    print("|---|---|---|---|---|")
    on_cpu = " (CPU autocast)" if device.type == "cpu" else ""
    variants = [("float32", False, lambda m: m), ("bf16 autocast, BatchNorm in float32", True, lambda m: m),
                ("bf16 autocast, plain nn.BatchNorm1d" + on_cpu, True, plain_bn)]
    for name, amp, convert in variants:
        img, txt = convert(copy.deepcopy(img0)), convert(copy.deepcopy(txt0))
        err = max(order_equivariance_error(img, args.image_dim, batch, amp, device),
                  order_equivariance_error(txt, txt_dim, batch, amp, device))
        losses = unpaired_training(cfg, img, txt, args.steps, batch, args.image_dim, txt_dim, amp, device, seed=2)
        first, last = sum(losses[:20]) / 20, sum(losses[-20:]) / 20
        print(f"| {name} | {first:.2f} | {last:.2f} | {last / floor:.3f} | {err:.2e} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
