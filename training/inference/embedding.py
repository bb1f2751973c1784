"""Encode with a model: the one inference path from pixels, image files, texts and data splits to embeddings.

``evaluate``, ``compose``, ``index`` and the service all embed through these:

* :func:`embed_pixels` — uint8 pixels (``model.preprocess.pixels``) → image embeddings;
* :func:`embed_image_files` — image files, decoded by DataLoader workers, → image embeddings (an unreadable file
  is skipped and reported; a large JPEG is decoded at the smallest DCT scale the preprocessing allows,
  ``preprocess.decode_image``; workers, prefetch and pinned memory by core count and device,
  ``features.loader_options``; on a CUDA device plain JPEGs are decoded and cut into views there instead,
  ``tensor_views.py``);
* :func:`embed_texts` — sentences, each optionally minus the meaning of some words (W2VV §IV-C) → text
  embeddings;
* :func:`embed_image_source`, :func:`embed_split` — the images of a data split (an ``ImageSource``,
  training/data/sources.py: cached backbone features, pixels or files) and its captions → embeddings;
  :func:`fine_embed_split` their regions and words (region attention).

The backbone features of :func:`embed_pixels` and :func:`pixel_features` (and so of every image the index, the
service, query by example and video frames embed) come from the image tower's inference backend
(:func:`backend.tower_features`: OpenVINO or ONNX Runtime on a CPU once ``backend.use_backend`` attached one, else
the model's own forward pass); the rest of the model runs in PyTorch over exactly those features.

Autocast policy for inference (:func:`inference_autocast`): on CUDA, bf16 autocast unless the model's config
says ``train.amp: off`` (a model trained in float32 is run in float32; an ensemble runs in bf16 only when every
member allows it); on CPU, float32. The projection's BatchNorm normalises in float32 either way
(``projection.Float32BatchNorm1d``). Embeddings come back as float32.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence, cast

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from training.data.features import Compute, ImageFiles, loader_options, usable_cores
from training.data.preprocess import (ZOOM, ImagePreprocess, MirroredViews, Preprocess, StackedPreprocess,
                                      decode_image, embed_side, open_image)
from training.data.sources import ImageSource, image_source
from training.data.vocab import pad_batch
from training.models.attention import embed_words
from training.models.config_schema import RunConfig
from training.models.ensemble import EnsembleEmbedding
from training.models.model import JointEmbedding
from training.models.protocol import EmbeddingModel
from .backend import tower_features
from .names import TTA
from .overlap import PHASES, Overlap, Timeline
from .shapes import Shapes, plan
from .tensor_views import EncodedJPEG, decode_choice, encoded_jpeg, encoded_pixels

PAD_TEXT = "a"                      # what fills a padded text batch: a sentence of one word (its rows are dropped)


def autocast(device: torch.device, amp: bool):
    """bf16 autocast on CUDA when ``amp``, else none: what training's ``train.amp`` and :func:`inference_autocast`
    switch."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp and device.type == "cuda")


def model_allows_amp(model: EmbeddingModel) -> bool:
    """Whether the model may run under bf16 autocast: its config's ``train.amp`` is not ``off`` (for an ensemble:
    no member's is)."""
    cfg = model.cfg
    if isinstance(cfg, RunConfig):
        return cfg.train.amp != "off"
    members = model.models if isinstance(model, EnsembleEmbedding) else ()
    return all(m.cfg.train.amp != "off" for m in members)


def device_of(model: EmbeddingModel) -> torch.device:
    return next(model.parameters()).device


def fixed_batches(batch_size: int, device: torch.device, pad: bool | None = None) -> Shapes | None:
    """Bulk embedding's one shape: every batch padded to ``batch_size`` — on CUDA by default (``pad`` None), where
    a short batch (the last one, or one that a skipped file shortened) would cost a new shape's first-call set-up
    (shapes.py); None (batches as they come) elsewhere, where padding only adds work."""
    if pad is None:
        pad = torch.device(device).type == "cuda"
    return Shapes((batch_size,), images="pad", texts="pad") if pad else None


CPU_VIEWS_PER_CORE = 8     # views a bulk forward pass takes per usable core on a CPU (default_batch_size)


