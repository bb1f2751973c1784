"""Bulk gallery embedding on Ray Data (``jointspace index build --engine ray``): image embeddings as shards.

The image list is cut into *shards* of ``shard_size`` consecutive images. Ray Data runs the shards that are not
on disk yet through ``map_batches`` on a pool of actors (:class:`ShardEmbedder`: each loads the model once, from
bytes the driver ships, and embeds a shard exactly as the in-process engine does,
:func:`~index.embed.embed_photos`); the driver writes every shard it receives atomically into the shard
directory. When all shards are there, they are read back in order and handed to
:func:`~index.gallery.build_from_embeddings`, the code the in-process build runs: same FAISS index, same metadata.

Shard directory::

    SHARD_DIR/
      .lock                            flock held by the driver while it runs
      shard-00000-3f2a9c0e1b7d4a55.npz shard 0: images 0 .. shard_size-1 of the list
      shard-00001-9d0c2e6f11a8b342.npz
      ...

The name holds the shard's number and a key: a hash of the model's fingerprint and of the shard's files (absolute
path, size, modification time). A shard (``numpy.savez``, no pickles) holds the vectors, the positions of the
readable images in the shard, their :class:`~index.embed.PhotoInfo` fields, the unreadable files with the reason,
and the paths and fingerprint it was made from. It is written to a temporary file, fsynced and renamed, so a
shard file is whole or absent. A re-run with the same model and files finds the shards already written and
embeds only the missing ones (after a failed worker, a killed driver, or a deleted shard); a changed file or
another model changes the key, and its shard is embedded again. Shard files no longer in the plan are deleted.

Ray is imported only here and only when this engine runs: the in-process engine never imports it. Without an
address a local Ray is started in this process (``workers`` × ``cpus_per_worker`` CPUs) and shut down at the
end; with one (``host:port`` of a head node, ``ray://host:port`` for Ray Client, or ``auto``) the existing
cluster is used, and every worker must read the image files and hold jointspace's code (docs/scale.md).
"""
from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import re
import socket
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from training.data.fileio import atomic_path
from training.inference.embedding import FileEmbeddings, device_of

from .embed import PhotoDecoding, PhotoInfo, decode_photos, embed_photos

SHARD_FORMAT = "jointspace-shard/1"
DEFAULT_SHARD_SIZE = 256
_SHARD = re.compile(r"^shard-(\d{5,})-([0-9a-f]{16})\.npz$")
_INFO_FIELDS = ("taken", "width", "height", "folder", "sha256", "size", "mtime", "phash", "text_likelihood")
NO_HASH = -1                 # a shard's phash of a photo without one (hashes are non-negative, index/phash.py)


@dataclass(frozen=True)
class ShardSpec:
    """One shard of the plan: images ``start .. start + len(paths) - 1`` of the list."""
    number: int
    start: int
    paths: tuple[str, ...]       # absolute paths (workers may run elsewhere, in another working directory)
    key: str

    @property
    def name(self) -> str:
        return f"shard-{self.number:05d}-{self.key}.npz"


@dataclass
class RayEmbedding:
    """What :func:`embed_with_ray` returns: the gallery's embeddings and which shards it embedded or reused."""
    embeddings: FileEmbeddings
    embedded: list[int] = field(default_factory=list)     # shard numbers embedded by this run's actors
    reused: list[int] = field(default_factory=list)       # shard numbers read from the shard directory
    shard_dir: Path = Path()


def _stat_key(path: str) -> str:
    try:
        st = os.stat(path)
    except OSError:
        return "missing"
    return f"{st.st_size}:{st.st_mtime_ns}"


def plan_shards(paths: Sequence[str | Path], shard_size: int, fingerprint: str) -> list[ShardSpec]:
    """Cuts ``paths`` into shards of ``shard_size`` and keys each by the model and its files' size and mtime."""
    if shard_size < 1:
        raise ValueError(f"the shard size must be at least 1 (got {shard_size})")
    absolute = [str(Path(p).resolve()) for p in paths]
    shards = []
    for number, start in enumerate(range(0, len(absolute), shard_size)):
        chunk = tuple(absolute[start:start + shard_size])
        digest = hashlib.sha256(fingerprint.encode())
        for p in chunk:
            digest.update(b"\0" + p.encode("utf-8", "surrogateescape") + b"\0" + _stat_key(p).encode())
        shards.append(ShardSpec(number, start, chunk, digest.hexdigest()[:16]))
    return shards


# --- shard files -----------------------------------------------------------------------------------------------

