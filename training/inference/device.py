"""The device a command or the service runs a model on (``--device``, ``train.device``, ``JOINTSPACE_DEVICE``)."""
from __future__ import annotations

import torch


def resolve_device(name: str) -> torch.device:
    """``auto``: the GPU when CUDA is available, else the CPU; any other name (``cpu``, ``cuda``, ``cuda:1``) as
    torch reads it. RuntimeError for a CUDA device on a machine without one."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device {name!r} asked for but no CUDA device is available")
    return device
