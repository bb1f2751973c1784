"""The image tower's inference backend: the frozen backbones run by OpenVINO or ONNX Runtime on a CPU, or as a
float16 CUDA tower on a GPU, instead of eager PyTorch; everything above them (projection, concept head,
normalisation) in PyTorch over exactly the features the backend computes.

What a backend runs is :class:`ImageTower`: uint8 pixels (``model.preprocess.pixels``), normalised inside the graph
(:func:`pixel_affine`), then the model's own ``image_features`` over one view per row — one backbone, the stacked
backbones of a ``ConcatBackbone`` or an ensemble's members alike — converted once (an ONNX graph for ONNX Runtime,
the same graph read into OpenVINO's IR, the CUDA tower's folded float16 weights) and cached under
``$JOINTSPACE_CACHE/backends`` (default ``~/.cache/jointspace/backends``), one folder per :func:`tower_fingerprint`
(the tower's weights and preprocessing, the converter's version): a changed model is converted again, an unchanged
one on another day or in another index is read back in a fraction of a second. A folder is written whole under a
temporary name and renamed, so a reader never sees half of one; where the cache cannot be written, the tower is
converted for the process alone. A conversion is checked against eager PyTorch on a probe batch before it is kept.

Every backend is a class of one interface, :class:`Backend` (its name, the converter it caches under, the device it
runs on; ``export``, ``open``, ``forward``), registered by name in :data:`REGISTRY`; the names are defined once,
torch-free, in ``names.py`` (``--backend``, ``JOINTSPACE_BACKEND``; :data:`BACKENDS`):

* ``auto`` (default): on a CPU the first of :data:`AUTO` that loads, on a CUDA device ``cuda``; eager PyTorch for a
  model whose backbone trains (not pretrained, ``image.train_blocks`` / learned pooling) and for region attention;
* ``eager`` (:class:`Eager`): PyTorch as the model is;
* ``openvino`` (:class:`OpenVINO`): OpenVINO in float32 (its CPU plugin would otherwise pick bf16 where the CPU has
  it);
* ``openvino-bf16`` (:class:`OpenVINOBf16`): OpenVINO with bf16 inference precision (a CPU with native bf16:
  AVX-512 BF16 or AMX; looser features, docs/benchmarks.md measures what it does to ranking);
* ``onnxruntime`` (:class:`ONNXRuntime`): ONNX Runtime's CPU provider, all graph optimisations;
* ``cuda`` (:class:`CUDA`): the tower on a CUDA device in float16 with its BatchNorms folded into the convolutions
  (:func:`fold_batchnorm`) and one CUDA graph per batch bucket (:data:`BUCKETS`).

OpenVINO runs a batch of one row (an interactive query) as one request on all of the backend's threads, and a
batch of several rows (bulk embedding, a service batch) one row per request across its CPU streams
(``PERFORMANCE_HINT: THROUGHPUT``: on 2 cores two streams of one thread each), which embeds more views a second
(docs/benchmarks.md#inference-backends). Each way is compiled on its first use, ``use_backend(prepare=...)``
compiles one at load; compiled graphs are kept in OpenVINO's own cache beside the graph (``compiled/``), so a later
process imports them instead of compiling again.

Any failure to load or convert falls back to eager PyTorch with one log line. :func:`use_backend` attaches the
chosen backend to a model; :func:`tower_features` is what ``embedding.py``'s ``embed_pixels`` and ``pixel_features``
call — the one code path above it, for the indexer, the service's image route, query by example and video frames.
"""
from __future__ import annotations

import copy
import hashlib
import io
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterator, cast
from weakref import WeakKeyDictionary

import numpy as np
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from training.data.user_cache import cache_folder
from training.models.ensemble import EnsembleEmbedding
from training.models.protocol import EmbeddingModel, has_attention

from .names import AUTO_CPU as AUTO
from .names import AUTO_CUDA, BACKENDS, choice
from .names import BACKEND_ENV as ENV

FORMAT = 2                           # of the cached graphs: bump to convert every model again (2: uint8 input)
OPSET = 17                           # ONNX opset of the exported graphs