def default_batch_size(device: torch.device | str) -> int:
    """Views per forward pass of bulk embedding (``index build/add/sync --batch-size`` unset): 64 on CUDA; on a
    CPU :data:`CPU_VIEWS_PER_CORE` per usable core, at most 64 — 16 on 2 cores, 4 photos under ``--tta
    flip-crop``. A CPU backend embeds a view about as fast in a batch of 4 as in one of 64, and a smaller batch
    starts the first forward pass sooner and leaves less work after the decoding workers have finished."""
    if torch.device(device).type == "cuda":
        return 64
    return max(1, min(64, CPU_VIEWS_PER_CORE * usable_cores()))


def inference_autocast(model: EmbeddingModel, device: torch.device | None = None):
    """The autocast context of every inference forward pass (module docstring: bf16 on CUDA when the model
    allows it, else none)."""
    device = device_of(model) if device is None else torch.device(device)
    return autocast(device, model_allows_amp(model))


def _bucketed(fn: Callable[[torch.Tensor], torch.Tensor], pixels: torch.Tensor, shapes: Shapes | None,
              ) -> torch.Tensor:
    """``fn`` over uint8 ``pixels`` ``(B, ...)`` at the bucket sizes of ``shapes`` (shapes.py): zero
    images pad a chunk to its size and their rows are dropped, so every call sees a bucket's shape."""
    if shapes is None or not len(pixels):
        return fn(pixels)
    out = []
    for chunk in plan(len(pixels), shapes.sizes, shapes.images):
        part = pixels[chunk.start:chunk.start + chunk.count]
        if chunk.size > chunk.count:
            part = torch.cat([part, part.new_zeros((chunk.size - chunk.count, *part.shape[1:]))])
        out.append(fn(part)[:chunk.count])
    return torch.cat(out)


def person_discount(model: EmbeddingModel) -> float:
    """λ of the model's person discount (its concept head's ``person_discount``, training/models/concepts.py; an
    ensemble's: its members' combined); 0 for a model without one."""
    return float(model.person_discount())


def view_preprocess(model: EmbeddingModel | ImagePreprocess, tta: str = "none"):
    """The preprocessing of gallery images under test-time augmentation ``tta`` (:data:`TTA`) for a model (or its
    ``preprocess``): ``none`` the model's own, ``flip`` each view and its mirror image, ``flip-crop`` also the
    image enlarged 8/7 and cut to the centre, and its mirror image; features averaged (``MirroredViews``)."""
    if tta not in TTA:
        raise ValueError(f"unknown test-time augmentation {tta!r} (known: {', '.join(TTA)})")
    base = model if isinstance(model, (Preprocess, StackedPreprocess)) else model.preprocess
    if tta == "none":
        return base
    return MirroredViews(base, zoom=ZOOM if tta == "flip-crop" else None)


@torch.no_grad()
def embed_pixels(model: EmbeddingModel, pixels: torch.Tensor, shapes: Shapes | None = None,
                 unfamiliarity: bool = False) -> torch.Tensor:
    """uint8 pixels ``(B, crops, 3, S, S)`` (``model.preprocess.pixels``, stacked) → image embeddings ``(B, E)``,
    float32 on the model's device, every forward pass at a bucket size of ``shapes`` when given: the backbone
    features from the model's inference backend (:func:`backend.tower_features`), the rest in PyTorch. With
    ``unfamiliarity`` (a model with a person discount, :func:`person_discount`): ``(B, E + 1)``, each photo's a(x)
    (concepts.py ``unfamiliarity``) after its embedding. The caller puts the model in eval mode."""
    device = device_of(model)
    if unfamiliarity and not person_discount(model):
        raise ValueError("this model has no person discount (concepts.person_discount): no unfamiliarity to give")

    def run(batch: torch.Tensor) -> torch.Tensor:
        with inference_autocast(model, device):
            features = tower_features(model, batch, device)
            vectors = model.embed_features(features).float()
            if unfamiliarity:
                vectors = torch.cat([vectors, model.unfamiliarity(features).float()[:, None]], dim=1)
            return vectors
    return _bucketed(run, pixels, shapes)


def _project_texts(model: EmbeddingModel,
                   texts: list[str], device: torch.device, shapes: Shapes | None) -> torch.Tensor:
    """Sentences → projected (not yet normalised) text vectors, one forward pass per bucket chunk."""
    chunks = plan(len(texts), shapes.sizes, shapes.texts) if shapes is not None and texts else []
    if not chunks:
        ids, lengths = pad_batch(model.encode_text_ids(texts))
        return model.project_texts(ids.to(device), lengths.to(device))
    out = []
    for chunk in chunks:
        part = texts[chunk.start:chunk.start + chunk.count] + [PAD_TEXT] * (chunk.size - chunk.count)
        ids, lengths = pad_batch(model.encode_text_ids(part))
        out.append(model.project_texts(ids.to(device), lengths.to(device))[:chunk.count])
    return torch.cat(out)


