"""Finding the media of a folder: which files are photos and videos, the excludes, and the symbolic-link policy.

* :func:`scan_media` walks a folder once for photos and/or videos (by suffix), prunes what the exclude patterns
  rule out (:func:`excluded`; :data:`DEFAULT_EXCLUDES` unless told otherwise) and lists the symbolic links it did
  not follow; :func:`scan_images`, :func:`find_images` and :func:`find_videos` are its narrower forms.
* :func:`is_video` tells a found file's kind by its content (``training.data.media.sniff_video``), not its name:
  a JPEG named ``.mp4`` is a photo.

What is read of each file once found: ``index/embed.py`` (photos) and ``index/video_embed.py`` (videos).
"""
from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from training.data.media import file_head, sniff_video
from training.data.preprocess import HEIF_SUFFIXES, RAW_SUFFIXES

from .choices import VIDEO_SUFFIXES

IMAGE_SUFFIXES = ({".jpg", ".jpeg", ".png", ".gif", ".bmp", ".webp", ".tif", ".tiff", ".avif"} | HEIF_SUFFIXES
                  | RAW_SUFFIXES)
# never indexed: thumbnail caches (freedesktop, Synology) and hidden files and folders (".*")
DEFAULT_EXCLUDES = (".thumbnails", "@eaDir", ".*")


def excluded(relative: str | Path, patterns: Iterable[str]) -> bool:
    """Whether a path (relative to the folder being indexed) matches an exclude pattern: a glob matched against
    the whole relative path (``2019/*``, ``*.png``; ``*`` also crosses ``/``) or against any one of its folder
    or file names (``drafts``, ``@eaDir``, ``.*``)."""
    rel = Path(relative).as_posix()
    parts = Path(relative).parts
    return any(fnmatch.fnmatchcase(rel, pat) or any(fnmatch.fnmatchcase(part, pat) for part in parts)
               for pat in patterns)


def is_video(path: str | Path) -> bool:
    """Whether a file holds a video, told by its content (``training.data.media.sniff_video``), not its name: a
    JPEG named ``.mp4`` is a photo. A file that cannot be read (gone since) is told by its suffix."""
    try:
        head = file_head(path)
    except OSError:
        return Path(path).suffix.lower() in VIDEO_SUFFIXES
    return sniff_video(head) is not None


@dataclass
class ImageScan:
    """What a scan found in a folder."""
    found: list[Path]                                   # media files to index, sorted
    outside: list[tuple[str, str]] = field(default_factory=list)   # symbolic links leaving the folder: (link, why)

    def by_kind(self) -> tuple[list[Path], list[Path]]:
        """The files found as ``(photos, videos)``, told apart by content (:func:`is_video`), each in order."""
        kinds = [is_video(p) for p in self.found]
        return ([p for p, video in zip(self.found, kinds) if not video],
                [p for p, video in zip(self.found, kinds) if video])


def find_images(root: str | Path, exclude: Sequence[str] = (), default_excludes: bool = True) -> list[Path]:
    """Every image file (by suffix) under ``root``, recursively, in sorted order, without the files that
    ``exclude`` (and, unless ``default_excludes`` is False, :data:`DEFAULT_EXCLUDES`) rule out; symbolic links
    as :func:`scan_images` treats them."""
    return scan_images(root, exclude, default_excludes).found


def find_videos(root: str | Path, exclude: Sequence[str] = (), default_excludes: bool = True) -> list[Path]:
    """Every video file (by suffix) under ``root``, recursively, sorted, without the excluded files and with
    symbolic links as photos are treated (:func:`scan_images`)."""
    return scan_media(root, exclude, default_excludes, videos=True).found


def scan_media(root: str | Path, exclude: Sequence[str] = (), default_excludes: bool = True, photos: bool = False,
               videos: bool = True) -> ImageScan:
    """One walk of ``root`` for photos and/or videos (:func:`scan_images`: excludes, symbolic links leaving the
    folder skipped and listed)."""
    suffixes = (IMAGE_SUFFIXES if photos else frozenset()) | (VIDEO_SUFFIXES if videos else frozenset())
    return scan_images(root, exclude, default_excludes, suffixes=suffixes)


def scan_images(root: str | Path, exclude: Sequence[str] = (), default_excludes: bool = True,
                suffixes: Iterable[str] = IMAGE_SUFFIXES) -> ImageScan:
    """:func:`find_images`, and the symbolic links it did not follow. The symlink policy: the files indexed are
    the folder's own. A link whose target lies outside the folder (after every link is resolved) is skipped and
    listed in ``outside``, never followed — a link to a file or to a folder alike. A link to a file inside the
    folder stands for that file, which is indexed once (under its real path: the index stores resolved paths);
    a link to a folder inside is not descended (its files are found where they are). ``suffixes``: the files
    looked for (photos by default; :func:`scan_media` adds videos)."""
    suffixes = frozenset(suffixes)
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"no image directory at {root}")
    real_root = root.resolve()
    patterns = [*(DEFAULT_EXCLUDES if default_excludes else ()), *exclude]
    found: dict[Path, Path] = {}                         # real path → the path it was found under
    outside: list[tuple[str, str]] = []

    def leaves(link: Path) -> bool:
        target = link.resolve()
        if target == real_root or real_root in target.parents:
            return False
        outside.append((str(link), f"a symbolic link to {target}, outside {real_root}: not followed"))
        return True

    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath).relative_to(root)
        kept = []
        for d in sorted(dirnames):
            if excluded(here / d, patterns):            # prune excluded folders
                continue
            if (Path(dirpath) / d).is_symlink():        # os.walk does not descend links; list those leaving
                leaves(Path(dirpath) / d)
                continue
            kept.append(d)
        dirnames[:] = kept
        for name in filenames:
            path = Path(dirpath) / name
            if path.suffix.lower() not in suffixes or excluded(here / name, patterns):
                continue
            link = path.is_symlink()
            if (link and leaves(path)) or not path.is_file():
                continue
            real = path.resolve()
            if real not in found or not link:           # a file and a link to it: the file itself
                found[real] = path
    return ImageScan(sorted(found.values()), sorted(outside))
