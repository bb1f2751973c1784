"""Optimisers and learning-rate schedules of the training stages (STT §4.2 Adam with a step, W2VV §III-B RMSprop
with a plateau, BiR §6.3 SGD with a linear decay, a cosine schedule with warm-up), per-group learning rates for
pretrained encoder weights, and sparse gradients for lookup layers under plain SGD."""
from __future__ import annotations

import contextlib
import math

import torch

from training.models.config_schema import TrainSection
from training.models.factory import pretrained_prefixes
from training.models.model import JointEmbedding


def use_sparse_gradients(model: torch.nn.Module, train: TrainSection) -> list[str]:
    """With plain SGD and no weight decay (BiR §6.3), lookup layers (the n-gram EmbeddingBag, 50,000 × 1,000)
    get sparse gradients: a step then touches the rows of the batch's features instead of the whole matrix,
    with the same update. Adam/RMSprop keep dense gradients (their state decays every row each step)."""
    if train.optimizer != "sgd" or train.weight_decay:
        return []
    names = []
    for name, module in model.named_modules():
        if isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and module.weight.requires_grad:
            module.sparse = True
            names.append(name)
    return names


def param_groups(model: JointEmbedding, encoder_lr_factor: float) -> list[dict]:
    """The trainable parameters; with ``encoder_lr_factor`` != 1 the pretrained encoder weights (a pretrained
    backbone, MiniLM's layers: the prefixes their registry entries name) form a second group whose lr is that
    multiple of the stage's (``lr_scale``)."""
    prefixes = pretrained_prefixes(model.cfg.image, model.cfg.text)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    pretrained = [p for n, p in named if n.startswith(prefixes)]
    if encoder_lr_factor == 1.0 or not pretrained:
        return [{"params": [p for _, p in named], "lr_scale": 1.0}]
    heads = [p for n, p in named if not n.startswith(prefixes)]
    return [g for g in ({"params": heads, "lr_scale": 1.0}, {"params": pretrained, "lr_scale": encoder_lr_factor})
            if g["params"]]


def build_optimizer(train: TrainSection, params, lr: float) -> torch.optim.Optimizer:
    """``params``: tensors, or groups whose ``lr_scale`` multiplies ``lr``."""
    params = list(params)
    if params and isinstance(params[0], dict):
        params = [{**g, "lr": lr * g.get("lr_scale", 1.0)} for g in params]
    opts = dict(train.optimizer_options)
    if train.optimizer == "rmsprop":     # W2VV §III-B: RMSprop, γ = 0.9, ε = 1e-6
        return torch.optim.RMSprop(params, lr=lr, weight_decay=train.weight_decay,
                                   **{"alpha": 0.9, "eps": 1e-6, **opts})
    if train.optimizer == "sgd":         # BiR §6.3: plain SGD, no momentum
        return torch.optim.SGD(params, lr=lr, weight_decay=train.weight_decay, **opts)
    return torch.optim.Adam(params, lr=lr, weight_decay=train.weight_decay, **opts)


def cosine_factor(step: int, total: int, warmup: int, final: float) -> float:
    """Linear warm-up over ``warmup`` updates, then a half cosine from 1 down to ``final`` at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return final + (1.0 - final) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(train: TrainSection, optimizer: torch.optim.Optimizer, total_steps: int = 1):
    """``total_steps``: the stage's updates (the cosine schedule steps per update, the others per epoch)."""
    if train.lr_schedule == "cosine":    # SGDR-style half cosine after a linear warm-up (as VSE∞ trains)
        warmup, final = train.warmup_steps, train.lr_final_factor
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: cosine_factor(s, total_steps, warmup, final))
    if train.lr_schedule == "plateau":   # W2VV §III-B: halve the lr after 3 epochs without val improvement
        return torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="max", factor=train.lr_decay_factor,
                                                          patience=train.lr_plateau_patience - 1)
    if train.lr_schedule == "linear":    # BiR §6.3: lr decreases linearly to lr_final_factor over the horizon
        horizon, final = max(1, train.lr_decay_epochs), train.lr_final_factor
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda e: 1.0 - (1.0 - final) * min(e, horizon) / horizon)
    # STT §4.2: the learning rate drops once, by lr_decay_factor, after lr_decay_epochs epochs
    return torch.optim.lr_scheduler.MultiStepLR(optimizer, [train.lr_decay_epochs], train.lr_decay_factor)


@contextlib.contextmanager
def weights_swapped(model: torch.nn.Module, weights: dict[str, torch.Tensor]):
    """Inside, the parameters of ``model`` named in ``weights`` hold those tensors; on leaving (also on an error),
    their own values again."""
    params = dict(model.named_parameters())
    own = {n: params[n].detach().clone() for n in weights}
    try:
        with torch.no_grad():
            for name, value in weights.items():
                params[name].copy_(value)
        yield model
    finally:
        with torch.no_grad():
            for name, value in own.items():
                params[name].copy_(value)


class WeightAverage:
    """An exponential moving average of the trained weights (Polyak averaging; ``train.ema``): after every update
    ``w̄ ← d·w̄ + (1 − d)·w`` with ``d = min(decay, (1 + n) / (10 + n))`` after ``n`` updates, so the first
    updates are not weighed against the initial weights for long. Validation and the kept checkpoint use the
    averaged weights (:meth:`applied`); the optimiser goes on from the raw ones."""

    def __init__(self, model: torch.nn.Module, decay: float):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"weight averaging needs a decay in (0, 1), got {decay}")
        self.decay, self.updates = decay, 0
        self.shadow = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        self.updates += 1
        keep = min(self.decay, (1 + self.updates) / (10 + self.updates))
        params = dict(model.named_parameters())
        for name, avg in self.shadow.items():
            avg.lerp_(params[name].detach(), 1.0 - keep)

    def applied(self, model: torch.nn.Module):
        """Inside, ``model`` holds the averaged weights; on leaving, its own again."""
        return weights_swapped(model, self.shadow)

    def state_dict(self) -> dict:
        return {"decay": self.decay, "updates": self.updates,
                "shadow": {n: t.detach().cpu() for n, t in self.shadow.items()}}

    def load_state_dict(self, state: dict) -> None:
        if set(state["shadow"]) != set(self.shadow):
            raise ValueError("the saved weight average covers other parameters than this stage trains")
        self.updates = int(state["updates"])
        for name, t in state["shadow"].items():
            self.shadow[name].copy_(t)