log = logging.getLogger("jointspace.backend")


def backend_choice(given: str | None = None) -> str:
    """The backend asked for: ``given`` (a flag), else ``$JOINTSPACE_BACKEND``, else ``auto``. ValueError naming
    the known ones for another name."""
    return choice(given, os.environ.get(ENV), BACKENDS, "inference backend", "--backend", ENV)


def graph_cache() -> Path:
    """Where converted graphs are kept: ``$JOINTSPACE_CACHE/backends`` (``~/.cache/jointspace/backends``)."""
    return cache_folder("backends")


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
        device = next(self.model.parameters()).device           # the normalisation where the weights are
        self.register_buffer("scale", scale.to(device), persistent=False)
        self.register_buffer("shift", shift.to(device), persistent=False)

    scale: torch.Tensor
    shift: torch.Tensor

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return cast(EmbeddingModel, self.model).image_features(pixels.float() * self.scale + self.shift)


def _input_shape(model: EmbeddingModel) -> tuple[int, int]:
    pre = model.preprocess
    return pre.channels, pre.image_size


def eager_reason(model: EmbeddingModel) -> str | None:
    """Why ``model``'s image tower stays in eager PyTorch whatever is asked, or None: a backend converts frozen
    pretrained CNNs on a CPU or a CUDA device (which backend runs on which device: :attr:`Backend.device_type`)."""
    try:
        device = next(model.parameters()).device
    except StopIteration:
        return "the model has no weights"
    if device.type not in ("cpu", "cuda"):
        return f"the model runs on {device.type}"
    if has_attention(model):
        return "the model scores image regions (region attention)"
    if not model.backbone_pretrained:
        return "its image backbone trains with the model"
    splits = [m.image_split for m in model.models] if isinstance(model, EnsembleEmbedding) else [model.image_split]
    if any(split is not None for split in splits):
        return "its backbone's top trains with the model (image.train_blocks or learned pooling)"
    return None


