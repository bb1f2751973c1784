"""QB-Norm's offsets folded into one inner product (training/inference/querybank.py says why): item vectors
``[v, −o]`` against query vectors ``[q, 1]``, so ``[q, 1] · [v, −o] = q · v − o``. Plain numpy, without torch, so
a search that only reads a folded index (``jointspace index search --text``) needs none."""
from __future__ import annotations

import numpy as np

DEFAULT_BETA = 20.0          # QB-Norm §4: inverse temperature of the inverted softmax, 20 in their experiments


def fold_items(vectors: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Item vectors with the offset as one extra coordinate: ``[v, −o]`` ``(N, D + 1)``."""
    return np.ascontiguousarray(np.concatenate([vectors, -offsets.reshape(-1, 1)], axis=1), dtype=np.float32)


def fold_queries(vectors: np.ndarray) -> np.ndarray:
    """Query vectors with a constant 1 appended: ``[q, 1] · [v, −o] = q · v − o``."""
    return np.ascontiguousarray(np.concatenate([vectors, np.ones((len(vectors), 1), vectors.dtype)], axis=1),
                                dtype=np.float32)
