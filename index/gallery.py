"""An index directory as the service and the commands use it: :class:`Gallery` (loading a generation and
searching it) and the updates (``build``, ``add``, ``remove``, ``compact``, ``sync``), each written as a new
generation. What a generation is on disk, how one is read, locked and replaced: ``index/generations.py``.

Loading checks the model fingerprint stored at build time against the model's and refuses a mismatch.
"""
from __future__ import annotations

import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch

from training.data.fileio import write_json
from training.inference.embedding import FileEmbeddings
from training.models.protocol import EmbeddingModel

from .embed import embed_image_files, embed_texts
from .generations import (FORMAT, current_generation, locked, new_generation, prune_banks, read_generation,
                          read_manifest)
from .faiss_index import VectorIndex, default_factory, factory_for_memory, training_sample
from .metadata import Metadata
from .ocr import OcrConfig, read_rows, store
from .order import SORT_DEPTH, by_time, check_sort
from .query import ImageFilter, PhotoTable, page
from .querybank import QueryBank, bank_for, correction, queries_for, references_for, unfold
from .relevance import Ranking, Reference
from .segments import SegmentedIndex, SideUpdate, write_new
from .video import DEFAULT_SAMPLING, Sampling, VideoEmbeddings, embed_videos, take_video_ids



class IndexMismatchError(ValueError):
    """The index was built with a different model than the one it is used with."""


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
    removed_videos: int = 0                                     # sync, remove: videos gone
    missing_paths: list[str] = field(default_factory=list)     # remove: paths under which nothing is indexed
    videos_seen: int = 0                                        # sync: videos under the folder, on disk or indexed


