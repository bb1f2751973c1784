"""One side of an index generation (its images or its captions) as append-only *segments* plus *tombstones*.

A generation directory holds, per side (``images`` shown; ``captions`` alike)::

    images.empty.faiss        the trained, empty index every new segment starts from (same coarse quantizer and
                              codebooks, so segments can be merged with FAISS's ``merge_from``)
    images.00000001.faiss     segments: immutable once written; a generation lists its own in the manifest
    images.00000007.faiss
    images.deleted.npy        tombstones: sorted int64 ids deleted from the segments (absent: none)

An update writes only what changed: the vectors it adds go to one new segment file, the ids it removes to a new
(small) tombstone file; the segments it keeps are hard links to the previous generation's files (a copy only on a
file system without hard links), so their bytes are neither read nor written. A search runs on every segment
with the tombstones excluded inside FAISS (``IDSelectorNot``) and merges the per-segment top-k.

Compaction merges segments: after an update, more than :data:`MAX_SEGMENTS` segments merge every segment but the
first (the large base stays untouched), and tombstones above :data:`MAX_DELETED` of the stored vectors merge all
of them, dropping the deleted vectors. ``jointspace index compact`` merges all into one.

A generation written before segments (format ``jointspace-index/1``: one ``images.faiss``) is read as one
segment; its first update derives the empty index from it (one full read) and continues in this layout.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .faiss_index import VectorIndex, faiss, training_sample

if TYPE_CHECKING:
    import torch

MAX_SEGMENTS = 8          # more after an update: the segments after the first are merged into one
MAX_DELETED = 0.10        # more of the stored vectors deleted: all segments are merged and the deleted dropped


def segment_name(role: str, number: int) -> str:
    return f"{role}.{number:08d}.faiss"


def empty_name(role: str) -> str:
    return f"{role}.empty.faiss"


def deleted_name(role: str) -> str:
    return f"{role}.deleted.npy"


def segment_files(entry: dict, role: str) -> list[dict]:
    """The manifest entry's segments, ``[{"file", "count"}]`` (a format-1 entry: its one index file)."""
    if "segments" in entry:
        return [dict(s) for s in entry["segments"]]
    return [{"file": f"{role}.faiss", "count": int(entry["count"])}]


def read_deleted(gen_dir: Path, role: str) -> np.ndarray:
    path = gen_dir / deleted_name(role)
    return np.load(path).astype(np.int64) if path.exists() else np.zeros(0, np.int64)


