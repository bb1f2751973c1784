"""Request and response bodies of the HTTP API (they also make the OpenAPI document at /docs)."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

HARD_MAX_K = 10_000         # schema bound; the configured JOINTSPACE_MAX_K (default 100) is checked per request
MAX_ID = 2 ** 63 - 1        # ids are FAISS/SQLite int64
MAX_GENERATED = 10          # most sentences, and widest beam, one caption/paraphrase request may ask for
MAX_TERMS = 16              # most add + subtract words or phrases of one composed query


def _not_blank(text: str) -> str:
    if not text.strip():
        raise ValueError("text must not be empty or only whitespace")
    return text


class TextSearch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str = Field(..., description="a sentence describing the images to find", examples=["a red circle"])
    k: int = Field(10, ge=1, le=HARD_MAX_K, description="number of results")

    _check_text = field_validator("text")(_not_blank)


class ImageIdSearch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    image_id: int = Field(..., ge=0, le=MAX_ID, description="id of a gallery image (from /v1/search/images)")
    k: int = Field(10, ge=1, le=HARD_MAX_K)


def _terms(terms: list[str]) -> list[str]:
    if any(not t.strip() for t in terms):
        raise ValueError("words to add or subtract must not be empty or only whitespace")
    return terms


class ImageIdCompose(BaseModel):
    """A composed query from a gallery image (W2VV §IV-C): its picture plus and/or minus words."""
    model_config = ConfigDict(extra="forbid")
    image_id: int = Field(..., ge=0, le=MAX_ID, description="id of a gallery image (from /v1/search/images)")
    add: list[str] = Field([], max_length=MAX_TERMS, description="words or phrases whose meaning to add",
                           examples=[["motorbike"]])
    subtract: list[str] = Field([], max_length=MAX_TERMS, description="words or phrases whose meaning to take away",
                                examples=[["bicycle"]])
    k: int = Field(10, ge=1, le=HARD_MAX_K, description="number of results")

    _check_terms = field_validator("add", "subtract")(_terms)

    @model_validator(mode="after")
    def _few_terms(self):
        if len(self.add) + len(self.subtract) > MAX_TERMS:
            raise ValueError(f"at most {MAX_TERMS} words or phrases to add and subtract in all")
        return self


class Paraphrase(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str = Field(..., description="the sentence to paraphrase", examples=["a red circle left of a blue square"])
    n: int = Field(5, ge=1, le=MAX_GENERATED, description="number of paraphrases")
    beam_size: int | None = Field(None, ge=1, le=MAX_GENERATED,
                                  description="beam width (default: the model's decoder.beam_size); widened to "
                                              "n + 1 when smaller")

    _check_text = field_validator("text")(_not_blank)


class ImageHit(BaseModel):
    id: int
    score: float
    uri: str = Field(..., description="/v1/images/{id}: the image file")


class ImageResults(BaseModel):
    results: list[ImageHit]


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


class Error(BaseModel):
    detail: str


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
                                                   "and /v1/paraphrases need (they answer 501 without one)")
    api_key_required: bool | None = Field(None, description="/v1/* needs the API key (X-API-Key or Bearer)")
    max_k: int | None = Field(None, description="the largest k a search may ask for")