def tower_fingerprint(model: EmbeddingModel, kind: str) -> str:
    """sha256 of what a converted graph depends on: the cache format, the converter (``kind`` and its version),
    torch's version (it traces), the model's class, preprocessing and image settings, and every backbone weight."""
    h = hashlib.sha256()
    h.update(json.dumps({"format": FORMAT, "kind": kind, "converter": REGISTRY_BY_KIND[kind].converter_version(),
                         "torch": torch.__version__, "class": type(model).__name__,
                         "preprocess": model.preprocess.to_dict(), "input": _input_shape(model),
                         "image": model.cfg.image.model_dump()}, sort_keys=True, default=str).encode())
    backbone: nn.Module = cast(Any, model).backbone     # a JointEmbedding's, or an ensemble's members' (a list)
    for key, tensor in backbone.state_dict().items():
        h.update(key.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


# --- the interface: one class per backend -------------------------------------------------------------------------

class Backend:
    """A loaded backend: :meth:`forward` maps uint8 pixels ``(N, C, S, S)``, one view a row, to backbone features
    ``(N, D)``; :meth:`features` is what the model's image path calls. A subclass names itself (:attr:`name`, one of
    ``names.BACKENDS``), the converter whose graphs it caches (:attr:`kind`: a cache folder's prefix, shared by the
    backends that run the same graph), the graph's file, the device it runs on, and implements
    :meth:`converter_version`, :meth:`export` (write the graph of an ``ImageTower``) and :meth:`open` (run a
    written graph); :func:`use_backend` converts, checks, caches and attaches one the same way for every class."""
    name: ClassVar[str] = ""
    kind: ClassVar[str] = ""            # the converter: what is cached (and fingerprinted) under this prefix
    file: ClassVar[str] = ""            # the graph's file in its cache folder
    device_type: ClassVar[str] = "cpu"  # the device the model must be on for this backend to run it

    def __init__(self, path: Path, converted: bool = False):
        self.path = path                # the cached graph's folder
        self.converted = converted      # converted by this load (False: read from the cache)
        self._lock = threading.Lock()

    @classmethod
    def converter_version(cls) -> str:
        raise NotImplementedError

    @classmethod
    def export(cls, model: EmbeddingModel, tower: ImageTower, probe: torch.Tensor, folder: Path) -> None:
        """Writes the graph of ``tower`` (the model's, on its device, in eval mode) into ``folder``."""
        raise NotImplementedError

    @classmethod
    def open(cls, model: EmbeddingModel, folder: Path, cache: bool = True) -> Backend:
        """The graph written in ``folder`` ready to run; ``cache``: the runtime may keep compiled forms beside it."""
        raise NotImplementedError

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """uint8 ``(N, C, S, S)`` → features ``(N, D)``, float32 (on the CPU for a CPU runtime, else the device)."""
        raise NotImplementedError

    def features(self, pixels: torch.Tensor) -> torch.Tensor:
        """uint8 pixels ``(B, 3k, S, S)`` or multi-view ``(B, V, 3k, S, S)`` (``model.preprocess.pixels``, not
        normalised: the graph normalises) → backbone features ``(B, D)``, float32, the views averaged as
        ``image_features`` averages them."""
        if pixels.dtype != torch.uint8:
            raise TypeError(f"a backend takes uint8 pixels, got {pixels.dtype}")
        views = pixels.shape[1] if pixels.dim() == 5 else 1
        flat = pixels.flatten(0, 1) if pixels.dim() == 5 else pixels
        with self._lock:             # one call at a time: the service's compute thread, or the indexer
            out = self.forward(flat)
        return out.view(-1, views, out.shape[-1]).mean(1)


class Eager(Backend):
    """The model's own forward pass in PyTorch (``eager``): what every conversion is checked against. Nothing is
    converted or cached, and :func:`use_backend` attaches nothing for it — the model runs as it is, under the
    inference autocast policy (``embedding.inference_autocast``)."""
    name = "eager"
    kind = "eager"

    def __init__(self, model: EmbeddingModel):
        super().__init__(Path(), converted=False)
        self.model = model

    @classmethod
    def converter_version(cls) -> str:
        return f"torch {torch.__version__}"

    @classmethod
    def open(cls, model: EmbeddingModel, folder: Path, cache: bool = True) -> Backend:
        return cls(model)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        device = next(self.model.parameters()).device
        return self.model.image_features(self.model.preprocess.normalize(pixels.to(device))).float()


class _NumpyRuntime(Backend):
    """A CPU runtime that runs numpy arrays (``run``: uint8 ``(N, C, S, S)`` → ``(N, D)``)."""

    def __init__(self, path: Path, run: Callable[[np.ndarray], np.ndarray]):
        super().__init__(path)
        self.run = run

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        array = np.ascontiguousarray(pixels.detach().cpu().numpy())
        return torch.from_numpy(np.array(self.run(array), dtype=np.float32, copy=True))


def _onnx(tower: ImageTower, probe: torch.Tensor, target: str | io.BytesIO) -> None:
    """The tower as an ONNX graph (one trace by the TorchScript exporter, a dynamic batch) into ``target``."""
    with warnings.catch_warnings():
        # the tracer's advice (Python values taken as constants) and the exporter's deprecation notice: the graph is
        # checked against eager PyTorch instead
        warnings.simplefilter("ignore")
        torch.onnx.export(tower, (probe[:1],), cast(Any, target), dynamo=False, input_names=["images"],
                          output_names=["features"], opset_version=OPSET,
                          dynamic_axes={"images": {0: "batch"}, "features": {0: "batch"}})


class OpenVINO(_NumpyRuntime):
    """``openvino``: OpenVINO's IR on the CPU in float32 (:class:`_OpenVINO`)."""
    name = "openvino"
    kind = "openvino"
    file = "tower.xml"
    bf16 = False

    @classmethod
    def converter_version(cls) -> str:
        return f"{openvino().__version__} from ONNX opset {OPSET}"     # the route is part of what was converted

    @classmethod
    def export(cls, model: EmbeddingModel, tower: ImageTower, probe: torch.Tensor, folder: Path) -> None:
        ov = openvino()
        channels, side = _input_shape(model)
        # through ONNX, in memory: OpenVINO's ONNX frontend reads the exporter's graph (the shipped model's three CNNs:
        # 2.0 s on 2 cores, against 3.1 s for its PyTorch frontend on a torch.jit.trace; the same features)
        raw = io.BytesIO()
        _onnx(tower, probe, raw)
        raw.seek(0)
        graph = ov.convert_model(raw)
        graph.reshape({graph.inputs[0]: ov.PartialShape([-1, channels, side, side])})
        ov.save_model(graph, str(folder / cls.file), compress_to_fp16=False)

    @classmethod
    def open(cls, model: EmbeddingModel, folder: Path, cache: bool = True) -> Backend:
        return cls(folder, _open_openvino(folder / cls.file, cls.bf16, cache=cache))


class OpenVINOBf16(OpenVINO):
    """``openvino-bf16``: the same IR with bf16 inference precision (refused on a CPU without native bf16)."""
    name = "openvino-bf16"
    bf16 = True


class ONNXRuntime(_NumpyRuntime):
    """``onnxruntime``: an ONNX graph in ONNX Runtime's CPU provider, every graph optimisation."""
    name = "onnxruntime"
    kind = "onnxruntime"
    file = "tower.onnx"

    @classmethod
    def converter_version(cls) -> str:
        import onnxruntime

        return f"onnxruntime {onnxruntime.__version__} opset {OPSET}"

    @classmethod
    def export(cls, model: EmbeddingModel, tower: ImageTower, probe: torch.Tensor, folder: Path) -> None:
        _onnx(tower, probe, str(folder / cls.file))

    @classmethod
    def open(cls, model: EmbeddingModel, folder: Path, cache: bool = True) -> Backend:
        return cls(folder, _open_onnxruntime(folder / cls.file))


# --- the CUDA tower ---------------------------------------------------------------------------------------------
BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)   # batch sizes the CUDA tower captures a graph for