def encode_shard(spec: ShardSpec, emb: FileEmbeddings, fingerprint: str) -> bytes:
    """A shard's embeddings (positions relative to the shard) as the bytes of an ``.npz`` file."""
    arrays: dict[str, np.ndarray] = {
        "format": np.array(SHARD_FORMAT), "fingerprint": np.array(fingerprint), "key": np.array(spec.key),
        "paths": np.array(spec.paths, dtype=str),
        "vectors": np.ascontiguousarray(emb.vectors, dtype=np.float32),
        "kept": np.asarray(emb.kept, dtype=np.int64),
        "unfamiliarity": (np.zeros(0, np.float32) if emb.unfamiliarity is None       # empty: the model has none
                          else np.asarray(emb.unfamiliarity, dtype=np.float32)),
        "skipped_path": np.array([p for p, _ in emb.skipped], dtype=str),
        "skipped_reason": np.array([r for _, r in emb.skipped], dtype=str),
    }
    for name in _INFO_FIELDS:
        values = [getattr(info, name) for info in emb.info]
        if name == "phash":
            values = [NO_HASH if v is None else v for v in values]
        elif name == "text_likelihood":          # the OCR gate's score (index/ocr.py): NaN for none
            values = [np.nan if v is None else v for v in values]
        arrays[f"info_{name}"] = np.array(values, dtype=str if name in ("folder", "sha256") else
                                          np.int64 if name in ("width", "height", "size", "phash") else np.float64)
    buf = io.BytesIO()
    np.savez(buf, **arrays)      # type: ignore[arg-type]  # numpy's stub reads the first keyword as allow_pickle
    return buf.getvalue()


def write_shard(shard_dir: Path, spec: ShardSpec, data: bytes) -> Path:
    """Writes a shard's bytes under its final name atomically (temporary file, fsync, rename, directory fsync)."""
    path = shard_dir / spec.name
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    fd = os.open(shard_dir, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def read_shard(path: Path, spec: ShardSpec, fingerprint: str) -> FileEmbeddings | None:
    """A shard file's embeddings (positions relative to the shard), or None when the file is missing, unreadable
    or was made from other files or another model (it is then embedded again)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            if (str(z["format"]) != SHARD_FORMAT or str(z["fingerprint"]) != fingerprint
                    or str(z["key"]) != spec.key or tuple(z["paths"].tolist()) != spec.paths):
                return None
            vectors = np.ascontiguousarray(z["vectors"], dtype=np.float32)
            kept = [int(i) for i in z["kept"]]
            unfamiliarity = np.asarray(z["unfamiliarity"], dtype=np.float32)
            skipped = list(zip(z["skipped_path"].tolist(), z["skipped_reason"].tolist()))
            columns = {name: z[f"info_{name}"].tolist() for name in _INFO_FIELDS}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):     # absent, truncated by another tool, not a shard
        return None
    if len(vectors) != len(kept) or any(not 0 <= i < len(spec.paths) for i in kept) \
            or any(len(c) != len(kept) for c in columns.values()) or len(unfamiliarity) not in (0, len(kept)):
        return None
    columns["phash"] = [None if v == NO_HASH else v for v in columns["phash"]]
    columns["text_likelihood"] = [None if v != v else v for v in columns["text_likelihood"]]    # NaN: none
    info = [PhotoInfo(**{name: columns[name][j] for name in _INFO_FIELDS}) for j in range(len(kept))]
    return FileEmbeddings(vectors, kept, skipped, info,
                          unfamiliarity=unfamiliarity if len(unfamiliarity) or not kept else None)


def gather(shards: Sequence[tuple[ShardSpec, FileEmbeddings]], dim: int) -> FileEmbeddings:
    """The shards' embeddings as one :class:`FileEmbeddings` of the whole list (positions in the list)."""
    vectors = [e.vectors for _, e in shards if len(e.kept)]
    kept = [spec.start + i for spec, e in shards for i in e.kept]
    out = np.concatenate(vectors) if vectors else np.zeros((0, dim), np.float32)
    given = [e.unfamiliarity for _, e in shards if len(e.kept)]
    known = [u for u in given if u is not None]
    unfamiliarity = (np.concatenate(known).astype(np.float32)                  # a model with a person discount
                     if known and len(known) == len(given) else None)
    return FileEmbeddings(np.ascontiguousarray(out, dtype=np.float32), kept,
                           [s for _, e in shards for s in e.skipped], [i for _, e in shards for i in e.info],
                           unfamiliarity=unfamiliarity)


# --- the actors --------------------------------------------------------------------------------------------------

class ShardEmbedder:
    """Ray Data's callable class: one per actor. Loads the model once; each call embeds one shard."""

    def __init__(self, model_bytes: bytes, fingerprint: str, device: str = "cpu", batch_size: int = 64,
                 threads: int = 1, decode: str | None = None):
        import torch

        from training.models.checkpoint import load_model

        torch.set_num_threads(max(1, threads))
        self.model = load_model(io.BytesIO(model_bytes), device)      # type: ignore[arg-type]  # torch.load reads it
        if self.model.fingerprint != fingerprint:
            raise RuntimeError("the model loaded on the Ray worker is not the driver's")
        self.fingerprint, self.batch_size = fingerprint, batch_size     # the model's device is the one it embeds on
        self.decode = decode
        if torch.device(device).type == "cuda":     # the CUDA tower (backend.py); on a CPU the actors stay eager
            from training.inference.backend import use_backend

            use_backend(self.model, prepare="throughput")

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        data = []
        for number, start, key, paths_json in zip(batch["shard"], batch["start"], batch["key"], batch["paths"]):
            spec = ShardSpec(int(number), int(start), tuple(json.loads(str(paths_json))), str(key))
            decoding = decode_photos(self.model.preprocess, spec.paths, self.batch_size, 0, device_of(self.model),
                                     how=PhotoDecoding(decode=self.decode))
            emb = embed_photos(self.model, spec.paths, progress=False, decoding=decoding)
            data.append(encode_shard(spec, emb, self.fingerprint))
        return {"shard": np.asarray(batch["shard"], dtype=np.int64), "data": np.array(data, dtype=object)}


# --- the driver ----------------------------------------------------------------------------------------------------

def check_address(address: str, timeout: float = 5.0) -> None:
    """Fails fast, with the address in the message, when nothing listens at a Ray head's ``host:port``
    (``ray://host:port`` too; ``auto`` and ``local`` are left to Ray)."""
    if address in ("auto", "local"):
        return
    hostport = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = hostport.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"--ray-address {address!r} is not host:port, ray://host:port or auto")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as err:
        raise RuntimeError(f"cannot reach the Ray cluster at {address}: {err.strerror or err} (is `ray start "
                           f"--head` running there, and is the port open?)") from None


