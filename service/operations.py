"""The table of the model's operations: every batched (or model-bound) request the service takes, in one place.

Each :class:`~service.api.routing.Route` is a ``POST`` path; each of its :class:`~service.api.routing.Operation`
entries one body it takes — JSON (``Json``, chosen among a route's JSON bodies by its ``when`` key) or a multipart
form with an image (``Upload``) — with the handler that answers it, the engine method that runs a batch of them, its
admission class (the batcher it waits in; ``DIRECT``: none, alone on the compute thread) and whether it needs the
model's sentence decoder. The app's routes and their OpenAPI request bodies, admission and in-flight counting
(service/middleware.py), the batchers (service/state.py) and the engine calls are all read from here
(service/api/routing.py says how), so adding an operation is an entry here, its handler and its engine method;
docs/architecture.md shows the table.
"""
from __future__ import annotations

from .api import generate, search
from .api.routing import Operation, Route
from .contract import Json, Upload
from .engine import Engine
from .schemas import (CaptionResults, CaptionSearch, Captions, ComposeUpload, GeneratedCaptions, ImageIdCompose,
                      ImageIdSearch, ImageResults, Paraphrase, Paraphrases, TextSearch)
from .state import DIRECT

OPERATIONS: tuple[Route, ...] = (
    Route("search_images", "/v1/search/images", (
        Operation("text_search", Json(TextSearch), "text", Engine.search_texts, search.text_search),
        Operation("compose_gallery_image", Json(ImageIdCompose, when="image_id"), "compose", Engine.compose_search,
                  search.compose_gallery_image),
        Operation("compose_upload", Upload(ComposeUpload, "the query image (query by example: similar gallery "
                                                          "images)"),
                  "compose", Engine.compose_search, search.compose_upload)),
        ImageResults, errors=(404, 409),
        summary="Text → gallery images, or a photo (± words) → similar gallery images; best first, filtered, paged",
        description="JSON `{\"text\", \"subtract\", \"mode\", \"k\", ...}`: images for a sentence, minus the "
                    "meaning of the `subtract` words; `mode` `vector` (default), `keyword` (file and folder names, "
                    "text read in the photos, captions: BM25) or `hybrid` (both, fused by reciprocal rank), each "
                    "keyword or hybrid hit with its `matched` words. Query by example and composition (W2VV §IV-C): multipart `image` (+ `add`, "
                    "`subtract`, `k`, ...) — an uploaded photo — or JSON `{\"image_id\", \"add\", \"subtract\", "
                    "\"k\", ...}` for a gallery image: images like the query image, with the meaning of the `add` "
                    "words added and of the `subtract` words taken away. Every form also takes `offset` and "
                    "`min_score` (paging and threshold) and the filters `folder`, `taken_after`, `taken_before`, "
                    "`media` (applied inside the index search: the best `k` of the images that pass; `media`: only "
                    "photos or only video moments), and `sort` (`relevance`, or `newest`/`oldest` by capture time "
                    "after a relevance cut: `min_score`, or without it the strong matches; an unknown value is 422). An unknown folder is 404; a date range "
                    "that holds no instant (`taken_before` not later than `taken_after`) matches no image. A model with region attention (STT-ATT) cannot compose: 409.",
        send="send JSON {\"text\": ..., \"k\": ...}, or for a composed query multipart/form-data with an 'image' file "
             "(and optional 'add', 'subtract', 'k') or JSON {\"image_id\": ..., \"add\": [...], \"subtract\": [...], "
             "\"k\": ...}"),
    Route("search_captions", "/v1/search/captions", (
        Operation("caption_search_upload", Upload(CaptionSearch, "the image whose captions to rank"), "image",
                  Engine.search_pixels, search.caption_search_upload),
        Operation("caption_search_gallery_image", Json(ImageIdSearch), DIRECT, Engine.search_image_ids,
                  search.caption_search_gallery_image)),
        CaptionResults, errors=(404,),
        summary="Image (upload, or a gallery image id) → captions of the corpus, best first (paged, with a "
                "threshold)",
        send="send multipart/form-data with an 'image' file (and optional 'k'), or JSON {\"image_id\": ..., "
             "\"k\": ...}"),
    Route("captions", "/v1/captions", (
        Operation("caption_generation", Upload(Captions, "the image to caption"), "caption", Engine.caption_pixels,
                  generate.caption_generation, decoder=True),),
        GeneratedCaptions, summary="Image → generated captions, best first (needs a model with a decoder)",
        send="send multipart/form-data with an 'image' file (and optional 'n', 'beam_size')"),
    Route("paraphrases", "/v1/paraphrases", (
        Operation("paraphrase_generation", Json(Paraphrase), "paraphrase", Engine.paraphrase_texts,
                  generate.paraphrase_generation, decoder=True),),
        Paraphrases, summary="Sentence → paraphrases, best first, never the sentence itself (needs a model with a "
                             "decoder)",
        send="send JSON {\"text\": ..., \"n\": ..., \"beam_size\": ...}"),
)
