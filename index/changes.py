"""The one update path of an index directory: a :class:`ChangeSet` applied to a :class:`Target` by :func:`apply`.

Every writer of an index — ``build`` (and its parts ``build_from_embeddings``/``build_from_vectors``), ``add``,
``sync``, ``remove``, ``compact``, ``update`` (index/gallery.py) — says what it changes as a ``ChangeSet``:

* new photos: their vectors (as the model gives them) and metadata rows ``(path, PhotoInfo or None)``, with ids
  given (a build: their positions in its list) or the index's next ones;
* embedded videos (``index.video_embed.VideoEmbeddings``): video ids from the manifest's ``next_video_id``, their
  moments image ids after the photos' (:func:`take_video_ids`);
* new captions ``(text, image id or None)``, ids the index's next ones;
* image ids (photos and moments), video ids and caption ids to remove; and how the segments merge afterwards
  (``compact``: ``auto``, ``none`` or ``all``, ``index/segments.py``);
* what OCR read in the new photos (index/ocr.py; an index built with it), stored with their rows.

:func:`apply` gives the ids, folds the new vectors with the index's query bank (``[v, −o]``, index/qbnorm.py),
adds and removes them on each side, copies the metadata with the rows removed and added, and writes it all as one
new generation (index/generations.py). A change that adds and removes nothing (and does not ask for ``compact:
all``) writes no generation. The target is the live generation of an index, read under the writers' lock
(:func:`live_target`), or a new index (:meth:`Target.new`, what ``build`` writes: the image index type chosen by
:class:`BuildOptions`, the query bank saved beside the generations).
"""
from __future__ import annotations

import time
import uuid
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Collection, Iterator, Sequence

import numpy as np

from training.data.fileio import write_json

from . import people
from .faiss_index import default_factory, factory_for_memory
from .generations import FORMAT, current_generation, locked, new_generation, prune_banks, read_generation
from .metadata import Metadata
from .ocr import OcrConfig, PhotoText, read_rows, store
from .qbnorm import QueryBank, bank_for
from .segments import NewSide, SideUpdate

if TYPE_CHECKING:
    from training.inference.overlap import Timeline     # imports torch: a text search loads none of it

    from .video_embed import VideoEmbeddings

COMPACT = ("auto", "none", "all")


@dataclass
class UpdateReport:
    image_ids: list[int] = field(default_factory=list)        # ids given to the images added
    caption_ids: list[int] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)   # unreadable image files: (path, reason)
    removed_images: int = 0
    removed_captions: int = 0
    missing: list[int] = field(default_factory=list)           # ids asked to remove that were not there
    generation: str = ""
    changed: list[int] = field(default_factory=list)            # sync: ids of re-embedded files (their new ids)
    unchanged: int = 0                                          # sync: files already indexed as they are
    outside: list[tuple[str, str]] = field(default_factory=list)   # symbolic links leaving the folder: (link, why)
    video_ids: list[int] = field(default_factory=list)          # ids given to the videos added
    moments: int = 0                                            # their moments (image ids among image_ids)
    timeline: Timeline | None = None        # build: when each batch of photos was embedded (start-up vs steady)
    removed_videos: int = 0                                     # sync, remove: videos gone
    missing_paths: list[str] = field(default_factory=list)     # remove: paths under which nothing is indexed
    videos_seen: int = 0                                        # sync: videos under the folder, on disk or indexed
    already: list[str] = field(default_factory=list)           # add: files given that the index holds as they are
    doubles: int = 0                                            # sync: extra entries of one file removed


