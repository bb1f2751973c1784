"""Response bodies of the HTTP API; the request bodies and their limits are in service/contract.py."""
from __future__ import annotations

from pydantic import BaseModel, Field

from .contract import MAX_GENERATED, MAX_ID, MAX_TERMS, Error, request_models  # noqa: F401 - re-exported

# the request bodies with the default limits (an app builds its own from its settings: service/contract.py)
_DEFAULT = request_models(max_k=100, max_text_chars=1000)
TextSearch, ImageIdSearch, ImageIdCompose, Paraphrase = (_DEFAULT.TextSearch, _DEFAULT.ImageIdSearch,
                                                          _DEFAULT.ImageIdCompose, _DEFAULT.Paraphrase)


class ImageHit(BaseModel):
    id: int
    score: float
    uri: str = Field(..., description="/v1/images/{id}: the image file")
    taken: str | None = Field(None, description="capture time, UTC (EXIF DateTimeOriginal, else the file's "
                                                "modification time); null for images indexed without it")
    folder: str | None = Field(None, description="the image's folder, relative to the gallery's root folder")
    width: int | None = Field(None, description="upright width in pixels")
    height: int | None = Field(None, description="upright height in pixels")
    media: str = Field("photo", description="'photo', or 'video' for a moment of a video (the fields below)")
    video_id: int | None = Field(None, description="a moment's video: GET /v1/videos/{video_id} streams it")
    start: float | None = Field(None, description="a moment's start in the video, seconds")
    end: float | None = Field(None, description="a moment's end in the video, seconds")
    frame: float | None = Field(None, description="the time of the moment's thumbnail frame (GET "
                                                  "/v1/images/{id}), seconds")


class ImageResults(BaseModel):
    results: list[ImageHit]


class Folder(BaseModel):
    folder: str = Field(..., description="relative to the gallery's root folder ('.' is the root itself)")
    images: int = Field(..., description="images directly in this folder")


class Folders(BaseModel):
    folders: list[Folder]


class CaptionHit(BaseModel):
    caption: str
    score: float
    id: int = Field(..., description="caption id in the index")


class CaptionResults(BaseModel):
    results: list[CaptionHit]


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
    images: int | None = None
    captions: int | None = None
    device: str | None = None
    decoder: bool | None = Field(None, description="the model has a caption/paraphrase decoder, which /v1/captions "
                                                   "and /v1/paraphrases need (they answer 409 without one)")
    api_key_required: bool | None = Field(None, description="/v1/* needs the API key (X-API-Key or Bearer)")
    max_k: int | None = Field(None, description="the largest k a search may ask for")
    similarity: str | None = Field(None, description="the model's similarity (cosine: scores from -1 to 1; order: "
                                                     "at most 0), which bounds min_score")
    search_backend: str | None = Field(None, description="what searches the index: faiss-cpu, faiss-gpu, or exact "
                                                         "matmul + top-k in torch (torch-cuda-fp16, …)")
    batch_sizes: list[int] | None = Field(None, description="the batch sizes the encoders run at (none: any)")
    warmup_seconds: float | None = Field(None, description="how long running each warmed batch size took before "
                                                           "ready")
    hubness_correction: dict | None = Field(
        None, description="whether the index's scores are hubness-corrected (QB-Norm, docs/index.md): "
                          "text_to_image and image_to_text (booleans), the bank's origin ('model': the one the "
                          "model carries), its sizes and beta")
