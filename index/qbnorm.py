"""Querybank normalisation inside the index: QB-Norm's inverted softmax (training/inference/querybank.py, where the
hubness code lives) folded into FAISS, and the bank stored beside the generations.

An index built with a query bank stores each item as ``[v, −o]``, where ``o`` is the item's offset against the
bank (``item_offsets``: (1/β) log Σ_b exp(β b·v), QB-Norm eq. 3), and every query is searched as
``[q, 1]``; the inner product is then ``q·v − o``, whose ranking is exactly the inverted softmax's. Search stays
one FAISS call (filters, IVF, GPU copies unchanged), and the scores it returns are the normalised ones.

- The image index is normalised with a bank of *captions* (typical text queries), the caption index with a bank
  of *images*; either bank may be absent (that side is searched as usual).
- The bank is stored once beside the generations (``INDEX_DIR/querybank-<key>.npz``, float16, written
  atomically and never changed; the key a digest of its vectors and beta) and named in the manifest, so ``add``
  and ``sync`` give new items their offsets from the same bank. Generations share it; it is removed with the index
  directory. A bank file once made is also kept in ``$JOINTSPACE_CACHE/querybank``, and a later index of the same
  bank copies it from there (checked against its name) instead of computing its reference sets again.
- Cosine-similarity models only (the offset of an ``order`` model's score is no inner product).
- A model may carry its own bank (training/inference/querybank.py: captions as text, images as vectors):
  ``index build`` uses it unless told otherwise (:func:`model_bank`). Its captions' vectors come with it when the
  model's file carries them for itself; else they are embedded once per model and the vectors cached under
  ``$JOINTSPACE_CACHE/querybank`` (default ``~/.cache/jointspace/querybank``), so building a second index with the
  same model does not embed them again.
- The bank file also holds each side's *reference set* (index/relevance.py): up to 1,000 of the bank's own
  vectors of that side (the image index's: the bank's images; the caption index's: its captions), evenly spaced,
  with their offsets against the other half, so that they score exactly as that side's items do. A hit's
  relevance is the share of them it outscores. Banks written before reference sets have none (relevance null).
- A bank may also hold *reference sentences* (``sentences``: a model with a fitted concept head gives its sentence
  per ImageNet class) and *null sentences* (``nulls``: index.relevance.null_sentences as the model embeds them):
  with the reference captions they are the image index's :class:`~index.relevance.Descriptions`, the text side of
  a hit's relevance. With the reference sentences come *alias sentences* (``aliases``: each class's other names
  in the concept head's templates, ``alias_classes`` their classes; index.relevance's name term). They are part of
  the bank's key; a bank without them is named as before.
"""
from __future__ import annotations

import hashlib
import io
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from training.data.fileio import atomic_path
from training.data.user_cache import cache_folder
from training.inference.folding import DEFAULT_BETA, fold_items, fold_queries

if TYPE_CHECKING:      # torch and the bank's embedding code are imported where a bank is made, not to search
    from training.models.protocol import EmbeddingModel

from . import people
from .relevance import Descriptions, Reference, alias_rows, null_sentences, reference_rows

BANK_ROLE = {"images": "captions", "captions": "images"}     # the index of a role ← the bank of queries it serves
FILE_FORMAT = "jointspace-querybank/2"                      # of the bank files: part of their names (QueryBank.key)


