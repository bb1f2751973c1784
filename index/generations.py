"""The generations of an index directory: the gallery's image index, its caption index, their metadata and the
model they fit, written whole as one generation and replaced atomically.

Layout (every change writes a new *generation*; the ``CURRENT`` file names the live one)::

    INDEX_DIR/
      CURRENT                  "gen-00000003"      ← replaced atomically (temp file + rename)
      gen-00000003/
        manifest.json          format, model fingerprint, similarity, dim, factory strings, counts, next ids,
                               index id, test-time augmentation, query bank, each side's segments and
                               tombstone count
        images.empty.faiss     the trained, empty image index new segments start from
        images.00000001.faiss  image segments (FAISS id = gallery image id): immutable, hard-linked from the
        images.00000004.faiss    generation that wrote them
        images.deleted.npy     image ids deleted from the segments (tombstones; absent: none)
        captions.…             the same for the caption embeddings
        metadata.sqlite        id → file path, capture time, size, folder, content hash / caption text, added time
      gen-00000002/            the previous generation (kept for readers that are still loading it)
      querybank-<hash>.npz     optional: the query bank of a QB-Norm index (index/qbnorm.py), shared by the
                               generations whose manifest names it

A build, ``add``, ``remove``, ``sync`` or ``compact`` writes the new generation into a temporary directory, fsyncs
it, renames it to ``gen-N`` and only then points ``CURRENT`` at it. An update writes only what changed: added
vectors go to a new segment, removed ids to a new tombstone file, and the segments it keeps are hard links to the
previous generation's files (``index/segments.py``; compaction merges segments). Generations get the modes the
writer's umask gives new files (directories 0755, files 0644 under the usual 022), so a service running as
another user — a second replica, a container with its own uid on a read-only volume — can read them. A process
killed at any point leaves ``CURRENT`` naming a complete generation: the previous index stays loadable, and the
half-written temporary directory is removed by the next writer. Writers take an exclusive ``flock`` on
``INDEX_DIR/.lock``. The metadata database is still copied whole by every update (an SQLite online backup).

Generations written before segments (format ``jointspace-index/1``: one ``images.faiss`` and one
``captions.faiss``) load as one segment each; their first update continues in the segment layout.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import tempfile
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Iterator

from training.data.fileio import created_mode, write_text

FORMAT = "jointspace-index/2"
READS = ("jointspace-index/1", FORMAT)         # formats that load (1: one FAISS file per side, no segments)
_GEN = re.compile(r"^gen-(\d{8})$")


# --- generations -----------------------------------------------------------------------------------------------

def current_generation(root: Path) -> str:
    pointer = root / "CURRENT"
    if not pointer.exists():
        raise FileNotFoundError(f"no jointspace index at {root} (no CURRENT file; build one with "
                                f"`jointspace index build`)")
    name = pointer.read_text().strip()
    if not _GEN.match(name) or not (root / name).is_dir():
        raise ValueError(f"{root}/CURRENT names {name!r}, which is not a generation directory")
    return name


def read_manifest(root: str | Path) -> dict:
    """The manifest of an index directory's live generation."""
    root = Path(root)
    return read_generation(root / current_generation(root))


def read_generation(gen_dir: Path) -> dict:
    """The manifest of one generation directory, refused when its format is not one this version reads."""
    manifest = json.loads((gen_dir / "manifest.json").read_text())
    if manifest.get("format") not in READS:
        raise ValueError(f"{gen_dir} is not an index this version reads (format {manifest.get('format')!r}; "
                         f"it reads {', '.join(READS)}): rebuild it with `jointspace index build`")
    return manifest


@contextmanager
def locked(root: Path) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def new_generation(root: Path, lock: bool = True) -> Iterator[Path]:
    """Yields an empty temporary directory; when the block ends normally it becomes the live generation.
    ``lock=False``: the caller already holds the writers' lock."""
    root = Path(root)
    with (locked(root) if lock else nullcontext()):
        for stale in root.glob(".tmp-gen-*"):        # left by a writer that died; we hold the lock
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-gen-", dir=root))
        os.chmod(tmp, created_mode(directory=True))     # mkdtemp's 0700 → readable by other users (0755 under umask 022)
        try:
            yield tmp
            for f in tmp.iterdir():
                fsync_path(f)
            fsync_path(tmp)
            previous = current_generation(root) if (root / "CURRENT").exists() else None
            numbers = [int(m.group(1)) for p in root.iterdir() if (m := _GEN.match(p.name))]
            final = root / f"gen-{max(numbers, default=0) + 1:08d}"
            os.rename(tmp, final)
            fsync_path(root)
            write_text(root / "CURRENT", final.name + "\n")
            fsync_path(root)
            keep = {final.name, previous}
            for old in root.iterdir():
                if _GEN.match(old.name) and old.name not in keep:
                    shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def prune_banks(root: Path) -> None:
    """Removes query bank files that no kept generation names (after a rebuild with another bank or none)."""
    named = set()
    for gen in root.iterdir():
        if _GEN.match(gen.name):
            try:
                named.add((read_generation(gen).get("querybank") or {}).get("file"))
            except (OSError, ValueError):
                return                                   # unreadable generation: keep everything
    for bank in root.glob("querybank-*.npz"):
        if bank.name not in named:
            bank.unlink(missing_ok=True)
