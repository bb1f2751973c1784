"""Bulk embedding's batches through the device with their copies overlapped: the next batch's pixels go up while
the current one computes, and the results come down into pinned host memory without the host waiting for them,
one batch later (double buffering), instead of one blocking copy each way per batch.

:class:`Overlap` takes a batch (``push``) and gives back the batches whose results are in host memory, in order;
``drain`` gives the rest. On a CUDA device the uploads run on a stream of their own (the compute stream waits on
an event, not the host), the downloads are asynchronous copies into pinned buffers, and at most ``depth`` batches
are in flight; on a CPU (``depth`` 1 by default) a batch's result is ready when ``push`` returns (what the device
would overlap, a CPU computes in place). It also keeps a :class:`Timeline`: when each batch's vectors were in hand,
so a run can tell its start-up (to the first batch) from its steady rate (the batches after it).
"""
from __future__ import annotations

import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np
import torch


# the steps of a bulk embedding's loop whose host time a Timeline adds up (embedding.embed_image_files)
PHASES = ("waiting for decoded photos", "decoding on the device", "the model")


@dataclass
class Timeline:
    """``marks``: ``(perf_counter seconds, items done)`` after each batch's results were in hand; ``phases``: the
    host's seconds in each step of the loop after the first batch's results (:data:`PHASES`: where the steady rate
    goes; work a device still has queued counts where the host waits for it)."""
    marks: list[tuple[float, int]] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)
    events: dict[str, float] = field(default_factory=dict)      # name → perf_counter seconds, the first time

    def event(self, name: str) -> None:
        """Notes when ``name`` first happened (e.g. the first decoded photos: the start-up's steps)."""
        self.events.setdefault(name, time.perf_counter())

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Adds the host's time in the ``with`` block to ``phases[name]``, once the first batch is in hand."""
        began, counted = time.perf_counter(), bool(self.marks)
        try:
            yield
        finally:
            if counted:
                self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - began

    def mark(self, count: int) -> None:
        done = self.marks[-1][1] if self.marks else 0
        self.marks.append((time.perf_counter(), done + count))

    def startup(self, since: float) -> float | None:
        """Seconds from ``since`` (a perf_counter reading: the command's start) to the first batch's results."""
        return self.marks[0][0] - since if self.marks else None

    def steady(self) -> float | None:
        """Items per second after the first batch (None with fewer than two batches)."""
        if len(self.marks) < 2 or self.marks[-1][0] <= self.marks[0][0]:
            return None
        return (self.marks[-1][1] - self.marks[0][1]) / (self.marks[-1][0] - self.marks[0][0])


class Overlap:
    """``embed`` (device tensor → device tensor, one row per item) over batches, ``depth`` of them in flight on a
    CUDA ``device``; each batch carries a ``tag`` (what the caller keeps with its rows) that comes back with its
    result as a float32 numpy array."""

    def __init__(self, embed: Callable[[torch.Tensor], torch.Tensor], device: torch.device | str,
                 depth: int | None = None):
        self.device = torch.device(device)
        # a CUDA device named where CUDA is missing (a test) is treated as a CPU
        self.cuda = self.device.type == "cuda" and torch.cuda.is_available()
        self.embed, self.depth = embed, max(1, depth if depth is not None else (2 if self.cuda else 1))
        self.copy_stream = torch.cuda.Stream(self.device) if self.cuda else None
        self.pending: deque[tuple[Any, Any, Any, int]] = deque()     # (tag, host result, event, rows)
        self.timeline = Timeline()

    def _upload(self, pixels: torch.Tensor) -> torch.Tensor:
        if not self.cuda or pixels.device == self.device:
            return pixels
        assert self.copy_stream is not None
        compute = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self.copy_stream):
            on_device = pixels.to(self.device, non_blocking=True)
        compute.wait_stream(self.copy_stream)           # the device waits for the copy, the host does not
        on_device.record_stream(compute)                # freed only once the compute stream is done with it
        return on_device

    def push(self, pixels: torch.Tensor, tag: Any = None) -> Iterator[tuple[Any, np.ndarray]]:
        """Starts ``pixels`` (host or device); yields ``(tag, vectors)`` of every earlier batch now done."""
        out = self.embed(self._upload(pixels)).float()
        if not self.cuda:
            self.pending.append((tag, out.cpu().numpy(), None, len(out)))
        else:
            host = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)
            host.copy_(out, non_blocking=True)
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.device))
            self.pending.append((tag, (host, pixels), event, len(out)))   # the pixels kept until their copy ran
        while len(self.pending) >= self.depth:
            yield self._finish()

    def drain(self) -> Iterator[tuple[Any, np.ndarray]]:
        """``(tag, vectors)`` of every batch still in flight, in order."""
        while self.pending:
            yield self._finish()

    def _finish(self) -> tuple[Any, np.ndarray]:
        tag, result, event, rows = self.pending.popleft()
        if event is not None:
            event.synchronize()
            result = result[0].numpy()
        self.timeline.mark(rows)
        return tag, result