class SegmentedIndex:
    """The loaded segments of one side, searched as one index. Same reading interface as
    :class:`~index.faiss_index.VectorIndex` (``search``, ``reconstruct``, ``ids``, ``ntotal``, ``to_device``)."""

    def __init__(self, role: str, similarity: str, factory: str, nprobe: int | None,
                 segments: list[tuple[str, VectorIndex]], deleted: np.ndarray, key: str = ""):
        self.role, self.similarity, self.factory, self.nprobe = role, similarity, factory, nprobe
        self.segments, self.deleted, self.key = segments, np.sort(deleted.astype(np.int64)), key
        self._deleted_set = set(self.deleted.tolist())
        self._mmap = False
        self._placement = ("cpu", "auto")      # (device, backend) the segments were loaded for

    @classmethod
    def load(cls, gen_dir: Path, role: str, manifest: dict, mmap: bool = False,
             device: str | torch.device = "cpu", previous: "SegmentedIndex | None" = None,
             backend: str = "auto") -> "SegmentedIndex":
        """Loads the segments of side ``role`` of the generation ``gen_dir`` (whose manifest is ``manifest``).
        The manifest's ``index_id`` names the index the files belong to (a segment file's name is unique within
        it); a segment of ``previous`` with the same key and name is taken as it is, not read again (segments
        never change). ``mmap``: see :meth:`VectorIndex.load`; ``backend``: see :meth:`VectorIndex.to_device`."""
        similarity, entry, key = manifest["similarity"], manifest[role], manifest.get("index_id", "")
        reuse = {}
        if (previous is not None and key and previous.key == key and previous._mmap == mmap
                and previous._placement == (str(device), backend)):
            reuse = dict(previous.segments)
        segments = []
        for seg in segment_files(entry, role):
            index = reuse.get(seg["file"])
            if index is None:
                index = VectorIndex.load(gen_dir / seg["file"], role, similarity, entry["factory"],
                                         entry["nprobe"], mmap=mmap).to_device(device, backend)
            segments.append((seg["file"], index))
        out = cls(role, similarity, entry["factory"], entry["nprobe"], segments, read_deleted(gen_dir, role), key)
        out._mmap, out._placement = mmap, (str(device), backend)
        return out

    # --- reads --------------------------------------------------------------------------------------------
    @property
    def dim(self) -> int:
        return self.segments[0][1].dim

    @property
    def ntotal(self) -> int:
        return sum(index.ntotal for _, index in self.segments) - len(self.deleted)

    def to_device(self, device: str | torch.device, backend: str = "auto") -> "SegmentedIndex":
        for _, index in self.segments:
            index.to_device(device, backend)
        self._placement = (str(device), backend)
        return self

    @property
    def backend(self) -> str:
        """The search backend of the segments (``VectorIndex.backend``), e.g. ``faiss-cpu`` or
        ``torch-cuda-fp16``; several joined with ``+`` when they differ."""
        names = sorted({index.backend for _, index in self.segments})
        return "+".join(names) if names else "none"

    def reconstruct(self, id_: int) -> np.ndarray:
        if int(id_) in self._deleted_set:
            raise KeyError(id_)
        for _, index in reversed(self.segments):
            try:
                return index.reconstruct(id_)
            except KeyError:
                continue
        raise KeyError(id_)

    def reconstruct_many(self, ids) -> np.ndarray:
        """:meth:`reconstruct` of each of ``ids``, ``(n, dim)``: one FAISS call when the side has one segment;
        KeyError naming an absent id."""
        ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        gone = ids[np.isin(ids, self.deleted)]
        if len(gone):
            raise KeyError(int(gone[0]))
        if len(self.segments) == 1:
            return self.segments[0][1].reconstruct_many(ids)
        if not len(ids):
            return np.zeros((0, self.dim if self.segments else 0), np.float32)
        return np.stack([self.reconstruct(int(i)) for i in ids])

    def ids(self) -> np.ndarray:
        every = np.concatenate([index.ids() for _, index in self.segments]) if self.segments else np.zeros(0)
        return np.sort(np.setdiff1d(every.astype(np.int64), self.deleted))

    def search(self, queries: np.ndarray, k: int, ids: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """As :meth:`VectorIndex.search`, over every segment: each returns its best ``k`` (deleted ids excluded
        inside the search), and the best ``k`` of those come back, padded with ``-1``."""
        if ids is not None and len(self.deleted):
            ids = np.setdiff1d(np.asarray(ids, dtype=np.int64), self.deleted)
        if len(self.segments) == 1:
            return self.segments[0][1].search(queries, k, ids=ids, exclude=self.deleted)
        parts = [index.search(queries, k, ids=ids, exclude=self.deleted) for _, index in self.segments]
        scores = np.concatenate([s for s, _ in parts], axis=1)
        found = np.concatenate([i for _, i in parts], axis=1)
        scores = np.where(found < 0, -np.inf, scores)
        limit = self.ntotal if ids is None else min(self.ntotal, len(ids))
        k = max(0, min(int(k), limit, found.shape[1]))
        order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        scores, found = np.take_along_axis(scores, order, 1), np.take_along_axis(found, order, 1)
        return scores.astype(np.float32), found


# --- writing ----------------------------------------------------------------------------------------------------

@dataclass
class SideUpdate:
    """The change to one side of the index that a writer is about to make: vectors to add, ids to delete."""
    role: str
    similarity: str
    entry: dict                                   # the live generation's manifest entry of this side
    src: Path                                     # the live generation's directory
    added: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    removed: list[int] = field(default_factory=list)

    def add(self, vectors: np.ndarray, ids: np.ndarray) -> None:
        if len(ids):
            self.added.append((vectors, np.asarray(ids, dtype=np.int64)))

    def remove(self, ids) -> int:
        """Deletes ``ids``, which the caller knows to be in the index (from the metadata)."""
        self.removed += [int(i) for i in ids]
        return len(ids)

    def write(self, dst: Path, next_segment: int, compact: str = "auto") -> tuple[dict, int]:
        """Writes this side into the new generation directory ``dst``: the kept segments linked, the added
        vectors as one new segment, the tombstones; merged as ``compact`` says (``"auto"``: by the thresholds,
        ``"all"``: into one segment, ``"none"``). Returns the manifest entry and the next segment number."""
        role, entry = self.role, self.entry
        segments = segment_files(entry, role)
        deleted = np.union1d(read_deleted(self.src, role), np.asarray(self.removed, dtype=np.int64))
        empty_path = self.src / empty_name(role)
        empty_file = empty_path if "empty" in entry and empty_path.exists() else None
        if empty_file is None:       # an index written before segments: its first update derives the empty index
            template = VectorIndex.load(self.src / segments[0]["file"], role, self.similarity, entry["factory"],
                                        entry["nprobe"])
            template.index.reset()
            template.save(dst / empty_name(role))
        else:
            _link(empty_file, dst / empty_name(role))
        new = None
        if self.added:
            new = VectorIndex.load(dst / empty_name(role), role, self.similarity, entry["factory"], entry["nprobe"])
            for vectors, ids in self.added:
                new.add(vectors, ids)
        stored = sum(s["count"] for s in segments) + (new.ntotal if new is not None else 0)
        n_seg = len(segments) + (new is not None)
        if compact == "all" or (compact == "auto" and stored and len(deleted) > MAX_DELETED * stored):
            first = 0
        elif compact == "auto" and n_seg > MAX_SEGMENTS:
            first = 1
        else:
            first = None
        if first is not None and (n_seg - first > 1 or len(deleted)):
            merged = self._merge([s["file"] for s in segments[first:]], new, deleted)
            keep_ids = merged.ids()
            gone = np.isin(deleted, keep_ids)        # tombstones of merged vectors: the vectors are dropped
            if gone.any():
                merged = _remove_or_rebuild(merged, deleted[gone], dst / empty_name(role))
            deleted = deleted[~gone]
            segments, new = segments[:first], merged
        out = []
        for seg in segments:
            _link(self.src / seg["file"], dst / seg["file"])
            out.append(seg)
        if new is not None and new.ntotal:
            name = segment_name(role, next_segment)
            next_segment += 1
            new.save(dst / name)
            out.append({"file": name, "count": new.ntotal})
        if not out:                 # every vector gone: one empty segment keeps the layout uniform
            name = segment_name(role, next_segment)
            next_segment += 1
            _link(dst / empty_name(role), dst / name)
            out.append({"file": name, "count": 0})
        if len(deleted):
            with open(dst / deleted_name(role), "wb") as fh:
                np.save(fh, np.sort(deleted))
        stored = sum(s["count"] for s in out)
        return {"factory": entry["factory"], "nprobe": entry["nprobe"], "count": stored - len(deleted),
                "segments": out, "deleted": int(len(deleted)), "empty": empty_name(role)}, next_segment

    def _merge(self, files: list[str], new: VectorIndex | None, deleted: np.ndarray) -> VectorIndex:
        """The segments ``files`` (and ``new``) as one index: FAISS's ``merge_from`` (codes copied, nothing
        re-encoded)."""
        parts = [VectorIndex.load(self.src / f, self.role, self.similarity, self.entry["factory"],
                                  self.entry["nprobe"]) for f in files] + ([new] if new is not None else [])
        base = parts[0]
        for other in parts[1:]:
            _merge_into(base, other)
        base._changed()
        return base


@dataclass
class NewSide:
    """One side of a new index: the same writing interface as :class:`SideUpdate`. Its index (type ``factory``;
    None: by the number of vectors) is created when its vectors come, trained on them (on a ``training_sample``
    of them with ``sample``), so that a factory that cannot hold them fails before anything is written."""
    role: str
    similarity: str
    dim: int                                      # the stored vectors' width
    factory: str | None = None
    sample: bool = False
    index: VectorIndex | None = None
    added: tuple[np.ndarray, np.ndarray] | None = None

    def add(self, vectors: np.ndarray, ids: np.ndarray) -> None:
        if self.index is not None:
            raise ValueError(f"a new index's {self.role} take their vectors at once")
        train = training_sample(vectors, self.factory) if self.sample and self.factory else vectors
        self.index = VectorIndex.create(self.dim, self.role, self.similarity, self.factory,
                                        train_vectors=train if len(vectors) else None)
        self.added = (vectors, np.asarray(ids, dtype=np.int64))

    def remove(self, ids) -> int:
        if len(ids):
            raise ValueError(f"a new index has no {self.role} to remove")
        return 0

    def write(self, dst: Path, next_segment: int, compact: str = "auto") -> tuple[dict, int]:
        """Writes this side as :func:`write_new` does (``compact`` has nothing to merge)."""
        if self.index is None:
            self.add(np.zeros((0, self.dim), np.float32), np.zeros(0, np.int64))
        assert self.index is not None and self.added is not None
        return write_new(dst, self.role, self.index, *self.added, next_segment)


def write_new(dst: Path, role: str, empty: VectorIndex, vectors: np.ndarray, ids: np.ndarray,
              next_segment: int) -> tuple[dict, int]:
    """Writes a freshly built side into ``dst``: ``empty`` (trained, nothing added) as the empty index, and
    ``empty`` with ``vectors`` added as the first segment. Returns the manifest entry and the next number."""
    empty.save(dst / empty_name(role))
    empty.add(vectors, ids)
    name = segment_name(role, next_segment)
    empty.save(dst / name)
    return {"factory": empty.factory, "nprobe": empty.nprobe, "count": empty.ntotal,
            "segments": [{"file": name, "count": empty.ntotal}], "deleted": 0,
            "empty": empty_name(role)}, next_segment + 1


def _merge_into(base: VectorIndex, other: VectorIndex) -> None:
    ivf, other_ivf = faiss.try_extract_index_ivf(base.index), faiss.try_extract_index_ivf(other.index)
    if ivf is not None:      # FAISS merges IVF lists only without a direct map: drop it, merge, rebuild it
        ivf.set_direct_map_type(faiss.DirectMap.NoMap)
        other_ivf.set_direct_map_type(faiss.DirectMap.NoMap)
        base.index.merge_from(other.index, 0)
        ivf.set_direct_map_type(faiss.DirectMap.Hashtable)
        return
    try:
        base.index.merge_from(other.index, 0)
    except RuntimeError:     # an index type FAISS cannot merge (HNSW): add the other's vectors again
        ids = other.ids()
        base.index.add_with_ids(np.stack([other.reconstruct(i) for i in ids]) if len(ids) else
                                np.zeros((0, base.dim), np.float32), ids)


def _remove_or_rebuild(index: VectorIndex, ids: np.ndarray, empty_file: Path) -> VectorIndex:
    """``index`` without ``ids``; a type that cannot remove (HNSW) is rebuilt from its other vectors."""
    try:
        index.remove(ids)
        return index
    except ValueError:
        keep = np.setdiff1d(index.ids(), ids)
        vectors = np.stack([index.reconstruct(i) for i in keep]) if len(keep) else np.zeros((0, index.dim))
        rebuilt = VectorIndex.load(empty_file, index.role, index.similarity, index.factory, index.nprobe)
        rebuilt.add(vectors, keep)
        return rebuilt


def _link(src: Path, dst: Path) -> None:
    """``dst`` becomes the same file as ``src`` (a hard link: no byte read or written); a copy where the file
    system has no hard links."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