def bucket(rows: int, buckets: tuple[int, ...] = BUCKETS) -> int:
    """The batch size ``rows`` views run at: the smallest bucket that holds them, else the largest (the rows are
    then run in chunks of it)."""
    if rows < 1:
        raise ValueError(f"a batch has at least one row, got {rows}")
    return next((b for b in buckets if b >= rows), buckets[-1])


class _Readers(TorchFunctionMode):
    """How many torch operations that make a tensor read each of the tensors ``watched`` (by id, from when it is
    added: ``watched`` tensors are kept alive, so no other tensor takes their id; size queries are not counted)."""

    def __init__(self) -> None:
        super().__init__()
        self.watched: set[int] = set()
        self.count: dict[int, int] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, (torch.Tensor, tuple, list)):
            flat = [*args, *(kwargs or {}).values()]
            for arg in flat + [a for x in flat if isinstance(x, (tuple, list)) for a in x]:
                if isinstance(arg, torch.Tensor) and id(arg) in self.watched:
                    self.count[id(arg)] = self.count.get(id(arg), 0) + 1
        return out


def fold_batchnorm(module: nn.Module, probe: torch.Tensor, run: Callable[[torch.Tensor], Any]) -> int:
    """Folds every BatchNorm (eval mode: running statistics) that reads a convolution's output and nothing else
    into that convolution's weights and bias, in place: ``W' = W·γ/√(σ²+ε)``, ``b' = (b − μ)·γ/√(σ²+ε) + β`` (Ioffe
    & Szegedy 2015, Alg. 2's inference transform, moved into the preceding linear map). The pairs are found by
    running ``run(probe)`` once with hooks and a torch-function mode that counts each tensor's readers: a
    BatchNorm whose input is the very tensor one convolution (called once) returned and no other operation read;
    a plain ``BatchNorm2d`` becomes an identity, a BatchNorm with its activation attached (timm's
    ``BatchNormAct2d``) keeps only its dropout and activation. Returns how many were folded."""
    made: dict[int, list[nn.Conv2d]] = {}      # id of a convolution's output → the convolutions that returned it
    read: dict[nn.Module, list[int]] = {}      # BatchNorm → ids of the tensors it read
    alive: list[torch.Tensor] = []             # every tensor whose id is kept: no id is reused meanwhile

    def conv_hook(mod: nn.Module, _inputs: Any, out: torch.Tensor) -> None:
        alive.append(out)
        readers.watched.add(id(out))
        made.setdefault(id(out), []).append(cast(nn.Conv2d, mod))

    def bn_hook(mod: nn.Module, inputs: tuple) -> None:
        alive.append(inputs[0])
        read.setdefault(mod, []).append(id(inputs[0]))
    readers = _Readers()
    hooks = []
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            hooks.append(m.register_forward_hook(conv_hook))
        elif isinstance(m, nn.BatchNorm2d):
            hooks.append(m.register_forward_pre_hook(bn_hook))
    try:
        with torch.no_grad(), readers:
            run(probe)
    finally:
        for h in hooks:
            h.remove()
    calls: dict[nn.Module, int] = {}
    for convs in made.values():
        for c in convs:
            calls[c] = calls.get(c, 0) + 1
    folded = 0
    parents = {child: (parent, name) for parent in module.modules() for name, child in parent.named_children()}
    for bn, inputs in read.items():
        convs = made.get(inputs[0], []) if len(inputs) == 1 else []
        if len(convs) != 1 or calls[convs[0]] != 1 or readers.count.get(inputs[0]) != 1 or bn not in parents:
            continue
        conv, bn2d = convs[0], cast(nn.BatchNorm2d, bn)
        if bn2d.running_mean is None or bn2d.running_var is None:
            continue
        with torch.no_grad():
            gamma = bn2d.weight if bn2d.weight is not None else torch.ones_like(bn2d.running_mean)
            beta = bn2d.bias if bn2d.bias is not None else torch.zeros_like(bn2d.running_mean)
            scale = gamma / torch.sqrt(bn2d.running_var + bn2d.eps)
            bias = conv.bias if conv.bias is not None else torch.zeros_like(bn2d.running_mean)
            conv.weight.mul_(scale.view(-1, 1, 1, 1).to(conv.weight.dtype))
            conv.bias = nn.Parameter((bias - bn2d.running_mean) * scale + beta)
        parent, name = parents[bn]
        rest = [getattr(bn, a) for a in ("drop", "act") if isinstance(getattr(bn, a, None), nn.Module)]
        setattr(parent, name, nn.Sequential(*rest) if rest else nn.Identity())
        folded += 1
    alive.clear()
    return folded