@dataclass
class ChangeSet:
    """One change to an index, written by :func:`apply` as one new generation (module docstring)."""
    image_vectors: np.ndarray | None = None      # (n, D): the new photos' vectors, unfolded
    image_unfamiliarity: np.ndarray | None = None   # (n,): their a(x) for the person discount (index/people.py)
    image_rows: Sequence[tuple] = ()             # per new photo: (path, PhotoInfo or None)
    image_ids: Sequence[int] | None = None       # their ids (a build: positions in its list); None: the next ones
    next_image_id: int = 0                       # at least this after the photos (a build: its list's length)
    videos: VideoEmbeddings | None = None        # their moments become images after the photos
    caption_vectors: np.ndarray | None = None    # (m, D), unfolded
    captions: Sequence[tuple[str, int | None]] = ()   # per new caption: (text, image id it describes or None)
    removed_images: Collection[int] = ()         # image ids (photos, moments): vectors and metadata rows
    removed_videos: Collection[int] = ()         # video ids: their rows (their moments' ids in removed_images)
    removed_captions: Collection[int] = ()
    compact: str = "auto"                        # how each side's segments merge after the change
    texts: dict[str, PhotoText] | None = None    # what OCR read in the new photos (None: read by apply, as the
                                                 # index says: index/ocr.py; :func:`read_texts` before a lock)

    def __post_init__(self):
        if self.compact not in COMPACT:
            raise ValueError(f"compact must be one of {', '.join(COMPACT)}, not {self.compact!r}")

    @property
    def moments(self) -> int:
        return self.videos.moments if self.videos is not None else 0

    @property
    def dim(self) -> int:
        """The width of the vectors added (photos', else the videos')."""
        if self.image_vectors is not None and np.asarray(self.image_vectors).size:
            return int(np.asarray(self.image_vectors).shape[1])
        if self.videos is not None and self.videos.vectors:
            return int(self.videos.vectors[0].shape[0])
        raise ValueError("no vectors: a new index needs photos or videos")


@dataclass(frozen=True)
class ModelFacts:
    """What an index records of the model whose vectors it holds (checked when it is loaded or updated)."""
    fingerprint: str
    similarity: str                              # the model's similarity (cosine | order)
    name: str = ""
    person_discount: float = 0.0                 # λ of its person discount (index/people.py); 0: none

    @classmethod
    def of(cls, model) -> "ModelFacts":
        from training.inference.embedding import person_discount

        return cls(model.fingerprint, model.cfg.model.similarity, model.cfg.name, person_discount(model))


@dataclass(frozen=True)
class BuildOptions:
    """What a new index is (``index build``'s options). ``factory``: the image index type, else the one that fits
    ``max_memory`` bytes (``index.faiss_index.factory_for_memory``), else the default by size; IVF/PQ types are
    trained on a sample. ``caption_factory``: the caption index type (default by size). ``image_root``: the folder
    the images were found in (folder filters are relative to it). ``querybank``: items stored as ``[v, −o]``
    (QB-Norm, index/qbnorm.py; cosine models). ``tta``: the gallery-side test-time augmentation the photos are
    embedded with (``index.tta.TTA``), recorded so that ``add`` and ``sync`` embed alike. ``ocr``: read the text
    in the photos (index/ocr.py), recorded so that ``add`` and ``sync`` read theirs too."""
    factory: str | None = None
    caption_factory: str | None = None
    image_root: str | Path | None = None
    max_memory: int | None = None
    querybank: QueryBank | None = None
    tta: str = "none"
    ocr: OcrConfig | None = None


DEFAULT_BUILD = BuildOptions()


