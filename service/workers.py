"""``jointspace serve --workers N``: N worker processes serving one listening socket, as one service.

The parent process binds the socket (a busy port is refused at once, before anything is loaded), starts N workers
(``multiprocessing``'s spawn: fresh interpreters, no forked CUDA or thread state) that each accept connections on
that socket and run the whole app — HTTP, admission, decoding, the dynamic batchers and the model, on the device
(on a host with several GPUs, worker ``i`` takes GPU ``i mod count``) — and supervises them. What makes the N
processes one service:

* **admission** (``max_queue``): one count of the requests admitted to the model across every worker, in shared
  memory (:class:`SharedAdmission`); a request over the limit is refused 503 by whichever worker receives it
  (workers admitting at the same instant may exceed it by at most ``workers - 1``).
  The byte budgets of uploads (``upload_buffer_bytes``) and of frames and thumbnails (``media_memory_bytes``) are
  divided among the workers, so their total still holds; what one client address may hold
  (``upload_peer_bytes``) and the count of frames being made (``max_thumbnails``) are per worker, and so are the
  decoding memory budget of uploads (``decode_memory_bytes``: one image above it is refused 413, so dividing it
  would refuse ordinary photos on a host of many workers; N workers may decode up to N times it at once) and the
  limit of wrong API keys a client address may send (``auth_failures_per_minute``).
* **metrics**: prometheus_client's multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``, a fresh directory the parent
  removes at exit): every worker's ``/metrics`` reports the service — counters and histograms summed over the
  workers, the in-flight, queue and receiving gauges summed over the live ones, and ``jointspace_index_vectors`` one
  series per live worker (label ``pid``), so that each worker's generation can be seen.
* **start-up**: a worker takes connections only once its model and index are loaded and warmed up (its app's
  start-up waits for that), so that a sibling answers them meanwhile.
* **reload**: every worker watches the index's ``CURRENT`` (``reload_interval_s``) and swaps in a new generation
  itself; /readyz says which worker answered (``worker``).
* **API key** and every other setting: the same in every worker.

A worker that exits while the service runs is restarted; one that exits :data:`RESTARTS` times within
:data:`RESTART_WINDOW_S` seconds stops the service, which exits 1 saying why, and one that cannot load the model or
the index (it says why) stops it at once, exit status 2 (as ``serve`` says such an error). SIGTERM or SIGINT (Ctrl-C) stops
every worker (each finishes its answers in flight, as one ``serve`` does) and the parent exits 0; a worker whose
parent is gone stops itself.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    import socket

    from .settings import Settings

log = logging.getLogger("jointspace.service")

RESTARTS = 3                 # a worker exiting this many times ...
RESTART_WINDOW_S = 60.0      # ... within this many seconds stops the service
STOP_GRACE_S = 30.0          # seconds the workers get to finish their answers after SIGTERM, before SIGKILL
MAX_AUTO_WORKERS = 8
START_FAILED = 3             # a worker's exit code when loading the model or the index failed: not restarted


def auto_workers(device_type: str, cores: int) -> int:
    """``--workers 0`` (the default): one process on a CPU host, a plain ``serve`` (one copy of the model in
    memory; on 2 cores a second process answered 1.5–2× as many requests at concurrency 32 and 128 for 1.8× the
    resident memory: docs/service.md), and one a core up to 8 on a CUDA host, where the CPUs' work
    — HTTP, JSON, decoding uploads — is what one interpreter cannot keep up with."""
    return 1 if device_type != "cuda" else max(1, min(cores, MAX_AUTO_WORKERS))


class SharedAdmission:
    """The requests admitted to the model, counted for the whole service: one slot per worker in shared memory,
    each written only by its own worker's event loop, the limit checked against their sum. No lock: a worker
    killed at any instant can never block the others (a dead worker's slot is cleared before it is restarted);
    the price is that workers admitting at the same instant may each see room for one more, so the service may
    hold up to ``workers - 1`` requests over the limit."""

    def __init__(self, slots: Any, index: int):
        """``slots``: a ``multiprocessing.RawArray('q', workers)``; ``index``: this worker's slot."""
        self.slots, self.index = slots, index

    def enter(self, limit: int) -> bool:
        """Counts one more request of this worker unless the service holds ``limit`` already (then False)."""
        slots = self.slots
        if sum(slots) >= limit:
            return False
        slots[self.index] += 1
        return True

    def leave(self) -> None:
        self.slots[self.index] -= 1

    @property
    def total(self) -> int:
        return sum(self.slots)


@dataclass(frozen=True)
class Worker:
    """What one worker process knows of the service it is part of: its number, the worker count and the shared
    admission count."""
    index: int
    count: int
    admission: SharedAdmission


def worker_settings(settings: Settings, workers: int) -> Settings:
    """The settings each of ``workers`` processes runs with: the service's, with its byte budgets divided among
    them (their total still holds) and the worker count, which sizes each worker's threads."""
    return settings.model_copy(update={
        "workers": workers,
        "upload_buffer_bytes": max(1, settings.upload_buffer_bytes // workers),
        "media_memory_bytes": max(1, settings.media_memory_bytes // workers)})


def worker_device(device: str, index: int) -> str:
    """Worker ``index``'s device: ``auto`` and ``cuda`` spread the workers over the GPUs (GPU ``index`` mod their
    count); a device named with its number (``cuda:1``), or the CPU, as given."""
    if device not in ("auto", "cuda"):
        return device
    import torch

    if not torch.cuda.is_available():
        return device
    return f"cuda:{index % torch.cuda.device_count()}"


def watch_parent(parent: int) -> None:
    """Stops this worker (SIGTERM to itself: a graceful stop) once the supervising parent ``parent`` is gone; run in
    a daemon thread of each worker."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGTERM)


class Supervisor:
    """Starts ``workers`` processes serving ``settings`` on ``listening``, restarts one that exits, stops them all
    on SIGTERM / SIGINT (see the module docstring). ``target(index, count, settings, listening, log_level, slots,
    parent pid)``: a worker's main function (service/serve.py), a module-level function (spawn pickles it by
    name)."""

    def __init__(self, settings: Settings, listening: socket.socket, log_level: str, workers: int,
                 target: Callable[..., None]):
        self.settings, self.listening, self.log_level, self.count = settings, listening, log_level, workers
        self.target = target
        self.context = multiprocessing.get_context("spawn")
        self.slots = self.context.RawArray("q", workers)
        self.procs: list[Any] = [None] * workers
        self.exits: list[list[float]] = [[] for _ in range(workers)]
        self.stopping = False

    def _start(self, index: int) -> None:
        self.slots[index] = 0          # a dead worker's requests are no longer in (it wrote its slot alone)
        proc = self.context.Process(target=self.target, name=f"jointspace-worker-{index}", daemon=False,
                                    args=(index, self.count, worker_settings(self.settings, self.count),
                                          self.listening, self.log_level, self.slots, os.getpid()))
        proc.start()
        self.procs[index] = proc

    def _stop(self, signum: int, _frame) -> None:
        if not self.stopping:
            log.info("stopping %d workers (%s)", self.count, signal.Signals(signum).name)
        self.stopping = True

    def run(self) -> int:
        metrics_dir = tempfile.mkdtemp(prefix="jointspace-metrics-")
        previous = {s: signal.signal(s, self._stop) for s in (signal.SIGTERM, signal.SIGINT)}
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir     # the workers inherit it: set before they start
        try:
            for i in range(self.count):
                self._start(i)
            return self._supervise(metrics_dir)
        finally:
            self._terminate()
            for s, handler in previous.items():
                signal.signal(s, handler)
            os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
            shutil.rmtree(metrics_dir, ignore_errors=True)

    def _supervise(self, metrics_dir: str) -> int:
        from prometheus_client import multiprocess

        while not self.stopping:
            sentinels = {p.sentinel: i for i, p in enumerate(self.procs)}
            for ready in wait(list(sentinels), timeout=0.5):
                if self.stopping:
                    break
                i = sentinels[ready]
                proc = self.procs[i]
                proc.join()
                multiprocess.mark_process_dead(proc.pid, metrics_dir)     # its live gauges leave /metrics
                if proc.exitcode == START_FAILED:
                    log.error("worker %d could not load the model or the index: stopping the service", i)
                    return 2
                now = time.monotonic()
                self.exits[i] = [t for t in self.exits[i] if now - t < RESTART_WINDOW_S] + [now]
                if len(self.exits[i]) >= RESTARTS:
                    log.error("worker %d exited (code %s) %d times within %.0f s: stopping the service", i,
                              proc.exitcode, RESTARTS, RESTART_WINDOW_S)
                    print(f"jointspace serve: worker {i} exited (code {proc.exitcode}) {RESTARTS} times within "
                          f"{RESTART_WINDOW_S:.0f} s; stopping every worker (its log above says why)",
                          file=sys.stderr, flush=True)
                    return 1
                log.warning("worker %d (pid %d) exited (code %s): restarting it", i, proc.pid, proc.exitcode)
                self._start(i)
        return 0

    def _terminate(self) -> None:
        """SIGTERM to every worker still running, SIGKILL to any still there after :data:`STOP_GRACE_S`."""
        live = [p for p in self.procs if p is not None and p.is_alive()]
        for proc in live:
            try:
                os.kill(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in live:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                log.error("worker pid %d did not stop within %.0f s: killing it", proc.pid, STOP_GRACE_S)
                proc.kill()
                proc.join()
