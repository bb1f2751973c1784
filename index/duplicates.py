"""Near-duplicate photos of a gallery: bursts, edits, re-saved and resized copies, grouped for review.

Two photos are *pairs* when one is among the other's :data:`NEIGHBOURS` nearest photos and their embeddings'
cosine similarity is at least the threshold (default :data:`DEFAULT_THRESHOLD`, chosen on generated edits of real
photos against distinct ones: benchmarks/duplicates.py, docs/index.md; never below :data:`FLOOR`); the *groups*
are the connected components of the pairs (a photo near one that is near a third joins both). Nothing is
quadratic: the neighbours are a k-nearest-neighbour search over the photos' stored vectors (a querybank offset left
out; video moments are not photos and take no part), exact (a FAISS Flat index) up to :data:`EXACT_UP_TO` photos,
beyond that candidates found exactly in a random projection to :data:`PROJECTED` dimensions and scored again in
the full one (:func:`nearest`; measured against exact search: benchmarks/hostile_media.py), in batches of
:data:`BATCH` queries. The neighbours at or above the
floor are found once (:func:`nearest`; a service keeps them per generation); a threshold then only filters them,
so memory and time are bounded by ``photos × NEIGHBOURS`` pairs whatever the threshold.

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

from .choices import DEFAULT_THRESHOLD
from .phash import distances, hash_file

# the lowest threshold asked for: at 0.70 one pair in ten is already two distinct photos (the sweep of
# benchmarks/duplicates.py); below 0.5 a threshold groups what the model merely finds alike, not copies
FLOOR = 0.5
NEIGHBOURS = 32              # nearest photos kept per photo: a burst of 33 shots is still all pairs
EXACT_UP_TO = 5_000          # photos: exact k-NN (5,000² dot products); beyond, candidates from a projection
PROJECTED = 128              # dimensions of the projection the candidates are found in
MARGIN = 0.3                 # projected cosine below the floor by more than this: not a candidate (~3 × 1/√128)
BATCH = 1024                 # photos searched at a time
EXACT_GROUP = 512            # groups up to this size get their exact lowest similarity (all pairs)
HASH_DISTANCE = 8            # perceptual-hash bits (of 63) within which two photos are one picture re-encoded
KINDS = ("identical", "re-encode", "near")


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
    """A cosine threshold: from :data:`FLOOR` to 1 (ValueError saying so)."""
    if not isinstance(threshold, (int, float)) or threshold != threshold or not FLOOR <= threshold <= 1:
        raise ValueError(f"the duplicate threshold is a cosine similarity from {FLOOR} to 1, not {threshold!r}")
    return float(threshold)


def unit_rows(vectors: np.ndarray, in_place: bool = False) -> np.ndarray:
    """``vectors`` as float32 rows of length 1 (a zero row stays zero); ``in_place``: a float32 C-contiguous array
    is scaled itself instead of copied."""
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return np.divide(vectors, np.where(norms > 0, norms, 1), out=vectors if in_place else None)


@dataclass
class Neighbours:
    """Each photo's nearest photos at or above :data:`FLOOR`: row pairs ``left < right`` (each pair once) and their
    cosine ``scores``; ``exact`` when found by exhaustive search."""
    photos: int
    left: np.ndarray
    right: np.ndarray
    scores: np.ndarray
    exact: bool

    def above(self, threshold: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The pairs at or above ``threshold``, within float32 rounding (two copies of one file score 1)."""
        keep = self.scores >= threshold - 1e-6
        return self.left[keep], self.right[keep], self.scores[keep]