class FoldedTower(nn.Module):
    """The tower the CUDA backend runs: uint8 pixels normalised in float32 (``pixel_affine``), then the model's
    ``image_features`` (its BatchNorms folded, :func:`fold_batchnorm`) in ``dtype``; features back in float32."""

    def __init__(self, model: nn.Module, scale: torch.Tensor, shift: torch.Tensor, dtype: torch.dtype):
        super().__init__()
        self.model, self.dtype = model, dtype
        self.register_buffer("scale", scale.float(), persistent=False)
        self.register_buffer("shift", shift.float(), persistent=False)

    scale: torch.Tensor
    shift: torch.Tensor

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        normalised = (pixels.float() * self.scale + self.shift).to(self.dtype)
        return cast(EmbeddingModel, self.model).image_features(normalised).float()


@contextmanager
def ieee_float32() -> Iterator[None]:
    """float32 convolutions and matrix products in full precision meanwhile, TF32 off (cuDNN's convolutions use
    TF32 on a CUDA device by default: 10 bits of mantissa, so a tower and its exact rewriting differ by ~1e-3 of
    each value there); the settings as they were afterwards. No effect on a CPU."""
    matmul = torch.backends.cuda.matmul.allow_tf32
    cudnn = torch.backends.cudnn
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with cudnn.flags(enabled=cudnn.enabled, benchmark=cudnn.benchmark, deterministic=cudnn.deterministic,
                         allow_tf32=False):
            yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = matmul