class Gallery:
    """A loaded generation of an index directory (read it; change it with :func:`build`/:func:`add`/:func:`remove`)."""

    def __init__(self, root: Path, generation: str, manifest: dict, images: SegmentedIndex,
                 captions: SegmentedIndex, meta: Metadata, references: dict[str, Reference] | None = None):
        self.root, self.generation, self.manifest = root, generation, manifest
        self.images, self.captions, self.meta = images, captions, meta
        self.references = references or {}          # per side (images | captions): index/relevance.py
        self._photos: PhotoTable | None = None
        self._counts: dict[str, int] | None = None

    @classmethod
    def load(cls, root: str | Path, model=None, device: str | torch.device = "cpu", readonly: bool = True,
             mmap: bool = False, previous: "Gallery | None" = None, backend: str = "auto") -> "Gallery":
        """Loads the live generation. With ``model``, refuses an index built with another model. ``mmap``:
        memory-map the FAISS files instead of reading them (see ``VectorIndex.load``). ``previous``: a loaded
        generation of the same index whose segments are taken as they are, not read again. ``backend``: what
        searches run on (``VectorIndex.to_device``: ``auto``, ``faiss`` or ``torch``)."""
        root = Path(root)
        generation = current_generation(root)
        gen_dir = root / generation
        manifest = read_generation(gen_dir)
        if model is not None:
            check_model(manifest, model, root)
        sim, key = manifest["similarity"], manifest.get("index_id", "")
        images, captions = (SegmentedIndex.load(gen_dir, role, sim, manifest[role], key, mmap=mmap, device=device,
                                                previous=getattr(previous, role, None), backend=backend)
                            for role in ("images", "captions"))
        meta = Metadata(gen_dir / "metadata.sqlite", readonly=readonly)
        bank = (manifest.get("querybank") or {}).get("file")
        same_bank = previous is not None and bank == (previous.manifest.get("querybank") or {}).get("file")
        references = previous.references if same_bank and previous is not None else references_for(root, manifest)
        return cls(root, generation, manifest, images, captions, meta, references)

    def close(self) -> None:
        self.meta.close()

    @property
    def fingerprint(self) -> str:
        return self.manifest["model_fingerprint"]

    @property
    def counts(self) -> dict[str, int]:
        """How many images (photos and video moments), moments, videos and captions the metadata holds (read on
        first use)."""
        if self._counts is None:
            self._counts = self.meta.counts()
        return self._counts

    @property
    def photos(self) -> PhotoTable:
        """The photos' capture times and folders as arrays, for filters (read on first use; a generation never
        changes)."""
        if self._photos is None:
            self._photos = PhotoTable(self.meta.all_images(), self.manifest.get("image_root"))
        return self._photos

    def allowed_ids(self, flt: ImageFilter | None) -> np.ndarray | None:
        """The image ids ``flt`` lets through (None: all). UnknownFolderError for a folder without images."""
        return None if flt is None or not flt.active else self.photos.allowed(flt)

    def search_images(self, queries: np.ndarray, k: int, flt: ImageFilter | None = None, offset: int = 0,
                      min_score: float | None = None, allowed: np.ndarray | None = None, sort: str = "relevance"
                      ) -> list[list[tuple[int, float]]]:
        """Caption/text embeddings → best-first ``(image id, score)`` per query: only images ``flt`` lets through
        (or only the ids ``allowed``; filtered inside FAISS, with an ID selector), scoring at least ``min_score``,
        the ``k`` from ``offset`` on. Fewer than ``k`` when fewer pass. ``sort`` ``newest``/``oldest``: those
        passing ``min_score`` in capture-time order instead (index/order.py)."""
        if allowed is None:
            allowed = self.allowed_ids(flt)
        queries = queries_for(self.manifest, "images", queries)
        if check_sort(sort) != "relevance":
            hits = _pairs(*self.images.search(queries, SORT_DEPTH, ids=allowed))
            return [page(by_time(page(h, SORT_DEPTH, 0, min_score), self.photos.ids, self.photos.taken, sort), k,
                         offset) for h in hits]
        hits = _pairs(*self.images.search(queries, k + offset, ids=allowed))
        return [page(h, k, offset, min_score) for h in hits]

    def search_captions(self, queries: np.ndarray, k: int) -> list[list[tuple[int, float]]]:
        """Image embeddings → best-first ``(caption id, score)`` per query."""
        return _pairs(*self.captions.search(queries_for(self.manifest, "captions", queries), k))

    def ranked(self, role: str, queries: np.ndarray, hits: Sequence[Sequence[tuple[int, float]]]) -> list[Ranking]:
        """The hits of ``queries`` on the side ``role`` (as :meth:`search_images` / :meth:`search_captions` gave
        them, one list per query) with each hit's relevance (index/relevance.py); None without a reference set."""
        reference = self.references.get(role)
        if reference is None:
            return [Ranking(list(h)) for h in hits]
        relevance = reference.relevance(queries_for(self.manifest, role, queries), [[s for _, s in h] for h in hits])
        return [Ranking(list(h), r) for h, r in zip(hits, relevance)]

    def image_vector(self, image_id: int) -> np.ndarray:
        """The stored embedding of a gallery image (without a querybank offset); KeyError when absent."""
        return unfold(self.manifest, "images", self.images.reconstruct(image_id))

    def info(self) -> dict:
        return {"root": str(self.root), "generation": self.generation, **self.manifest,
                "hubness_correction": correction(self.manifest), "metadata": self.meta.counts()}


def _pairs(scores: np.ndarray, ids: np.ndarray) -> list[list[tuple[int, float]]]:
    """FAISS's result rows → ``(id, score)`` lists, without the ``-1`` padding of rows with fewer results."""
    return [[(int(i), float(s)) for s, i in zip(srow, irow) if i >= 0] for srow, irow in zip(scores, ids)]


# --- model check ----------------------------------------------------------------------------------------------

def check_model(manifest: dict, model: EmbeddingModel, root: Path | str = "") -> None:
    check_fingerprint(manifest, model.fingerprint, root)


def check_fingerprint(manifest: dict, given: str | None, root: Path | str = "") -> None:
    built = manifest["model_fingerprint"]
    if given != built:
        raise IndexMismatchError(
            f"the index {root} was built with model {built[:12]}… but the model given is "
            f"{(given or 'unknown')[:12]}…: the embeddings would not be comparable. Rebuild the index with this "
            f"model (jointspace index build) or use the model it was built with")


def _write(gen_dir: Path, manifest: dict, images: SideUpdate, captions: SideUpdate, compact: str = "auto") -> dict:
    """Writes both sides' segments and tombstones (see ``index/segments.py``) and the manifest into ``gen_dir``."""
    manifest = {**manifest, "format": FORMAT, "updated": time.time()}
    manifest.setdefault("index_id", uuid.uuid4().hex)       # an index from before segments gets one now
    number = manifest.get("next_segment", 1)
    for side in (images, captions):
        manifest[side.role], number = side.write(gen_dir, number, compact)
    manifest["next_segment"] = number
    write_json(gen_dir / "manifest.json", manifest)
    return manifest


