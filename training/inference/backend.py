"""The image tower's inference backend: the frozen backbones run by OpenVINO or ONNX Runtime on a CPU instead of
eager PyTorch, everything above them (projection, concept head, normalisation) in PyTorch over exactly the features
the backend computes.

What a backend runs is :class:`ImageTower`: uint8 pixels (``model.preprocess.pixels``), normalised inside the graph
(:func:`pixel_affine`), then the model's own ``image_features`` over one view per row — one backbone, the stacked
backbones of a ``ConcatBackbone`` or an ensemble's members alike — traced once, converted
(OpenVINO's IR, or an ONNX graph for ONNX Runtime) and cached under ``$JOINTSPACE_CACHE/backends`` (default
``~/.cache/jointspace/backends``), one folder per :func:`tower_fingerprint` (the tower's weights and preprocessing,
the converter's version): a changed model is converted again, an unchanged one on another day or in another index
is read back in a fraction of a second. A folder is written whole under a temporary name and renamed, so a reader
never sees half of one; where the cache cannot be written, the tower is converted for the process alone. A
conversion is checked against eager PyTorch on a probe batch before it is kept.

Names (``--backend``, ``JOINTSPACE_BACKEND``; :data:`BACKENDS`):

* ``auto`` (default): on a CPU the first of :data:`AUTO` that loads; eager PyTorch on CUDA, for a model whose
  backbone trains (not pretrained, ``image.train_blocks`` / learned pooling) and for region attention;
* ``eager``: PyTorch as the model is;
* ``openvino``: OpenVINO in float32 (its CPU plugin would otherwise pick bf16 where the CPU has it);
* ``openvino-bf16``: OpenVINO with bf16 inference precision (a CPU with native bf16: AVX-512 BF16 or AMX; looser
  features, docs/benchmarks.md measures what it does to ranking);
* ``onnxruntime``: ONNX Runtime's CPU provider, all graph optimisations.

OpenVINO runs a batch of one row (an interactive query) as one request on all of the backend's threads, and a
batch of several rows (bulk embedding, a service batch) one row per request across its CPU streams
(``PERFORMANCE_HINT: THROUGHPUT``: on 2 cores two streams of one thread each), which embeds more views a second
(docs/benchmarks.md#inference-backends). Each way is compiled on its first use, ``use_backend(prepare=...)``
compiles one at load; compiled graphs are kept in OpenVINO's own cache beside the graph (``compiled/``), so a later
process imports them instead of compiling again.

Any failure to load or convert falls back to eager PyTorch with one log line. :func:`use_backend` attaches the
chosen backend to a model; :func:`tower_features` is what ``embed.py``'s ``embed_pixels`` and ``pixel_features``
call — the one code path above it, for the indexer, the service's image route, query by example and video frames.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, cast
from weakref import WeakKeyDictionary

import numpy as np
import torch
from torch import nn

from training.models.protocol import EmbeddingModel, has_attention

from .names import AUTO_CPU as AUTO
from .names import BACKEND_ENV as ENV
from .names import BACKENDS

FORMAT = 2                           # of the cached graphs: bump to convert every model again (2: uint8 input)
OPSET = 17                           # ONNX opset of the exported graphs
# a conversion is kept when every probe row's features have at least this cosine with eager PyTorch's
AGREEMENT = {"openvino": 0.9999, "openvino-bf16": 0.99, "onnxruntime": 0.9999}

log = logging.getLogger("jointspace.backend")


def backend_choice(given: str | None = None) -> str:
    """The backend asked for: ``given`` (a flag), else ``$JOINTSPACE_BACKEND``, else ``auto``. ValueError naming
    the known ones for another name."""
    source = "--backend" if given else ENV
    name = (given or os.environ.get(ENV) or "auto").strip().lower()
    if name not in BACKENDS:
        raise ValueError(f"unknown inference backend {name!r} ({source}); known: {', '.join(BACKENDS)}")
    return name


def cache_root() -> Path:
    """Where converted graphs are kept: ``$JOINTSPACE_CACHE/backends`` (``~/.cache/jointspace/backends``)."""
    return Path(os.environ.get("JOINTSPACE_CACHE") or Path.home() / ".cache" / "jointspace") / "backends"


def pixel_affine(preprocess: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``(scale, shift)`` with ``preprocess.normalize(x) == x · scale + shift`` for uint8 pixels ``x`` ``(..., C, S,
    S)``: a normalisation is elementwise affine (``(x / 255 − mean) / std`` per channel; a stacked preprocessing's
    padding stays 0), so it is read off the normalisation itself at 0 and 255, checked at 128, and kept per channel
    ``(C, 1, 1)`` when it is the same at every pixel, else ``(C, S, S)``. ValueError for one that is not affine."""
    channels, side = preprocess.channels, preprocess.image_size

    def at(value: int) -> torch.Tensor:
        return preprocess.normalize(torch.full((1, channels, side, side), value, dtype=torch.uint8))[0].float()
    shift = at(0)
    scale = (at(255) - shift) / 255
    if not torch.allclose(at(128), shift + 128 * scale, atol=1e-5):
        raise ValueError("the preprocessing's normalisation is not elementwise affine")
    if bool((scale == scale[:, :1, :1]).all() and (shift == shift[:, :1, :1]).all()):
        return scale[:, :1, :1].clone(), shift[:, :1, :1].clone()
    return scale, shift


