"""Crash-safe writes: write a temporary file next to the target, fsync, then ``os.replace`` it in.

A process killed mid-write leaves the previous file (or none) under the final name, never a torn one. The file
gets the mode any newly created file of the process gets (0666 less the umask: 0644 under the usual umask 022),
not the 0600 of the temporary file it was written as — so a model or an index written by one user can be read
by a service running as another (a container's own uid).
"""
from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def current_umask() -> int:
    """The process's umask, without changing it (Linux: /proc/self/status; elsewhere set and restored at once)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def created_mode(directory: bool = False) -> int:
    """The mode ``open``/``mkdir`` would give a new file (0o666) or directory (0o777) under the umask."""
    return (0o777 if directory else 0o666) & ~current_umask()


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yields a temporary path in the target's directory; on success it replaces ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, created_mode())             # mkstemp's 0600 → what a plain open() would have made
    finally:
        os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp_path, path)
    finally:
        tmp_path.unlink(missing_ok=True)


def write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json(path: str | Path, obj) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")