@dataclass
class QueryBank:
    """Bank embeddings (unit vectors of the model the index is built with) and the inverse temperature."""

    captions: np.ndarray | None = None       # (B, D): normalises the image index (text → image search)
    images: np.ndarray | None = None         # (B', D): normalises the caption index (image → text search)
    beta: float = DEFAULT_BETA
    origin: str = ""                         # in words: "model" (the bank the model carries), a file, a data set
    sentences: np.ndarray | None = None      # (S, D): reference sentences (index/relevance.py's text side); no bank
    nulls: np.ndarray | None = None          # (N, D): null sentences (index/relevance.py's text side); no bank
    aliases: np.ndarray | None = None        # (A, D): alias sentences, a class's other names (with sentences)
    alias_classes: np.ndarray | None = None  # (A,): each alias sentence's class, a row of sentences

    def __post_init__(self):
        if not self.beta > 0:
            raise ValueError(f"the querybank's beta must be > 0, got {self.beta}")
        if self.aliases is not None or self.alias_classes is not None:
            if self.aliases is None or self.alias_classes is None or self.sentences is None:
                raise ValueError("alias sentences need their classes and the reference sentences")
            self.alias_classes = alias_rows(self.alias_classes, len(self.aliases), len(self.sentences))
        for name in ("captions", "images", "sentences", "nulls", "aliases"):
            bank = getattr(self, name)
            if bank is not None:
                if bank.ndim != 2 or len(bank) == 0:
                    raise ValueError(f"the {name} query bank must be a non-empty (n, dim) array, got shape "
                                     f"{bank.shape}")
                setattr(self, name, np.ascontiguousarray(bank, dtype=np.float16))
        if self.captions is None and self.images is None:
            raise ValueError("a query bank needs captions and/or images")

    def folds(self, role: str) -> bool:
        """Whether the index of ``role`` (images | captions) is normalised by this bank."""
        return getattr(self, BANK_ROLE[role]) is not None

    def fold(self, role: str, vectors: np.ndarray) -> np.ndarray:
        """Item vectors of ``role`` → ``[v, −o]`` (or unchanged when that side has no bank)."""
        if not self.folds(role):
            return vectors
        vectors = np.asarray(vectors, dtype=np.float32)
        if len(vectors) == 0:
            return np.zeros((0, vectors.shape[1] + 1), np.float32)
        return fold_items(vectors, self._offsets(role, vectors))

    def _offsets(self, role: str, vectors: np.ndarray) -> np.ndarray:
        import torch

        from training.inference.querybank import item_offsets

        bank = getattr(self, BANK_ROLE[role])
        return item_offsets(torch.from_numpy(bank), torch.from_numpy(vectors), self.beta).numpy()

    def reference(self, role: str) -> tuple[np.ndarray, np.ndarray | None] | None:
        """The reference set of the index of ``role`` (index/relevance.py): up to ``REFERENCE_SIZE`` of the bank's
        own vectors of that role, evenly spaced (float16, as the bank holds them), and their offsets against the
        other half (float32; None when that side is not folded). None when the bank has no vectors of ``role``."""
        own = getattr(self, role)
        if own is None:
            return None
        rows = own[reference_rows(len(own))]
        offsets = self._offsets(role, rows.astype(np.float32)).astype(np.float32) if self.folds(role) else None
        return rows, offsets

    # --- storage ------------------------------------------------------------------------------------------
    def key(self) -> str:
        """What the bank file is named by: a digest of the bank's vectors and beta (not of the file's bytes, so it
        is known before the file is made)."""
        h = hashlib.blake2b(f"{FILE_FORMAT} beta={self.beta!r}".encode(), digest_size=10)
        for name, bank in (("captions", self.captions), ("images", self.images), ("sentences", self.sentences),
                           ("nulls", self.nulls), ("aliases", self.aliases), ("alias_classes", self.alias_classes)):
            if bank is not None:
                h.update(f" {name} {bank.shape} {bank.dtype}".encode())
                h.update(np.ascontiguousarray(bank).data)
        return h.hexdigest()

    def save(self, root: Path, cache: Path | None = None) -> dict:
        """Writes the bank beside the generations (once per content: ``querybank-<key>.npz``) and returns its
        manifest entry. The file of a bank met before is copied from ``cache`` (default :func:`bank_cache`) once
        its vectors are read back and match its name, instead of computing the reference sets again; a new one is
        made and kept there too (where the cache can be written)."""
        name = f"querybank-{self.key()}.npz"
        path = Path(root) / name
        if not path.exists():
            data = self._cached(name, cache) or self._file_bytes()
            path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_path(path) as tmp:
                tmp.write_bytes(data)
            self._keep(name, data, cache)
        references = {role: len(reference_rows(len(own))) for role in ("images", "captions")
                      if (own := getattr(self, role)) is not None}
        for role in ("sentences", "nulls", "aliases"):
            if (own := getattr(self, role)) is not None:
                references[role] = len(own)
        return {"file": name, "beta": self.beta,
                "captions": 0 if self.captions is None else len(self.captions),
                "images": 0 if self.images is None else len(self.images), "origin": self.origin or "given",
                "references": references}

    def _file_bytes(self) -> bytes:
        """The bank file: the vectors of each side and its reference set (with their offsets where folded)."""
        buf = io.BytesIO()
        arrays = {k: v for k, v in (("captions", self.captions), ("images", self.images)) if v is not None}
        for role in ("images", "captions"):
            if (ref := self.reference(role)) is not None:
                arrays[f"reference_{role}"], offsets = ref
                if offsets is not None:
                    arrays[f"reference_{role}_offsets"] = offsets
        for role in ("sentences", "nulls", "aliases", "alias_classes"):
            if (own := getattr(self, role)) is not None:
                arrays[f"reference_{role}"] = own
        np.savez(buf, **arrays)  # type: ignore[arg-type]  # numpy's stub reads **kwds as allow_pickle
        return buf.getvalue()

    def _cached(self, name: str, cache: Path | None) -> bytes | None:
        """The cached file ``name`` when it holds this bank (its vectors read back and keyed alike), else None."""
        path = (bank_cache() if cache is None else Path(cache)) / name
        try:
            data = path.read_bytes()
            with np.load(io.BytesIO(data)) as z:
                stored = _read_bank(z, self.beta)
                complete = all(f"reference_{role}" in z for role in ("images", "captions")
                               if getattr(self, role) is not None)
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
            return None                                   # absent or damaged: made again
        return data if complete and stored.key() == name[len("querybank-"):-len(".npz")] else None

    def _keep(self, name: str, data: bytes, cache: Path | None) -> None:
        path = (bank_cache() if cache is None else Path(cache)) / name
        if path.exists():
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_path(path) as tmp:
                tmp.write_bytes(data)
        except OSError as err:                            # a read-only cache: the index has its copy
            print(f"querybank: bank file not cached ({err})", file=sys.stderr)

    @classmethod
    def load(cls, root: Path, entry: dict) -> "QueryBank":
        path = Path(root) / entry["file"]
        if not path.is_file():
            raise FileNotFoundError(f"the index {root} names the query bank {entry['file']}, which is missing; "
                                    f"rebuild the index (jointspace index build --querybank ...)")
        with np.load(path) as z:
            return _read_bank(z, float(entry["beta"]), str(entry.get("origin", "")))