@torch.no_grad()
def embed_texts(model: EmbeddingModel,
                texts: Sequence[str], subtract: Sequence[Sequence[str]] = (), batch_size: int = 256,
                progress: bool = False, shapes: Shapes | None = None) -> torch.Tensor:
    """Sentences → text embeddings ``(n, E)``, float32 on the model's device, ``batch_size`` sentences a forward
    pass (with ``shapes``: each at a bucket size, padded with :data:`PAD_TEXT`). With ``subtract`` (one list of
    words or phrases per sentence): ``normalise(r(text) − Σ r(w))`` in the common space, as query composition
    does for an image (W2VV §IV-C); a sentence without words to subtract gets exactly its sentence embedding.
    The caller puts the model in eval mode."""
    device = device_of(model)
    words = [list(w) for w in subtract] if subtract else [[] for _ in texts]
    if len(words) != len(texts):
        raise ValueError(f"{len(texts)} texts but {len(words)} lists of words to subtract")
    out = []
    for start in tqdm(range(0, len(texts), batch_size), desc="embedding texts", unit="batch",
                      disable=not progress or len(texts) <= batch_size):
        batch, minus = list(texts[start:start + batch_size]), words[start:start + batch_size]
        flat = batch + [w for ws in minus for w in ws]
        with inference_autocast(model, device):
            projected = _project_texts(model, flat, device, shapes)
            queries, at = projected[:len(batch)], len(batch)
            if at < len(flat):
                rows = []
                for row, ws in enumerate(minus):
                    rows.append(queries[row] - projected[at:at + len(ws)].sum(0) if ws else queries[row])
                    at += len(ws)
                queries = torch.stack(rows)
            out.append(model.similarity.normalize(queries).float())
    return torch.cat(out) if out else torch.zeros(0, model.cfg.model.embed_dim, device=device)


def read_image(path: str | Path, min_side: int | None = None) -> tuple[Image.Image, None]:
    """The default reader of :func:`embed_image_files`: the upright RGB image (shrunk while decoding down to a
    shorter side of ``min_side``, ``preprocess.decode_image``), nothing else."""
    return open_image(path, min_side), None


def read_encoded(path: str | Path, min_side: int | None = None) -> tuple[Image.Image | EncodedJPEG, None]:
    """The reader of :func:`embed_image_files` under ``decode`` torch: a plain JPEG's bytes, its header checked, for
    the device to decode (``tensor_views.encoded_jpeg``), any other file decoded as :func:`read_image` does."""
    data = Path(path).read_bytes()
    encoded = encoded_jpeg(data, min_side)
    if encoded is not None:
        return encoded, None
    return decode_image(data, Path(path).suffix, min_side).image, None


# (path, min_side) → (image, or a JPEG left for the device to decode; what else to keep)
Reader = Callable[[str, int | None], tuple[Any, Any]]


@dataclass
class FileEmbeddings:
    """What :func:`embed_image_files` made of a list of image files (and what the index builds from)."""
    vectors: np.ndarray                    # (m, E) float32, one row per readable image
    kept: list[int]                        # positions (in the input list) of those m images
    skipped: list[tuple[str, str]] = field(default_factory=list)   # (path, reason) of unreadable files
    # one per kept image: what ``read`` returned besides the image (the index's reader: a photo's PhotoInfo)
    info: list[Any] = field(default_factory=list)
    # positions ``read`` found nothing to embed in (the index's reader: files whose bytes are the indexed ones)
    passed: list[int] = field(default_factory=list)
    timeline: Timeline = field(default_factory=Timeline)    # when each batch's vectors were in hand (overlap.py)
    # (m,) float32: each image's a(x) for the person discount (concepts.py); None: the model has no person discount
    unfamiliarity: np.ndarray | None = None


class _Decoded(Dataset):
    def __init__(self, paths: Sequence[str | Path], preprocess, read: Reader):
        self.paths, self.preprocess, self.read = [str(p) for p in paths], preprocess, read

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        try:
            image, extra = self.read(self.paths[i], embed_side(self.preprocess))
            if image is None:               # the reader found nothing to embed (e.g. content already indexed)
                return i, None, None
            if isinstance(image, EncodedJPEG):      # decoded on the model's device (tensor_views.py)
                return i, (image, extra), None
            return i, (self.preprocess.pixels(image), extra), None
        except Exception as err:  # noqa: BLE001 - any decoding failure means "skip this file"
            return i, None, f"{type(err).__name__}: {err}"


