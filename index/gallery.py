"""An index directory as the service and the commands use it: :class:`Gallery` (loading a generation and
searching it) and the updates (``build``, ``add``, ``update``, ``remove``, ``compact``, ``sync``). Each update
finds what changed (files scanned and embedded, rows looked up) and says it as a ``ChangeSet``, which the one
update path, ``index/changes.py``'s ``apply``, writes as a new generation. What a generation is on disk, how one
is read, locked and replaced: ``index/generations.py``.

Loading checks the model fingerprint stored at build time against the model's and refuses a mismatch.
"""
from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

import numpy as np

from .changes import (DEFAULT_BUILD, BuildOptions, ChangeSet, ModelFacts, Target, UpdateReport, apply, live_target,
                      read_texts)
from .generations import current_generation, read_generation, read_manifest
from .metadata import ImageRow, Metadata
from .ocr import OcrConfig, start_reading
from .choices import SORT_DEPTH
from .order import by_time, check_sort
from .query import ImageFilter, PhotoTable, page
from .qbnorm import correction, plain_queries, queries_for, references_for, unfold
from .relevance import Descriptions, Ranking, Reference, both_sides, is_strong
from .segments import SegmentedIndex

if TYPE_CHECKING:
    # the updates import torch and the embedding code where they embed: loading and searching an index
    # (``jointspace index search --text``, index/cli_search.py) needs neither
    import torch

    from training.inference.embedding import FileEmbeddings, ImageDecoding
    from training.models.protocol import EmbeddingModel

    from .moments import Sampling
    from .video_embed import VideoEmbeddings


class IndexMismatchError(ValueError):
    """The index was built with a different model than the one it is used with."""


CACHED_ROWS = 65_536     # metadata rows a loaded generation keeps for its searches' hits (Gallery.image_rows)