def local_init_kwargs(num_cpus: int) -> dict:
    """``ray.init`` arguments of a local Ray: ``num_cpus`` CPUs, no dashboard, and workers that import this
    process's jointspace (its folder first on their PYTHONPATH, as when it runs from a checkout)."""
    code = str(Path(__file__).resolve().parents[1])
    pythonpath = os.pathsep.join(p for p in (code, os.environ.get("PYTHONPATH", "")) if p)
    return {"num_cpus": num_cpus, "include_dashboard": False,
            "runtime_env": {"env_vars": {"PYTHONPATH": pythonpath}}}


def _import_ray():
    try:
        import ray
        import ray.data
    except ImportError:
        raise RuntimeError("the ray engine needs Ray Data: pip install 'jointspace[ray]'") from None
    return ray


@dataclass(frozen=True)
class RayOptions:
    """Where and how the shards are embedded (``index build --engine ray``'s ``--shard-size``, ``--ray-address``,
    ``--ray-workers``, ``--ray-cpus-per-worker``, ``--ray-gpus-per-worker``, ``--batch-size``). ``address``: a Ray
    head (``host:port``, ``ray://host:port``, ``auto``); None: a local Ray with ``workers`` × ``cpus_per_worker``
    CPUs. The actors run on the GPU when ``gpus_per_worker`` > 0 (a fraction shares one GPU among actors), else on
    the CPU with ``cpus_per_worker`` torch threads each. ``decode`` (``--decode``): where an actor decodes plain
    JPEGs (``tensor_views.decode_choice``; None: ``$JOINTSPACE_DECODE`` on the actor, else torch on its GPU, PIL
    on a CPU)."""
    shard_size: int = DEFAULT_SHARD_SIZE
    address: str | None = None
    workers: int = 2
    cpus_per_worker: float = 1
    gpus_per_worker: float = 0
    batch_size: int = 64
    progress: bool = True
    decode: str | None = None


DEFAULT_RAY = RayOptions()


