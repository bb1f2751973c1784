"""A model's text tower for queries, run by ONNX Runtime without torch: what ``jointspace index search --text``
needs of a model (a sentence → its vector in the common space), loaded in a fraction of a second and a fraction of
the memory of the whole model (a CUDA build of torch alone maps about 800 MB and takes seconds to import; the
image backbones more).

:func:`prepare` converts the text side of a loaded model — its text encoder and text projection
(``model.project_texts``), one sentence a run — into an ONNX graph, with the encoder's tokenizer beside it, and
keeps them under ``$JOINTSPACE_CACHE/text`` (default ``~/.cache/jointspace/text``), one folder per model file
(the sha256 of its bytes) and format: a conversion runs once per model file, the way the image backends'
(``backend.py``) do. A folder is written whole under a temporary name and renamed, so a reader never sees half
of one. A conversion is checked before it is kept: on probe sentences (short, long, past the token limit, with
words to subtract) the graph's vectors must agree with eager PyTorch's (``embedding.embed_texts``) to a cosine of
:data:`AGREEMENT`, and its token ids must be the encoder's. A model whose text side cannot be run so (an encoder
without its own tokenizer, region attention, an ensemble, a conversion that disagrees) gets a folder that says
why, and its queries are embedded by the whole model in PyTorch, as before.

:func:`ensure` prepares a model's folder where the whole model is loaded anyway and a few seconds are cheap —
after ``index build/add/sync`` have embedded their photos, and at ``serve``'s start-up, where
``python -m training.inference.text_tower MODEL`` runs it in a process of its own at low priority once the service
is ready — so that a user's first terminal search finds it prepared. A conversion that fails says why in the folder
as an unsupported one does (a failure that may pass — out of memory, a cache that cannot be written — leaves no
folder, and is tried again next time); it never fails the command that asked for it.

:func:`load` reads a prepared folder (None when there is none) into a :class:`TextTower`, whose
:meth:`TextTower.embed` is ``embedding.embed_texts`` for one query: ``normalise(r(text) − Σ r(w))`` (W2VV §IV-C
for the words to subtract), normalised as the model's similarity normalises.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence, cast

import numpy as np

from training.data.user_cache import cache_folder

if TYPE_CHECKING:
    from training.models.protocol import EmbeddingModel

FORMAT = 1                  # of the cached folders: bump to convert every model again
OPSET = 17
AGREEMENT = 0.9999          # a conversion is kept when every probe's vector has at least this cosine with PyTorch's
PROBES = ("a cat", "x", "two dogs play in the snow beside a red barn on a winter afternoon",
          "a photo of " * 120)                              # the last one past MiniLM's 256-token limit
PROBE_SUBTRACT = (("a dog on a beach", ("dog",)), ("a city street at night", ("cars", "rain")))


def tower_cache() -> Path:
    """Where converted text towers are kept: ``$JOINTSPACE_CACHE/text`` (``~/.cache/jointspace/text``)."""
    return cache_folder("text")


def sha256_of(path: str | Path) -> str:
    """sha256 of a file's bytes, read in blocks (a 48 MB model.pt: about 0.06 s)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def folder_for(model_path: str | Path, root: Path | None = None) -> Path:
    """The cache folder of the model file ``model_path``'s text tower (it need not exist)."""
    return (tower_cache() if root is None else root) / f"{sha256_of(model_path)[:32]}-f{FORMAT}"


def normalize(x: np.ndarray, similarity: str) -> np.ndarray:
    """Rows normalised as the model's similarity does (similarity.py): L2 (``F.normalize``), then ``abs`` for the
    order embedding (STT eq. 9)."""
    out = x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)
    return np.abs(out) if similarity == "order" else out