class ImageTower(nn.Module):
    """What a backend runs: uint8 pixels ``(N, C, S, S)``, one view a row, normalised as ``model.preprocess`` does
    (:func:`pixel_affine`) and through the model's ``image_features`` → backbone features ``(N, D)`` (the views of
    a photo are averaged afterwards, in PyTorch, as the model does)."""

    def __init__(self, model: EmbeddingModel):
        super().__init__()
        self.model = cast(nn.Module, model)
        scale, shift = pixel_affine(model.preprocess)
        self.register_buffer("scale", scale, persistent=False)
        self.register_buffer("shift", shift, persistent=False)

    scale: torch.Tensor
    shift: torch.Tensor

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return cast(EmbeddingModel, self.model).image_features(pixels.float() * self.scale + self.shift)


def _input_shape(model: EmbeddingModel) -> tuple[int, int]:
    pre = model.preprocess
    return pre.channels, pre.image_size


def eager_reason(model: EmbeddingModel) -> str | None:
    """Why ``model``'s image tower stays in eager PyTorch whatever is asked, or None: a backend converts frozen
    pretrained CNNs for a CPU."""
    try:
        device = next(model.parameters()).device
    except StopIteration:
        return "the model has no weights"
    if device.type != "cpu":
        return f"the model runs on {device.type}"
    if has_attention(model):
        return "the model scores image regions (region attention)"
    if not getattr(model, "backbone_pretrained", False):
        return "its image backbone trains with the model"
    members = getattr(model, "models", None) or [model]
    if any(getattr(m, "image_split", None) is not None for m in members):
        return "its backbone's top trains with the model (image.train_blocks or learned pooling)"
    return None


