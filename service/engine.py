"""One batch of queries → one forward pass of an encoder → one index search, or one decoding call. What the
batchers run.

Runs on the service's single compute thread (never on the event loop). Texts and pixels become embeddings
through the project's one inference path (training/inference/embedding.py), under its autocast policy — bf16 on CUDA
when the model allows it, float32 on CPU — and so do query composition and the decoder. The index (a
:class:`index.gallery.Gallery`) can be swapped for a newer generation at any time: each batch reads
``self.gallery`` once.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from index.hybrid import TextPaging, search_text
from index.people import text_queries
from index.query import page
from index.relevance import Ranking
from training.inference.compose import example_queries
from training.inference.embedding import embed_pixels, embed_texts
from training.inference.generate import caption_embeddings, decode_settings, identical_to
from training.inference.shapes import Shapes
from training.models.protocol import EmbeddingModel, has_decoder

log = logging.getLogger("jointspace.service")

Generated = list[tuple[str, float]]
WARM_TEXT = "a dog runs on the beach"     # the text warm-up's sentence: a caption's length


@dataclass(frozen=True, eq=False)
class Options:
    """What a search asks besides its query: ``k`` results from ``offset`` on, none scoring under ``min_score``,
    only among the image ids ``allowed`` (a filter's, resolved by the route; None: all), and for a text query the
    words whose meaning to take away (``subtract``). A plain ``int`` where an ``Options`` goes means ``k``."""
    k: int = 10
    offset: int = 0
    min_score: float | None = None
    allowed: np.ndarray | None = None
    subtract: tuple[str, ...] = ()
    mode: str = "vector"             # a text query: index/hybrid.py's vector, keyword or hybrid
    sort: str = "relevance"           # an image search's order (index/order.py): relevance, newest, oldest


def options(value) -> Options:
    return value if isinstance(value, Options) else Options(k=int(value))


def _paged(gallery, side: str, queries: np.ndarray, opts: Sequence[Options]) -> list[list[tuple[int, float]]]:
    """One index search for the unfiltered queries (deep enough for the deepest page among them), one per filtered
    query (FAISS ID selector) and per query sorted by capture time (index/order.py); then each query's page."""
    out: list[list[tuple[int, float]]] = [[] for _ in opts]
    plain = [i for i, o in enumerate(opts) if o.allowed is None and o.sort == "relevance"]
    search = gallery.search_images if side == "images" else gallery.search_captions
    if plain:
        depth = max(opts[i].k + opts[i].offset for i in plain)
        for i, hits in zip(plain, search(queries[plain], depth)):
            out[i] = page(hits, opts[i].k, opts[i].offset, opts[i].min_score)
    for i, o in enumerate(opts):
        if o.allowed is not None or o.sort != "relevance":
            out[i] = gallery.search_images(queries[i:i + 1], o.k, offset=o.offset, min_score=o.min_score,
                                           allowed=o.allowed, sort=o.sort)[0]
    return out


class Engine:
    def __init__(self, model: EmbeddingModel, gallery, shapes: Shapes | None = None):
        """``model`` on the device it runs on (its parameters' device is where the batches go). ``shapes``: the
        batch sizes every forward pass runs at (training/inference/shapes.py); None: each batch at its own size."""
        self.model, self.gallery, self.shapes = model, gallery, shapes
        self.warmup_steps: list[tuple[str, int, float]] = []      # warm_up's (route, batch size, seconds)

    def _text_vectors(self, texts: Sequence[str], subtract: Sequence[Sequence[str]] = ()) -> torch.Tensor:
        """Sentences (each minus its own words) → vectors on the device, one forward pass (per bucket)."""
        return embed_texts(self.model, texts, subtract, batch_size=max(len(texts), 1), shapes=self.shapes)

    def _pixel_vectors(self, pixels: Sequence[torch.Tensor]) -> torch.Tensor:
        return embed_pixels(self.model, torch.stack(list(pixels)), shapes=self.shapes)

    def warm_up(self, sizes: Sequence[int]) -> float:
        """Runs the image search once at each batch size of ``sizes``, the text search at the smallest and the
        largest (and the decoder, when the model has one, at the smallest), so that no request pays a shape's
        first-call cost (seconds on a GPU: kernel selection and compilation, per convolution and batch size). A
        text batch's shape is its rows times its longest sentence, new with almost every request whatever the
        warm-up, and its kernels (matrix products) have no per-shape set-up to speak of: the two text sizes
        bring in every kernel, more would repeat them. Query composition runs the same image backbone at the same
        sizes. A route whose warm-up fails is logged and left for its requests to report. Returns the seconds it
        took; :attr:`warmup_steps` has each step's ``(route, size, seconds)``."""
        start = time.perf_counter()
        pre = self.model.preprocess
        blank = torch.zeros(pre.crops, pre.channels, pre.image_size, pre.image_size, dtype=torch.uint8)
        text_sizes = sorted({min(sizes), max(sizes)}) if sizes else []
        runs: list[tuple[str, Sequence[int], Callable[[int], object]]] = [
            ("text search", text_sizes, lambda n: self.search_texts([(WARM_TEXT, 1)] * n)),
            ("image search", sizes, lambda n: self.search_pixels([(blank, 1)] * n))]
        if has_decoder(self.model) and sizes:
            runs.append(("captioning", [min(sizes)], lambda n: self.caption_pixels([(blank, 1, None)] * n)))
        self.warmup_steps = []
        for route, route_sizes, run in runs:
            try:
                for size in route_sizes:
                    began = time.perf_counter()
                    run(size)
                    self.warmup_steps.append((route, size, time.perf_counter() - began))
                    log.debug("warm-up: %s at batch %d in %.2f s", route, size, self.warmup_steps[-1][2])
            except Exception as err:  # noqa: BLE001 - the route's own requests will say what is wrong
                log.warning("warm-up of the %s failed: %s: %s", route, type(err).__name__, err)
        return time.perf_counter() - start

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        """Sentences → text embeddings, one forward pass."""
        return self._text_vectors(texts).cpu().numpy()

    def embed_pixels(self, pixels: Sequence[torch.Tensor]) -> np.ndarray:
        """uint8 ``(crops, 3, S, S)`` tensors (``model.preprocess.pixels``) → image embeddings."""
        return self._pixel_vectors(pixels).cpu().numpy()

    def search_texts(self, items: Sequence[tuple[str, int | Options]]) -> list[Ranking]:
        """``(text, k or Options)`` queries → best-first ``(image id, score)`` lists, with their relevance."""
        gallery = self.gallery
        opts = [options(o) for _, o in items]
        queries = self._text_vectors([t for t, _ in items], [o.subtract for o in opts]).cpu().numpy()
        plain = [i for i, o in enumerate(opts) if o.mode == "vector"]
        out: list[Ranking] = [Ranking([]) for _ in items]
        if plain:                             # with each text's person flag (index/people.py)
            flagged = text_queries(queries[plain], [items[i][0] for i in plain])
            for i, ranking in zip(plain, gallery.ranked("images", flagged,
                                                        _paged(gallery, "images", flagged, [opts[i] for i in plain]))):
                out[i] = ranking
        for i, o in enumerate(opts):          # keyword and hybrid modes, one query at a time (index/hybrid.py)
            if o.mode != "vector":
                out[i] = search_text(gallery, queries[i:i + 1], items[i][0], o.mode,
                                     TextPaging(o.k, o.offset, o.min_score, o.sort), o.allowed)
        return out

    def search_pixels(self, items: Sequence[tuple[torch.Tensor, int | Options]]) -> list[Ranking]:
        """``(pixels, k or Options)`` queries → best-first ``(caption id, score)`` lists, with their relevance."""
        gallery = self.gallery
        opts = [options(o) for _, o in items]
        queries = self.embed_pixels([p for p, _ in items])
        return gallery.ranked("captions", queries, _paged(gallery, "captions", queries, opts))

    def search_image_id(self, image_id: int, k: int | Options) -> Ranking:
        """Captions for a gallery image, from its stored embedding (no forward pass); KeyError if unknown."""
        gallery = self.gallery
        query = gallery.image_vector(image_id)[None, :]
        return gallery.ranked("captions", query, _paged(gallery, "captions", query, [options(k)]))[0]

    def search_image_ids(self, items: Sequence[tuple[int, int | Options]]) -> list[Ranking]:
        """``(gallery image id, k or Options)`` queries → :meth:`search_image_id` of each; KeyError if one is
        unknown."""
        return [self.search_image_id(image_id, k) for image_id, k in items]

    # --- query composition (W2VV §IV-C) -------------------------------------------------------------------------
    @torch.inference_mode()
    def compose_search(self, items: Sequence[tuple[torch.Tensor, Sequence[str], Sequence[str], int | Options]]
                       ) -> list[Ranking]:
        """``(pixels, add, subtract, k)`` queries → best-first ``(image id, score)`` lists with their relevance:
        query by example (``training.inference.compose.example_queries``: the images in one forward pass, each
        composed with its words), then one index search."""
        gallery = self.gallery
        queries = example_queries(self.model, torch.stack([p for p, *_ in items]),
                                  [(add, subtract) for _, add, subtract, _ in items], shapes=self.shapes).cpu().numpy()
        return gallery.ranked("images", queries, _paged(gallery, "images", queries, [options(o) for *_, o in items]))

    # --- the sentence decoder (Show, Translate and Tell) --------------------------------------------------------
    def _decode(self, vectors: torch.Tensor, settings: Sequence[tuple[int, int | None]],
                exclude: Sequence[Sequence[str]] | None = None) -> list[Generated]:
        """Row ``i`` of ``vectors`` → its ``n`` best sentences, ``settings[i] = (n, beam_size or None)``.

        Rows are decoded together, one ``caption_embeddings`` call per effective beam width: rows with the same
        ``(n, beam_size)`` always share a call, and so do rows whose settings give the same width (the beam is
        widened to ``n``, plus one for an excluded sentence). The call asks for the group's largest ``n`` and each
        row keeps its own first ``n``: a beam's finished hypotheses do not depend on ``n``, so every row gets
        exactly what it would get decoded alone."""
        extra = 1 if exclude is not None else 0
        groups: dict[int, list[int]] = {}
        for row, (n, beam_size) in enumerate(settings):
            width = max(decode_settings(self.model, beam_size).beam_size, n + extra)
            groups.setdefault(width, []).append(row)
        out: list[Generated] = [[] for _ in settings]
        for width, rows in groups.items():
            index = torch.tensor(rows, device=vectors.device)
            results = caption_embeddings(self.model, vectors.index_select(0, index),
                                         n=max(settings[r][0] for r in rows),
                                         settings=decode_settings(self.model, beam_size=width), batch_size=len(rows),
                                         exclude=[exclude[r] for r in rows] if exclude is not None else None)
            for row, result in zip(rows, results):
                out[row] = result[:settings[row][0]]
        return out

    @torch.inference_mode()
    def caption_pixels(self, items: Sequence[tuple[torch.Tensor, int, int | None]]) -> list[Generated]:
        """``(pixels, n, beam_size)`` requests → generated captions, best first (STT eq. 10): one forward pass
        of the image encoder for the whole batch, then :meth:`_decode`."""
        vectors = self._pixel_vectors([p for p, _, _ in items])
        return self._decode(vectors, [(n, beam) for _, n, beam in items])

    @torch.inference_mode()
    def paraphrase_texts(self, items: Sequence[tuple[str, int, int | None]]) -> list[Generated]:
        """``(text, n, beam_size)`` requests → paraphrases, best first (STT eq. 11), never the input sentence
        itself: one forward pass of the text encoder for the whole batch, then :meth:`_decode`."""
        texts = [t for t, _, _ in items]
        return self._decode(self._text_vectors(texts), [(n, beam) for _, n, beam in items],
                            exclude=identical_to(texts))