def _read_bank(z, beta: float, origin: str = "") -> QueryBank:
    """The QueryBank a bank file ``z`` holds: its vectors, and its reference, null and alias sentences (with the
    aliases' classes) where it has them."""
    def get(key: str) -> np.ndarray | None:
        return z[key] if key in z else None

    return QueryBank(captions=get("captions"), images=get("images"), beta=beta, origin=origin,
                     sentences=get("reference_sentences"), nulls=get("reference_nulls"),
                     aliases=get("reference_aliases"), alias_classes=get("reference_alias_classes"))


def folded(manifest: dict, role: str) -> bool:
    """Whether the index of ``role`` in this manifest stores folded ``[v, −o]`` vectors."""
    entry = manifest.get("querybank") or {}
    return bool(entry) and entry[BANK_ROLE[role]] > 0


def bank_for(root: Path, manifest: dict) -> QueryBank | None:
    entry = manifest.get("querybank")
    return QueryBank.load(root, entry) if entry else None


def references_for(root: Path, manifest: dict) -> dict[str, Reference]:
    """The reference set of each side of the index (index/relevance.py), as that side stores its items; empty for
    an index without a bank, or with a bank written before reference sets. The image side's carries the bank's
    reference captions and sentences (and its reference photos, for r(q)) as its :class:`Descriptions` when the bank
    holds sentences."""
    entry = manifest.get("querybank") or {}
    if not entry.get("references"):
        return {}
    path = Path(root) / entry["file"]
    if not path.is_file():
        raise FileNotFoundError(f"the index {root} names the query bank {entry['file']}, which is missing; "
                                f"rebuild the index (jointspace index build --querybank ...)")
    out = {}
    with np.load(path) as z:
        descriptions = None
        if entry["references"].get("sentences") and "reference_sentences" in z:
            said = [z[k].astype(np.float32) for k in ("reference_captions", "reference_sentences") if k in z]
            aliases = entry["references"].get("aliases") and "reference_aliases" in z
            descriptions = Descriptions(np.concatenate(said), z["reference_nulls"].astype(np.float32)
                                        if entry["references"].get("nulls") and "reference_nulls" in z else None,
                                        z["reference_images"].astype(np.float32) if "reference_images" in z else None,
                                        names=len(said[-1]),            # the class sentences: the last rows
                                        aliases=z["reference_aliases"].astype(np.float32) if aliases else None,
                                        alias_classes=z["reference_alias_classes"] if aliases else None)
        for role in ("images", "captions"):
            if role not in entry["references"]:
                continue
            rows = z[f"reference_{role}"].astype(np.float32)
            key = f"reference_{role}_offsets"
            items = fold_items(rows, z[key]) if key in z else rows
            out[role] = Reference(people.fold(manifest, role, items),          # reference photos: a = 0
                                  descriptions if role == "images" else None)
    return out


def queries_for(manifest: dict, role: str, queries: np.ndarray) -> np.ndarray:
    """Queries against the index of ``role``: ``[q, 1]`` when it is folded, else ``q``; then P(q) when that side
    has the person discount (index/people.py; a text query's flag, given as one column after its embedding)."""
    vectors, flags = people.split(manifest, queries)
    out = fold_queries(vectors) if folded(manifest, role) else vectors
    return np.concatenate([out, flags[:, None]], axis=1) if people.discounted(manifest, role) else out


def plain_queries(manifest: dict, queries: np.ndarray) -> np.ndarray:
    """Queries as a caller gives them (a text query with its person flag, or not) → their embeddings alone."""
    return people.split(manifest, queries)[0]


def unfold(manifest: dict, role: str, vector: np.ndarray) -> np.ndarray:
    """A stored vector of ``role`` without its offset and discount coordinates (the embedding itself)."""
    return vector[..., :int(manifest["dim"])]