class Target:
    """What a change is applied to: a manifest (advanced by the change), the change pending on each side, the
    metadata to copy and the query bank. ``generation``: the live generation's name (None: a new index)."""

    def __init__(self, root: Path, manifest: dict, sides: tuple[SideUpdate | NewSide, SideUpdate | NewSide],
                 meta: Metadata | None = None, generation: str | None = None, bank: QueryBank | None = None):
        self.root, self.manifest, self.meta, self.generation = Path(root), manifest, meta, generation
        self.images, self.captions = sides
        self._bank = bank

    @classmethod
    def live(cls, root: Path) -> "Target":
        """The live generation of the index at ``root`` (the caller holds the writers' lock; :func:`live_target`)
        with an empty change to each side (no vector is read) and its metadata open for reading."""
        generation = current_generation(root)
        gen_dir = root / generation
        manifest = read_generation(gen_dir)
        sim = manifest["similarity"]
        sides = (SideUpdate("images", sim, manifest["images"], gen_dir),
                 SideUpdate("captions", sim, manifest["captions"], gen_dir))
        return cls(root, manifest, sides, Metadata(gen_dir / "metadata.sqlite", readonly=True), generation)

    @classmethod
    def new(cls, root: str | Path, model: ModelFacts, dim: int, images: int, options: BuildOptions) -> "Target":
        """A new index at ``root`` for ``images`` vectors of ``dim`` dimensions (which image index type they get:
        :class:`BuildOptions`). Nothing is written until the change is applied."""
        factory = options.factory
        if factory is None:
            factory = factory_for_memory(images, dim, options.max_memory) if options.max_memory is not None else \
                default_factory(images, dim)
        bank = options.querybank
        now = time.time()
        manifest = {"format": FORMAT, "model_fingerprint": model.fingerprint, "similarity": model.similarity,
                    "dim": dim, "model_name": model.name, "created": now, "index_id": uuid.uuid4().hex,
                    "next_image_id": 0, "next_caption_id": 0, "next_video_id": 0, "tta": options.tta}
        if model.person_discount > 0 and model.similarity == "cosine":
            manifest[people.KEY] = people.entry(model.person_discount)
        width = {role: (bank.fold(role, np.zeros((0, dim), np.float32)).shape[1] if bank is not None else dim)
                 + people.discounted(manifest, role) for role in ("images", "captions")}
        sides = (NewSide("images", model.similarity, width["images"], factory, sample=True),
                 NewSide("captions", model.similarity, width["captions"], options.caption_factory))
        if options.image_root is not None:
            manifest["image_root"] = str(Path(options.image_root).resolve())
        if options.ocr is not None:
            manifest["ocr"] = options.ocr.manifest()
        return cls(Path(root), manifest, sides, bank=bank)

    @property
    def bank(self) -> QueryBank | None:
        """The query bank the index folds its vectors with (an existing index's: read on first use)."""
        if self._bank is None and self.generation is not None and self.manifest.get("querybank"):
            self._bank = bank_for(self.root, self.manifest)
        return self._bank

    def close(self) -> None:
        if self.meta is not None:
            self.meta.close()


@contextmanager
def live_target(root: Path) -> Iterator[Target]:
    """The live generation as a :class:`Target`, read and replaced under the writers' lock (no other writer runs
    meanwhile)."""
    with locked(root):
        target = Target.live(root)
        try:
            yield target
        finally:
            target.close()


def read_texts(changes: ChangeSet, manifest: dict) -> ChangeSet:
    """``changes`` with what OCR reads in its new photos, as the index whose manifest is ``manifest`` says
    (index/ocr.py; none for an index built without it). Tesseract takes a while: an update reads them before it
    takes the writers' lock; :func:`apply` reads them itself when they were not."""
    return replace(changes, texts=read_rows(changes.image_rows, OcrConfig.from_manifest(manifest.get("ocr"))))


def take_video_ids(manifest: dict, videos: VideoEmbeddings):
    """:meth:`VideoEmbeddings.rows` with video ids from the manifest's ``next_video_id`` (0 in an index written
    before videos), which it advances."""
    first = int(manifest.get("next_video_id", 0))
    out = videos.rows(first)
    manifest["next_video_id"] = first + len(videos.kept)
    return out


def _matrix(vectors: np.ndarray | None, dim: int) -> np.ndarray:
    return np.zeros((0, dim), np.float32) if vectors is None else np.asarray(vectors, np.float32).reshape(-1, dim)


def _next_ids(manifest: dict, key: str, n: int) -> np.ndarray:
    first = int(manifest[key])
    manifest[key] = first + n
    return np.arange(first, first + n, dtype=np.int64)


