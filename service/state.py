"""What a running service holds: the model, the live index, the engine, the batchers and the thread pools.

Loading happens in the background after start-up (``/healthz`` answers at once, ``/readyz`` once the model and
index are loaded). A watcher picks up new index generations written by ``jointspace index add/remove`` while
the service runs and swaps them in between batches.
"""
from __future__ import annotations

import asyncio
import gc
import logging
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from index.gallery import Gallery
from index.generations import current_generation, read_manifest
from index.video_decode import VideoError, decoder
from training.data.preprocess import register_heif
from training.data.features import usable_cores
from training.models.ensemble import EnsembleEmbedding
from training.models.model import JointEmbedding
from training.models.checkpoint import load_model
from training.inference import text_tower
from training.inference.backend import use_backend
from training.inference.device import resolve_device
from training.inference.pretrained import resolve
from training.inference.shapes import Shapes
from training.inference.shapes import resolve_shapes
from training.inference.threads import single_threaded_blas
from training.models.protocol import has_decoder

from .batcher import DynamicBatcher
from training.data.decode_cost import MemoryBudget

from .decoding import MediaDecoder
from .trust import FailureLimiter
from .engine import Engine
from .metrics import Metrics
from .settings import Settings
from .workers import Worker

log = logging.getLogger("jointspace.service")
# an absolute path (POSIX or Windows) not inside a word or URL: group 1 is its last name
_PATH = re.compile(r"(?<![\w.:/\\])(?:[A-Za-z]:)?[\\/](?:[^\s'\",;()\[\]<>]*[\\/])?([^\s'\",;()\[\]<>\\/]*)")