def folded_tower(model: EmbeddingModel, dtype: torch.dtype = torch.float16) -> FoldedTower:
    """A copy of ``model``'s image tower (on its device, eval mode) with its BatchNorms folded into their
    convolutions and its weights in ``dtype``; the model itself is left as it is. RuntimeError when the folded
    tower's float32 features differ from the model's on the probe (a BatchNorm's input read elsewhere too): both
    in full float32 (:func:`ieee_float32`), so the check sees the folding's arithmetic, not the device's TF32."""
    tower = ImageTower(copy.deepcopy(model)).eval()
    probe = _probe(model).to(tower.scale.device)
    with torch.no_grad(), ieee_float32():
        before = tower(probe)
        fold_batchnorm(tower, probe[:1], tower)
        after = tower(probe)
    if not torch.allclose(after, before, rtol=1e-3, atol=1e-4 * float(before.abs().max())):
        raise RuntimeError("folding the BatchNorms changed the features")
    return FoldedTower(tower.model.to(dtype=dtype), tower.scale, tower.shift, dtype).eval()


class CUDA(Backend):
    """``cuda``: the image tower on a CUDA device in float16, its BatchNorms folded into the convolutions
    (:func:`folded_tower`), one CUDA graph captured per batch bucket (:data:`BUCKETS`, :func:`bucket`) on its
    first use, so a batch is one graph launch. The folded float16 weights are what is cached (``tower.pt``,
    a ``state_dict``) and checked against eager PyTorch like any conversion."""
    name = "cuda"
    kind = "cuda"
    file = "tower.pt"
    device_type = "cuda"
    dtype = torch.float16

    def __init__(self, path: Path, tower: FoldedTower, graphs: bool = True):
        super().__init__(path)
        self.tower, self.graphs = tower, graphs
        self.device = tower.scale.device
        self._captured: dict[int, tuple[Any, torch.Tensor, torch.Tensor]] = {}

    @classmethod
    def converter_version(cls) -> str:
        return f"torch {torch.__version__} cuda {torch.version.cuda} {cls.dtype} batchnorm folded"

    @classmethod
    def export(cls, model: EmbeddingModel, tower: ImageTower, probe: torch.Tensor, folder: Path) -> None:
        torch.save(folded_tower(model, cls.dtype).state_dict(), folder / cls.file)

    @classmethod
    def open(cls, model: EmbeddingModel, folder: Path, cache: bool = True) -> Backend:
        tower = folded_tower(model, cls.dtype)          # the folded structure; its weights as cached
        device = next(model.parameters()).device
        tower.load_state_dict(torch.load(folder / cls.file, map_location=device, weights_only=True))
        return cls(folder, tower, graphs=device.type == "cuda")

    @torch.no_grad()
    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        pixels = pixels.to(self.device, non_blocking=True)
        size = bucket(len(pixels))
        out = []
        for start in range(0, len(pixels), size):
            chunk = pixels[start:start + size]
            with torch.autocast(self.device.type, enabled=False):      # the graph's own dtype, not autocast's
                out.append(self._run(chunk, bucket(len(chunk))))
        return torch.cat(out)

    def _run(self, chunk: torch.Tensor, size: int) -> torch.Tensor:
        if not self.graphs:
            return self.tower(chunk)
        if size not in self._captured:
            self._captured[size] = self._capture(size, chunk.shape[1:])
        graph, static_in, static_out = self._captured[size]
        static_in[:len(chunk)].copy_(chunk)
        graph.replay()
        return static_out[:len(chunk)].clone()

    def _capture(self, size: int, shape: torch.Size) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """A CUDA graph of the tower at batch ``size`` (warmed on a side stream first, as capture requires)."""
        static_in = torch.zeros((size, *shape), dtype=torch.uint8, device=self.device)
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self.tower(static_in)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = self.tower(static_in)
        return graph, static_in, static_out


REGISTRY: dict[str, type[Backend]] = {c.name: c for c in (Eager, OpenVINO, OpenVINOBf16, ONNXRuntime, CUDA)}
REGISTRY_BY_KIND: dict[str, type[Backend]] = {c.kind: c for c in reversed(REGISTRY.values())}
# a conversion is kept when every probe row's features have at least this cosine with eager PyTorch's
AGREEMENT = {"openvino": 0.9999, "openvino-bf16": 0.99, "onnxruntime": 0.9999, "cuda": 0.999}


