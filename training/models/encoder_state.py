"""State a text encoder learns from the training captions (``fit``) and keeps inside ``model.pt``.

An encoder's n-gram table, idf weights or tokenizer is data, not a weight, but ``model.pt`` must hold
everything (it loads with no other file). Such state lives in ``state_dict`` tensors:

* strings (an n-gram list, a tokenizer's JSON) as a ``uint8`` buffer of UTF-8 JSON (:func:`pack_json`);
* tensors whose size ``fit`` decides (an n-gram layer with one row per n-gram kept): a module built for
  loading does not know that size yet, so :func:`resize_to_checkpoint` makes its tensors take the
  checkpoint's shapes before ``load_state_dict`` copies the values in.
"""
from __future__ import annotations

import json
from typing import Any

import torch
from torch import nn


def pack_json(obj: Any) -> torch.Tensor:
    return pack_bytes(json.dumps(obj).encode("utf-8"))


def pack_bytes(data: bytes) -> torch.Tensor:
    """``data`` as a ``uint8`` tensor of its own (what :func:`pack_json` stores, given the JSON's bytes)."""
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8)


def unpack_json(buffer: torch.Tensor) -> Any:
    if buffer.numel() == 0:
        return None
    return json.loads(bytes(buffer.cpu().tolist()).decode("utf-8"))


def resize_to_checkpoint(module: nn.Module) -> None:
    """Registers a hook: on ``load_state_dict``, every parameter and buffer of ``module`` (recursively) whose
    checkpoint tensor has another shape is re-allocated with that shape first."""

    def hook(mod, state_dict, prefix, *args):
        for name, tensor in list(mod.named_parameters(recurse=True)) + list(mod.named_buffers(recurse=True)):
            incoming = state_dict.get(prefix + name)
            if incoming is None or incoming.shape == tensor.shape:
                continue
            owner_path, _, leaf = name.rpartition(".")
            owner = mod.get_submodule(owner_path) if owner_path else mod
            fresh = torch.empty(incoming.shape, dtype=incoming.dtype, device=tensor.device)
            if isinstance(tensor, nn.Parameter):
                setattr(owner, leaf, nn.Parameter(fresh, requires_grad=tensor.requires_grad))
            else:
                owner._buffers[leaf] = fresh
            if isinstance(owner, nn.EmbeddingBag | nn.Embedding) and leaf == "weight":
                owner.num_embeddings = incoming.shape[0]

    module.register_load_state_dict_pre_hook(hook)