@dataclass
class TextTower:
    """A prepared text tower: ``session`` maps one sentence's token ids ``(1, T)`` to its projected vector ``(1, E)``
    (before normalisation); ``tokenizer`` (the ``tokenizers`` library's) and ``max_tokens`` make the ids as the
    encoder does."""
    session: Any
    tokenizer: Any
    max_tokens: int
    fingerprint: str            # of the model it was converted from: an index checks it as it checks a model's
    similarity: str
    dim: int

    def ids(self, text: str) -> list[int]:
        """WordPiece ids ``[CLS] … [SEP]``, cut to ``max_tokens``, the [SEP] kept (``MiniLMEncoder.encode_text``)."""
        ids = self.tokenizer.encode(text).ids
        return ids[:self.max_tokens - 1] + ids[-1:] if len(ids) > self.max_tokens else ids

    def project(self, texts: Sequence[str]) -> np.ndarray:
        """Sentences → projected vectors ``(n, E)`` float32, not normalised (one run a sentence: no padding)."""
        rows = [self.session.run(None, {"ids": np.asarray([self.ids(t)], dtype=np.int64)})[0][0] for t in texts]
        return np.asarray(rows, dtype=np.float32).reshape(len(rows), self.dim)

    def embed(self, texts: Sequence[str], subtract: Sequence[Sequence[str]] = ()) -> np.ndarray:
        """``embedding.embed_texts``: sentences (each with its words to subtract) → normalised vectors ``(n, E)``."""
        words = [list(w) for w in subtract] if subtract else [[] for _ in texts]
        if len(words) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(words)} lists of words to subtract")
        queries = self.project(texts)
        for row, ws in enumerate(words):
            if ws:
                queries[row] = queries[row] - self.project(ws).sum(0)
        return normalize(queries, self.similarity).astype(np.float32)


def load(model_path: str | Path, root: Path | None = None) -> TextTower | None:
    """The prepared text tower of the model file ``model_path``; None when none is prepared, or when the folder
    says this model's text side runs in PyTorch only (``unsupported``)."""
    return _load_folder(folder_for(model_path, root))


def _load_folder(folder: Path) -> TextTower | None:
    try:
        facts = json.loads((folder / "tower.json").read_text())
    except (OSError, ValueError):
        return None
    if facts.get("unsupported") or facts.get("format") != FORMAT:
        return None
    return _open(folder, facts)


def _open(folder: Path, facts: dict) -> TextTower:
    import onnxruntime as ort
    from tokenizers import Tokenizer

    options = ort.SessionOptions()
    options.log_severity_level = 3
    # the graph is kept optimised (_convert): reading it back needs no optimisation pass
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(folder / "text.onnx"), options, providers=["CPUExecutionProvider"])
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return TextTower(session, tokenizer, int(facts["max_tokens"]), facts["fingerprint"], facts["similarity"],
                     int(facts["dim"]))


def prepared(model_path: str | Path, root: Path | None = None) -> bool:
    """Whether :func:`prepare` has run for this model file (a tower, or a folder saying why there is none)."""
    return (folder_for(model_path, root) / "tower.json").is_file()


def unsupported_reason(model: EmbeddingModel) -> str | None:
    """Why ``model``'s text side cannot run as a :class:`TextTower`, or None."""
    from training.models.minilm import MiniLMEncoder
    from training.models.model import JointEmbedding

    if not isinstance(model, JointEmbedding):
        return "an ensemble (several text encoders)"
    encoder = model.text_encoder
    if model.attention is not None:
        return "region attention scores words against regions"
    if not encoder.tokenizes or not isinstance(encoder, MiniLMEncoder):     # a tokenizer.json of its own to export
        return f"its text encoder ({type(encoder).__name__}) reads the model's vocabulary, not a tokenizer of its own"
    if model.cfg.model.similarity not in ("cosine", "order"):
        return f"similarity {model.cfg.model.similarity}"
    return None


def prepare(model: EmbeddingModel, model_path: str | Path, root: Path | None = None) -> TextTower | None:
    """Converts ``model``'s text tower (read from ``model_path``) and keeps it in the cache (see the module's
    docstring); returns it loaded, or None when this model's text side runs in PyTorch only (the folder says
    why) or the cache cannot be written."""
    return _prepare_in(model, folder_for(model_path, root))