class Gallery:
    """A loaded generation of an index directory (read it; change it with :func:`build`/:func:`add`/:func:`remove`)."""

    def __init__(self, root: Path, generation: str, manifest: dict, images: SegmentedIndex,
                 captions: SegmentedIndex, meta: Metadata, references: dict[str, Reference] | None = None):
        self.root, self.generation, self.manifest = root, generation, manifest
        self.images, self.captions, self.meta = images, captions, meta
        self.references = references or {}          # per side (images | captions): index/relevance.py
        self._floors: dict[int, np.ndarray] = {}     # b(v), n(v), best names of images met in searches (relevance.py)
        self._photos: PhotoTable | None = None
        self._counts: dict[str, int] | None = None
        self._rows: OrderedDict[int, ImageRow | None] = OrderedDict()    # image_rows' cache, least recent first

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
        images, captions = (SegmentedIndex.load(gen_dir, role, manifest, mmap=mmap, device=device,
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
        the ``k`` from ``offset`` on. Fewer than ``k`` when fewer pass. ``sort`` ``newest``/``oldest``: the
        relevant ones in capture-time order instead (index/order.py) — those scoring at least ``min_score``, or
        without ``min_score`` the strong matches (:func:`strong_only`; every result of an index without a reference
        set)."""
        if allowed is None:
            allowed = self.allowed_ids(flt)
        raw, queries = queries, queries_for(self.manifest, "images", queries)
        if check_sort(sort) != "relevance":
            hits = _pairs(*self.images.search(queries, SORT_DEPTH, ids=allowed))
            if min_score is None:
                hits = strong_only(self.ranked("images", raw, self._photo_side_strong(queries, hits)))
            return [page(by_time(page(h, SORT_DEPTH, 0, min_score), self.photos.ids, self.photos.taken, sort), k,
                         offset) for h in hits]
        hits = _pairs(*self.images.search(queries, k + offset, ids=allowed))
        return [page(h, k, offset, min_score) for h in hits]

    def _photo_side_strong(self, queries: np.ndarray, hits: list[list[tuple[int, float]]]
                           ) -> list[list[tuple[int, float]]]:
        """The hits whose photo side alone is strong (``queries`` as the index searches them): a hit's relevance is
        at most its photo side, so only these can be strong matches, and the text side is computed for them alone."""
        reference = self.references.get("images")
        if reference is None:
            return hits
        photo = reference.relevance(queries, [[s for _, s in h] for h in hits])
        return [[hit for hit, v in zip(h, r) if is_strong(v)] for h, r in zip(hits, photo)]

    def search_captions(self, queries: np.ndarray, k: int) -> list[list[tuple[int, float]]]:
        """Image embeddings → best-first ``(caption id, score)`` per query."""
        return _pairs(*self.captions.search(queries_for(self.manifest, "captions", queries), k))

    def ranked(self, role: str, queries: np.ndarray, hits: Sequence[Sequence[tuple[int, float]]]) -> list[Ranking]:
        """The hits of ``queries`` on the side ``role`` (as :meth:`search_images` / :meth:`search_captions` gave
        them, one list per query) with each hit's relevance (index/relevance.py); None without a reference set.
        An image index with reference sentences also weighs the text side: the smaller of the two directions."""
        reference = self.references.get(role)
        if reference is None:
            return [Ranking(list(h)) for h in hits]
        relevance = reference.relevance(queries_for(self.manifest, role, queries), [[s for _, s in h] for h in hits])
        if reference.descriptions is not None:
            relevance = [both_sides(r, t) for r, t in
                         zip(relevance, self._text_side(reference.descriptions, plain_queries(self.manifest, queries),
                                                        hits))]
        return [Ranking(list(h), r) for h, r in zip(hits, relevance)]

    def _text_side(self, descriptions: Descriptions, queries: np.ndarray,
                   hits: Sequence[Sequence[tuple[int, float]]]) -> list[list[float]]:
        """The text side's relevance of each hit of each raw query (index/relevance.py), all queries at once: each
        image's vector read once a call, its floors once per generation (a generation never changes)."""
        ids = [i for h in hits for i, _ in h]
        if not ids:
            return [[] for _ in hits]
        unique = list(dict.fromkeys(ids))
        stored = self.image_vectors(unique)
        new = [n for n, i in enumerate(unique) if i not in self._floors]
        if new:
            for n, row in zip(new, descriptions.floors(stored[new])):
                self._floors[unique[n]] = row
        at = {i: n for n, i in enumerate(unique)}
        rows = np.fromiter((at[i] for i in ids), dtype=np.intp, count=len(ids))
        owner = np.repeat(np.arange(len(hits)), [len(h) for h in hits])
        floors = np.stack([self._floors[i] for i in unique])[rows]
        flat = descriptions.relevance_of(queries, stored[rows], owner, floors).tolist()
        ends = np.cumsum([len(h) for h in hits]).tolist()
        return [flat[end - len(h):end] for h, end in zip(hits, ends)]

    def image_rows(self, image_ids: Sequence[int]) -> dict[int, ImageRow]:
        """The metadata rows of those of ``image_ids`` that exist (``Metadata.images``). A generation never changes,
        so the rows read are kept (the :data:`CACHED_ROWS` used last): a search's hits seen before cost no query."""
        cache = self._rows
        ids = [int(i) for i in image_ids]
        missing = [i for i in dict.fromkeys(ids) if i not in cache]
        if missing:
            read = self.meta.images(missing)
            for i in missing:
                cache[i] = read.get(i)               # None: no row (the image left in a later generation)
        out = {}
        for i in ids:
            cache.move_to_end(i)
            row = cache[i]
            if row is not None:
                out[i] = row
        while len(cache) > CACHED_ROWS:
            cache.popitem(last=False)
        return out

    def image_vector(self, image_id: int) -> np.ndarray:
        """The stored embedding of a gallery image (without a querybank offset); KeyError when absent."""
        return unfold(self.manifest, "images", self.images.reconstruct(image_id))

    def image_vectors(self, image_ids: Sequence[int]) -> np.ndarray:
        """:meth:`image_vector` of each of ``image_ids``, ``(n, dim)`` float32, read in one call; KeyError when one
        is absent."""
        return np.ascontiguousarray(unfold(self.manifest, "images", self.images.reconstruct_many(image_ids)),
                                    dtype=np.float32)

    def info(self) -> dict:
        return {"root": str(self.root), "generation": self.generation, **self.manifest,
                "hubness_correction": correction(self.manifest), "metadata": self.meta.counts()}


def strong_only(rankings: Sequence[Ranking]) -> list[list[tuple[int, float]]]:
    """The relevance cut of a search sorted by time without ``min_score``: per query, its hits that are strong
    matches (index/relevance.py ``is_strong``, of the same relevance a result shows: both directions where the index
    has reference sentences), so "newest first" lists the photos the query describes, newest first, not every photo
    of the gallery by date. All of them where the index has no reference set (no relevance to cut by)."""
    return [list(r.hits) if r.relevance is None else [hit for hit, v in zip(r.hits, r.relevance) if is_strong(v)]
            for r in rankings]


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


# --- build / add / update / remove / compact / sync: each a ChangeSet, applied by index/changes.py ------------------

@dataclass(frozen=True)
class EmbedOptions:
    """How an update reads and embeds files (``index build/add/sync``'s ``--batch-size``, ``--workers``, ``--quiet``
    and video options, ``--decode``): ``batch_size`` rows a forward pass, ``workers`` decoding processes (None: by
    core count), progress bars, how videos are sampled and cut into moments (``sampling``, index/moments.py), and
    where photos are decoded (``decode``: ``embed.PhotoDecoding``; None: ``$JOINTSPACE_DECODE``, else by device)."""
    batch_size: int = 64
    workers: int | None = None
    progress: bool = True
    sampling: Sampling | None = None            # None: index.moments.DEFAULT_SAMPLING
    decode: str | None = None


DEFAULT_EMBEDDING = EmbedOptions()


def _embed_photos(model: EmbeddingModel, paths: Sequence[str | Path], embedding: EmbedOptions, tta: str,
                  ocr: OcrConfig | None, indexed: dict[str, str] | None = None,
                  decoding: ImageDecoding | None = None) -> FileEmbeddings:
    """The photos' embeddings, each photo's :class:`~index.embed.PhotoInfo` with what OCR read in it (``ocr``: the
    index's reading, None for an index that does not read its photos), read while the embedding goes on
    (index/ocr.py ``TextReading``)."""
    from training.inference.embedding import device_of
    from training.inference.embedding import embed_image_files as files_to_embeddings

    from .embed import PhotoDecoding, decode_photos

    if decoding is None:
        decoding = decode_photos(model.preprocess, paths, embedding.batch_size, embedding.workers, device_of(model),
                                 indexed, tta, how=PhotoDecoding(decode=embedding.decode))
    reading = start_reading(ocr)
    if reading is None:
        return files_to_embeddings(model, paths, progress=embedding.progress, decoding=decoding)

    def read(positions: list[int], infos: list) -> None:
        for i, info in zip(positions, infos):
            reading.add(paths[i], info.text_likelihood)
    try:
        emb = files_to_embeddings(model, paths, progress=embedding.progress, decoding=decoding, on_batch=read)
    except BaseException:
        reading.close()
        raise
    texts = reading.texts()
    emb.info = [replace(info, text=texts.get(str(paths[i]))) for i, info in zip(emb.kept, emb.info)]
    return emb


def _embed_videos(model: EmbeddingModel, paths: Sequence[str | Path], embedding: EmbedOptions
                  ) -> VideoEmbeddings | None:
    from .moments import DEFAULT_SAMPLING
    from .video_embed import embed_videos

    return embed_videos(model, paths, embedding.sampling or DEFAULT_SAMPLING, batch_size=embedding.batch_size, workers=embedding.workers,
                        progress=embedding.progress) if paths else None


def _photo_rows(paths: Sequence[str | Path], emb: FileEmbeddings) -> list[tuple]:
    """The metadata rows ``(absolute path, PhotoInfo)`` of the photos ``emb`` kept (positions in ``paths``)."""
    return [(str(Path(paths[i]).resolve()), info) for i, info in zip(emb.kept, emb.info)]


def build(root: str | Path, model: EmbeddingModel, image_paths: Sequence[str | Path],
          captions: Sequence[tuple[str, int | None]] = (), video_paths: Sequence[str | Path] = (),
          options: BuildOptions = DEFAULT_BUILD, embedding: EmbedOptions = DEFAULT_EMBEDDING,
          decoding: ImageDecoding | None = None) -> UpdateReport:
    """Embeds ``image_paths`` (image id = position in the list) and ``captions`` (text, position of the image
    it describes or None) and writes a new index generation at ``root`` (replacing any previous one
    atomically), as ``options`` say (:class:`~index.changes.BuildOptions`: index type, image root, query bank,
    test-time augmentation and text reading of the photos). ``video_paths``: videos, read as ``embedding.sampling``
    says and stored as moments (index/moments.py) after the images. ``decoding``: the photos' decoding, started
    before the model was loaded (``embed.decode_photos`` with ``embedding``'s batch size and workers and
    ``options.tta``)."""
    emb = _embed_photos(model, image_paths, embedding, options.tta, options.ocr, decoding=decoding)
    videos = _embed_videos(model, video_paths, embedding)
    report = build_from_embeddings(root, model, image_paths, emb, captions, options, videos, embedding.progress)
    report.timeline = emb.timeline
    return report


def build_from_embeddings(root: str | Path, model: EmbeddingModel, image_paths: Sequence[str | Path],
                          emb: FileEmbeddings, captions: Sequence[tuple[str, int | None]] = (),
                          options: BuildOptions = DEFAULT_BUILD, videos: VideoEmbeddings | None = None,
                          progress: bool = True) -> UpdateReport:
    """The rest of :func:`build` once the images are embedded (``emb``: their vectors, positions in
    ``image_paths`` and photo information, from :func:`~index.embed.embed_photos` or from the Ray engine's
    shards, index/ray_embed.py): embeds the captions and writes a new generation (:func:`build_from_vectors`)."""
    if options.querybank is not None and model.cfg.model.similarity != "cosine":
        raise ValueError(f"querybank normalisation applies to cosine-similarity models; this one uses "
                         f"{model.cfg.model.similarity!r}")
    from .embed import embed_sentences

    if not emb.kept and not (videos is not None and videos.moments):
        raise ValueError(f"none of the {len(image_paths)} images and {len(videos.paths) if videos else 0} videos "
                         f"could be read: nothing to index")
    kept = set(emb.kept)
    changes = ChangeSet(image_vectors=emb.vectors, image_unfamiliarity=emb.unfamiliarity,
                        image_rows=_photo_rows(image_paths, emb), image_ids=emb.kept,
                        next_image_id=len(image_paths), videos=videos,
                        caption_vectors=embed_sentences(model, [t for t, _ in captions], progress=progress),
                        captions=[(t, g if g in kept else None) for t, g in captions])
    report = build_from_vectors(root, ModelFacts.of(model), changes, options)
    report.skipped = emb.skipped + (videos.skipped if videos is not None else [])
    return report


def build_from_vectors(root: str | Path, model: ModelFacts, changes: ChangeSet,
                       options: BuildOptions = DEFAULT_BUILD) -> UpdateReport:
    """Writes a new index generation at ``root`` (replacing any previous one atomically) from the embeddings in
    ``changes`` (of the model ``model`` describes): photos with their ids and rows, videos, captions. The index
    is what ``options`` say (:class:`~index.changes.BuildOptions`)."""
    dim = changes.dim
    return apply(Target.new(root, model, dim, len(changes.image_rows) + changes.moments, options), changes)


def add(root: str | Path, model: EmbeddingModel, image_paths: Sequence[str | Path] = (), captions: Sequence[str] = (),
        video_paths: Sequence[str | Path] = (), embedding: EmbedOptions = DEFAULT_EMBEDDING) -> UpdateReport:
    """Adds images, videos and/or captions to an existing index (new ids after the largest ever given), no
    rebuild. The images are embedded with the index's test-time augmentation and folded with its query bank, if
    any. A file is known by its resolved path (``photos/a.jpg``, ``./photos/a.jpg``, ``/abs/photos/a.jpg`` and a
    symbolic link to it are one file), and never indexed twice: a file the index holds as it is (the same size and
    mtime, else the same content hash) is not added again but listed in ``already``; one whose content changed
    is embedded again under a new id, its old entry removed (as ``sync`` does)."""
    from .embed import embed_sentences

    root = Path(root)
    photos, videos_held = _held(root) if image_paths or video_paths else ({}, {})
    image_paths, photo_hashes, photo_already = _new_files(image_paths, photos, _same_stat)
    video_paths, _, video_already = _new_files(video_paths, videos_held, _unchanged)
    manifest = read_manifest(root) if image_paths else {}
    emb = (_embed_photos(model, image_paths, embedding, manifest.get("tta", "none"),
                         OcrConfig.from_manifest(manifest.get("ocr")), photo_hashes) if image_paths else None)
    same = {image_paths[i] for i in emb.passed} if emb is not None else set()
    videos = _embed_videos(model, video_paths, embedding)
    cap_vectors = embed_sentences(model, list(captions), progress=embedding.progress) if captions else None
    stale_photos = {photos[Path(image_paths[i])].id for i in (emb.kept if emb is not None else [])
                    if Path(image_paths[i]) in photos}
    read_videos = [Path(videos.paths[i]) for i in videos.kept] if videos is not None else []
    stale_videos = {videos_held[p].id for p in read_videos if p in videos_held}
    report = update(root, model.fingerprint, ChangeSet(
        image_vectors=emb.vectors if emb is not None else None,
        image_unfamiliarity=emb.unfamiliarity if emb is not None else None,
        image_rows=_photo_rows(image_paths, emb) if emb is not None else [], videos=videos,
        caption_vectors=cap_vectors, captions=[(t, None) for t in captions],
        removed_images=stale_photos | _moments_of(root, stale_videos), removed_videos=stale_videos))
    report.skipped = (emb.skipped if emb is not None else []) + (videos.skipped if videos is not None else [])
    report.already = photo_already + video_already + [str(p) for p in same]
    report.removed_images, report.removed_videos = len(stale_photos), len(stale_videos)
    return report


def _held(root: Path) -> tuple[dict[Path, Any], dict[Path, Any]]:
    """The live generation's photo and video rows by (resolved) path."""
    gen_dir = root / current_generation(root)
    meta = Metadata(gen_dir / "metadata.sqlite", readonly=True)
    try:
        return ({Path(r.path): r for r in meta.all_images() if r.video_id is None},
                {Path(r.path): r for r in meta.all_videos()})
    finally:
        meta.close()


def _new_files(given: Sequence[str | Path], held: dict[Path, Any], unchanged: Callable[[Any, Path], bool]
               ) -> tuple[list[Path], dict[str, str], list[str]]:
    """The files of ``given`` to embed (resolved, each once, in order), the content hashes the index holds for
    those of them it holds already (a file whose bytes still hash to it is not embedded again), and the files
    given that the index holds as they are (``unchanged``: by size and mtime)."""
    wanted: dict[Path, str] = {}
    for path in given:
        wanted.setdefault(Path(path).resolve(), str(path))
    embed, already = [], []
    for real, spelled in wanted.items():
        row = held.get(real)
        if row is not None and unchanged(row, real):
            already.append(spelled)
        else:
            embed.append(real)
    hashes = {str(p): held[p].sha256 for p in embed if p in held and held[p].sha256 is not None}
    return embed, hashes, already


def _moments_of(root: Path, video_ids: set[int]) -> set[int]:
    """The image ids of the moments of ``video_ids`` in the live generation."""
    if not video_ids:
        return set()
    meta = Metadata(root / current_generation(root) / "metadata.sqlite", readonly=True)
    try:
        return {r.id for r in meta.all_images() if r.video_id in video_ids}
    finally:
        meta.close()


def update(root: str | Path, fingerprint: str, changes: ChangeSet) -> UpdateReport:
    """Applies ``changes`` (embeddings of the model with ``fingerprint``: refused when the index holds another
    model's) to the live generation of the index at ``root``. The vectors added become one new segment; no
    stored vector is read or written unless the compaction thresholds are crossed (``changes.compact``). Nothing
    to add or remove: no new generation."""
    root = Path(root)
    if changes.texts is None and len(changes.image_rows):
        changes = read_texts(changes, read_manifest(root))      # before the writers' lock: Tesseract takes a while
    with live_target(root) as target:
        check_fingerprint(target.manifest, fingerprint, root)
        return apply(target, _against_live(target, changes))


def _against_live(target: Target, changes: ChangeSet) -> ChangeSet:
    """``changes`` as the live generation stands now, under the writers' lock: ``add`` and ``sync`` read the index
    before embedding, unlocked, and another writer may have changed it since. A file added replaces what the
    live generation holds at its path (a photo, a video with its moments) — one entry per file, whichever writer
    came first — and only ids the generation still holds are removed."""
    meta = target.meta
    videos = changes.videos
    photo_paths = {str(row[0]) for row in changes.image_rows}
    video_paths = {str(Path(videos.paths[i]).resolve()) for i in videos.kept} if videos is not None else set()
    if meta is None or not (photo_paths or video_paths or changes.removed_images or changes.removed_videos):
        return changes
    images, held_videos = meta.all_images(), meta.all_videos()
    replaced_videos = {r.id for r in held_videos if r.path in video_paths}
    removed_videos = (set(changes.removed_videos) & {r.id for r in held_videos}) | replaced_videos
    removed_images = ((set(changes.removed_images) & {r.id for r in images})
                      | {r.id for r in images if (r.video_id is None and r.path in photo_paths)
                         or r.video_id in replaced_videos})
    return replace(changes, removed_images=removed_images, removed_videos=removed_videos)


def compact(root: str | Path) -> dict:
    """Merges each side's segments into one and drops the deleted vectors (a full rewrite of the vectors, into
    a new generation like every change). Returns the segment and tombstone counts before and after."""
    root = Path(root)
    with live_target(root) as target:
        before = {role: {"segments": len(target.manifest[role].get("segments", [None])),
                         "deleted": target.manifest[role].get("deleted", 0)} for role in ("images", "captions")}
        report = apply(target, ChangeSet(compact="all"))
        after = {role: {"segments": len(target.manifest[role]["segments"]), "deleted": target.manifest[role]["deleted"]}
                 for role in ("images", "captions")}
    return {"before": before, "after": after, "generation": report.generation}


def remove(root: str | Path, image_ids: Sequence[int] = (), caption_ids: Sequence[int] = (),
           paths: Sequence[str | Path] = ()) -> UpdateReport:
    """Removes images and/or captions by id, and files by path: a photo, a video (with its moments) or a folder
    (every photo and video indexed under it). Ids and paths not in the index are reported in ``missing`` and
    ``missing_paths``; when nothing is left to remove, no new generation is written."""
    root = Path(root)
    with live_target(root) as target:
        meta = target.meta
        assert meta is not None
        known_img, known_cap = set(meta.images(image_ids)), set(meta.captions(caption_ids))
        photos, videos, missing_paths = _indexed_at(meta, paths)
        moments = {r.id for r in meta.all_images() if r.video_id in videos} if videos else set()
        gone = known_img | photos | moments
        report = apply(target, ChangeSet(removed_images=gone, removed_videos=videos, removed_captions=known_cap))
    report.missing = sorted({int(i) for i in image_ids} - known_img) + sorted({int(i) for i in caption_ids} - known_cap)
    report.missing_paths = missing_paths
    report.removed_images, report.removed_captions, report.removed_videos = len(gone), len(known_cap), len(videos)
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
    the worker that would decode the file hashes its bytes first (``index.embed.embed_photos(indexed=…)``)."""
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



def _one_each(rows: Iterable[Any]) -> tuple[dict[Path, Any], list[int]]:
    """Rows (in id order) by their file's path, the first of each file; and the ids of the others."""
    first: dict[Path, Any] = {}
    others: list[int] = []
    for row in sorted(rows, key=lambda r: r.id):
        if first.setdefault(Path(os.path.normpath(row.path)), row) is not row:
            others.append(row.id)
    return first, others


def sync(root: str | Path, model: EmbeddingModel, images: str | Path, exclude: Sequence[str] = (),
         default_excludes: bool = True, videos: bool = True,
         embedding: EmbedOptions = DEFAULT_EMBEDDING) -> UpdateReport:
    """Makes the index's images (and, with ``videos``, its videos) under the folder ``images`` what is there now:
    files not in the index are added, files whose content changed (sha256; size + mtime spare reading unchanged
    ones) are embedded again — under a new id, the old one removed — and indexed files that are gone (or now
    excluded) are removed. Images outside the folder are left alone. Nothing changed: no new generation (a second
    run does nothing). One new generation otherwise, written like every update (a process killed meanwhile leaves
    the previous one live). Files that cannot be read are listed in ``skipped`` and left out of the index; symbolic
    links whose target leaves the folder are listed in ``outside`` and not followed (``index.scan.scan_images``).
    A changed video is read again whole (its moments get new ids); a gone one loses its moments."""
    from .scan import scan_media

    root = Path(root)
    folder = Path(images).resolve()
    scan = scan_media(folder, exclude, default_excludes, photos=True, videos=videos)
    found, found_videos = scan.by_kind()
    with live_target(root) as target:
        manifest, meta = target.manifest, target.meta
        assert meta is not None
        check_model(manifest, model, root)
        all_rows = meta.all_images()
        # one entry a file: an index written before `add` knew files by their resolved path may hold a file twice;
        # the first entry is kept, the others removed (``doubles``)
        indexed, doubles = _one_each(r for r in all_rows
                                     if r.video_id is None and (Path(r.path) == folder or folder in Path(r.path).parents))
        indexed_videos, double_videos = _one_each(r for r in meta.all_videos()
                                                  if Path(r.path) == folder or folder in Path(r.path).parents) \
            if videos else ({}, [])
        video_files = {p.resolve() for p in found_videos}
        gone_videos = [r.id for p, r in indexed_videos.items() if p not in video_files]
        new_videos, differing, unchanged_videos = _partition(video_files, indexed_videos, _unchanged)
        changed_videos = [indexed_videos[p].id for p in differing]      # read again whole, under new ids
        on_disk = {p.resolve(): p for p in found}
        gone = [r.id for p, r in indexed.items() if p not in on_disk]
        new, differing, unchanged = _partition(on_disk, indexed, _same_stat)
        # a photo whose size or mtime changed is embedded unless its bytes still hash to the indexed sha256
        hashes = {str(p): sha for p in differing if (sha := indexed[p].sha256) is not None}
        emb = (_embed_photos(model, new, embedding, manifest.get("tta", "none"),
                             OcrConfig.from_manifest(manifest.get("ocr")), hashes) if new else None)
        same = {new[p] for p in emb.passed} if emb is not None else set()
        changed = [indexed[p].id for p in new if p in indexed and p not in same]
        video_emb = _embed_videos(model, new_videos, embedding)
        stale_videos = set(gone_videos + changed_videos + double_videos)
        stale = sorted(gone + changed + doubles + [r.id for r in all_rows if r.video_id in stale_videos])
        rows = _photo_rows(new, emb) if emb is not None else []
        manifest.setdefault("image_root", str(folder))
        report = apply(target, ChangeSet(image_vectors=emb.vectors if emb is not None else None,
                                         image_unfamiliarity=emb.unfamiliarity if emb is not None else None,
                                         image_rows=rows, videos=video_emb, removed_images=stale, removed_videos=sorted(stale_videos)))
    photo_ids = report.image_ids[:len(rows)]
    report.image_ids = [i for i, (p, _) in zip(photo_ids, rows) if Path(p) not in indexed]
    report.changed = [i for i, (p, _) in zip(photo_ids, rows) if Path(p) in indexed]
    report.removed_images, report.removed_videos = len(gone), len(gone_videos)
    report.doubles = len(doubles) + len(double_videos)
    report.unchanged, report.outside = unchanged + len(same) + unchanged_videos, scan.outside
    report.videos_seen = len(video_files) + len(gone_videos)
    report.skipped = (emb.skipped if emb is not None else []) + (video_emb.skipped if video_emb is not None else [])
    return report
