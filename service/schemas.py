"""The bodies of the HTTP API: one pydantic model per request, and the responses.

A request model names its fields, their types, defaults and descriptions once; the limits that come from the
app's settings are :class:`~service.contract.Bound` fields, given their numbers once per app
(service/contract.py ``bind``). The model routes validate JSON bodies and multipart forms with those models and the
OpenAPI document shows them (the table of operations, service/operations.py, names each operation's body).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from index.duplicates import HASH_DISTANCE
from index.choices import MAX_OFFSET, SORT_DEPTH
from index.relevance import REFERENCE_SIZE, STRONG

from .contract import (MAX_ID, Bound, Limits, Time, bind, json_int, json_number, json_int_field,
                       terms_field, text_field)
from .settings import Settings

# the fields whose limits are settings (and the model's similarity, for min_score)
K = Annotated[int, Bound(lambda lim: json_int_field(ge=1, le=lim.max_k))]
MinScore = Annotated[float | None, Bound(lambda lim: Annotated[float, Field(**lim.score_bounds),
                                                                BeforeValidator(json_number)] | None)]
Text = Annotated[str, Bound(lambda lim: text_field(lim.max_text_chars))]
OptionalText = Annotated[str | None, Bound(lambda lim: text_field(lim.max_text_chars) | None)]
Terms = Annotated[list[str], Bound(lambda lim: terms_field(lim.max_text_chars, lim.max_terms))]
Generated = Annotated[int, Bound(lambda lim: json_int_field(ge=1, le=lim.max_generated))]
Beam = Annotated[int | None, Bound(lambda lim: json_int_field(ge=1, le=lim.max_generated) | None)]
# and those whose limits are fixed
Offset = Annotated[int, Field(ge=0, le=MAX_OFFSET), BeforeValidator(json_int)]
ImageId = Annotated[int, Field(ge=0, le=MAX_ID, description="id of a gallery image (from /v1/search/images)"),
                    BeforeValidator(json_int)]


class Request(BaseModel):
    """A request body: its fields only (an unknown one is 422). Its ``Bound`` fields get their limits per app
    (service/contract.py ``bind``): until then the model is not built."""
    model_config = ConfigDict(extra="forbid", defer_build=True)


class Paging(Request):
    """Which results: ``k`` of them from ``offset`` on, none scoring below ``min_score``."""
    k: K = Field(10, description="number of results, 1 to {max_k}")
    offset: Offset = Field(0, description=f"results to skip before the first one returned (pagination), 0 to "
                                          f"{MAX_OFFSET}")
    min_score: MinScore = Field(None, description="hide results scoring below this ({score_range}: the range of "
                                                  "the model's {similarity} similarity)")


class Filters(Request):
    """Which gallery images a search considers (applied inside the index search)."""
    folder: OptionalText = Field(None, description="only images in this folder or below it: a path relative to the "
                                             "gallery's root folder (GET /v1/folders lists them); a folder without "
                                             "images, an absolute path or one climbing out of the root is 404",
                                 examples=["2024/summer"])
    taken_after: Time | None = Field(None, description="only photos taken at or after this date (00:00 UTC) or "
                                                       "RFC 3339 date-time; the capture time is EXIF "
                                                       "DateTimeOriginal, else the file's modification time",
                                     examples=["2024-06-01"])
    taken_before: Time | None = Field(None, description="only photos taken before this date (00:00 UTC) or RFC "
                                                        "3339 date-time; a range with taken_before not later than "
                                                        "taken_after holds no instant and matches no image (200, "
                                                        "no results)", examples=["2024-09-01T00:00:00Z"])
    media: Literal["photo", "video"] | None = Field(None, description="only photos (`photo`) or only moments of "
                                                                      "videos (`video`); absent: both in one "
                                                                      "ranking", examples=["video"])


class ImageSearch(Filters, Paging):
    """What every search for gallery images takes besides its query: paging, filters, words to take away."""
    subtract: Terms = Field([], description="words or phrases whose meaning to take away (at most {max_terms})",
                            examples=[["bicycle"]])
    sort: Literal["relevance", "newest", "oldest"] = Field(
        "relevance", description=f"the results' order: `relevance` (best first), or by capture time, `newest` or "
                                 f"`oldest` first — applied after a relevance cut: of the best {SORT_DEPTH:,} results "
                                 f"that pass the filters, those scoring at least `min_score`, or without `min_score` "
                                 f"the strong matches (relevance at least {STRONG:g}, as `strong_match` says; an index "
                                 f"without a reference set: all), in capture-time order (ties by id), then paged by "
                                 f"`offset` and `k` (the same list for every page); `min_score: -1` sorts every "
                                 f"result. Images without a capture time come last", examples=["newest"])


class TextSearch(ImageSearch):
    """Images for a sentence, optionally minus some words' meaning."""
    text: Text = Field(..., description="a sentence describing the images to find", examples=["a red circle"])
    mode: Literal["vector", "keyword", "hybrid"] = Field(
        "vector", description="`vector`: the embedding ranking (the default); `keyword`: only images whose file "
                              "name, folder names, text read in the photo (OCR) or captions hold a word of `text`, "
                              "best BM25 first; `hybrid`: both rankings fused by reciprocal rank (k = 60, equal "
                              "weights), the vector ranking where no image holds a word. In every mode `score` is "
                              "the embedding similarity and `min_score` applies to it (docs/search.md)",
        examples=["hybrid"])


