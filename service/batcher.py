"""Dynamic batching (the shape of Triton's dynamic batcher): concurrent requests share one forward pass.

Requests are put on a bounded asyncio queue. One worker task takes the first waiting request, then collects
more until it holds ``max_batch`` or ``max_wait_ms`` have passed since it took the first, runs ``fn`` on the
whole batch in a thread executor (so the event loop keeps accepting requests while the model runs) and
resolves each request's future with its own result. While a batch runs, new requests queue up and form the
next batch, so under load batches fill without waiting. A full queue refuses at once (:class:`QueueFull`,
answered 503 + Retry-After) rather than growing memory. When a batch fails, each of its requests is run again on
its own, so one bad request fails alone and never takes the other requests of its batch with it.

Waiting is adaptive when the batcher is told how many requests are on their way (``pending``: requests the
server has received for this batcher, counting the queued ones — e.g. still being parsed or decoded): once
every one of them is in the batch it runs at once, so a lone request never waits ``max_wait_ms`` for company
that cannot come.
"""
from __future__ import annotations

import asyncio
import time
from concurrent.futures import Executor
from typing import Callable, Generic, Sequence, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Shed(Exception):
    """A request refused without being computed (answered 503 + Retry-After); ``reason`` names why."""
    reason = "shed"


class QueueFull(Shed):
    """The batcher's queue holds ``max_queue`` requests already."""
    reason = "queue_full"


class DeadlineExceeded(Shed):
    """The request's deadline passed before its batch began."""
    reason = "deadline"


class DynamicBatcher(Generic[T, R]):
    def __init__(self, fn: Callable[[Sequence[T]], Sequence[R]], executor: Executor, *, max_batch: int = 64,
                 max_wait_ms: float = 2.0, max_queue: int = 1024, name: str = "batcher", metrics=None,
                 pending: Callable[[], int] | None = None):
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self.fn, self.executor, self.name, self.metrics = fn, executor, name, metrics
        self.max_batch, self.max_wait = max_batch, max_wait_ms / 1000.0
        self.max_queue = max_queue
        self.pending = pending
        self._queue: asyncio.Queue | None = None
        self._worker: asyncio.Task | None = None

    async def start(self) -> None:
        queue: asyncio.Queue = asyncio.Queue(maxsize=self.max_queue)
        self._queue = queue
        self._worker = asyncio.create_task(self._run(queue), name=f"{self.name}-worker")

    async def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            try:
                await self._worker
            except asyncio.CancelledError:
                pass
            self._worker = None
        while self._queue is not None and not self._queue.empty():
            _, fut, _ = self._queue.get_nowait()
            if not fut.done():
                fut.set_exception(RuntimeError("the service is shutting down"))

    @property
    def depth(self) -> int:
        return self._queue.qsize() if self._queue is not None else 0

    async def submit(self, item: T, deadline: float | None = None) -> R:
        """Queues ``item`` and waits for its result; raises :class:`QueueFull` when the queue is full and
        :class:`DeadlineExceeded` when ``deadline`` (``time.monotonic()``) passes before its batch runs."""
        if self._queue is None:
            raise RuntimeError(f"{self.name} is not started")
        if deadline is not None and time.monotonic() >= deadline:
            self._count_shed(DeadlineExceeded.reason)
            raise DeadlineExceeded(f"{self.name}: the request's deadline passed before it was queued")
        fut = asyncio.get_running_loop().create_future()
        try:
            self._queue.put_nowait((item, fut, deadline))
        except asyncio.QueueFull:
            self._count_shed(QueueFull.reason)
            raise QueueFull(f"{self.name}: {self.max_queue} requests are already waiting") from None
        self._gauge()
        return await fut

    def _count_shed(self, reason: str, n: int = 1) -> None:
        if self.metrics is not None:
            self.metrics.shed.labels(self.name, reason).inc(n)

    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_depth.labels(self.name).set(self.depth)

    async def _collect(self, queue: asyncio.Queue) -> list:
        loop = asyncio.get_running_loop()
        batch = [await queue.get()]
        deadline = loop.time() + self.max_wait
        while len(batch) < self.max_batch:
            try:
                batch.append(queue.get_nowait())
                continue
            except asyncio.QueueEmpty:
                pass
            if self.pending is not None and self.pending() <= len(batch):
                break                                   # nobody else is on the way: do not wait
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(queue.get(), remaining))
            except TimeoutError:
                break
        return batch

    async def _one_by_one(self, batch: list) -> None:
        """Runs each request of a failed batch on its own, so that one bad request fails alone and the others of
        its batch still get their results."""
        loop = asyncio.get_running_loop()
        for item, fut in batch:
            if fut.done():
                continue
            try:
                result = await loop.run_in_executor(self.executor, self.fn, [item])
                if len(result) != 1:
                    raise RuntimeError(f"{self.name}: {len(result)} results for 1 request")
            except Exception as err:  # noqa: BLE001 - this request's own error
                if not fut.done():
                    fut.set_exception(err)
                continue
            if not fut.done():
                fut.set_result(result[0])

    async def _run(self, queue: asyncio.Queue) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._collect(queue)
            self._gauge()
            now, live = time.monotonic(), []
            for item, fut, deadline in batch:
                if fut.done():                                  # the client gave up
                    continue
                if deadline is not None and now >= deadline:    # too late: drop it before spending work on it
                    fut.set_exception(DeadlineExceeded(f"{self.name}: the request's deadline passed while it "
                                                       f"waited for a batch"))
                    self._count_shed(DeadlineExceeded.reason)
                    continue
                live.append((item, fut))
            batch = live
            if not batch:
                continue
            start = time.perf_counter()
            try:
                results = await loop.run_in_executor(self.executor, self.fn, [item for item, _ in batch])
                if len(results) != len(batch):
                    raise RuntimeError(f"{self.name}: {len(results)} results for {len(batch)} requests")
            except Exception as err:  # noqa: BLE001 - the batch failed: find the request(s) that made it fail
                if len(batch) == 1:
                    if not batch[0][1].done():
                        batch[0][1].set_exception(err)
                else:
                    await self._one_by_one(batch)
                continue
            if self.metrics is not None:
                self.metrics.batch_size.labels(self.name).observe(len(batch))
                self.metrics.batch_seconds.labels(self.name).observe(time.perf_counter() - start)
            for (_, fut), result in zip(batch, results):
                if not fut.done():
                    fut.set_result(result)