# --- build / add / remove --------------------------------------------------------------------------------------

def build(root: str | Path, model: EmbeddingModel, image_paths: Sequence[str | Path],
          captions: Sequence[tuple[str, int | None]] = (), factory: str | None = None,
          caption_factory: str | None = None, batch_size: int = 64, workers: int | None = None, progress: bool = True,
          image_root: str | Path | None = None, max_memory: int | None = None,
          querybank: QueryBank | None = None, video_paths: Sequence[str | Path] = (),
          sampling: Sampling = DEFAULT_SAMPLING, tta: str = "none", ocr: OcrConfig | None = None) -> UpdateReport:
    """Embeds ``image_paths`` (image id = position in the list) and ``captions`` (text, position of the image
    it describes or None) and writes a new index generation at ``root`` (replacing any previous one
    atomically). ``image_root``: the folder the images were found in (folder filters are relative to it; by
    default the deepest folder holding them all). ``max_memory``: bytes the image index may take, when no
    ``factory`` is given (``index.faiss_index.factory_for_memory``). ``querybank``: normalise the scores
    against this bank of queries (QB-Norm, index/querybank.py; cosine models). ``video_paths``: videos, read as
    ``sampling`` says and stored as moments (index/video.py) after the images. ``tta``: gallery-side test-time
    augmentation (``index.embed.TTA``) of the photos, recorded in the manifest so that ``add`` and ``sync`` embed
    alike. ``ocr``: read the text in the photos (index/ocr.py), and in those that ``add`` and ``sync`` add later."""
    emb = embed_image_files(model, image_paths, batch_size=batch_size, workers=workers, progress=progress, tta=tta)
    videos = embed_videos(model, video_paths, sampling, batch_size=batch_size, workers=workers,
                          progress=progress) if video_paths else None
    return build_from_embeddings(root, model, image_paths, emb, captions, factory=factory,
                                 caption_factory=caption_factory, progress=progress,
                                 image_root=image_root, max_memory=max_memory, querybank=querybank,
                                 videos=videos, video_paths=video_paths, tta=tta, ocr=ocr)


def build_from_embeddings(root: str | Path, model: EmbeddingModel, image_paths: Sequence[str | Path], emb: FileEmbeddings,
                          captions: Sequence[tuple[str, int | None]] = (), factory: str | None = None,
                          caption_factory: str | None = None, progress: bool = True,
                          image_root: str | Path | None = None,
                          max_memory: int | None = None, querybank: QueryBank | None = None,
                          videos: VideoEmbeddings | None = None, video_paths: Sequence[str | Path] = (),
                          tta: str = "none", ocr: OcrConfig | None = None) -> UpdateReport:
    """The rest of :func:`build` once the images are embedded (``emb``: their vectors, positions in
    ``image_paths`` and photo information, from :func:`~index.embed.embed_image_files` or from the Ray engine's
    shards, index/ray_embed.py): embeds the captions and writes a new generation (:func:`build_from_vectors`)."""
    if querybank is not None and model.cfg.model.similarity != "cosine":
        raise ValueError(f"querybank normalisation applies to cosine-similarity models; this one uses "
                         f"{model.cfg.model.similarity!r}")
    if not emb.kept and not (videos is not None and videos.moments):
        raise ValueError(f"none of the {len(image_paths)} images and {len(video_paths)} videos could be read: "
                         f"nothing to index")
    texts = [t for t, _ in captions]
    cap_vectors = embed_texts(model, texts, progress=progress)
    kept = set(emb.kept)
    vectors, ids = emb.vectors, np.asarray(emb.kept, np.int64)
    rows = [(str(Path(image_paths[i]).resolve()), info) for i, info in zip(emb.kept, emb.info)]
    video_rows: list = []
    if videos is not None and videos.moments:                   # moments: image ids after the images'
        manifest: dict = {"next_video_id": 0}
        moment_vectors, moment_rows, video_rows = take_video_ids(manifest, videos, video_paths)
        vectors = np.concatenate([vectors.reshape(-1, moment_vectors.shape[1]), moment_vectors])
        ids = np.concatenate([ids, np.arange(len(image_paths), len(image_paths) + len(moment_rows))])
        rows += moment_rows
    report = build_from_vectors(
        root, model.fingerprint, model.cfg.model.similarity, vectors, ids, rows,
        cap_vectors, [(t, g if g in kept else None) for t, g in captions], next_image_id=int(len(image_paths)
                                                                                            + len(rows) - len(emb.kept)),
        factory=factory, caption_factory=caption_factory, image_root=image_root, max_memory=max_memory,
        model_name=model.cfg.name, querybank=querybank, videos=video_rows, tta=tta, ocr=ocr)
    report.skipped = emb.skipped + (videos.skipped if videos is not None else [])
    report.video_ids = [r[0] for r in video_rows]
    report.moments = len(rows) - len(emb.kept)
    return report