def cpu_threads(setting: int, workers: int = 1) -> int:
    """torch intra-op threads for CPU inference: the setting, or by default every core but one — the event
    loop, HTTP parsing and image decoding need a core too, and an oversubscribed CPU makes torch's spinning
    worker threads many times slower — shared among ``workers`` processes (``serve --workers``), at least one."""
    return setting or max(1, (usable_cores() - 1) // max(1, workers))


def decode_threads(setting: int, device: torch.device, workers: int = 1) -> int:
    """Threads that decode and preprocess uploads: the setting, or by default 2 where the model runs on the CPU
    (its forward passes take the other cores) and every core, 2 to 32, where it runs on a GPU — there decoding is
    the CPUs' main work, and two threads would hold the image route far below the model's pace (docs/benchmarks.md,
    the GPU host's rows) — the cores shared among ``workers`` processes (``serve --workers``)."""
    if setting:
        return setting
    return 2 if device.type == "cpu" else min(32, max(2, usable_cores() // max(1, workers)))


def _import_decoders() -> None:
    try:
        decoder()
    except VideoError as err:   # photos are still served; a video query or gallery video answers 415 saying why
        log.warning("%s", err)
    register_heif()


DIRECT = "direct"       # the admission class of model requests that use no batcher


@dataclass(frozen=True)
class BatcherSpec:
    """A batcher the service runs for the table of operations (service/operations.py): its ``name`` (the admission
    class its requests are counted under, and its metrics label), the engine method ``run`` on a batch of items, and
    whether it needs the model's sentence decoder (it then exists only once a model with a decoder is loaded)."""
    name: str
    run: Callable[[Engine, Sequence[Any]], Sequence[Any]]
    decoder: bool = False


@dataclass(frozen=True)
class Loaded:
    """What a ready service serves with: the model, the live index generation and the engine over both."""
    model: JointEmbedding | EnsembleEmbedding
    gallery: Gallery
    engine: Engine


class ServiceState:
    def __init__(self, settings: Settings, metrics: Metrics, model=None, gallery: Gallery | None = None,
                 queues: Sequence[BatcherSpec] = (), worker: Worker | None = None):
        """``queues``: the batchers of the table of operations (``service.api.routing.queues``); ``worker``: this
        state is one worker's of ``serve --workers N`` (service/workers.py)."""
        self.settings, self.metrics, self.worker = settings, metrics, worker
        workers = worker.count if worker is not None else 1
        self.model, self.gallery = model, gallery
        self.engine: Engine | None = None
        self.error: str | None = None
        self.phase = "loading"              # loading → warming up → ready (or the error)
        self.warmup_seconds: float | None = None
        self.backend = "eager"              # what runs the image backbones, once loaded (training/inference/backend.py)
        self.device = resolve_device(settings.device)
        max_batch = settings.max_batch if settings.batching else 1
        self.shapes: Shapes | None = resolve_shapes(settings.batch_sizes if settings.batching else "1", max_batch,
                                                    settings.bucket_mode, self.device.type)
        # one compute thread: forward passes and index searches run one batch at a time, as on a GPU stream
        self.compute_pool = ThreadPoolExecutor(1, thread_name_prefix="jointspace-compute")
        self.decode_pool = ThreadPoolExecutor(decode_threads(settings.decode_workers, self.device, workers),
                                              thread_name_prefix="jointspace-decode")
        # the memory the upload decodings running at once may hold, each estimated from its header
        # (training/data/decode_cost.py)
        self.decode_budget = MemoryBudget(settings.decode_memory_bytes)
        self.auth_failures = FailureLimiter(settings.auth_failures_per_minute)     # wrong API keys per address
        # thumbnails and video frames: one admission, threads of their own, a memory budget (service/decoding.py)
        self.media = MediaDecoder(settings.thumbnail_workers, settings.max_thumbnails, settings.media_memory_bytes,
                                  metrics)
        self.queues = {q.name: q for q in queues}
        # requests on their way to each batcher, and to the model without one (InFlightMiddleware)
        self.inflight = {name: 0 for name in (*self.queues, DIRECT)}
        # the model's similarity bounds min_score: known from the index's manifest before anything is loaded
        self.similarity = self._similarity()
        # a batcher per queue; one that needs the decoder is created once the model is loaded, only when it has
        # one (the routes that need it answer 409 without)
        self.batchers: dict[str, DynamicBatcher] = {q.name: self._batcher(q) for q in queues if not q.decoder}
        self._tasks: list[asyncio.Task] = []

    def _similarity(self) -> str:
        if self.gallery is not None:
            return self.gallery.manifest["similarity"]
        try:
            return read_manifest(self.settings.index)["similarity"]
        except Exception:  # noqa: BLE001 - no index yet: loading will fail and say why (/readyz)
            return "cosine"

    def _batcher(self, queue: BatcherSpec) -> DynamicBatcher:
        """A dynamic batcher with the service's batching settings, running ``queue``'s engine method on the compute
        thread."""
        batching, name = self.settings.batching, queue.name
        return DynamicBatcher(lambda items: queue.run(self.loaded.engine, items), self.compute_pool,
                              max_batch=self.settings.max_batch if batching else 1,
                              max_wait_ms=self.settings.max_wait_ms if batching else 0.0,
                              max_queue=self.settings.max_queue, name=name, metrics=self.metrics,
                              pending=lambda: self.inflight[name])

    def deadline(self, arrival: float | None) -> float | None:
        """The ``time.monotonic()`` instant after which a request that arrived at ``arrival`` is dropped."""
        if not self.settings.deadline_ms or arrival is None:
            return None
        return arrival + self.settings.deadline_ms / 1000.0

    @property
    def public_error(self) -> str | None:
        """The loading error as ``/readyz`` shows it: every file path cut to its last name (the full error, with
        the server's paths, is in the log)."""
        return None if self.error is None else _PATH.sub(lambda m: "…/" + m.group(1), self.error)

    @property
    def ready(self) -> bool:
        return self.engine is not None

    def warmup_sizes(self) -> tuple[int, ...]:
        """The batch sizes run before ready (``settings.warmup``; auto: all on CUDA, the smallest on the CPU)."""
        sizes = self.shapes.sizes if self.shapes is not None else (1,)
        mode = self.settings.warmup
        if mode == "auto":
            mode = "all" if self.device.type == "cuda" else "smallest"
        return {"all": sizes, "smallest": sizes[:1], "off": ()}[mode]

    @property
    def search_backend(self) -> str:
        return self.gallery.images.backend if self.gallery is not None else "none"

    @property
    def loaded(self) -> Loaded:
        """The model, index and engine; only once ready (the routes' dependency waits for that: 503 before)."""
        if self.engine is None or self.gallery is None or self.model is None:
            raise RuntimeError("the model and index are not loaded yet")
        return Loaded(self.model, self.gallery, self.engine)

    @property
    def has_decoder(self) -> bool:
        """The loaded model carries a caption/paraphrase decoder (Show, Translate and Tell)."""
        return has_decoder(self.model)

    async def start(self) -> None:
        self._torch_threads = torch.get_num_threads()
        # the cores go to torch's threads: numpy's and FAISS's BLAS pools get one thread each (their products
        # between forward passes are small, and their idle threads spin against torch's: threads.py)
        self._restore_blas = single_threaded_blas()
        if self.device.type == "cpu":
            torch.set_num_threads(cpu_threads(self.settings.torch_threads,
                                              self.worker.count if self.worker is not None else 1))
        for batcher in self.batchers.values():
            await batcher.start()
        self._tasks.append(asyncio.create_task(self._load(), name="jointspace-load"))

    async def until_loaded(self) -> None:
        """Returns once the model and the index are loaded and warmed up; RuntimeError saying why when loading
        failed. (A worker of ``serve --workers`` starts taking connections only then, so that its siblings answer
        them meanwhile.)"""
        await self._tasks[0]
        if self.error is not None:
            raise RuntimeError(f"loading failed: {self.error}")

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - shutting down
                pass
        for batcher in self.batchers.values():
            await batcher.stop()
        self.compute_pool.shutdown(wait=False, cancel_futures=True)
        self.decode_pool.shutdown(wait=False, cancel_futures=True)
        self.media.shutdown()
        torch.set_num_threads(self._torch_threads)      # the process's setting, as it was before start()
        self._restore_blas()                            # and its BLAS pools'
        gc.unfreeze()                                   # let a clean shutdown free everything again

    async def _load(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            if self.model is None:
                model_file = str(resolve(self.settings.model))      # the shipped model when none is set
                self.model = await loop.run_in_executor(self.compute_pool, load_model, model_file, self.device)
            else:
                self.model = self.model.to(self.device).eval()
            model = self.model
            # the image tower's backend (OpenVINO / ONNX Runtime on a CPU): converted, or read from its cache, before
            # the warm-up, so that the warm-up and every request run on it
            self.backend = await loop.run_in_executor(self.compute_pool, use_backend, model, self.settings.backend)
            gallery = self.gallery
            if gallery is None:
                if not self.settings.index:
                    raise ValueError("no index: set --index or JOINTSPACE_INDEX")
                gallery = self.gallery = await loop.run_in_executor(self.compute_pool, self._open_gallery,
                                                                    self.settings.index)
            else:
                await loop.run_in_executor(self.compute_pool, lambda: gallery.photos)   # warm, off the loop
            if self.has_decoder:
                for queue in self.queues.values():
                    if queue.decoder:
                        self.batchers[queue.name] = self._batcher(queue)
                        await self.batchers[queue.name].start()
            # the decoders that are imported on first use (PyAV, pillow-heif) are imported here, once, before the
            # decoding threads may each need one first: a first import is not safe from two threads at once
            await loop.run_in_executor(self.compute_pool, _import_decoders)
            engine = Engine(model, gallery, self.shapes)
            sizes = self.warmup_sizes()
            self.phase = "warming up"
            self.warmup_seconds = await loop.run_in_executor(self.compute_pool, engine.warm_up, sizes)
            log.info("warm-up: batch sizes %s of the text and image searches in %.1f s (device %s, image backend "
                     "%s, search backend %s; the slowest steps: %s)", ",".join(map(str, sizes)) or "none",
                     self.warmup_seconds, self.device, self.backend, gallery.images.backend,
                     ", ".join(f"{route} at {size} {seconds:.1f} s" for route, size, seconds in
                               sorted(engine.warmup_steps, key=lambda step: -step[2])[:3]) or "none")
            self.engine = engine
            self.phase = "ready"
            self._count_vectors(gallery)
            # Everything loaded so far (torch, FastAPI, pydantic, the model) lives as long as the process: keep it
            # out of the cyclic GC, whose full collections otherwise scan it all, pausing every request in flight
            # once every few seconds under load.
            gc.freeze()
            log.info("ready: model %s…, index %s (%s)", self.model.fingerprint[:12], gallery.root,
                     gallery.generation)
            if self.settings.prepare_text_tower and (self.worker is None or self.worker.index == 0):
                self._tasks.append(asyncio.create_task(self._prepare_text_tower(), name="jointspace-text-tower"))
        except Exception as err:  # noqa: BLE001 - reported by /readyz and the log
            self.error = f"{type(err).__name__}: {err}"
            log.error("loading failed: %s", self.error)
            return
        if self.settings.reload_interval_s > 0:
            self._tasks.append(asyncio.create_task(self._watch(), name="jointspace-reload"))

    async def _prepare_text_tower(self) -> None:
        """Once ready, in the background: the served model file's text tower for ``index search --text``
        (training/inference/text_tower.py), prepared unless the cache holds it, in a process of its own at low
        priority (``python -m training.inference.text_tower``), so that neither readiness nor the requests wait
        for it and a failed conversion cannot take the service down. Stopping the service stops it."""
        try:
            path = str(resolve(self.settings.model))
            if text_tower.unsupported_reason(self.model) is not None \
                    or await asyncio.to_thread(text_tower.prepared, path):
                return
            proc = await asyncio.create_subprocess_exec(*text_tower.command(path, self.model.fingerprint),
                                                        stdin=asyncio.subprocess.DEVNULL,
                                                        stdout=asyncio.subprocess.DEVNULL,
                                                        stderr=asyncio.subprocess.PIPE)
        except Exception as err:  # noqa: BLE001 - a search prepares it later: the service goes on
            log.warning("text encoder for terminal searches: not prepared in the background: %s: %s",
                        type(err).__name__, err)
            return
        log.info("text encoder for terminal searches: preparing it in the background (process %d)", proc.pid)
        try:
            _, said = await proc.communicate()
        except asyncio.CancelledError:
            proc.kill()
            await proc.wait()
            raise
        lines = said.decode(errors="replace").strip().splitlines()
        (log.info if proc.returncode == 0 else log.warning)(
            "%s (exit %d)", lines[-1] if lines else "text encoder for terminal searches: no answer", proc.returncode)

    def _open_gallery(self, root: str | Path) -> Gallery:
        # the segments the loaded generation shares with the new one are taken as they are, not read again
        gallery = Gallery.load(root, model=self.model, device=self.device, mmap=self.settings.index_mmap,
                               previous=self.gallery, backend=self.settings.search_backend)
        gallery.photos          # the photo table for filters and result metadata, read here, off the event loop
        return gallery

    def _count_vectors(self, gallery: Gallery) -> None:
        self.metrics.index_vectors.labels("images").set(gallery.images.ntotal)
        self.metrics.index_vectors.labels("captions").set(gallery.captions.ntotal)

    async def reload_if_changed(self) -> bool:
        """Swaps in the index's live generation when it is not the one loaded; True when it did."""
        loaded = self.loaded
        root = Path(loaded.gallery.root)
        try:
            generation = current_generation(root)
        except (FileNotFoundError, ValueError) as err:
            log.warning("index reload skipped: %s", err)
            return False
        if generation == loaded.gallery.generation:
            return False
        loop = asyncio.get_running_loop()
        try:
            gallery = await loop.run_in_executor(self.decode_pool, self._open_gallery, root)
        except Exception as err:  # noqa: BLE001 - keep serving the generation we have
            log.error("index reload failed, still serving %s: %s", loaded.gallery.generation, err)
            return False
        self.gallery = loaded.engine.gallery = gallery
        self._count_vectors(gallery)
        log.info("index reloaded: %s", gallery.generation)
        return True

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.settings.reload_interval_s)
            await self.reload_if_changed()