def _search(index, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``index.search`` of ``queries`` :data:`BATCH` at a time."""
    scores, found = zip(*(index.search(queries[i:i + BATCH], k) for i in range(0, len(queries), BATCH)))
    return np.concatenate(scores), np.concatenate(found)


def nearest(vectors: np.ndarray, k: int = NEIGHBOURS, floor: float = FLOOR, in_place: bool = False) -> Neighbours:
    """The :class:`Neighbours` of the rows of ``vectors``: each row's ``k`` nearest other rows by cosine, kept at
    or above ``floor``. Up to :data:`EXACT_UP_TO` rows, an exact inner-product search (FAISS Flat) over the unit
    rows; beyond, the ``k`` nearest in a seeded random orthonormal projection to :data:`PROJECTED` dimensions
    (Johnson–Lindenstrauss: inner products kept within about ``1/√PROJECTED``), exact search there, then those
    candidates scored again in the full dimension — candidates more than :data:`MARGIN` below ``floor`` in the
    projection skipped — and the best ``k`` kept. :data:`BATCH` rows at a time. ``in_place``: ``vectors`` (float32,
    C-contiguous) may be scaled to unit length itself rather than copied."""
    import faiss

    unit = unit_rows(vectors, in_place)
    n, dim = unit.shape
    empty = np.zeros(0, np.int64)
    if n < 2:
        return Neighbours(n, empty, empty, np.zeros(0, np.float32), True)
    exact = n <= EXACT_UP_TO or dim <= PROJECTED
    want = min(k + 1, n)                                   # the photo itself comes back too
    if exact:
        index = faiss.IndexFlatIP(dim)
        index.add(unit)
        scores, found = _search(index, unit, want)
    else:
        basis, _ = np.linalg.qr(np.random.default_rng(0).standard_normal((dim, PROJECTED)).astype(np.float32))
        projected = unit_rows(unit @ basis)
        index = faiss.IndexFlatIP(PROJECTED)
        index.add(projected)
        rough, found = _search(index, projected, want)
        del projected, index
        scores = np.full(found.shape, -np.inf, np.float32)
        for start in range(0, n, BATCH // 8):                 # the candidates' full vectors, a block at a time
            block = slice(start, start + BATCH // 8)
            near = rough[block] >= floor - MARGIN
            rows, cols = np.nonzero(near)
            scores[block][rows, cols] = np.einsum("ij,ij->i", unit[block][rows], unit[found[block][rows, cols]])
        order = np.argsort(-scores, axis=1)[:, :want]
        scores, found = np.take_along_axis(scores, order, 1), np.take_along_axis(found, order, 1)
    rows = np.repeat(np.arange(n), found.shape[1])
    cols, sims = found.ravel(), scores.ravel()
    keep = (cols >= 0) & (cols != rows) & (sims >= floor)
    rows, cols, sims = rows[keep], cols[keep], sims[keep]
    a, b = np.minimum(rows, cols), np.maximum(rows, cols)
    _, first = np.unique(a * n + b, return_index=True)         # a pair found from both sides, once
    return Neighbours(n, a[first], b[first], np.minimum(sims[first], 1.0).astype(np.float32), exact)


def components(n: int, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """The connected component of each of ``n`` nodes given undirected edges: a label per node, the smallest node
    of its component (vectorised hooking of the larger root under the smaller, then pointer jumping, until no edge
    joins two roots)."""
    parent = np.arange(n, dtype=np.int64)
    left, right = np.asarray(left, np.int64), np.asarray(right, np.int64)
    while True:
        a, b = parent[left], parent[right]
        differ = a != b
        if not differ.any():
            return parent
        np.minimum.at(parent, np.maximum(a, b)[differ], np.minimum(a, b)[differ])
        while True:                                            # every node straight under its root
            up = parent[parent]
            if np.array_equal(up, parent):
                break
            parent = up


def kind_of(sha256: Sequence[str | None], hashes: Sequence[int | None]) -> str:
    """A group's kind from its members' content hashes and perceptual hashes (:data:`KINDS`); the hashes'
    distances are compared a block of members at a time (memory ``256 × members``)."""
    if all(s is not None for s in sha256) and len(set(sha256)) == 1:
        return "identical"
    if all(h is not None for h in hashes):
        h = np.asarray(hashes, dtype=np.int64)
        if all(int(distances(h[i:i + 256, None], h[None, :]).max()) <= HASH_DISTANCE
               for i in range(0, len(h), 256)):
            return "re-encode"
    return "near"


def group(neighbours: Neighbours, ids: np.ndarray, threshold: float,
          vectors: Callable[[np.ndarray], np.ndarray], sha256: Sequence[str | None] | None = None,
          hashes: Callable[[int], int | None] | None = None) -> Groups:
    """The groups of the pairs of ``neighbours`` at or above ``threshold`` (photos ``ids``, row by row).
    ``vectors``: rows → their vectors, asked only for the members of a group of at most :data:`EXACT_GROUP`
    photos, whose lowest similarity is then exact (a larger group's is the lowest of the pairs that joined it);
    ``sha256``: content hashes row by row; ``hashes``: row → perceptual hash (asked only for groups' members)."""
    threshold = check_threshold(threshold)
    ids = np.asarray(ids, dtype=np.int64)
    out = Groups(threshold, len(ids))
    left, right, scores = neighbours.above(threshold)
    if not len(left):
        return out
    labels = components(len(ids), left, right)
    order = np.argsort(labels, kind="stable")
    starts = np.flatnonzero(np.r_[True, labels[order][1:] != labels[order][:-1]])
    bounds = np.r_[starts, len(order)]
    pair_label = labels[left]
    lowest = np.full(len(ids), np.inf, np.float32)
    np.minimum.at(lowest, pair_label, scores)                 # the lowest pair of each component
    groups = []
    for begin, end in zip(bounds[:-1], bounds[1:]):
        if end - begin < 2:
            continue
        rows = np.sort(order[begin:end])
        if len(rows) <= EXACT_GROUP:
            members = unit_rows(vectors(rows))
            low = float((members @ members.T)[np.triu_indices(len(rows), 1)].min())
        else:
            low = float(lowest[labels[rows[0]]])
        shas = [sha256[r] for r in rows] if sha256 is not None else [None] * len(rows)
        identical = None not in shas and len(set(shas)) == 1        # no perceptual hash needed
        phashes = [hashes(int(r)) for r in rows] if hashes is not None and not identical else [None] * len(rows)
        groups.append(Group(tuple(int(ids[r]) for r in rows), kind_of(shas, phashes), round(low, 6)))
    groups.sort(key=lambda g: (-len(g.ids), g.ids[0]))
    out.groups = groups
    return out


def find_groups(ids: np.ndarray, vectors: np.ndarray, threshold: float = DEFAULT_THRESHOLD,
                sha256: Sequence[str | None] | None = None,
                hashes: Callable[[int], int | None] | None = None) -> Groups:
    """The near-duplicate groups of photos ``ids`` (their ``vectors`` row by row): :func:`nearest`, then
    :func:`group`. ``sha256``: their content hashes, row by row; ``hashes``: row → perceptual hash (asked only for
    the members of groups)."""
    threshold = check_threshold(threshold)
    vectors = np.asarray(vectors, np.float32)
    return group(nearest(vectors), ids, threshold, lambda rows: vectors[rows], sha256, hashes)


class GalleryNeighbours:
    """A loaded :class:`~index.gallery.Gallery`'s photos (not video moments) and their :class:`Neighbours`: found
    once (the vectors read from the index, searched, then dropped), grouped at any threshold after
    (:meth:`groups`). A member's perceptual hash is the metadata's, or for a photo indexed before hashes were
    kept, computed from its file when its group is labelled (counted in ``Groups.hashed``)."""

    def __init__(self, gallery):
        from .qbnorm import unfold

        stored = set(gallery.images.ids().tolist())
        rows = [r for r in gallery.meta.all_images() if r.video_id is None and r.id in stored]
        self.images = gallery.images               # not the gallery: a cache keyed by it must not keep it alive
        self.ids = np.asarray([r.id for r in rows], dtype=np.int64)
        self.sha256 = [r.sha256 for r in rows]
        self.phash = [r.phash for r in rows]
        self.paths = [r.path for r in rows]
        manifest = gallery.manifest
        self._unfold = lambda v: unfold(manifest, "images", v)
        self.neighbours = nearest(self.vectors(np.arange(len(rows))), in_place=True)
        self._computed: dict[int, int | None] = {}

    def vectors(self, rows: np.ndarray) -> np.ndarray:
        """The stored vectors (without a querybank offset) of photos at ``rows``, read into one array."""
        return np.ascontiguousarray(self._unfold(self.images.reconstruct_many(self.ids[rows])), dtype=np.float32)

    def _hash(self, row: int) -> int | None:
        if self.phash[row] is not None:
            return self.phash[row]
        if row not in self._computed:
            self._computed[row] = hash_file(self.paths[row])
        return self._computed[row]

    def groups(self, threshold: float = DEFAULT_THRESHOLD) -> Groups:
        out = group(self.neighbours, self.ids, threshold, self.vectors, self.sha256, self._hash)
        out.hashed = sum(1 for h in self._computed.values() if h is not None)
        return out


def gallery_groups(gallery, threshold: float = DEFAULT_THRESHOLD) -> Groups:
    """The near-duplicate groups of a loaded :class:`~index.gallery.Gallery`'s photos at ``threshold``
    (:class:`GalleryNeighbours`; ``jointspace index duplicates`` and ``GET /v1/duplicates`` alike)."""
    return GalleryNeighbours(gallery).groups(check_threshold(threshold))