class ComposeUpload(ImageSearch):
    """A composed query from an uploaded image (W2VV §IV-C): its picture plus and/or minus words (the form's
    fields besides the image)."""
    add: Terms = Field([], description="words or phrases whose meaning to add (at most {max_terms})",
                       examples=[["motorbike"]])


class ImageIdCompose(ComposeUpload):
    """A composed query from a gallery image (W2VV §IV-C): its picture plus and/or minus words."""
    image_id: ImageId


class CaptionSearch(Paging):
    """Captions for an uploaded image (the form's fields besides the image)."""


class ImageIdSearch(CaptionSearch):
    """Captions for a gallery image."""
    image_id: ImageId


class Captions(Request):
    """Captions generated for an uploaded image (the form's fields besides the image)."""
    n: Generated = Field(1, description="number of captions, 1 to {max_generated}")
    beam_size: Beam = Field(None, description="beam width (default: the model's decoder.beam_size); widened to n "
                                              "when smaller")


class Paraphrase(Request):
    """Paraphrases of a sentence."""
    text: Text = Field(..., description="the sentence to paraphrase", examples=["a red circle left of a blue square"])
    n: Generated = Field(5, description="number of paraphrases, 1 to {max_generated}")
    beam_size: Beam = Field(None, description="beam width (default: the model's decoder.beam_size); widened to n "
                                              "+ 1 when smaller")


@dataclass(frozen=True)
class RequestModels:
    """The JSON request models of the service's searches and paraphrases, bound to an app's limits: what a client or
    a test validates a body with as the service does (the service binds each operation's body itself, from the
    table of operations: service/api/routing.py)."""
    text_search: type[TextSearch]
    image_id_compose: type[ImageIdCompose]
    image_id_search: type[ImageIdSearch]
    paraphrase: type[Paraphrase]


def request_models(settings: Settings, similarity: str = "cosine") -> RequestModels:
    """The JSON request models with ``settings``' limits; ``similarity``: the served model's, which bounds
    ``min_score``."""
    limits = Limits.of(settings, similarity)
    return RequestModels(text_search=bind(TextSearch, limits), image_id_compose=bind(ImageIdCompose, limits),
                         image_id_search=bind(ImageIdSearch, limits), paraphrase=bind(Paraphrase, limits))


_RELEVANCE = ("how well this hit matches the query, 0 to 1: the share of the index's reference set — up to {size:,} "
              "typical {what} of the model's training data — that score lower than this hit for the same query; for a "
              "photo, when the index's bank holds reference sentences, also no more than the text side: how close the "
              "query comes to the photo's own best descriptions among the model's reference sentences, how far above "
              "sentences that describe nothing, and, for a query that names a thing the model has a name for, whether "
              "the photo's own best names include it (docs/index.md#relevance-and-no-strong-match). Unlike `score`, it means "
              "the same in every gallery and does not change when other items are added. At least {strong:g} is a "
              "strong match. Null when the index has no reference set (built without a query bank, or before reference "
              "sets)")
_STRONG_MATCH = (f"whether a result of this list has a relevance of at least {STRONG:g} (a strong match); false: the "
                 f"query has no strong match here, these are only the closest. A page of results says this of its own "
                 f"results. Null when the index has no reference set")


def _relevance_field(what: str):
    return Field(None, ge=0, le=1, description=_RELEVANCE.format(size=REFERENCE_SIZE, what=what, strong=STRONG))


class ImageHit(BaseModel):
    id: int
    score: float
    relevance: float | None = _relevance_field("photos")
    uri: str = Field(..., description="/v1/images/{id}: the image file")
    taken: str | None = Field(None, description="capture time, UTC (EXIF DateTimeOriginal, else the file's "
                                                "modification time); null for images indexed without it")
    name: str | None = Field(None, description="the file's name (a moment: its video's file name)")
    folder: str | None = Field(None, description="the image's folder, relative to the gallery's root folder "
                                                 "(absolute when it lies outside it)")
    width: int | None = Field(None, description="upright width in pixels")
    height: int | None = Field(None, description="upright height in pixels")
    media: str = Field("photo", description="'photo', or 'video' for a moment of a video (the fields below)")
    video_id: int | None = Field(None, description="a moment's video: GET /v1/videos/{video_id} streams it")
    start: float | None = Field(None, description="a moment's start in the video, seconds")
    end: float | None = Field(None, description="a moment's end in the video, seconds")
    frame: float | None = Field(None, description="the time of the moment's thumbnail frame (GET "
                                                  "/v1/images/{id}), seconds")
    matched: list[str] | None = Field(None, description="a text search in keyword or hybrid mode: the words of the "
                                                        "query found in the image's file name, folder names, OCR "
                                                        "text or captions")
    keyword_score: float | None = Field(None, description="keyword or hybrid mode: the image's BM25 score (higher "
                                                          "is better; null: no word matched)")
    fused_score: float | None = Field(None, description="hybrid mode: the reciprocal-rank-fusion score the results "
                                                        "are ordered by")