def tower_fingerprint(model: EmbeddingModel, kind: str) -> str:
    """sha256 of what a converted graph depends on: the cache format, the converter (``kind`` and its version),
    torch's version (it traces), the model's class, preprocessing and image settings, and every backbone weight."""
    h = hashlib.sha256()
    h.update(json.dumps({"format": FORMAT, "kind": kind, "converter": _converter_version(kind),
                         "torch": torch.__version__, "class": type(model).__name__,
                         "preprocess": model.preprocess.to_dict(), "input": _input_shape(model),
                         "image": model.cfg.image.model_dump()}, sort_keys=True, default=str).encode())
    backbone: nn.Module = cast(Any, model).backbone     # a JointEmbedding's, or an ensemble's members' (a list)
    for key, tensor in backbone.state_dict().items():
        h.update(key.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _converter_version(kind: str) -> str:
    if kind == "openvino":
        return openvino().__version__
    import onnxruntime

    return f"onnxruntime {onnxruntime.__version__} opset {OPSET}"


@dataclass
class Backend:
    """A loaded backend: ``run`` maps uint8 pixels ``(N, C, S, S)`` to features ``(N, D)`` (numpy, CPU)."""
    name: str
    run: Callable[[np.ndarray], np.ndarray]
    path: Path                      # the cached graph's folder
    converted: bool                 # converted by this load (False: read from the cache)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def features(self, pixels: torch.Tensor) -> torch.Tensor:
        """uint8 pixels ``(B, 3k, S, S)`` or multi-view ``(B, V, 3k, S, S)`` (``model.preprocess.pixels``, not
        normalised: the graph normalises) → backbone features ``(B, D)``, float32 on the CPU, the views averaged
        as ``image_features`` averages them."""
        if pixels.dtype != torch.uint8:
            raise TypeError(f"a backend takes uint8 pixels, got {pixels.dtype}")
        views = pixels.shape[1] if pixels.dim() == 5 else 1
        flat = pixels.flatten(0, 1) if pixels.dim() == 5 else pixels
        array = np.ascontiguousarray(flat.detach().cpu().numpy())
        with self._lock:             # one call at a time: the service's compute thread, or the indexer
            out = torch.from_numpy(np.array(self.run(array), dtype=np.float32, copy=True))
        return out.view(-1, views, out.shape[-1]).mean(1)


_ATTACHED: WeakKeyDictionary[Any, Backend] = WeakKeyDictionary()


def attached(model: EmbeddingModel) -> str:
    """The backend ``model``'s image tower runs on: a name of :data:`BACKENDS` (``eager`` when none is attached)."""
    backend = _ATTACHED.get(model)
    return "eager" if backend is None else backend.name


def backend_of(model: EmbeddingModel) -> Backend | None:
    return _ATTACHED.get(model)


def tower_features(model: EmbeddingModel, pixels: torch.Tensor, device: torch.device | None = None) -> torch.Tensor:
    """uint8 pixels ``(B, [V,] C, S, S)`` (``model.preprocess.pixels``) → pooled backbone features ``(B, D)`` on
    ``device`` (default: the pixels'): through the backend attached to ``model`` (:func:`use_backend`), which
    normalises in its graph, else normalised (``model.preprocess.normalize``) on ``device`` and through the
    model's own forward pass."""
    device = pixels.device if device is None else torch.device(device)
    backend = _ATTACHED.get(model)
    if backend is not None:
        return backend.features(pixels).to(device)
    return model.image_features(model.preprocess.normalize(pixels.to(device, non_blocking=True)))


PREPARE = ("latency", "throughput")


def use_backend(model: EmbeddingModel, name: str | None = None, cache: str | Path | None = None,
                prepare: str = "latency") -> str:
    """Runs ``model``'s image tower on the backend ``name`` (:func:`backend_choice`: the flag, else
    ``$JOINTSPACE_BACKEND``, else ``auto``) from now on, converting it (or reading its cached conversion from
    ``cache``, default :func:`cache_root`). Returns the backend in use: ``eager`` when asked, when the model is not
    one a backend runs (:func:`eager_reason`) or when loading failed — said in one log line. ``prepare``: the way
    of running it that is compiled and tried at load (``latency``: one row at a time, an interactive service;
    ``throughput``: batches across CPU streams, bulk embedding); the other is compiled on its first use. Call it
    once the model is on its device, in eval mode, with its final weights."""
    if prepare not in PREPARE:
        raise ValueError(f"prepare must be one of {', '.join(PREPARE)}, got {prepare!r}")
    choice = backend_choice(name)
    _ATTACHED.pop(model, None)
    if choice == "eager":
        return "eager"
    reason = eager_reason(model)
    if reason is not None:
        if choice != "auto":
            log.warning("inference backend %s not used: %s; the image tower runs in eager PyTorch", choice, reason)
        return "eager"
    root = Path(cache) if cache is not None else cache_root()
    failures = []
    for candidate in AUTO if choice == "auto" else (choice,):
        try:
            backend = _load(model, candidate, root, prepare)
        except Exception as err:  # noqa: BLE001 - any failure to load or convert: the next one, else eager
            failures.append(f"{candidate}: {type(err).__name__}: {err}".replace("\n", " "))
            continue
        _ATTACHED[model] = backend
        log.info("inference backend: %s (%s %s)%s", candidate, "converted to" if backend.converted else "read from",
                 backend.path, f"; not loaded: {'; '.join(failures)}" if failures else "")
        return candidate
    log.warning("inference backend %s failed (%s); the image tower runs in eager PyTorch", choice,
                "; ".join(failures))
    return "eager"


def _load(model: EmbeddingModel, name: str, root: Path, prepare: str = "latency") -> Backend:
    kind = "openvino" if name.startswith("openvino") else "onnxruntime"
    key = f"{kind}-{tower_fingerprint(model, kind)[:32]}"
    file = "tower.xml" if kind == "openvino" else "tower.onnx"
    converted = not (root / key / file).is_file()
    scratch = None
    if converted and not _writable(root):       # a read-only cache: converted for this process alone
        scratch = root = Path(tempfile.mkdtemp(prefix="jointspace-backends-"))
    try:
        if converted:
            _convert(model, kind, name, root / key)
        graph = root / key / file
        run = (_open_openvino(graph, name == "openvino-bf16", cache=scratch is None) if kind == "openvino"
               else _open_onnxruntime(graph))
        channels, side = _input_shape(model)
        # it runs: the first call's set-up paid here, for the way of running it that the caller uses
        run(np.zeros((2 if prepare == "throughput" else 1, channels, side, side), np.uint8))
    finally:
        if scratch is not None:                 # the runtimes hold the graph in memory once it is loaded
            shutil.rmtree(scratch, ignore_errors=True)
    return Backend(name, run, root / key, converted)


def _writable(root: Path) -> bool:
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(root, os.W_OK | os.X_OK)


def _probe(model: EmbeddingModel) -> torch.Tensor:
    """Two deterministic uint8 images: what a conversion is checked on."""
    channels, side = _input_shape(model)
    return torch.randint(0, 256, (2, channels, side, side), dtype=torch.uint8,
                         generator=torch.Generator().manual_seed(0))


def _convert(model: EmbeddingModel, kind: str, name: str, folder: Path) -> None:
    """Traces the tower, writes its graph into a temporary folder beside ``folder``, checks it against eager
    PyTorch and renames the folder into place (another process that got there first wins)."""
    tower = ImageTower(model).eval()
    probe = _probe(model)
    scratch = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    os.chmod(scratch, 0o755)            # readable as the rest of the cache (mkdtemp makes it the owner's only)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            # the tracer's and exporters' advice (Python values taken as constants, the TorchScript exporter's
            # deprecation): the graph is checked against eager PyTorch below instead
            warnings.simplefilter("ignore")
            traced = torch.jit.trace(tower, probe[:1], check_trace=False)
            expected = model.image_features(model.preprocess.normalize(probe))    # eager PyTorch, as it runs
            if kind == "onnxruntime":
                torch.onnx.export(traced, (probe[:1],), str(scratch / "tower.onnx"), dynamo=False,
                                  input_names=["images"], output_names=["features"], opset_version=OPSET,
                                  dynamic_axes={"images": {0: "batch"}, "features": {0: "batch"}})
        if kind == "openvino":
            ov = openvino()
            channels, side = _input_shape(model)
            graph = ov.convert_model(traced, example_input=probe[:1])
            graph.reshape({graph.inputs[0]: ov.PartialShape([-1, channels, side, side])})
            ov.save_model(graph, str(scratch / "tower.xml"), compress_to_fp16=False)
            run = _open_openvino(scratch / "tower.xml", name == "openvino-bf16", cache=False)
        else:
            run = _open_onnxruntime(scratch / "tower.onnx")
        # the batch and the single row alike (OpenVINO runs them differently, _OpenVINO)
        got = torch.from_numpy(np.concatenate([run(probe.numpy()), run(probe[:1].numpy())]).astype(np.float32))
        agreement = torch.nn.functional.cosine_similarity(got, torch.cat([expected, expected[:1]]).float(),
                                                          dim=-1).min().item()
        if not agreement >= AGREEMENT[name]:
            raise RuntimeError(f"the converted graph disagrees with eager PyTorch (cosine {agreement:.6f} < "
                               f"{AGREEMENT[name]})")
        try:
            os.rename(scratch, folder)
        except OSError:
            if not folder.is_dir():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


_CORE: Any = None


def openvino() -> Any:
    """The ``openvino`` module, imported without its usage telemetry: OpenVINO's converter reports its import and
    every conversion to Intel unless the user opted out (the ``openvino-telemetry`` package, on by default), and
    an indexer of someone's photos sends nothing anywhere. With that package unimportable in this process OpenVINO
    uses its own no-op stub (nothing is written under ``~/intel`` either)."""
    if "openvino" not in sys.modules:
        sys.modules.setdefault("openvino_telemetry", cast(Any, None))
    import openvino as ov

    return ov


class _OpenVINO:
    """An OpenVINO IR on the CPU for one row a request (its batch dimension fixed at 1), compiled two ways, each on
    its first use: ``LATENCY`` (one request on all threads) for a batch of one row, ``THROUGHPUT`` (the CPU streams
    OpenVINO picks for the threads, one request per stream) for a batch of several, run one row per request: on 2
    cores two single-thread streams embed more views a second than one request of the whole batch on both threads,
    while one row on both threads answers sooner than on one stream
    (docs/benchmarks.md#the-tower-alone-and-torchcompile). Calls are serialised by the :class:`Backend` that holds
    it."""

    def __init__(self, graph: Path, bf16: bool, cache: Path | None):
        ov = openvino()
        global _CORE
        if _CORE is None:
            _CORE = ov.Core()
        if bf16 and "BF16" not in _CORE.get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
            raise RuntimeError("this CPU has no native bf16 (AVX-512 BF16 or AMX)")
        self.graph = _CORE.read_model(str(graph))
        # every request is one row (below): compiled for that static shape, which runs faster than a dynamic batch
        shape = self.graph.inputs[0].get_partial_shape()
        self.graph.reshape({self.graph.inputs[0]: ov.PartialShape([1, *list(shape)[1:]])})
        self.config = {"INFERENCE_PRECISION_HINT": "bf16" if bf16 else "f32",
                       "INFERENCE_NUM_THREADS": torch.get_num_threads(),
                       **({"CACHE_DIR": str(cache)} if cache is not None else {})}
        self._request: Any = None
        self._queue: Any = None
        self._dim = 0
        self._out: np.ndarray | None = None

    def _compile(self, hint: str) -> Any:
        return _CORE.compile_model(self.graph, "CPU", {**self.config, "PERFORMANCE_HINT": hint})

    def __call__(self, pixels: np.ndarray) -> np.ndarray:
        if len(pixels) <= 1:
            if self._request is None:
                self._request = self._compile("LATENCY").create_infer_request()
            return self._request.infer({0: pixels})[0]
        if self._queue is None:
            compiled = self._compile("THROUGHPUT")
            self._dim = compiled.output(0).get_partial_shape()[1].get_length()
            self._queue = openvino().AsyncInferQueue(compiled, compiled.get_property(
                "OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
            self._queue.set_callback(self._done)
        out = self._out = np.empty((len(pixels), self._dim), np.float32)   # each request writes its own row
        try:
            for row in range(len(pixels)):
                self._queue.start_async({0: pixels[row:row + 1]}, row)
            self._queue.wait_all()
        finally:
            self._out = None
        return out

    def _done(self, request: Any, row: int) -> None:
        assert self._out is not None
        self._out[row] = request.get_output_tensor(0).data[0]


def _open_openvino(graph: Path, bf16: bool, cache: bool = True) -> Callable[[np.ndarray], np.ndarray]:
    """The IR at ``graph`` for the CPU (:class:`_OpenVINO`): float32 inference precision, or bf16 (refused on a CPU
    without native bf16), on torch's intra-op thread count; ``cache``: compiled graphs kept in ``compiled/`` beside
    it where that folder can be written (OpenVINO's ``CACHE_DIR``: it compiles again over a damaged file)."""
    folder = graph.parent / "compiled"
    if cache:
        try:
            folder.mkdir(exist_ok=True)
        except OSError:
            cache = False
    return _OpenVINO(graph, bf16, folder if cache and os.access(folder, os.W_OK | os.X_OK) else None)


def _open_onnxruntime(graph: Path) -> Callable[[np.ndarray], np.ndarray]:
    """The ONNX graph at ``graph`` in an ONNX Runtime CPU session with every graph optimisation, on torch's
    intra-op thread count."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = torch.get_num_threads()
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])

    def run(images: np.ndarray) -> np.ndarray:
        return session.run(None, {"images": images})[0]
    return run