def apply(target: Target, changes: ChangeSet) -> UpdateReport:
    """Applies ``changes`` to ``target`` and writes the result as the index's new live generation (a new index:
    its first, under the writers' lock taken here; an existing one: the caller holds it). Returns the ids given
    (``image_ids``: the photos' then the moments'; ``caption_ids``, ``video_ids``, ``moments``) and the generation
    live afterwards — the target's own when the change adds and removes nothing."""
    manifest, dim = target.manifest, int(target.manifest["dim"])
    report = UpdateReport()
    # ids: the photos' (given or the next ones), then their videos' and the moments', then the captions'
    vectors, rows = _matrix(changes.image_vectors, dim), list(changes.image_rows)
    unfamiliarity = (np.zeros(len(vectors), np.float32) if changes.image_unfamiliarity is None
                     else np.asarray(changes.image_unfamiliarity, np.float32).reshape(-1))
    if changes.image_ids is None:
        ids = _next_ids(manifest, "next_image_id", len(rows))
    else:
        ids = np.asarray(changes.image_ids, np.int64)
        manifest["next_image_id"] = max(int(manifest["next_image_id"]), int(ids.max()) + 1 if len(ids) else 0)
    manifest["next_image_id"] = max(int(manifest["next_image_id"]), changes.next_image_id)
    video_rows: list = []
    if changes.moments:
        assert changes.videos is not None
        moment_vectors, moment_rows, video_rows = take_video_ids(manifest, changes.videos)
        ids = np.concatenate([ids, _next_ids(manifest, "next_image_id", len(moment_rows))])
        vectors, rows = np.concatenate([vectors, moment_vectors]), rows + moment_rows
        moments_a = changes.videos.moment_unfamiliarity()           # a moment's: the mean of its frames'
        unfamiliarity = np.concatenate([unfamiliarity, np.zeros(len(moment_rows), np.float32)
                                        if moments_a is None else moments_a])
        report.video_ids, report.moments = [int(r[0]) for r in video_rows], len(moment_rows)
    if changes.texts is None and rows:
        changes = read_texts(changes, manifest)
    captions = list(changes.captions)
    caption_ids = _next_ids(manifest, "next_caption_id", len(captions))
    report.image_ids, report.caption_ids = ids.tolist(), caption_ids.tolist()
    if target.generation is not None and not (len(ids) or len(caption_ids) or changes.removed_images
                                              or changes.removed_videos or changes.removed_captions
                                              or changes.compact == "all"):
        report.generation = target.generation              # nothing to change: no new generation
        return report
    # the vectors: folded with the bank, added and removed on each side (a new side is trained here)
    bank = target.bank if len(ids) or len(caption_ids) else None
    if changes.removed_images:
        target.images.remove(sorted(changes.removed_images))
    if changes.removed_captions:
        target.captions.remove(sorted(changes.removed_captions))
    if len(ids):
        target.images.add(people.fold(manifest, "images", bank.fold("images", vectors) if bank is not None
                                      else vectors, unfamiliarity), ids)
    if len(caption_ids):
        caption_vectors = _matrix(changes.caption_vectors, dim)
        target.captions.add(bank.fold("captions", caption_vectors) if bank is not None else caption_vectors,
                            caption_ids)
    with (locked(target.root) if target.generation is None else nullcontext()):
        try:
            _write(target, changes, (ids, rows), (caption_ids, captions), video_rows)
        finally:
            if target.generation is None:           # a new index: the banks no generation names any more
                prune_banks(target.root)
    report.generation = current_generation(target.root)
    return report


def _write(target: Target, changes: ChangeSet, images: tuple[np.ndarray, list], captions: tuple[np.ndarray, list],
           video_rows: list) -> None:
    """Writes the new generation: the metadata (a copy of the target's, or a new one) with the rows removed and
    added, each side's segments and tombstones (``index/segments.py``), the manifest."""
    now = time.time()
    manifest = {**target.manifest, "format": FORMAT, "updated": now}
    manifest.setdefault("index_id", uuid.uuid4().hex)       # an index from before segments gets one now
    with new_generation(target.root, lock=False) as gen_dir:
        if target.generation is None and target.bank is not None:       # saved once per content, beside them
            manifest["querybank"] = target.bank.save(target.root)
        path = gen_dir / "metadata.sqlite"
        meta = target.meta.copy_to(path) if target.meta is not None else Metadata(path)
        try:
            meta.remove_images(sorted(changes.removed_images))
            meta.remove_videos(sorted(changes.removed_videos))
            meta.remove_captions(sorted(changes.removed_captions))
            meta.add_images(id_rows := [(int(i), *row) for i, row in zip(*images)], added=now)
            store(meta, id_rows, changes.texts or {}, OcrConfig.from_manifest(manifest.get("ocr")))
            meta.add_captions([(int(i), text, image) for i, (text, image) in zip(*captions)], added=now)
            meta.add_videos(video_rows, added=now)
        finally:
            meta.close()
        number = manifest.get("next_segment", 1)
        for side in (target.images, target.captions):
            manifest[side.role], number = side.write(gen_dir, number, changes.compact)
        manifest["next_segment"] = number
        write_json(gen_dir / "manifest.json", manifest)
    target.manifest = manifest
