"""Near-duplicate photos of a gallery: bursts, edits, re-saved and resized copies, grouped for review.

Two photos are *pairs* when their embeddings' cosine similarity is at least the threshold (default
:data:`DEFAULT_THRESHOLD`, chosen on generated edits of real photos against distinct ones:
benchmarks/duplicates.py, docs/index.md); the *groups* are the connected components of the pairs (a photo near
one that is near a third joins both). The pairs come from an exact blocked matrix product over the photos'
stored vectors (a querybank offset left out; video moments are not photos and take no part).

Each group has a kind, from the members' content hashes and perceptual hashes (index/phash.py):

* ``identical`` — every member has the same bytes (sha256): copies of one file;
* ``re-encode`` — every two members' perceptual hashes differ in at most :data:`HASH_DISTANCE` bits: the same
  picture re-saved, resized or recoloured slightly;
* ``near`` — otherwise: crops, edits that change the picture, shots of a burst.

Photos indexed before perceptual hashes were kept have none in the metadata: theirs are computed from their files
when groups are asked for (``hashes=`` of :func:`find_groups`), not stored.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from .phash import distances, hash_file

DEFAULT_THRESHOLD = 0.85     # cosine; measured on the shipped model: benchmarks/results/duplicates.json
HASH_DISTANCE = 8            # perceptual-hash bits (of 63) within which two photos are one picture re-encoded
KINDS = ("identical", "re-encode", "near")
BLOCK = 2048                 # rows of the similarity matrix computed at a time


@dataclass(frozen=True)
class Group:
    """One group of near-duplicates: its image ids (ascending), its kind (:data:`KINDS`) and the lowest cosine
    similarity between two of its members (chaining can bring it below the threshold)."""
    ids: tuple[int, ...]
    kind: str
    min_score: float


@dataclass
class Groups:
    """Every group of a gallery at a threshold, the largest first (then by their first id), and how many photos
    were compared."""
    threshold: float
    photos: int
    groups: list[Group] = field(default_factory=list)
    hashed: int = 0            # photos whose perceptual hash was computed from the file (none stored)


def check_threshold(threshold: float) -> float:
    """A cosine threshold: above 0 and at most 1 (ValueError saying so)."""
    if not isinstance(threshold, (int, float)) or threshold != threshold or not 0 < threshold <= 1:
        raise ValueError(f"the duplicate threshold is a cosine similarity above 0 and at most 1, not {threshold!r}")
    return float(threshold)


def pairs_above(vectors: np.ndarray, threshold: float, block: int = BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """Row pairs ``(i, j)``, ``i < j``, of the L2-normalised ``vectors`` whose cosine is at least ``threshold``:
    the upper triangle of ``V Vᵀ``, ``block`` rows at a time (memory ``block × n``)."""
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    unit = vectors / np.where(norms > 0, norms, 1)
    left, right = [], []
    for start in range(0, len(unit), block):
        sims = unit[start:start + block] @ unit[start:].T           # rows start.., columns start..
        rows, cols = np.nonzero(sims >= threshold)
        keep = cols > rows                                           # columns are offset by start as rows are
        left.append(rows[keep] + start)
        right.append(cols[keep] + start)
    if not left:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(left).astype(np.int64), np.concatenate(right).astype(np.int64)


def components(n: int, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """The connected component of each of ``n`` nodes given undirected edges: a label per node, the smallest node
    of its component (union–find with path halving)."""
    parent = list(range(n))

    def root(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in zip(left.tolist(), right.tolist()):
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    return np.asarray([root(x) for x in range(n)], dtype=np.int64)


def kind_of(sha256: Sequence[str | None], hashes: Sequence[int | None]) -> str:
    """A group's kind from its members' content hashes and perceptual hashes (:data:`KINDS`)."""
    if all(s is not None for s in sha256) and len(set(sha256)) == 1:
        return "identical"
    if all(h is not None for h in hashes):
        h = np.asarray(hashes, dtype=np.int64)
        if int(distances(h[:, None], h[None, :]).max()) <= HASH_DISTANCE:
            return "re-encode"
    return "near"


def find_groups(ids: np.ndarray, vectors: np.ndarray, threshold: float = DEFAULT_THRESHOLD,
                sha256: Sequence[str | None] | None = None,
                hashes: Callable[[int], int | None] | None = None) -> Groups:
    """The near-duplicate groups of photos ``ids`` (their ``vectors`` row by row): :class:`Groups`. ``sha256``:
    their content hashes, row by row; ``hashes``: row → perceptual hash (asked only for the members of groups)."""
    threshold = check_threshold(threshold)
    ids = np.asarray(ids, dtype=np.int64)
    out = Groups(threshold, len(ids))
    if len(ids) < 2:
        return out
    left, right = pairs_above(vectors, threshold)
    if not len(left):
        return out
    labels = components(len(ids), left, right)
    sizes = np.bincount(labels)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    unit = np.asarray(vectors, np.float32) / np.where(norms > 0, norms, 1)
    groups = []
    for label in np.nonzero(sizes > 1)[0]:
        rows = np.sort(np.nonzero(labels == label)[0])
        members = unit[rows]
        sims = members @ members.T
        low = float(sims[np.triu_indices(len(rows), 1)].min())
        shas = [sha256[r] for r in rows] if sha256 is not None else [None] * len(rows)
        identical = None not in shas and len(set(shas)) == 1        # no perceptual hash needed
        phashes = [hashes(int(r)) for r in rows] if hashes is not None and not identical else [None] * len(rows)
        groups.append(Group(tuple(int(ids[r]) for r in rows), kind_of(shas, phashes), round(low, 6)))
    groups.sort(key=lambda g: (-len(g.ids), g.ids[0]))
    out.groups = groups
    return out


def gallery_groups(gallery, threshold: float = DEFAULT_THRESHOLD) -> Groups:
    """The near-duplicate groups of a loaded :class:`~index.gallery.Gallery`'s photos. A member's perceptual
    hash is the metadata's, or for a photo indexed before hashes were kept, computed from its file (counted in
    ``hashed``)."""
    from .querybank import unfold

    threshold = check_threshold(threshold)
    rows = [r for r in gallery.meta.all_images() if r.video_id is None]
    stored = set(gallery.images.ids().tolist())
    rows = [r for r in rows if r.id in stored]
    if not rows:
        return Groups(threshold, 0)
    vectors = np.stack([unfold(gallery.manifest, "images", gallery.images.reconstruct(r.id)) for r in rows])
    computed: dict[int, int | None] = {}

    def phash(row: int) -> int | None:
        r = rows[row]
        if r.phash is not None:
            return r.phash
        if row not in computed:
            computed[row] = hash_file(r.path)
        return computed[row]

    out = find_groups(np.asarray([r.id for r in rows]), vectors, threshold, [r.sha256 for r in rows], phash)
    out.hashed = sum(1 for h in computed.values() if h is not None)
    return out