def build_from_vectors(root: str | Path, fingerprint: str, similarity: str, image_vectors: np.ndarray,
                       image_ids: np.ndarray, image_rows: Sequence[tuple], caption_vectors: np.ndarray,
                       caption_rows: Sequence[tuple[str, int | None]], next_image_id: int | None = None,
                       factory: str | None = None, caption_factory: str | None = None,
                       image_root: str | Path | None = None, max_memory: int | None = None,
                       model_name: str = "", querybank: QueryBank | None = None,
                       videos: Sequence[tuple] = (), tta: str = "none", ocr: OcrConfig | None = None) -> UpdateReport:
    """Writes a new index generation from embeddings: ``image_rows`` ``(path, info or None)`` per image id,
    ``caption_rows`` ``(text, image id or None)`` per caption (caption id = position). The image index type is
    ``factory``, else the one that fits ``max_memory`` bytes, else the default by size; IVF/PQ types are
    trained on a sample. ``querybank``: items stored as ``[v, −o]`` (QB-Norm, index/querybank.py). ``videos``:
    rows ``(id, path, VideoInfo, vector)`` of the videos whose moments are among the image rows. ``tta``: the
    test-time augmentation the photos' vectors were embedded with (recorded for ``add`` and ``sync``). ``ocr``: read
    the photos' text (index/ocr.py; recorded for ``add`` and ``sync`` too)."""
    root = Path(root)
    texts = read_rows(image_rows, ocr)
    image_ids = np.asarray(image_ids, dtype=np.int64)
    dim = int(image_vectors.shape[1])
    if querybank is not None:                            # [v, −o] items (index/querybank.py)
        image_vectors = querybank.fold("images", image_vectors)
        caption_vectors = querybank.fold("captions", np.asarray(caption_vectors, np.float32).reshape(-1, dim))
    cap_ids = np.arange(len(caption_rows), dtype=np.int64)
    if factory is None:
        factory = factory_for_memory(len(image_ids), dim, max_memory) if max_memory is not None else \
            default_factory(len(image_ids), dim)
    images = VectorIndex.create(image_vectors.shape[1], "images", similarity, factory,
                                train_vectors=training_sample(image_vectors, factory))
    caps = VectorIndex.create(caption_vectors.shape[1], "captions", similarity, caption_factory,
                              train_vectors=caption_vectors if len(caption_rows) else None)
    now = time.time()
    manifest = {"format": FORMAT, "model_fingerprint": fingerprint, "similarity": similarity, "dim": dim,
                "model_name": model_name, "created": now, "index_id": uuid.uuid4().hex,
                "next_image_id": int(image_ids.max()) + 1 if next_image_id is None else int(next_image_id),
                "next_caption_id": len(caption_rows),
                "next_video_id": max((int(r[0]) for r in videos), default=-1) + 1, "tta": tta}
    if image_root is not None:
        manifest["image_root"] = str(Path(image_root).resolve())
    if ocr is not None:
        manifest["ocr"] = ocr.manifest()
    with locked(root):                                   # the bank file and the generation naming it, together
        if querybank is not None:
            manifest["querybank"] = querybank.save(root)
        with new_generation(root, lock=False) as gen_dir:
            meta = Metadata(gen_dir / "metadata.sqlite")
            meta.add_images(id_rows := [(int(i), *row) for i, row in zip(image_ids, image_rows)], added=now)
            store(meta, id_rows, texts, ocr)
            meta.add_captions([(int(i), t, g) for i, (t, g) in zip(cap_ids, caption_rows)], added=now)
            meta.add_videos(videos, added=now)
            meta.close()
            number = 1
            manifest["images"], number = write_new(gen_dir, "images", images, image_vectors, image_ids, number)
            manifest["captions"], number = write_new(gen_dir, "captions", caps, caption_vectors, cap_ids, number)
            manifest["next_segment"] = number
            write_json(gen_dir / "manifest.json", {**manifest, "updated": now})
        prune_banks(root)
    return UpdateReport(image_ids=image_ids.tolist(), caption_ids=cap_ids.tolist(),
                        generation=current_generation(root))