def backend_class(name: str) -> type[Backend]:
    """The class of the backend ``name`` (of ``names.BACKENDS`` but ``auto``); ValueError for another name."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown inference backend {name!r}; known: {', '.join(REGISTRY)}") from None


def auto_backends(device: torch.device | str) -> tuple[str, ...]:
    """What ``auto`` tries, in order, for a model on ``device``: :data:`AUTO` on a CPU, :data:`AUTO_CUDA` on CUDA."""
    return AUTO_CUDA if torch.device(device).type == "cuda" else AUTO


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


def extraction_tower(model: EmbeddingModel) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """What runs ``model``'s frozen backbones for a pass over a data set's images (the feature cache,
    ``training/data/features.py``, as ``Compute.tower``): the first float32 CPU backend of :data:`AUTO` that loads,
    whose features are eager PyTorch's (each conversion is checked to a cosine of at least 0.9999; docs/training.md
    measures the speed), as ``forward``: uint8 views ``(N, C, S, S)`` → features ``(N, D)``. None where eager
    PyTorch runs instead: a model on CUDA (its bf16 autocast extraction is kept), one a backend does not run
    (:func:`eager_reason`), ``JOINTSPACE_BACKEND=eager``, or when none loads. Nothing is attached to the model, and
    its modules keep their training modes (a conversion traces the model in eval mode)."""
    reason = eager_reason(model)
    if reason is not None or next(model.parameters()).device.type != "cpu" or backend_choice() == "eager":
        return None
    modes = [(module, module.training) for module in cast(nn.Module, model).modules()]
    failures = []
    try:
        for name in AUTO:
            try:
                backend = _load(model, name, graph_cache(), "throughput")
            except Exception as err:  # noqa: BLE001 - any failure to load or convert: the next one, else eager
                failures.append(f"{name}: {type(err).__name__}: {err}".replace("\n", " "))
                continue
            log.info("feature extraction on %s (%s %s)", name, "converted to" if backend.converted else "read from",
                     backend.path)
            return backend.forward
    finally:
        for module, training in modes:
            module.training = training
    log.warning("feature extraction in eager PyTorch: no backend loaded (%s)", "; ".join(failures))
    return None


PREPARE = ("latency", "throughput")


def use_backend(model: EmbeddingModel, name: str | None = None, cache: str | Path | None = None,
                prepare: str = "latency") -> str:
    """Runs ``model``'s image tower on the backend ``name`` (:func:`backend_choice`: the flag, else
    ``$JOINTSPACE_BACKEND``, else ``auto``) from now on, converting it (or reading its cached conversion from
    ``cache``, default :func:`graph_cache`). Returns the backend in use: ``eager`` when asked, when the model is not
    one a backend runs (:func:`eager_reason`), when the backend runs on another device than the model's, or when
    loading failed — said in one log line. ``prepare``: the way of running it that is compiled and tried at load
    (``latency``: one row at a time, an interactive service; ``throughput``: batches across CPU streams, bulk
    embedding); the other is compiled on its first use. Call it once the model is on its device, in eval mode,
    with its final weights."""
    if prepare not in PREPARE:
        raise ValueError(f"prepare must be one of {', '.join(PREPARE)}, got {prepare!r}")
    choice = backend_choice(name)
    _ATTACHED.pop(model, None)
    if choice == "eager":
        return "eager"
    reason = eager_reason(model)
    device = next(model.parameters()).device if reason is None else None
    if reason is None and choice != "auto" and backend_class(choice).device_type != cast(torch.device, device).type:
        reason = f"the model runs on {cast(torch.device, device).type}"
    if reason is not None:
        if choice != "auto":
            log.warning("inference backend %s not used: %s; the image tower runs in eager PyTorch", choice, reason)
        return "eager"
    root = Path(cache) if cache is not None else graph_cache()
    failures = []
    for candidate in auto_backends(cast(torch.device, device)) if choice == "auto" else (choice,):
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
    cls = backend_class(name)
    key = f"{cls.kind}-{tower_fingerprint(model, cls.kind)[:32]}"
    converted = not (root / key / cls.file).is_file()
    scratch = None
    if converted and not _writable(root):       # a read-only cache: converted for this process alone
        scratch = root = Path(tempfile.mkdtemp(prefix="jointspace-backends-"))
    try:
        if converted:
            _convert(model, cls, root / key)
        backend = cls.open(model, root / key, cache=scratch is None)
        channels, side = _input_shape(model)
        # it runs: the first call's set-up paid here, for the way of running it that the caller uses
        backend.forward(torch.zeros((2 if prepare == "throughput" else 1, channels, side, side), dtype=torch.uint8))
    finally:
        if scratch is not None:                 # the runtimes hold the graph in memory once it is loaded
            shutil.rmtree(scratch, ignore_errors=True)
    backend.converted = converted
    return backend


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


def _convert(model: EmbeddingModel, cls: type[Backend], folder: Path) -> None:
    """Writes the tower's graph for ``cls`` (:meth:`Backend.export`) into a temporary folder beside ``folder``,
    checks it against eager PyTorch (:class:`Eager`) and renames the folder into place (another process that got
    there first wins)."""
    device = next(model.parameters()).device
    tower = ImageTower(model).eval()
    probe = _probe(model).to(device)
    scratch = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    os.chmod(scratch, 0o755)            # readable as the rest of the cache (mkdtemp makes it the owner's only)
    try:
        with torch.no_grad():
            expected = Eager(model).forward(probe)          # eager PyTorch, as it runs
            cls.export(model, tower, probe.cpu() if cls.device_type == "cpu" else probe, scratch)
            # with the runtime's compiled-graph cache in the folder: renamed into place with it, the load that
            # follows (and the next process's) reads what this check compiled instead of compiling it again
            backend = cls.open(model, scratch)
            # the batch and the single row alike (OpenVINO runs them differently, _OpenVINO)
            got = torch.cat([backend.forward(probe), backend.forward(probe[:1])]).float().to(device)
        agreement = torch.nn.functional.cosine_similarity(got, torch.cat([expected, expected[:1]]).float(),
                                                          dim=-1).min().item()
        if not agreement >= AGREEMENT[cls.name]:
            raise RuntimeError(f"the converted graph disagrees with eager PyTorch (cosine {agreement:.6f} < "
                               f"{AGREEMENT[cls.name]})")
        del backend
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


def _core() -> Any:
    """OpenVINO's one ``Core`` of this process, made on first use."""
    global _CORE
    if _CORE is None:
        _CORE = openvino().Core()
    return _CORE