def _prepare_in(model: EmbeddingModel, folder: Path) -> TextTower | None:
    """:func:`prepare` into the cache folder ``folder`` (the model file's hash read once by the caller)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".tmp-", dir=folder.parent))
    try:
        reason = unsupported_reason(model)
        facts: dict[str, Any] = {"format": FORMAT, "fingerprint": model.fingerprint,
                                 "similarity": model.cfg.model.similarity, "dim": model.cfg.model.embed_dim}
        tower = None
        if reason is None:
            try:
                converted = _convert(model, scratch, facts)
            except (OSError, MemoryError):      # may pass: no folder, tried again next time
                raise
            except Exception as err:  # noqa: BLE001 - whatever the exporter or the runtime raise: said in the folder
                converted = f"the conversion failed: {type(err).__name__}: {err}".replace("\n", " ")[:500]
            reason, tower = (converted, None) if isinstance(converted, str) else (None, converted)
        if reason is not None:
            facts = {"format": FORMAT, "unsupported": reason}
        (scratch / "tower.json").write_text(json.dumps(facts, indent=1))
        try:
            os.rename(scratch, folder)
        except OSError:                  # another process prepared it meanwhile: theirs is as good
            shutil.rmtree(scratch, ignore_errors=True)
            tower = None
    except OSError:
        shutil.rmtree(scratch, ignore_errors=True)
        return None
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return tower if tower is not None else _load_folder(folder)   # the checked session holds its graph in memory


def ensure(model: EmbeddingModel, model_path: str | Path, progress: bool = True, root: Path | None = None) -> str:
    """Prepares the text tower of the model file ``model_path`` from ``model`` (that file's model, already loaded)
    unless the cache holds it already, converting a copy on the CPU when ``model`` runs elsewhere; never raises.
    Returns what happened, in words: ``prepared in S s``, ``already prepared`` or ``not prepared: why`` (the
    folder keeps why, or nothing could be written and it is tried again next time). ``progress``: a line on
    stderr before a conversion and one with its outcome; without it, only a conversion that failed is said."""
    reason = None
    try:
        folder = folder_for(model_path, root)          # the model file hashed once (48 MB: about 0.06 s)
        if (folder / "tower.json").is_file():
            return "already prepared"
        reason = unsupported_reason(model)
        if reason is None and progress:
            print("preparing the model's text encoder for quick terminal searches (once per model file)…",
                  file=sys.stderr, flush=True)
        started = time.perf_counter()
        if reason is None and next(model.parameters()).device.type != "cpu":
            from training.models.checkpoint import load_model

            model = load_model(model_path)          # traced and checked on the CPU, where it runs
        tower = _prepare_in(model, folder)
        outcome = (f"prepared in {time.perf_counter() - started:.1f} s" if tower is not None else
                   "not prepared: " + (_recorded_reason(folder) or "nothing kept (tried again next time)"))
    except Exception as err:  # noqa: BLE001 - a search converts it later, or runs in PyTorch: never a failed command
        outcome = f"not prepared: {type(err).__name__}: {err}".replace("\n", " ")
    if progress or (reason is None and not outcome.startswith("prepared")):
        print(f"text encoder for terminal searches: {outcome}"
              + ("; a terminal text search loads the whole model" if outcome.startswith("not") else ""),
              file=sys.stderr, flush=True)
    return outcome


NICE = 10      # the background preparation's added niceness: the service's requests come first


def command(model_path: str | Path, fingerprint: str | None = None) -> list[str]:
    """The process that runs :func:`ensure` for the model file ``model_path`` on its own, at lowered priority
    (:func:`main`); ``fingerprint``: it converts only the model of that fingerprint."""
    return [sys.executable, "-m", "training.inference.text_tower", str(model_path), "--nice", str(NICE),
            *(["--fingerprint", fingerprint] if fingerprint else [])]


def _recorded_reason(folder: Path) -> str | None:
    try:
        return json.loads((folder / "tower.json").read_text()).get("unsupported")
    except (OSError, ValueError):
        return None


@contextmanager
def _quiet() -> Iterator[None]:
    """The exporter's warnings (Python's and its C++ ones, written to file descriptor 2) kept off the terminal: a
    conversion is checked by its result (:func:`_convert`), not by what the tracer says on the way."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _convert(model: EmbeddingModel, scratch: Path, facts: dict) -> TextTower | str:
    """Writes ``text.onnx`` and ``tokenizer.json`` into ``scratch`` and checks them: the tower read back from them,
    or why not."""
    import torch
    from torch import nn

    from training.models.encoder_state import unpack_json
    from .embedding import embed_texts

    encoder: Any = cast(Any, model).text_encoder
    spec = unpack_json(encoder.tokenizer_json)
    if spec is None:
        return "its text encoder holds no tokenizer"
    (scratch / "tokenizer.json").write_text(json.dumps(spec))
    facts["max_tokens"] = int(encoder.max_tokens)

    class Tower(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return cast(Any, self.model).project_texts(ids, (ids >= 0).sum(1))     # one sentence: no padding

    model.eval()
    example = torch.tensor([cast(Any, model).encode_text_ids(["a dog runs on the beach"])[0]], dtype=torch.long)
    raw = io.BytesIO()                  # the unoptimised graph is never kept: not written to disk
    with torch.no_grad(), _quiet():     # (the TorchScript exporter writes to a file object; its hint says a path)
        torch.onnx.export(Tower().eval(), (example,), cast(Any, raw), dynamo=False, input_names=["ids"],
                          output_names=["projected"], opset_version=OPSET,
                          dynamic_axes={"ids": {1: "tokens"}, "projected": {0: "batch"}})
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.optimized_model_filepath = str(scratch / "text.onnx")    # saved optimised: quick to load
    ort.InferenceSession(raw.getvalue(), options, providers=["CPUExecutionProvider"])
    del raw
    tower = _open(scratch, facts)       # what is kept, read back as a search reads it: that is what is checked
    texts = [*PROBES, *(t for t, _ in PROBE_SUBTRACT)]
    words: list[list[str]] = [[] for _ in PROBES] + [list(w) for _, w in PROBE_SUBTRACT]
    if any(tower.ids(t) != ids for t, ids in zip(texts, cast(Any, model).encode_text_ids(texts))):
        return "the tokenizer's ids differ from the text encoder's"
    with torch.no_grad():
        expected = embed_texts(model, texts, words).cpu().numpy()
    agreement = float((tower.embed(texts, words) * expected).sum(1).min())
    if not agreement >= AGREEMENT:
        return f"the converted graph disagrees with PyTorch (cosine {agreement:.6f} < {AGREEMENT})"
    return tower


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m training.inference.text_tower MODEL``: :func:`ensure` for the model file ``MODEL`` (serve runs it
    in the background once ready: service/state.py); ``--nice N`` lowers its priority first."""
    ap = argparse.ArgumentParser(prog="python -m training.inference.text_tower", description=main.__doc__)
    ap.add_argument("model", help="a model.pt")
    ap.add_argument("--nice", type=int, default=0, help="added to the process's niceness before anything else")
    ap.add_argument("--fingerprint", help="convert only when the file holds the model of this fingerprint")
    args = ap.parse_args(argv)
    if args.nice:
        os.nice(args.nice)
    if prepared(args.model):
        print("text encoder for terminal searches: already prepared", file=sys.stderr)
        return 0
    from training.models.checkpoint import load_model

    model = load_model(args.model)
    if args.fingerprint and model.fingerprint != args.fingerprint:
        print(f"text encoder for terminal searches: not prepared: {args.model} holds another model than the one "
              f"served ({model.fingerprint[:12]}…, not {args.fingerprint[:12]}…)", file=sys.stderr)
        return 1
    outcome = ensure(model, args.model)
    return 0 if outcome.startswith(("prepared", "already")) else 1


if __name__ == "__main__":
    sys.exit(main())
