"""The names of the inference settings, defined once and torch-free: the command lines (``index/cli.py``,
``service/serve.py``), the service's settings and the modules that implement them (``backend.py``,
``training/inference/tensor_views.py``) all import them from here, so ``jointspace --help`` builds its parser without
importing the model code.

* :data:`BACKENDS` — what runs the image tower (``--backend``, ``JOINTSPACE_BACKEND``; training/inference/backend.py),
  described for ``--help`` by :data:`BACKEND_HELP`;
* :data:`TTA` — the views of a photo whose features are averaged (``index build --tta``; training reads them one
  at a time as ``image.train_views``; ``embedding.view_preprocess``);
* :data:`DECODES` — where images to embed are decoded and cut into views (``--decode``, ``JOINTSPACE_DECODE``;
  training/inference/tensor_views.py), described by :data:`DECODE_HELP`.
"""
from __future__ import annotations

TTA = ("none", "flip", "flip-crop")
BACKENDS = ("auto", "eager", "openvino", "openvino-bf16", "onnxruntime", "cuda")
AUTO_CPU = ("openvino", "onnxruntime")   # what auto tries on a CPU, fastest first (docs/benchmarks.md#inference-...)
AUTO_CUDA = ("cuda",)                    # what auto tries on a CUDA device
BACKEND_ENV = "JOINTSPACE_BACKEND"
BACKEND_HELP = ("what runs the image backbones: auto (OpenVINO, else ONNX Runtime, on a CPU; cuda on a CUDA device), "
                "eager, openvino, openvino-bf16, onnxruntime or cuda (float16, BatchNorm folded, CUDA graphs); a "
                "backend that fails to load falls back to eager (env JOINTSPACE_BACKEND; docs/index.md)")

DECODES = ("auto", "pil", "torch")       # auto: torch on a CUDA device, PIL on a CPU
DECODE_ENV = "JOINTSPACE_DECODE"
DECODE_HELP = ("where photos are decoded and cut into views: auto (torch on a CUDA device, else pil), pil (Pillow in "
               "the decoding workers) or torch (plain JPEGs on the model's device; other files by Pillow) "
               "(env JOINTSPACE_DECODE; docs/index.md)")


def choice(given: str | None, env_value: str | None, known: tuple[str, ...], what: str, flag: str, env: str) -> str:
    """The setting asked for: ``given`` (a flag), else the environment's value, else ``auto``. ValueError naming
    the known ones for another name."""
    source = flag if given else env
    name = (given or env_value or "auto").strip().lower()
    if name not in known:
        raise ValueError(f"unknown {what} {name!r} ({source}); known: {', '.join(known)}")
    return name
