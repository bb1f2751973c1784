"""Shape discipline for inference (Triton's "preferred batch sizes"): the encoders only ever see a small, fixed set
of batch sizes, each warmed once before the service says it is ready.

On a GPU every new input shape costs a one-time set-up on its first call (kernel selection and compilation:
seconds for the shipped CNNs), so a dynamic batcher that forms batches of every size up to ``max_batch`` would stall
on each of them. Instead a batch of ``n`` requests is run as

* ``pad``: one call at the smallest bucket ``≥ n``, the extra rows filled with a neutral input whose results are
  dropped (the GPU's cost barely depends on the batch size);
* ``split``: calls at buckets that add up to ``n`` exactly, largest first (on a CPU the cost grows with every row,
  so padding would waste work that splitting does not).

Buckets are powers of two up to ``max_batch`` (and ``max_batch`` itself) unless configured. The inference path
(embedding.py) takes a :class:`Shapes` and runs every forward pass at one of its sizes; the service chooses it from its
settings (:func:`resolve_shapes`) and warms each size before it says ready.
"""
from __future__ import annotations

from dataclasses import dataclass

MODES = ("pad", "split")


def bucket_sizes(spec: str, max_batch: int) -> tuple[int, ...]:
    """``auto``: 1, 2, 4, … up to ``max_batch`` (and ``max_batch`` itself); else comma-separated sizes, which
    must include 1 (a lone request) and none above ``max_batch``. ValueError naming what is wrong."""
    if spec.strip() in ("", "auto"):
        sizes, b = {max_batch}, 1
        while b < max_batch:
            sizes.add(b)
            b *= 2
        return tuple(sorted(sizes))
    try:
        sizes = {int(part) for part in spec.split(",") if part.strip()}
    except ValueError:
        raise ValueError(f"batch sizes must be 'auto' or comma-separated whole numbers, not {spec!r}") from None
    if 1 not in sizes or min(sizes) < 1:
        raise ValueError(f"batch sizes must include 1 and be positive, got {spec!r}")
    if max(sizes) > max_batch:
        raise ValueError(f"batch size {max(sizes)} is above max_batch ({max_batch})")
    return tuple(sorted(sizes))


@dataclass(frozen=True)
class Chunk:
    """Rows ``start:start + count`` of a batch, run as one call of ``size`` rows (``size - count`` of them
    padding)."""
    start: int
    count: int
    size: int


def plan(n: int, sizes: tuple[int, ...], mode: str) -> list[Chunk]:
    """How a batch of ``n`` rows runs at the bucket ``sizes`` (sorted, including 1) in ``mode``."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    out, start, largest = [], 0, sizes[-1]
    while start < n:
        left = n - start
        if mode == "pad" or left >= largest:
            size = next((s for s in sizes if s >= left), largest)
            count = min(left, size)
        else:
            size = count = max(s for s in sizes if s <= left)
        out.append(Chunk(start, count, size))
        start += count
    return out


@dataclass(frozen=True)
class Shapes:
    """The bucket sizes and how each input kind reaches them: ``images`` and ``texts`` are a mode of
    :data:`MODES`. None (no bucketing): every batch runs at its own size."""
    sizes: tuple[int, ...]
    images: str = "pad"
    texts: str = "pad"


def resolve_shapes(sizes_spec: str, max_batch: int, mode: str, device_type: str) -> Shapes | None:
    """The service's shapes from its settings. ``mode``: ``auto`` (on CUDA images and texts padded; on the CPU
    none — a CPU has no first-call cost per shape, and padding cost the shipped model's text route at c = 32
    about a fifth of its throughput: docs/service.md), ``pad``, ``split`` or ``off``."""
    if mode == "off" or (mode == "auto" and device_type != "cuda"):
        return None
    sizes = bucket_sizes(sizes_spec, max_batch)
    if mode == "auto":
        return Shapes(sizes, images="pad", texts="pad")
    if mode not in MODES:
        raise ValueError(f"bucket mode must be auto, pad, split or off, not {mode!r}")
    return Shapes(sizes, images=mode, texts=mode)