def _load_for_update(root: Path) -> tuple[Path, dict, SideUpdate, SideUpdate]:
    """The live generation's directory and manifest, and an empty change to each side (no vector is read)."""
    gen_dir = root / current_generation(root)
    manifest = read_generation(gen_dir)
    sim = manifest["similarity"]
    return (gen_dir, manifest, SideUpdate("images", sim, manifest["images"], gen_dir),
            SideUpdate("captions", sim, manifest["captions"], gen_dir))


def add(root: str | Path, model: EmbeddingModel, image_paths: Sequence[str | Path] = (), captions: Sequence[str] = (),
        batch_size: int = 64, workers: int | None = None, progress: bool = True, video_paths: Sequence[str | Path] = (),
        sampling: Sampling = DEFAULT_SAMPLING) -> UpdateReport:
    """Adds images, videos and/or captions to an existing index (new ids after the largest ever given), no
    rebuild. The images are embedded with the index's test-time augmentation and folded with its query bank, if
    any."""
    tta = read_manifest(root).get("tta", "none") if image_paths else "none"
    emb = embed_image_files(model, image_paths, batch_size=batch_size, workers=workers,
                            progress=progress, tta=tta) if image_paths else None
    videos = embed_videos(model, video_paths, sampling, batch_size=batch_size, workers=workers,
                          progress=progress) if video_paths else None
    cap_vectors = embed_texts(model, list(captions), progress=progress) if captions else None
    report = add_vectors(root, model.fingerprint, emb.vectors if emb is not None else None,
                         [(str(Path(image_paths[p]).resolve()), info) for p, info in zip(emb.kept, emb.info)]
                         if emb is not None else [], cap_vectors, list(captions),
                         videos=(videos, video_paths) if videos is not None else None)
    report.skipped = (emb.skipped if emb is not None else []) + (videos.skipped if videos is not None else [])
    return report