def _collate(items):
    ok = [(i, px) for i, px, _ in items if px is not None]
    bad = [(i, reason) for i, px, reason in items if reason is not None]
    passed = [i for i, px, reason in items if px is None and reason is None]
    rows = [px for _, (px, _) in ok]
    pixels: torch.Tensor | list | None = None
    if rows:
        pixels = rows if any(isinstance(r, EncodedJPEG) for r in rows) else torch.stack(rows)
    return [i for i, _ in ok], pixels, bad, [extra for _, (_, extra) in ok], passed


AHEAD_BYTES = 128 * 2**20   # pixels an early-started decoding (ImageDecoding(ahead=True)) may hold ready, at most


class ImageDecoding:
    """Image files being decoded and preprocessed by DataLoader workers (``workers`` None: by core count,
    ``features.loader_options``), ``batch_size`` images a batch, each read by ``read`` (see
    :class:`FileReading`); under ``decode`` torch (``tensor_views.decode_choice``: by default on a CUDA
    ``device``) the workers leave plain JPEGs encoded and :meth:`pixels` decodes them on the model's device
    (``read_image`` is then :func:`read_encoded`; another reader returns an ``EncodedJPEG`` itself). The workers
    start here, so decoding can begin before the model is loaded (the indexer starts it, then loads the model: the
    decoding uses the cores the loading leaves idle); ``ahead``: up
    to :data:`AHEAD_BYTES` of pixels are decoded ahead of the model instead of the loader's usual few batches.
    An iterator of its batches, consumed by :func:`embed_image_files`; :meth:`close` stops the workers of one that
    is not."""

    def __init__(self, paths: Sequence[str | Path], preprocess, read: Reader = read_image, batch_size: int = 64,
                 workers: int | None = 2, device: str | torch.device = "cpu", ahead: bool = False,
                 decode: str | None = None):
        self.paths, self.preprocess, self.batch_size = [str(p) for p in paths], preprocess, batch_size
        self.decode = decode_choice(device, decode)
        if self.decode == "torch" and read is read_image:
            read = read_encoded
        options = loader_options(len(self.paths), batch_size, workers, device)
        if ahead and options["num_workers"]:
            side = preprocess.image_size
            batch_bytes = batch_size * preprocess.crops * preprocess.channels * side * side
            options["prefetch_factor"] = max(options["prefetch_factor"],
                                             min(64, AHEAD_BYTES // (batch_bytes * options["num_workers"])))
        self.loader = DataLoader(_Decoded(self.paths, preprocess, read), batch_size=batch_size,
                                 collate_fn=_collate, generator=torch.Generator(),     # leaves the global RNG alone
                                 **options)
        self._batches: Any = iter(self.loader)                    # starts the workers and their first batches

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        return self

    def __next__(self):
        if self._batches is None:
            raise StopIteration
        try:
            return next(self._batches)
        except StopIteration:
            self._batches = None
            raise

    def close(self) -> None:
        self._batches = None                  # the loader's iterator stops its workers as it is let go

    def pixels(self, batch: torch.Tensor | list, device: torch.device) -> torch.Tensor:
        """A batch's pixels ``(B, crops, C, S, S)`` on ``device``: the rows the workers left encoded
        (``EncodedJPEG``) decoded there in one call and cut into views in torch, the others as the workers made
        them."""
        if isinstance(batch, torch.Tensor):
            return batch
        encoded = [r for r in batch if isinstance(r, EncodedJPEG)]
        decoded = iter(encoded_pixels(self.preprocess, encoded, device))
        return torch.stack([next(decoded) if isinstance(r, EncodedJPEG) else r.to(device) for r in batch])


@dataclass(frozen=True)
class FileReading:
    """How :func:`embed_image_files` reads its files: ``batch_size`` images a batch, decoded by ``read`` (a path
    and the shorter side the preprocessing needs → the upright image, which may be shrunk down to that side, and
    anything else to keep of the file, listed in ``info``; no image: nothing to embed, the position listed in
    ``passed``) and preprocessed in ``workers`` DataLoader workers (None: by core count,
    ``features.loader_options``; 0: in this process); ``preprocess``: other views of each image than the model's
    own (e.g. ``MirroredViews``: test-time augmentation; normalised as the model's; None: the model's);
    ``decode``: where plain JPEGs are decoded and cut into views (``tensor_views.decode_choice``: ``pil`` in the
    workers, ``torch`` on the model's device; None: ``$JOINTSPACE_DECODE``, else by the device)."""
    batch_size: int = 64
    workers: int | None = 2
    read: Reader = read_image
    preprocess: Any = None
    decode: str | None = None


DEFAULT_READING = FileReading()


@torch.no_grad()
def embed_image_files(model: EmbeddingModel, paths: Sequence[str | Path], reading: FileReading = DEFAULT_READING,
                      progress: bool = True, pad: bool | None = None, decoding: ImageDecoding | None = None,
                      on_batch: Callable[[list[int], list[Any]], None] | None = None) -> FileEmbeddings:
    """Every readable image of ``paths`` → embeddings (:func:`embed_pixels`), read, decoded and preprocessed as
    ``reading`` says (:class:`FileReading`); a file that cannot be read is skipped and reported, never fatal. Puts
    the model in eval mode. ``pad``: every forward pass at the batch size's rows (:func:`fixed_batches`; default:
    on CUDA). ``decoding``: the files already being decoded (:class:`ImageDecoding`, started before the model was
    loaded), instead of ``paths`` read as ``reading`` says; its preprocessing must be the model's own views.
    ``on_batch``: called with each batch's kept positions and what the reader returned besides their images, as
    soon as the batch is decoded (e.g. to start more work on those files meanwhile)."""
    model.eval()
    if decoding is None:
        decoding = ImageDecoding(paths, reading.preprocess or model.preprocess, reading.read, reading.batch_size,
                                 reading.workers, device_of(model), decode=reading.decode)
    elif decoding.paths != [str(p) for p in paths]:
        decoding.close()
        raise ValueError("the decoding started is of other files than those to embed")
    elif (decoding.preprocess.base if isinstance(decoding.preprocess, MirroredViews)
          else decoding.preprocess) != model.preprocess:
        decoding.close()
        raise ValueError("the decoding started preprocesses the images otherwise than the model does")
    shapes = fixed_batches(decoding.batch_size, device_of(model), pad)
    vectors, kept, skipped, info, passed = [], [], [], [], []
    # double-buffered on a GPU: a batch's upload and download overlap the next one's forward pass (overlap.py)
    unfamiliarity = person_discount(model) > 0      # then each row carries the photo's a(x) last (embed_pixels)
    flight = Overlap(lambda batch: embed_pixels(model, batch, shapes, unfamiliarity), device_of(model))

    def done(finished) -> None:
        for (idx, extra), rows in finished:
            vectors.append(rows)
            kept.extend(idx)
            info.extend(extra)
    # counts images, not batches (a bar of "6/6" says little of 42 photos); drawn at 0 before the first batch
    bar = tqdm(total=len(paths), desc="embedding images", unit="image", disable=not progress)
    timeline = flight.timeline
    waiting, decoding_here, modelling = PHASES
    while True:
        with timeline.phase(waiting):
            batch = next(decoding, None)
        if batch is None:
            break
        timeline.event("first decoded batch in hand")
        idx, pixels, bad, extra, nothing = batch
        bar.update(len(idx) + len(bad) + len(nothing))
        skipped += [(str(paths[i]), reason) for i, reason in bad]
        passed += nothing
        if pixels is None:
            continue
        if on_batch is not None:
            on_batch(idx, extra)
        # plain JPEGs the workers left encoded are decoded on the model's device here (ImageDecoding.pixels)
        with timeline.phase(decoding_here):
            pixels = decoding.pixels(pixels, device_of(model))
        with timeline.phase(modelling):
            done(flight.push(pixels, (idx, extra)))
    with timeline.phase(modelling):
        done(flight.drain())
    bar.close()
    dim = model.cfg.model.embed_dim
    out = np.concatenate(vectors) if vectors else np.zeros((0, dim + unfamiliarity), np.float32)
    return FileEmbeddings(np.ascontiguousarray(out[:, :dim], dtype=np.float32), kept, skipped, info, passed,
                          flight.timeline,
                          np.ascontiguousarray(out[:, dim], dtype=np.float32) if unfamiliarity else None)


@torch.no_grad()
def pixel_features(model: EmbeddingModel, pixels: torch.Tensor, shapes: Shapes | None = None) -> torch.Tensor:
    """uint8 pixels ``(B, crops, 3, S, S)`` → backbone features ``(B, D)``, float32 on the model's device (what
    query composition starts from), from the model's inference backend (:func:`backend.tower_features`); at the
    bucket sizes of ``shapes`` when given."""
    device = device_of(model)

    def run(batch: torch.Tensor) -> torch.Tensor:
        with inference_autocast(model, device):
            return tower_features(model, batch, device).float()
    return _bucketed(run, pixels, shapes)


@torch.no_grad()
def embed_image_source(model: EmbeddingModel,
                       source: ImageSource, batch_size: int = 128, workers: int | None = 2) -> torch.Tensor:
    """Every image of ``source`` → embeddings ``(N, E)`` on the model's device: pixels through
    :func:`embed_pixels`, precomputed features (or a ``views`` source's evaluation view) through the model's
    projection, under the same autocast policy."""
    device = device_of(model)
    was_training = model.training
    model.eval()
    out = []
    if source.kind == "files":
        loader = DataLoader(cast(ImageFiles, source.data), batch_size=batch_size,
                            generator=torch.Generator(),      # leaves the global RNG alone (features.image_loader)
                            **loader_options(len(source), batch_size, workers, device))
        out = [embed_pixels(model, pixels) for _, pixels in loader]
    else:
        data = cast(torch.Tensor, source.data)
        data = data[:, 0] if source.kind == "views" else data     # views: the evaluation view
        for i in range(0, len(source), batch_size):
            batch = data[i:i + batch_size]
            if source.kind == "pixels":
                out.append(embed_pixels(model, batch))
            else:
                with inference_autocast(model, device):
                    out.append(model.embed_features(batch.to(device)).float())
    model.train(was_training)
    return torch.cat(out)


def embed_split(model: EmbeddingModel,
                dataset, device="cpu", cache_dir=None, workers: int | None = 2, progress: bool = True,
                amp: bool = False, source: ImageSource | None = None):
    """Embeds every image and caption of ``dataset`` (a CaptionDataset) with the inference path above.
    ``device`` and ``amp`` are for extracting backbone features when ``source`` is not given.
    Returns ``(image_emb (N, E), caption_emb (M, E), cap_to_img (M,))``."""
    if source is None:
        source = image_source(model, [r.path for r in dataset.images], cache_dir=cache_dir,
                              compute=Compute(device=device, workers=workers, progress=progress, amp=amp))
    img_emb = embed_image_source(model, source, workers=workers)
    was_training = model.training
    model.eval()
    cap_emb = embed_texts(model, [c for r in dataset.images for c in r.captions], batch_size=512)
    model.train(was_training)
    cap_to_img = torch.tensor([r.image_id for r in dataset.images for _ in r.captions], dtype=torch.long)
    return img_emb.cpu(), cap_emb.cpu(), cap_to_img


@torch.no_grad()
def fine_embed_split(model: JointEmbedding, dataset, source, device="cpu", batch_size: int = 128):
    """A model with region attention (STT-ATT; only a ``JointEmbedding`` has one): region embeddings
    ``(N, k, E)`` of a split's images (from ``source``, an ImageSource of grid features
    or pixels), word embeddings ``(M, T, E)`` and mask ``(M, T)`` of its captions, and ``cap_to_img``."""
    device = torch.device(device)
    was_training = model.training
    model.eval()
    if source.kind == "files":
        loader = torch.utils.data.DataLoader(source.data, batch_size=batch_size, generator=torch.Generator())
        batches = (pixels for _, pixels in loader)
    else:
        batches = (source.data[i:i + batch_size] for i in range(0, len(source), batch_size))
    regions = []
    for batch in batches:
        feats = batch.to(device) if source.kind == "features" else pixel_features(model, batch)
        with inference_autocast(model, device):
            regions.append(model.embed_regions(feats).float().cpu())
    ids_all = [model.encode_text_ids([c])[0] for r in dataset.images for c in r.captions]
    ids, lengths = pad_batch(ids_all)
    words, masks = [], []
    for start in range(0, len(ids_all), batch_size):
        with inference_autocast(model, device):
            w, m = embed_words(model, ids[start:start + batch_size].to(device), lengths[start:start + batch_size])
        words.append(w.float().cpu())
        masks.append(m.cpu())
    cap_to_img = torch.tensor([r.image_id for r in dataset.images for _ in r.captions], dtype=torch.long)
    model.train(was_training)
    return torch.cat(regions), torch.cat(words), torch.cat(masks), cap_to_img
