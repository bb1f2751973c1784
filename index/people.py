"""The person discount inside the index (training/models/concepts.py, ``unfamiliarity``).

A model with a person discount λ (``concepts.person_discount``) gives each photo a(x) ∈ [0, 1], how unlike every
training photo it is. The trained embedding learnt people from the training photos alone and scores a short query
such as "a person" highest on the photos with the least content, so a text query that names a person
(training/inference/person_words.py) loses λ · a(x) on each photo:

    score(q, x) = q · v(x) − o(x) − λ · P(q) · a(x),    P(q) = 1 if q names a person, else 0.

Like QB-Norm's offset (index/qbnorm.py), the term is one more coordinate: an image index built with such a model
(its manifest's ``people``: ``{"discount": λ}``) stores each photo as ``[v, −o, −λ · a]`` (a video moment: the mean
of its frames' a; an index's reference photos: a = 0) and a query is searched as ``[q, 1, P(q)]``, so that search stays one FAISS call
and the scores it returns are the discounted ones. Queries of text carry P(q) as one column after their embedding
(:func:`text_queries`, ``(n, dim + 1)``); any other query (a photo) is searched with P = 0. The caption index is
not discounted.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from training.inference.person_words import names_person

KEY = "people"          # the manifest's entry: {"discount": λ}


def discount(manifest: dict) -> float:
    """λ of the index whose manifest is ``manifest`` (0: no person discount)."""
    return float((manifest.get(KEY) or {}).get("discount", 0.0))


def discounted(manifest: dict, role: str) -> bool:
    """Whether the index of ``role`` (images | captions) stores the discount's coordinate."""
    return role == "images" and discount(manifest) > 0


def entry(person_discount: float) -> dict:
    """The manifest's entry for a new index of a model whose person discount is ``person_discount``."""
    return {"discount": float(person_discount)}


def fold(manifest: dict, role: str, vectors: np.ndarray, unfamiliarity: np.ndarray | None = None) -> np.ndarray:
    """Stored vectors of ``role`` (``[v]`` or ``[v, −o]``) → with ``−λ · a`` last when that side is discounted
    (``unfamiliarity``: a per row; None: 0, as for reference photos); else unchanged."""
    if not discounted(manifest, role):
        return vectors
    vectors = np.asarray(vectors, dtype=np.float32)
    a = np.zeros(len(vectors), np.float32) if unfamiliarity is None else np.asarray(unfamiliarity, np.float32)
    if a.shape != (len(vectors),):
        raise ValueError(f"{len(a)} unfamiliarities for {len(vectors)} vectors")
    return np.concatenate([vectors, (-discount(manifest) * a)[:, None]], axis=1)


def text_queries(vectors: np.ndarray, texts: Sequence[str]) -> np.ndarray:
    """Embedded text queries ``(n, dim)`` → ``(n, dim + 1)``: P(q) after each embedding (1 when the text names a
    person), as the image search reads a text query."""
    vectors = np.asarray(vectors, dtype=np.float32)
    if len(vectors) != len(texts):
        raise ValueError(f"{len(texts)} texts for {len(vectors)} query vectors")
    flags = np.array([names_person(t) for t in texts], dtype=np.float32)
    return np.concatenate([vectors.reshape(len(texts), -1), flags[:, None]], axis=1)


def split(manifest: dict, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Queries as a caller gives them (``(n, dim)``, or text queries ``(n, dim + 1)``: :func:`text_queries`) → the
    embeddings ``(n, dim)`` and P ``(n,)`` (zeros for queries without the column)."""
    queries = np.asarray(queries, dtype=np.float32)
    dim = int(manifest["dim"])
    if queries.ndim != 2 or queries.shape[1] not in (dim, dim + 1):
        raise ValueError(f"queries of {dim} dimensions (or {dim + 1}: a text query's person flag last) expected, "
                         f"got shape {queries.shape}")
    if queries.shape[1] == dim:
        return queries, np.zeros(len(queries), np.float32)
    return queries[:, :dim], queries[:, dim]