def add_vectors(root: str | Path, fingerprint: str, image_vectors: np.ndarray | None = None,
                image_rows: Sequence[tuple] = (), caption_vectors: np.ndarray | None = None,
                captions: Sequence[str] = (), compact: str = "auto",
                videos: tuple[VideoEmbeddings, Sequence[str | Path]] | None = None) -> UpdateReport:
    """Adds embeddings (of the model with ``fingerprint``): images with their rows ``(path, info or None)``,
    captions with their texts. The new vectors become one new segment; no stored vector is read or written
    unless the compaction thresholds are crossed (``compact``: ``auto``, ``none`` or ``all``). ``videos``: embedded
    videos and their paths, whose moments are added after the images. Nothing to add: no new generation."""
    root = Path(root)
    ocr = OcrConfig.from_manifest(read_manifest(root).get("ocr")) if len(image_rows) else None
    texts = read_rows(image_rows, ocr)                      # before the writers' lock: Tesseract takes a while
    with _locked_for_update(root) as (gen_dir, manifest, images, caps):
        check_fingerprint(manifest, fingerprint, root)
        bank = bank_for(root, manifest)
        report = UpdateReport()
        now = time.time()
        rows_img, rows_cap, rows_vid = [], [], []
        if videos is not None and videos[0].moments:
            moment_vectors, moment_rows, rows_vid = take_video_ids(manifest, *videos)
            image_vectors = moment_vectors if image_vectors is None or not len(image_rows) else \
                np.concatenate([image_vectors, moment_vectors])
            image_rows = [*image_rows, *moment_rows]
            report.video_ids, report.moments = [r[0] for r in rows_vid], len(moment_rows)
        if image_vectors is not None and len(image_rows):
            ids = np.arange(manifest["next_image_id"], manifest["next_image_id"] + len(image_rows), dtype=np.int64)
            images.add(bank.fold("images", image_vectors) if bank else image_vectors, ids)
            manifest["next_image_id"] += len(image_rows)
            rows_img = [(int(i), *row) for i, row in zip(ids, image_rows)]
            report.image_ids = ids.tolist()
        if caption_vectors is not None and len(captions):
            ids = np.arange(manifest["next_caption_id"], manifest["next_caption_id"] + len(captions),
                            dtype=np.int64)
            caps.add(bank.fold("captions", caption_vectors) if bank else caption_vectors, ids)
            manifest["next_caption_id"] += len(captions)
            rows_cap = [(int(i), t, None) for i, t in zip(ids, captions)]
            report.caption_ids = ids.tolist()
        if not rows_img and not rows_cap and not rows_vid:          # nothing to add: no new generation
            report.generation = gen_dir.name
            return report
        with new_generation(root, lock=False) as new_dir:
            meta = Metadata(gen_dir / "metadata.sqlite", readonly=True)
            copy = meta.copy_to(new_dir / "metadata.sqlite")
            meta.close()
            copy.add_images(rows_img, added=now)
            store(copy, rows_img, texts, ocr)
            copy.add_captions(rows_cap, added=now)
            copy.add_videos(rows_vid, added=now)
            copy.close()
            _write(new_dir, manifest, images, caps, compact)
    report.generation = current_generation(root)
    return report


def compact(root: str | Path) -> dict:
    """Merges each side's segments into one and drops the deleted vectors (a full rewrite of the vectors, into
    a new generation like every change). Returns the segment and tombstone counts before and after."""
    root = Path(root)
    with _locked_for_update(root) as (gen_dir, manifest, images, caps):
        before = {role: {"segments": len(manifest[role].get("segments", [None])),
                         "deleted": manifest[role].get("deleted", 0)} for role in ("images", "captions")}
        with new_generation(root, lock=False) as new_dir:
            meta = Metadata(gen_dir / "metadata.sqlite", readonly=True)
            meta.copy_to(new_dir / "metadata.sqlite").close()
            meta.close()
            manifest = _write(new_dir, manifest, images, caps, "all")
    after = {role: {"segments": len(manifest[role]["segments"]), "deleted": manifest[role]["deleted"]}
             for role in ("images", "captions")}
    return {"before": before, "after": after, "generation": current_generation(root)}


def remove(root: str | Path, image_ids: Sequence[int] = (), caption_ids: Sequence[int] = (),
           paths: Sequence[str | Path] = ()) -> UpdateReport:
    """Removes images and/or captions by id, and files by path: a photo, a video (with its moments) or a folder
    (every photo and video indexed under it). Ids and paths not in the index are reported in ``missing`` and
    ``missing_paths``; when nothing is left to remove, no new generation is written."""
    root = Path(root)
    with _locked_for_update(root) as (gen_dir, manifest, images, caps):
        meta = Metadata(gen_dir / "metadata.sqlite", readonly=True)
        known_img, known_cap = set(meta.images(image_ids)), set(meta.captions(caption_ids))
        report = UpdateReport(missing=sorted({int(i) for i in image_ids} - known_img)
                              + sorted({int(i) for i in caption_ids} - known_cap))
        photos, videos, report.missing_paths = _indexed_at(meta, paths)
        moments = {r.id for r in meta.all_images() if r.video_id in videos} if videos else set()
        gone = known_img | photos | moments
        if not gone and not known_cap:
            meta.close()
            report.generation = gen_dir.name
            return report
        report.removed_images = images.remove(sorted(gone)) if gone else 0
        report.removed_captions = caps.remove(sorted(known_cap)) if known_cap else 0
        report.removed_videos = len(videos)
        with new_generation(root, lock=False) as new_dir:
            copy = meta.copy_to(new_dir / "metadata.sqlite")
            meta.close()
            copy.remove_images(sorted(known_img | photos))
            copy.remove_videos(sorted(videos))
            copy.remove_captions(sorted(known_cap))
            copy.close()
            _write(new_dir, manifest, images, caps)
    report.generation = current_generation(root)
    return report