def embed_with_ray(model, model_bytes: bytes, paths: Sequence[str | Path], shard_dir: str | Path,
                   options: RayOptions = DEFAULT_RAY, log: Callable[[str], None] = print) -> RayEmbedding:
    """Embeds the images of ``paths`` on a pool of Ray actors (``options``), shard by shard, into ``shard_dir``,
    and returns all shards' embeddings (positions in ``paths``, as :func:`~index.embed.embed_photos`
    returns them). ``model`` is the driver's copy of the model whose file's bytes are ``model_bytes``. A Ray
    already initialized in this process is used as it is (``options.address`` is then only checked for
    reachability)."""
    if options.workers < 1:
        raise ValueError(f"--ray-workers must be at least 1 (got {options.workers})")
    if options.cpus_per_worker <= 0 or options.gpus_per_worker < 0:
        raise ValueError("--ray-cpus-per-worker must be > 0 and --ray-gpus-per-worker >= 0")
    if options.address:
        check_address(options.address)
    fingerprint = model.fingerprint
    dim = model.cfg.model.embed_dim
    plan = plan_shards(paths, options.shard_size, fingerprint)
    shard_dir = Path(shard_dir)
    shard_dir.mkdir(parents=True, exist_ok=True)
    result = RayEmbedding(FileEmbeddings(np.zeros((0, dim), np.float32), []), shard_dir=shard_dir)
    with open(shard_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        wanted = {spec.name for spec in plan}
        for stale in shard_dir.iterdir():      # other plans' shards and temporary files of a killed writer
            if (_SHARD.match(stale.name) and stale.name not in wanted) or \
                    (stale.name.startswith(".shard-") and stale.name.endswith(".tmp")):
                stale.unlink(missing_ok=True)
        done: dict[int, FileEmbeddings] = {}
        for spec in plan:
            emb = read_shard(shard_dir / spec.name, spec, fingerprint)
            if emb is not None:
                done[spec.number] = emb
        result.reused = sorted(done)
        todo = [spec for spec in plan if spec.number not in done]
        log(f"{len(plan)} shards of up to {options.shard_size} images in {shard_dir}: {len(done)} already embedded, "
            f"{len(todo)} to embed on Ray")
        if todo:
            _run(todo, model_bytes, fingerprint, shard_dir, options, result, log)
            for spec in todo:
                emb = read_shard(shard_dir / spec.name, spec, fingerprint)
                if emb is None:
                    raise RuntimeError(f"shard {spec.number} ({shard_dir / spec.name}) was not written")
                done[spec.number] = emb
        result.embeddings = gather([(spec, done[spec.number]) for spec in plan], dim)
    return result


def _run(todo: list[ShardSpec], model_bytes: bytes, fingerprint: str, shard_dir: Path, options: RayOptions,
         result: RayEmbedding, log: Callable[[str], None]) -> None:
    """Runs the shards ``todo`` through the actors and writes each one as it comes back."""
    import logging

    address, workers, progress = options.address, options.workers, options.progress
    cpus_per_worker, gpus_per_worker = options.cpus_per_worker, options.gpus_per_worker

    ray = _import_ray()
    started = not ray.is_initialized()
    if started:
        level = logging.INFO if progress else logging.WARNING
        try:
            if address:
                ray.init(address=address, logging_level=level)
            else:
                ray.init(**local_init_kwargs(max(1, int(np.ceil(workers * cpus_per_worker)))), logging_level=level)
        except (ConnectionError, ray.exceptions.RayError) as err:     # RayError: e.g. a missing auth token
            raise RuntimeError(f"cannot connect to the Ray cluster at {address or 'a new local Ray'}: {err}") from None
    try:
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = progress
        items = [{"shard": s.number, "start": s.start, "key": s.key, "paths": json.dumps(s.paths)} for s in todo]
        ds = ray.data.from_items(items, override_num_blocks=len(items))
        ds = ds.map_batches(
            ShardEmbedder, batch_size=1, compute=ray.data.ActorPoolStrategy(size=min(workers, len(todo))),
            num_cpus=cpus_per_worker, num_gpus=gpus_per_worker or None,
            fn_constructor_kwargs={"model_bytes": model_bytes, "fingerprint": fingerprint,
                                   "device": "cuda" if gpus_per_worker > 0 else "cpu", "batch_size": options.batch_size,
                                   "threads": max(1, int(cpus_per_worker)), "decode": options.decode})
        by_number = {s.number: s for s in todo}
        try:
            for row in ds.iter_rows():
                spec = by_number[int(row["shard"])]
                write_shard(shard_dir, spec, bytes(row["data"]))
                result.embedded.append(spec.number)
                log(f"shard {spec.number} written ({len(result.embedded)}/{len(todo)})")
        except ray.exceptions.RayError as err:   # an error in the actors' code (dead actors are restarted by Ray)
            raise RuntimeError(f"embedding on Ray failed after {len(result.embedded)} of {len(todo)} shards (those "
                               f"are kept in {shard_dir}: a re-run embeds the rest): {err}") from None
    finally:
        if started:
            ray.shutdown()