# --- the bank a model carries ------------------------------------------------------------------------------------

def bank_cache() -> Path:
    """Where embedded model banks are cached: ``$JOINTSPACE_CACHE/querybank`` (``~/.cache/jointspace/querybank``)."""
    return cache_folder("querybank")


def _cache_file(model: EmbeddingModel, captions: list[str], root: Path) -> Path:
    digest = hashlib.blake2b("\n".join(captions).encode(), digest_size=10).hexdigest()
    return root / f"{model.fingerprint[:20]}-{digest}.npy"


def embed_bank_captions(model: EmbeddingModel, captions: list[str], progress: bool = True, cache: Path | None = None
                        ) -> tuple[np.ndarray, bool]:
    """The bank's captions embedded with ``model`` (float16), from the cache when there; returns the vectors and
    whether they came from the cache. A cache that cannot be written (a read-only home) is skipped."""
    from .embed import embed_sentences

    path = _cache_file(model, captions, bank_cache() if cache is None else cache)
    if path.is_file():
        try:
            vectors = np.load(path)
            if vectors.shape == (len(captions), model.cfg.model.embed_dim):
                return vectors, True
        except (OSError, ValueError):
            pass                                      # unreadable: embed again and rewrite it
    vectors = embed_sentences(model, captions, progress=progress).astype(np.float16)
    try:
        with atomic_path(path) as tmp:
            with open(tmp, "wb") as fh:
                np.save(fh, vectors)
    except OSError as err:
        print(f"querybank: not cached ({err})", file=sys.stderr)
    return vectors, False


def model_bank(model: EmbeddingModel, progress: bool = True, cache: Path | None = None) -> QueryBank | None:
    """The QueryBank of the bank ``model`` carries (its captions embedded, or read from the cache), or None when
    it carries none or is not a cosine model."""
    from training.inference.querybank import caption_vectors, carried, image_vectors

    bank = carried(model)
    if bank is None or model.cfg.model.similarity != "cosine":
        return None
    captions = None
    if bank.get("captions"):
        shipped = caption_vectors(bank, model)
        if shipped is not None:
            captions = shipped.astype(np.float16)
        else:
            captions, _ = embed_bank_captions(model, list(bank["captions"]), progress=progress, cache=cache)
    vectors = image_vectors(bank)
    images = None if vectors is None else vectors.astype(np.float16)
    sentences = reference_sentences(model)
    nulls = aliases = alias_classes = None
    if sentences is not None:                         # the text side's null and alias sentences, embedded once per model
        nulls, _ = embed_bank_captions(model, null_sentences(), progress=False, cache=cache)
        aliases, alias_classes = alias_sentences(model, cache)
    return QueryBank(captions=captions, images=images, beta=float(bank.get("beta", DEFAULT_BETA)), origin="model",
                     sentences=sentences, nulls=nulls, aliases=aliases, alias_classes=alias_classes)


def reference_sentences(model: EmbeddingModel) -> np.ndarray | None:
    """The reference sentences a model gives its index (index/relevance.py's text side): its fitted concept head's
    sentence embedding per ImageNet class (training/models/concepts.py), float16; None without one."""
    concepts = model.concepts
    if concepts is None or not bool(concepts.fitted):
        return None
    return concepts.class_embeddings.detach().float().cpu().numpy().astype(np.float16)


def alias_sentences(model: EmbeddingModel, cache: Path | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The alias sentences of a model with a fitted concept head: each ImageNet class's other names
    (training/models/concepts.py ``class_aliases`` under the head's ``class_names``) in the head's templates, embedded
    as its class sentences are (averaged over the templates, normalised; float16), and each one's class."""
    from training.models.concepts import class_aliases, class_sentences

    if model.concepts is None:
        raise ValueError("alias sentences are a concept head's: this model has none")
    classes, names = zip(*class_aliases(model.concepts.cfg.class_names))
    total = sum(embed_bank_captions(model, class_sentences(names, t), progress=False, cache=cache)[0]
                .astype(np.float32) for t in model.concepts.cfg.templates)
    vectors = np.asarray(total, dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors.astype(np.float16), np.asarray(classes, dtype=np.int32)


def correction(manifest: dict) -> dict:
    """Whether each search direction of an index is hubness-corrected, and by which bank (for ``index info``,
    ``/readyz`` and the page)."""
    entry = manifest.get("querybank") or {}
    return {"text_to_image": folded(manifest, "images"), "image_to_text": folded(manifest, "captions"),
            "bank": entry.get("origin", "given") if entry else None,
            "bank_captions": entry.get("captions", 0), "bank_images": entry.get("images", 0),
            "beta": entry.get("beta"), "references": dict(entry.get("references") or {})}