def native_bf16() -> bool:
    """Whether this CPU runs bf16 natively (OpenVINO's BF16 capability: AVX-512 BF16 or AMX), which
    ``openvino-bf16`` needs; False without OpenVINO."""
    try:
        return "BF16" in _core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    except ImportError:
        return False


class _OpenVINO:
    """An OpenVINO IR on the CPU for one row a request (its batch dimension fixed at 1), compiled two ways, each on
    its first use: ``LATENCY`` (one request on all threads) for a batch of one row, ``THROUGHPUT`` (the CPU streams
    OpenVINO picks for the threads, one request per stream) for a batch of several, run one row per request: on 2
    cores two single-thread streams embed more views a second than one request of the whole batch on both threads,
    while one row on both threads answers sooner than on one stream
    (docs/benchmarks.md#the-tower-alone-and-torchcompile). Calls are serialised by the :class:`Backend` that holds
    it."""

    def __init__(self, graph: Path, bf16: bool, cache: Path | None):
        ov, core = openvino(), _core()
        if bf16 and not native_bf16():
            raise RuntimeError("this CPU has no native bf16 (AVX-512 BF16 or AMX)")
        self.graph = core.read_model(str(graph))
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
        self.from_cache: dict[str, bool] = {}       # per hint compiled: read from CACHE_DIR (True) or compiled

    def _compile(self, hint: str) -> Any:
        compiled = _core().compile_model(self.graph, "CPU", {**self.config, "PERFORMANCE_HINT": hint})
        self.from_cache[hint] = bool(compiled.get_property("LOADED_FROM_CACHE"))
        return compiled

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
