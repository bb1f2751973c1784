"""Speed of the RCN capsule GRUs: torch's fused GRU kernel (``CapsuleGRUs``, cuDNN on CUDA) against RCN eqs. 1-4
written out step by step (``capsule_grus_stepwise``, the per-word loop the model used before), forward +
backward, and a whole RCN-0.05 text encoder at paper size (4 capsules, 4 recursions, 300-d words, 1024-d GRUs).

    python benchmarks/rcn_speed.py [--device cuda] [--batch 128] [--words 16] [--repeats 5]

Prints one Markdown table; ratios are measured in the same run. On CUDA the timed region runs under bf16
autocast, as training does (``train.amp: auto``).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from training.config import build_config  # noqa: E402
from training.models.rcn import CapsuleGRUs, RecurrentCapsuleNetwork, capsule_grus_stepwise  # noqa: E402


def best_of(fn, repeats: int, device: torch.device) -> float:
    """Fastest of ``repeats`` timed calls after one warm-up call."""
    times = []
    for i in range(repeats + 1):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            out = fn()
        out.float().sum().backward()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - start)
    return min(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--words", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    lengths = torch.randint(args.words // 2, args.words + 1, (args.batch,))

    print(f"device {device}, batch {args.batch}, up to {args.words} words, best of {args.repeats}, forward + backward")
    print("| what | fused s | step by step s | step by step / fused |")
    print("|---|---|---|---|")
    for name, capsules, in_dim, hidden, activation in [("embedding GRUs, 4 × 1024-d", 4, 300, 1024, "tanh"),
                                                       ("mask GRUs, 4 × 300-d", 4, 300, 300, "sigmoid")]:
        caps = CapsuleGRUs(capsules, in_dim, hidden, activation).to(device)
        x = torch.randn(capsules, args.batch, args.words, in_dim, device=device)
        fused = best_of(lambda: caps(x, lengths), args.repeats, device)
        stepwise = best_of(lambda: capsule_grus_stepwise(caps, x, lengths), args.repeats, device)
        print(f"| {name} | {fused:.4f} | {stepwise:.4f} | {stepwise / fused:.2f} |")

    cfg = build_config({"text": {"encoder": "rcn", "word_dim": 300, "hidden": 1024, "dropout": 0.0,
                                 "options": {"capsules": 4, "recursions": 4}}}).text
    rcn = RecurrentCapsuleNetwork(5000, cfg).to(device)
    ids = torch.randint(4, 5000, (args.batch, args.words), device=device)
    fused = best_of(lambda: rcn(ids, lengths), args.repeats, device)
    rcn.emb_grus.forward = lambda x, l: capsule_grus_stepwise(rcn.emb_grus, x, l)       # noqa: E731
    rcn.mask_grus.forward = lambda x, l: capsule_grus_stepwise(rcn.mask_grus, x, l)     # noqa: E731
    stepwise = best_of(lambda: rcn(ids, lengths), args.repeats, device)
    print(f"| RCN-0.05 encoder (4 capsules, 4 recursions) | {fused:.4f} | {stepwise:.4f} | {stepwise / fused:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
