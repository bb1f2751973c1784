"""Gallery media decoded for an answer — thumbnails (``/v1/images/{id}?size=``), video frames
(``/v1/videos/{id}/frame``, a moment's ``/v1/images/{id}``, a moment as a query) — under one admission, on a bounded
pool of threads of its own, each job's memory estimated from the file's header (or the index's record of its size)
before it is admitted.

* **Admission**: at most ``limit`` jobs at once, being made or waiting for a thread; of them at most half *heavy*
  (an estimate above :data:`LIGHT_BYTES`: a full-size frame of a large video, a thumbnail of a large PNG). One more
  is answered 503 + ``Retry-After`` at once, before any work — so a flood of heavy frames never fills the
  admission a small thumbnail needs.
* **Threads**: ``workers`` of them, apart from the upload decoding threads; heavy jobs take at most
  ``workers - 1``, so a light job never waits behind heavy ones for a thread, and waiting light jobs go first.
* **Memory**: jobs run while the sum of their estimates stays within ``memory_bytes``; a job larger than that runs
  when nothing else does. So decoding holds at most the larger of ``memory_bytes`` and the largest single job —
  which the geometry limits bound (an image's pixels and aspect ratio, a video's 8192-pixel sides, a frame scaled
  to what is asked before it is converted to RGB).
"""
from __future__ import annotations

import asyncio
import heapq
import itertools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

LIGHT_BYTES = 32 * 1024 * 1024      # a job estimated at more than this is heavy


class MediaBusy(Exception):
    """The decoding admission is full: answer 503 + Retry-After."""


@dataclass(order=True)
class _Job:
    heavy: bool                                     # light jobs first, then in arrival order
    seq: int
    cost: int = field(compare=False)
    fn: Callable = field(compare=False)
    args: tuple = field(compare=False)
    future: asyncio.Future = field(compare=False)


class MediaDecoder:
    """One admission and one thread pool for every thumbnail and frame the service makes (module docstring)."""

    def __init__(self, workers: int, limit: int, memory_bytes: int, metrics=None):
        self.workers, self.limit, self.memory_bytes, self.metrics = workers, limit, memory_bytes, metrics
        self.heavy_limit = max(1, limit // 2)
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="jointspace-media")
        self.admitted = self.admitted_heavy = 0
        self.running = self.running_heavy = self.running_bytes = 0
        self.peak_bytes = 0                                 # the most estimated bytes that ran at once
        self._waiting: list[_Job] = []
        self._seq = itertools.count()

    def is_heavy(self, cost: int) -> bool:
        return cost > LIGHT_BYTES

    async def run(self, cost: int, fn: Callable, *args) -> Any:
        """``fn(*args)`` on the pool once admitted and once its ``cost`` (estimated bytes) fits; :class:`MediaBusy`
        at once when the admission is full."""
        heavy = self.is_heavy(cost)
        if self.admitted >= self.limit or (heavy and self.admitted_heavy >= self.heavy_limit):
            if self.metrics is not None:
                self.metrics.shed.labels("media", "queue_full").inc()
            raise MediaBusy
        self.admitted += 1
        self.admitted_heavy += heavy
        job = _Job(heavy, next(self._seq), cost, fn, args, asyncio.get_running_loop().create_future())
        heapq.heappush(self._waiting, job)
        try:
            self._dispatch()
            return await job.future
        finally:
            self.admitted -= 1
            self.admitted_heavy -= heavy
            if not job.future.done():           # the request went away while its job waited: never started
                job.future.cancel()

    def _dispatch(self) -> None:
        while self._waiting:
            job = self._waiting[0]
            if job.future.done():               # cancelled while waiting
                heapq.heappop(self._waiting)
                continue
            if self.running >= self.workers:
                return
            if job.heavy and self.workers > 1 and self.running_heavy >= self.workers - 1:
                return                          # waiting light jobs come first, so none is waiting now
            if self.running and self.running_bytes + job.cost > self.memory_bytes:
                return
            heapq.heappop(self._waiting)
            self._start(job)

    def _start(self, job: _Job) -> None:
        self.running += 1
        self.running_heavy += job.heavy
        self.running_bytes += job.cost
        self.peak_bytes = max(self.peak_bytes, self.running_bytes)
        work = asyncio.get_running_loop().run_in_executor(self.pool, job.fn, *job.args)
        work.add_done_callback(lambda done: self._finished(job, done))

    def _finished(self, job: _Job, done: asyncio.Future) -> None:
        self.running -= 1
        self.running_heavy -= job.heavy
        self.running_bytes -= job.cost
        if not job.future.done():
            if done.cancelled():
                job.future.cancel()
            elif done.exception() is not None:
                job.future.set_exception(done.exception())      # type: ignore[arg-type]
            else:
                job.future.set_result(done.result())
        elif not done.cancelled():
            done.exception()                    # retrieved: nobody waits for it any more
        self._dispatch()

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