class ImageResults(BaseModel):
    results: list[ImageHit]
    strong_match: bool | None = Field(None, description=_STRONG_MATCH)


class Folder(BaseModel):
    folder: str = Field(..., description="relative to the gallery's root folder ('.' is the root itself)")
    images: int = Field(..., description="images directly in this folder")


class Folders(BaseModel):
    folders: list[Folder]


class CaptionHit(BaseModel):
    caption: str
    score: float
    id: int = Field(..., description="caption id in the index")
    relevance: float | None = _relevance_field("captions")


class CaptionResults(BaseModel):
    results: list[CaptionHit]
    strong_match: bool | None = Field(None, description=_STRONG_MATCH)


class GeneratedText(BaseModel):
    text: str = Field(..., description="a sentence written by the model's decoder")
    score: float = Field(..., description="length-normalised log-probability (log P / steps; ≤ 0, higher is "
                                         "better); sentences come best first")


class GeneratedCaptions(BaseModel):
    captions: list[GeneratedText]


class Paraphrases(BaseModel):
    paraphrases: list[GeneratedText] = Field(..., description="never the input sentence itself")


class Health(BaseModel):
    status: str


class Ready(BaseModel):
    status: str
    model_fingerprint: str | None = None
    index_generation: str | None = None
    images: int | None = Field(None, description="searchable images: photos and moments of videos")
    photos: int | None = Field(None, description="photos among the images")
    videos: int | None = Field(None, description="videos, whose moments are the other images")
    moments: int | None = Field(None, description="moments of videos among the images")
    captions: int | None = None
    device: str | None = None
    decoder: bool | None = Field(None, description="the model has a caption/paraphrase decoder, which /v1/captions "
                                                   "and /v1/paraphrases need (they answer 409 without one)")
    api_key_required: bool | None = Field(None, description="/v1/* needs the API key (X-API-Key or Bearer)")
    max_k: int | None = Field(None, description="the largest k a search may ask for")
    max_text_chars: int | None = Field(None, description="the longest query text a search takes, in characters")
    similarity: str | None = Field(None, description="the model's similarity (cosine: scores from -1 to 1; order: "
                                                     "at most 0), which bounds min_score")
    search_backend: str | None = Field(None, description="what searches the index: faiss-cpu, faiss-gpu, or exact "
                                                         "matmul + top-k in torch (torch-cuda-fp16, …)")
    image_backend: str | None = Field(None, description="what runs the image backbones (--backend): eager, openvino, "
                                                        "openvino-bf16, onnxruntime or cuda; eager where the one "
                                                        "asked for did not load (the log says why)")
    batch_sizes: list[int] | None = Field(None, description="the batch sizes the encoders run at (none: any)")
    warmup_seconds: float | None = Field(None, description="how long running each warmed batch size took before "
                                                           "ready")
    strong_relevance: float | None = Field(
        None, description="the relevance at which a search hit is a strong match (`strong_match` of the search "
                          "answers); null when the index has no reference set, and its hits no relevance")
    worker: int | None = Field(None, description="which worker process answered, 0 to workers - 1 (jointspace serve "
                                                 "--workers N, N > 1); null with one process")
    workers: int | None = Field(None, description="the worker processes serving this port as one service")
    hubness_correction: dict | None = Field(
        None, description="whether the index's scores are hubness-corrected (QB-Norm, docs/index.md): "
                          "text_to_image and image_to_text (booleans), the bank's origin ('model': the one the "
                          "model carries), its sizes and beta")


# --- near-duplicates (GET /v1/duplicates, service/api/duplicates.py) ---------------------------------------------

class DuplicateImage(BaseModel):
    id: int
    uri: str = Field(..., description="/v1/images/{id}: the image file (?size= for a thumbnail)")
    name: str | None = Field(None, description="the file's name")
    folder: str | None = Field(None, description="the image's folder, relative to the gallery's root folder")
    taken: str | None = Field(None, description="capture time, UTC")
    width: int | None = None
    height: int | None = None
    size: int | None = Field(None, description="the file's size in bytes")


class DuplicateGroup(BaseModel):
    kind: Literal["identical", "re-encode", "near"] = Field(
        ..., description=f"`identical`: the same bytes; `re-encode`: the same picture re-saved, resized or recoloured "
                         f"(perceptual hashes within {HASH_DISTANCE} bits); `near`: crops, edits, shots of a burst")
    min_score: float = Field(..., description="the lowest cosine similarity between two of its photos")
    images: list[DuplicateImage] = Field(..., description="its photos, by id")


class Duplicates(BaseModel):
    threshold: float
    photos: int = Field(..., description="photos compared (video moments take no part)")
    total: int = Field(..., description="groups at this threshold, all pages")
    offset: int
    limit: int
    groups: list[DuplicateGroup] = Field(..., description="the largest first, then by their first id")
