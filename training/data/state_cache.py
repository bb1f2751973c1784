"""A content-keyed, memory-mapped disk cache of per-token activations of a frozen encoder bottom.

Partial fine-tuning (``text.options.train_layers``) trains only the top layers of a pretrained encoder; the
frozen layers below give the same output for the same tokens at every epoch, so they run once over the
training captions and their outputs are kept here: one ``(total_tokens, H)`` array (float16 or float32)
and the row offsets of each sentence. The key hashes the frozen weights, the layer cut and every token id
list in order, so other weights, another cut or other data never reuse a cache. Files are written under
temporary names and renamed into place (manifest last): a killed run leaves no half-written cache.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from .fileio import atomic_path, write_json

DTYPES = {"float16": np.float16, "float32": np.float32}


def weights_digest(modules: Sequence[torch.nn.Module]) -> str:
    h = hashlib.sha256()
    for module in modules:
        for key, tensor in module.state_dict().items():
            h.update(key.encode())
            h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def ids_digest(id_lists: Sequence[Sequence[int]]) -> str:
    h = hashlib.blake2b(digest_size=32)
    for ids in id_lists:
        h.update(np.asarray(ids, dtype=np.int64).tobytes())
        h.update(b"|")
    return h.hexdigest()


class TokenStateCache:
    """Rows of a frozen bottom's token states, looked up by the token id tuple of a sentence."""

    def __init__(self, states: np.ndarray, offsets: np.ndarray, id_lists: Sequence[Sequence[int]]):
        self.states, self.offsets = states, offsets
        self.rows = {tuple(ids): i for i, ids in enumerate(id_lists)}

    def __contains__(self, ids: tuple) -> bool:
        return ids in self.rows

    def padded(self, keys: Sequence[tuple], steps: int) -> torch.Tensor:
        """``(B, steps, H)`` float32 states of the sentences ``keys`` (all cached), zero past each length."""
        out = torch.zeros(len(keys), steps, self.states.shape[1])
        for b, key in enumerate(keys):
            i = self.rows[key]
            lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
            out[b, :hi - lo] = torch.from_numpy(np.array(self.states[lo:hi], dtype=np.float32))
        return out


@dataclass(frozen=True)
class StateSpec:
    """What a cache holds, and part of its key: the token states of the frozen layers ``name`` (e.g.
    ``minilm-L4``) with weights ``digest`` (:func:`weights_digest`), ``width`` values a token, stored as
    ``dtype`` (:data:`DTYPES`)."""
    name: str
    digest: str
    width: int
    dtype: str = "float16"


def build_state_cache(spec: StateSpec, id_lists: Sequence[Sequence[int]],
                      compute: Callable[[list[list[int]]], list[torch.Tensor]], cache_dir: Path,
                      batch_size: int = 256, progress: bool = True) -> TokenStateCache:
    """The cache of ``compute`` (a batch of id lists → one ``(len, spec.width)`` tensor each) over ``id_lists``,
    read from ``cache_dir`` when a cache with the same key exists, else computed and written there."""
    name, digest, width, dtype = spec.name, spec.digest, spec.width, spec.dtype
    if dtype not in DTYPES:
        raise ValueError(f"cache dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    unique = list(dict.fromkeys(tuple(ids) for ids in id_lists))       # each sentence once, in first order
    manifest = {"name": name, "weights": digest, "ids_blake2b": ids_digest(unique), "n": len(unique),
                "width": width, "dtype": dtype}
    key = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:32]
    cache_dir = Path(cache_dir)
    states_path, offsets_path = cache_dir / f"text-{key}.npy", cache_dir / f"text-{key}.offsets.npy"
    manifest_path = cache_dir / f"text-{key}.json"
    lengths = np.array([len(ids) for ids in unique], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    if manifest_path.exists() and states_path.exists() and offsets_path.exists():
        if json.loads(manifest_path.read_text()) == manifest:
            stored = np.load(offsets_path)
            states = np.load(states_path, mmap_mode="r")
            if np.array_equal(stored, offsets) and states.shape == (int(offsets[-1]), width):
                return TokenStateCache(states, offsets, unique)
    cache_dir.mkdir(parents=True, exist_ok=True)
    # longest first: batches of similar lengths waste little padding
    order = sorted(range(len(unique)), key=lambda i: -len(unique[i]))
    with atomic_path(states_path) as tmp:
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype=DTYPES[dtype], shape=(int(offsets[-1]), width))
        for start in tqdm(range(0, len(order), batch_size), desc=f"{name} token states", disable=not progress,
                          unit="batch"):
            chunk = order[start:start + batch_size]
            for i, states in zip(chunk, compute([list(unique[i]) for i in chunk])):
                out[offsets[i]:offsets[i + 1]] = states.float().cpu().numpy()
        out.flush()
        del out
    with atomic_path(offsets_path) as tmp:
        with open(tmp, "wb") as fh:
            np.save(fh, offsets)
    write_json(manifest_path, manifest)
    return TokenStateCache(np.load(states_path, mmap_mode="r"), offsets, unique)