def _indexed_at(meta: Metadata, paths: Sequence[str | Path]) -> tuple[set[int], set[int], list[str]]:
    """The photos (image ids) and videos (video ids) indexed at ``paths`` — each a file, or a folder and everything
    under it — and the paths under which nothing is indexed."""
    if not paths:
        return set(), set(), []
    wanted = [(str(p), Path(p).resolve()) for p in paths]
    photos: set[int] = set()
    videos: set[int] = set()
    found: set[str] = set()
    for rows, ids in (([r for r in meta.all_images() if r.video_id is None], photos), (meta.all_videos(), videos)):
        for row in rows:
            path = Path(row.path)
            for given, target in wanted:
                if path == target or target in path.parents:
                    ids.add(row.id)
                    found.add(given)
    return photos, videos, [given for given, _ in wanted if given not in found]


@contextmanager
def _locked_for_update(root: Path):
    """The live generation, read and replaced under the writers' lock (no other writer runs meanwhile)."""
    with locked(root):
        yield _load_for_update(root)


def _partition(on_disk: Iterable[Path], indexed: dict, unchanged: Callable[[Any, Path], bool]
               ) -> tuple[list[Path], list[Path], int]:
    """The files found against the rows indexed for them: the files to embed (new or no longer ``unchanged``, in
    path order), those of them that are indexed already, and how many are left as they are."""
    to_embed, differing, kept = [], [], 0
    for path in sorted(on_disk):
        row = indexed.get(path)
        if row is not None and unchanged(row, path):
            kept += 1
            continue
        to_embed.append(path)
        if row is not None:
            differing.append(path)
    return to_embed, differing, kept


def _same_stat(row, path: Path) -> bool:
    """The indexed row still describes the file by size and mtime (no read). Otherwise the content hash decides:
    the worker that would decode the file hashes its bytes first (``embed_image_files(indexed=…)``)."""
    if row.sha256 is None:                 # indexed before content hashes were kept: embed it again once
        return False
    try:
        stat = path.stat()
    except OSError:                        # vanished or unreadable since the scan: embedding it will say so
        return False
    return row.size == stat.st_size and row.mtime == stat.st_mtime


def _unchanged(row, path: Path) -> bool:
    """A video's indexed row still describes its file: same size and mtime (no read), else the same content hash
    (a video is decoded by its own loader, which does not hash: read it here)."""
    import hashlib

    if _same_stat(row, path):
        return True
    if row.sha256 is None:
        return False
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    except OSError:                        # vanished or unreadable since the scan: embedding it will say so
        return False
    return digest.hexdigest() == row.sha256


def sync(root: str | Path, model: EmbeddingModel, images: str | Path, exclude: Sequence[str] = (), default_excludes: bool = True,
         batch_size: int = 64, workers: int | None = None, progress: bool = True, videos: bool = True,
         sampling: Sampling = DEFAULT_SAMPLING) -> UpdateReport:
    """Makes the index's images (and, with ``videos``, its videos) under the folder ``images`` what is there now: files not in the index are added,
    files whose content changed (sha256; size + mtime spare reading unchanged ones) are embedded again — under a
    new id, the old one removed — and indexed files that are gone (or now excluded) are removed. Images outside
    the folder are left alone. Nothing changed: no new generation (a second run does nothing). One new generation
    otherwise, written like every update (a process killed meanwhile leaves the previous one live). Files that
    cannot be read are listed in ``skipped`` and left out of the index; symbolic links whose target leaves the
    folder are listed in ``outside`` and not followed (``index.embed.scan_images``). A changed video is read again
    whole (its moments get new ids); a gone one loses its moments."""
    from .video import is_video, scan_media

    root = Path(root)
    folder = Path(images).resolve()
    scan = scan_media(folder, exclude, default_excludes, photos=True, videos=videos)
    found = [p for p in scan.found if not is_video(p)]
    found_videos = [p for p in scan.found if is_video(p)]
    with _locked_for_update(root) as (gen_dir, manifest, vectors, caps):
        check_model(manifest, model, root)
        meta = Metadata(gen_dir / "metadata.sqlite", readonly=True)
        try:
            all_rows = meta.all_images()
            indexed = {Path(r.path): r for r in all_rows
                       if r.video_id is None and (Path(r.path) == folder or folder in Path(r.path).parents)}
            indexed_videos = {Path(r.path): r for r in meta.all_videos()
                              if Path(r.path) == folder or folder in Path(r.path).parents} if videos else {}
            video_files = {p.resolve() for p in found_videos}
            gone_videos = [r.id for p, r in indexed_videos.items() if p not in video_files]
            new_videos, differing, unchanged_videos = _partition(video_files, indexed_videos, _unchanged)
            changed_videos = [indexed_videos[p].id for p in differing]      # read again whole, under new ids
            on_disk = {p.resolve(): p for p in found}
            gone = [r.id for p, r in indexed.items() if p not in on_disk]
            new, differing, unchanged = _partition(on_disk, indexed, _same_stat)
            # a photo whose size or mtime changed is embedded unless its bytes still hash to the indexed sha256
            hashes = {str(p): sha for p in differing if (sha := indexed[p].sha256) is not None}
            emb = embed_image_files(model, new, batch_size=batch_size, workers=workers, progress=progress,
                                    indexed=hashes, tta=manifest.get("tta", "none")) if new else None
            same = {new[p] for p in emb.passed} if emb is not None else set()
            changed = [indexed[p].id for p in new if p in indexed and p not in same]
            report = UpdateReport(unchanged=unchanged + len(same) + unchanged_videos, outside=scan.outside,
                                  videos_seen=len(video_files) + len(gone_videos))
            video_emb = embed_videos(model, new_videos, sampling, batch_size=batch_size, workers=workers,
                                     progress=progress) if new_videos else None
            report.skipped = (emb.skipped if emb is not None else []) + \
                (video_emb.skipped if video_emb is not None else [])
            if not gone and not changed and (emb is None or not emb.kept) and not gone_videos \
                    and not changed_videos and (video_emb is None or not video_emb.moments):
                report.generation = gen_dir.name
                return report
            stale_videos = set(gone_videos + changed_videos)
            stale = sorted(gone + changed + [r.id for r in all_rows if r.video_id in stale_videos])
            if stale:
                vectors.remove(stale)
            report.removed_images = len(gone)
            report.removed_videos = len(gone_videos)
            rows: list = []
            image_vectors = np.zeros((0, int(manifest["dim"])), np.float32)
            if emb is not None and emb.kept:
                image_vectors = emb.vectors
                rows = [(str(new[p]), info) for p, info in zip(emb.kept, emb.info)]
            video_rows: list = []
            if video_emb is not None and video_emb.moments:
                moment_vectors, moment_rows, video_rows = take_video_ids(manifest, video_emb, new_videos)
                image_vectors = np.concatenate([image_vectors, moment_vectors])
                rows += moment_rows
                report.video_ids = [r[0] for r in video_rows]
                report.moments = len(moment_rows)
            if rows:
                ids = np.arange(manifest["next_image_id"], manifest["next_image_id"] + len(rows), dtype=np.int64)
                bank = bank_for(root, manifest)
                vectors.add(bank.fold("images", image_vectors) if bank else image_vectors, ids)
                manifest["next_image_id"] += len(rows)
                photos = len(emb.kept) if emb is not None else 0
                report.image_ids = [int(i) for i, (p, _) in zip(ids[:photos], rows) if Path(p) not in indexed]
                report.changed = [int(i) for i, (p, _) in zip(ids[:photos], rows) if Path(p) in indexed]
                rows = [(int(i), *row) for i, row in zip(ids, rows)]
            manifest.setdefault("image_root", str(folder))
            now = time.time()
            ocr = OcrConfig.from_manifest(manifest.get("ocr"))
            texts = read_rows([row[1:] for row in rows], ocr)
            with new_generation(root, lock=False) as new_dir:
                copy = meta.copy_to(new_dir / "metadata.sqlite")
                copy.remove_images(stale)
                copy.remove_videos(sorted(stale_videos))
                copy.add_images(rows, added=now)
                store(copy, rows, texts, ocr)
                copy.add_videos(video_rows, added=now)
                copy.close()
                _write(new_dir, manifest, vectors, caps)
        finally:
            meta.close()
    report.generation = current_generation(root)
    return report
