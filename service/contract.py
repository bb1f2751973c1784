"""The HTTP contract: request bodies with the limits this service enforces, and the OpenAPI document that states
them.

Every limit the server checks is in the document it serves at ``/openapi.json``, and both come from the same
definitions here, built from the app's :class:`~service.settings.Settings`: the JSON bodies are validated by the
very pydantic models whose JSON Schema the document shows (``k`` up to ``JOINTSPACE_MAX_K``, text up to
``JOINTSPACE_MAX_TEXT_CHARS`` characters and not blank, ``extra`` fields refused), and the multipart forms by
:func:`parse_form` against the same :class:`FormField` list the document is written from (unknown or repeated
fields refused, the accepted image types named in the part's ``encoding``).

Rules that JSON Schema spells differently from Python are written once, as a pattern both sides use:
``NOT_BLANK`` (text must contain a character that is not whitespace — whitespace as Python's ``str.isspace`` and
ECMAScript's ``\\s`` count it, listed by code point, so every regex engine reads the class alike) and ``TERM`` (a
word or phrase to add or subtract: not blank, no comma). Integers of a JSON body are JSON integers: ``5`` and
``5.0``, never ``"5"`` or ``true``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from types import GenericAlias, SimpleNamespace
from typing import Annotated, Any, Literal

from fastapi.exceptions import RequestValidationError
from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, create_model,
                      model_validator)

from index.query import MAX_OFFSET, SCORE_RANGES, parse_time

MAX_ID = 2 ** 63 - 1        # ids are FAISS/SQLite int64
MAX_GENERATED = 10          # most sentences, and widest beam, one caption/paraphrase request may ask for
MAX_TERMS = 16              # most words or phrases to add, and to subtract, in one composed query
IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp", "image/bmp", "image/tiff", "image/heic",
               "image/heif", "image/avif")

# whitespace: str.isspace() and ECMAScript \s together, by code point (\ufeff is ECMAScript-only)
_WS = ("\\t\\n\\u000b\\f\\r\\u001c-\\u001f \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f"
       "\\u3000\\ufeff")
NOT_BLANK = f"[^{_WS}]"                          # searched: somewhere a character that is not whitespace
_PHRASE = f"[^,]*[^,{_WS}][^,]*"                  # not blank, no comma
TERM = f"^{_PHRASE}$"
TERM_LIST = f"^{_PHRASE}(,{_PHRASE}){{0,{MAX_TERMS - 1}}}$"    # 1 to MAX_TERMS comma-separated phrases
_NOT_BLANK_RE, _TERM_RE = re.compile(NOT_BLANK), re.compile(TERM)


def _valid_unicode(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("text must be valid Unicode (it holds an unpaired surrogate)") from None


def check_text(text: str) -> str:
    """A query sentence: not empty or only whitespace, valid Unicode."""
    _valid_unicode(text)
    if not _NOT_BLANK_RE.search(text):
        raise ValueError("text must not be empty or only whitespace")
    return text


def check_term(term: str) -> str:
    """A word or phrase to add or subtract (an item of a JSON list): not blank, no comma."""
    _valid_unicode(term)
    if not _NOT_BLANK_RE.search(term):
        raise ValueError("words to add or subtract must not be empty or only whitespace")
    if not _TERM_RE.search(term):
        raise ValueError("one word or phrase per list item, without commas: give several as several items")
    return term


def split_terms(value: str) -> list[str]:
    """A form field's comma-separated words or phrases (``green star, yellow``), each not blank; at most
    ``MAX_TERMS``. The field's schema says the same with the pattern ``TERM_LIST``."""
    _valid_unicode(value)
    terms = value.split(",")
    if any(not _NOT_BLANK_RE.search(t) for t in terms):
        raise ValueError("words to add or subtract must not be empty or only whitespace")
    if len(terms) > MAX_TERMS:
        raise ValueError(f"at most {MAX_TERMS} words or phrases")
    return [t.strip() for t in terms]


def json_int(value: Any) -> Any:
    """A JSON integer (also written ``5.0``); a string or a boolean is not one."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError("must be a JSON integer")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError("must be a JSON integer")
        return int(value)
    return value


def json_number(value: Any) -> Any:
    """A JSON number (integer or not); a string or a boolean is not one, nor is one too large for a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError("must be a JSON number")
    try:
        return float(value)
    except OverflowError:
        raise ValueError("must be a number a float can hold") from None


def check_time(value: str) -> str:
    """A filter time: a date or an RFC 3339 date-time (``index.query.parse_time``); kept as given."""
    parse_time(value, "the time")
    return value


# a date or an RFC 3339 date-time: what parse_time reads, exactly
TIME_SCHEMA = {"anyOf": [{"type": "string", "format": "date"}, {"type": "string", "format": "date-time"}]}


def score_bounds(similarity: str) -> dict:
    """``minimum``/``maximum`` of ``min_score`` for a model's similarity (cosine: −1 to 1; order: at most 0)."""
    lo, hi = SCORE_RANGES.get(similarity, (None, None))
    return {k: v for k, v in (("ge", lo), ("le", hi)) if v is not None}


def json_int_field(**constraints) -> Any:
    """An integer with ``Field`` constraints (they must come before the validator to reach the JSON Schema)."""
    return Annotated[int, Field(**constraints), BeforeValidator(json_int)]


def _text(max_chars: int, description: str, example: str):
    # minLength is what the pattern implies; the blank check says it in its own words ("must not be empty ...")
    return Annotated[str, Field(max_length=max_chars, description=description, examples=[example],
                                json_schema_extra={"minLength": 1, "pattern": NOT_BLANK}), AfterValidator(check_text)]


def _term(max_chars: int):
    return Annotated[str, Field(max_length=max_chars, json_schema_extra={"minLength": 1, "pattern": TERM}),
                     AfterValidator(check_term)]


_STRICT = ConfigDict(extra="forbid")


OFFSET_DESCRIPTION = f"results to skip before the first one returned (pagination), 0 to {MAX_OFFSET}"
FOLDER_DESCRIPTION = ("only images in this folder or below it: a path relative to the gallery's root folder "
                      "(GET /v1/folders lists them) or absolute; a folder without images is 404")
AFTER_DESCRIPTION = ("only photos taken at or after this date (00:00 UTC) or RFC 3339 date-time; the capture time "
                     "is EXIF DateTimeOriginal, else the file's modification time")
MEDIA_DESCRIPTION = ("only photos (`photo`) or only moments of videos (`video`); absent: both in one ranking")
MEDIA_TYPES = ("photo", "video")
BEFORE_DESCRIPTION = ("only photos taken before this date (00:00 UTC) or RFC 3339 date-time; must be later than "
                      "taken_after (an empty range is 422)")


def min_score_description(similarity: str) -> str:
    lo, hi = SCORE_RANGES.get(similarity, (None, None))
    span = f"{lo:g} to {hi:g}" if lo is not None else f"at most {hi:g}"
    return f"hide results scoring below this ({span}: the range of the model's {similarity} similarity)"


def check_date_range(after: str | None, before: str | None) -> None:
    """``taken_after`` earlier than ``taken_before`` (when both are given): what JSON Schema cannot say."""
    if after is not None and before is not None and parse_time(after) >= parse_time(before):
        raise ValueError(f"taken_after ({after}) must be earlier than taken_before ({before}): the date range is "
                         f"empty")


class _DateRange(BaseModel):
    """Checks what JSON Schema cannot say: ``taken_after`` earlier than ``taken_before``."""
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="after")
    def _ordered(self):
        check_date_range(getattr(self, "taken_after", None), getattr(self, "taken_before", None))
        return self


@dataclass(frozen=True)
class OneOf:
    """A JSON body that is one of two models, told apart by whether the object has ``key`` (the document states
    it as ``oneOf`` the two: each model refuses the other's fields)."""
    key: str
    with_key: type[BaseModel]
    without_key: type[BaseModel]

    def model_for(self, obj: Any) -> type[BaseModel]:
        return self.with_key if isinstance(obj, dict) and self.key in obj else self.without_key


def request_models(max_k: int, max_text_chars: int, similarity: str = "cosine") -> SimpleNamespace:
    """The JSON request bodies with these limits: ``TextSearch``, ``ImageIdSearch``, ``ImageIdCompose``,
    ``Paraphrase``, and ``SearchImages`` (``ImageIdCompose`` when the object has an ``image_id``, else
    ``TextSearch``). The routes validate with them and the OpenAPI document shows their JSON Schema.
    ``similarity``: the model's, which bounds ``min_score``."""
    k = json_int_field(ge=1, le=max_k, description=f"number of results, 1 to {max_k}")
    image_id = json_int_field(ge=0, le=MAX_ID, description="id of a gallery image (from /v1/search/images)")
    # list[term], the term's limits known only now: built as the generic alias it is
    terms: Any = Annotated[GenericAlias(list, (_term(max_text_chars),)), Field(max_length=MAX_TERMS)]
    generated = json_int_field(ge=1, le=MAX_GENERATED)
    offset = json_int_field(ge=0, le=MAX_OFFSET, description=OFFSET_DESCRIPTION)
    min_score = Annotated[float, Field(**score_bounds(similarity)), BeforeValidator(json_number)]
    folder = Annotated[str, Field(max_length=max_text_chars, json_schema_extra={"minLength": 1, "pattern": NOT_BLANK}),
                       AfterValidator(check_text)]
    when = Annotated[str, WithJsonSchema(TIME_SCHEMA), AfterValidator(check_time)]

    def paging():
        return dict(k=(k, 10), offset=(offset, 0),
                    min_score=(min_score | None, Field(None, description=min_score_description(similarity))))

    def filters():
        return dict(folder=(folder | None, Field(None, description=FOLDER_DESCRIPTION, examples=["2024/summer"])),
                    taken_after=(when | None, Field(None, description=AFTER_DESCRIPTION, examples=["2024-06-01"])),
                    taken_before=(when | None, Field(None, description=BEFORE_DESCRIPTION,
                                                     examples=["2024-09-01T00:00:00Z"])),
                    media=(Literal[MEDIA_TYPES] | None, Field(None, description=MEDIA_DESCRIPTION,
                                                              examples=["video"])))

    models = SimpleNamespace(
        TextSearch=create_model(
            "TextSearch", __base__=_DateRange, __doc__="Images for a sentence, optionally minus some words' meaning.",
            text=(_text(max_text_chars, "a sentence describing the images to find", "a red circle"), ...),
            subtract=(terms, Field([], description=f"words or phrases whose meaning to take away from the "
                                                   f"sentence's (at most {MAX_TERMS})", examples=[["people"]])),
            **paging(), **filters()),
        ImageIdSearch=create_model("ImageIdSearch", __config__=_STRICT, image_id=(image_id, ...), **paging()),
        ImageIdCompose=create_model(
            "ImageIdCompose", __base__=_DateRange,
            __doc__="A composed query from a gallery image (W2VV §IV-C): its picture plus and/or minus words.",
            image_id=(image_id, ...),
            add=(terms, Field([], description=f"words or phrases whose meaning to add (at most {MAX_TERMS})",
                              examples=[["motorbike"]])),
            subtract=(terms, Field([], description=f"words or phrases whose meaning to take away (at most "
                                                   f"{MAX_TERMS})", examples=[["bicycle"]])),
            **paging(), **filters()),
        Paraphrase=create_model(
            "Paraphrase", __config__=_STRICT,
            text=(_text(max_text_chars, "the sentence to paraphrase", "a red circle left of a blue square"), ...),
            n=(generated, Field(5, description=f"number of paraphrases, 1 to {MAX_GENERATED}")),
            beam_size=(generated | None, Field(None, description="beam width (default: the model's "
                                                                 "decoder.beam_size); widened to n + 1 when "
                                                                 "smaller"))),
    )
    models.SearchImages = OneOf("image_id", with_key=models.ImageIdCompose, without_key=models.TextSearch)
    return models


# --- multipart forms ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FormField:
    """One field of a multipart form: ``kind`` is ``image`` (the file), ``int``, ``number``, ``terms`` (a
    comma-separated list of words or phrases), ``text`` (not blank), ``time`` (a date or RFC 3339 date-time) or
    ``choice`` (one of ``choices``). Each field may be given once."""
    name: str
    kind: str
    description: str
    minimum: float | None = 1
    maximum: float | None = None
    default: int | None = None
    required: bool = False
    choices: tuple[str, ...] = ()


def image_field(description: str) -> FormField:
    return FormField("image", "image", description, required=True)


def request_forms(max_k: int, similarity: str = "cosine") -> SimpleNamespace:
    """The multipart forms with these limits: ``SearchImages`` (query by example and composition),
    ``SearchCaptions`` and ``Captions``, each a list of :class:`FormField`. The routes parse with them
    (:func:`parse_form`) and the OpenAPI document is written from them (:func:`form_body`)."""
    lo, hi = SCORE_RANGES.get(similarity, (None, None))
    paging = [FormField("k", "int", f"number of results, 1 to {max_k}", maximum=max_k, default=10),
              FormField("offset", "int", OFFSET_DESCRIPTION, minimum=0, maximum=MAX_OFFSET, default=0),
              FormField("min_score", "number", min_score_description(similarity), minimum=lo, maximum=hi)]
    filters = [FormField("folder", "text", FOLDER_DESCRIPTION), FormField("taken_after", "time", AFTER_DESCRIPTION),
               FormField("taken_before", "time", BEFORE_DESCRIPTION),
               FormField("media", "choice", MEDIA_DESCRIPTION, choices=MEDIA_TYPES)]
    return SimpleNamespace(
        SearchImages=[image_field("the query image (query by example: similar gallery images)"),
                      FormField("add", "terms", f"words or phrases whose meaning to add, separated by commas (at "
                                                f"most {MAX_TERMS})"),
                      FormField("subtract", "terms", f"words or phrases whose meaning to take away, separated by "
                                                     f"commas (at most {MAX_TERMS})"),
                      *paging, *filters],
        SearchCaptions=[image_field("the image whose captions to rank"), *paging],
        Captions=[image_field("the image to caption"),
                  FormField("n", "int", f"number of captions, 1 to {MAX_GENERATED}", maximum=MAX_GENERATED,
                            default=1),
                  FormField("beam_size", "int", "beam width (default: the model's decoder.beam_size); widened to n "
                                                "when smaller", maximum=MAX_GENERATED)],
    )


def invalid(loc: tuple, msg: str, type_: str = "value_error", value: Any = None) -> RequestValidationError:
    """A 422 for one field, located and typed as FastAPI reports its own validation errors."""
    return RequestValidationError([{"type": type_, "loc": loc, "msg": msg, "input": value}])


def check_form_part(fields: list[FormField], name: str, is_file: bool) -> None:
    """A multipart part named ``name`` fills a field of the form: 422 for an unknown field, a file where a plain
    field goes or a plain field where the image goes."""
    field = next((f for f in fields if f.name == name), None)
    if field is None:
        raise invalid(("body", name), f"unknown form field {name!r}; the fields are "
                                      f"{', '.join(repr(f.name) for f in fields)}", "extra_forbidden")
    if field.kind == "image" and not is_file:
        raise invalid(("body", "image"), "the 'image' field must be a file part (with a filename)")
    if field.kind != "image" and is_file:
        raise invalid(("body", name), f"{name} must be a plain form field, not a file")


def parse_form(fields: list[FormField], values: dict[str, list[str]], max_text_chars: int) -> dict[str, Any]:
    """The plain fields of a multipart form (every value given for each name) → their values by name: integers
    (the default when absent), numbers, texts, times or lists of terms. 422 for a field given more than once, a
    value out of its bounds and an empty date range."""
    out: dict[str, Any] = {}
    for field in fields:
        given = values.get(field.name, [])
        if len(given) > 1:
            raise invalid(("body", field.name), f"{field.name} given {len(given)} times; give it once"
                          + (" (separate words or phrases by commas)" if field.kind == "terms" else ""))
        raw = given[0] if given else None
        if field.kind == "int":
            out[field.name] = _form_int(field, raw)
        elif field.kind == "number":
            out[field.name] = _form_number(field, raw)
        elif field.kind == "terms":
            out[field.name] = _form_terms(field.name, raw, max_text_chars)
        elif field.kind == "text":
            out[field.name] = _form_text(field.name, raw, max_text_chars)
        elif field.kind == "time":
            out[field.name] = _form_time(field.name, raw)
        elif field.kind == "choice":
            out[field.name] = _form_choice(field, raw)
    try:
        check_date_range(out.get("taken_after"), out.get("taken_before"))
    except ValueError as err:
        raise invalid(("body",), str(err)) from None
    return out


_NUMBER = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")
_INT = re.compile(r"[+-]?[0-9]{1,20}")


def _form_int(field: FormField, raw: str | None) -> int | None:
    if raw is None:
        return field.default
    value = int(raw) if _INT.fullmatch(raw.strip()) else None
    lo = field.minimum if field.minimum is not None else float("-inf")
    if value is None or value < lo or (field.maximum is not None and value > field.maximum):
        bounds = (f"an integer from {field.minimum} to {field.maximum}" if field.maximum is not None
                  else f"an integer of at least {field.minimum}")
        raise invalid(("body", field.name), f"{field.name} must be {bounds}", "int_parsing", raw)
    return value


def _form_number(field: FormField, raw: str | None) -> float | None:
    if raw is None:
        return None
    value = float(raw.strip()) if _NUMBER.fullmatch(raw.strip()) else None
    if value is None or value != value or value in (float("inf"), float("-inf")) \
            or (field.minimum is not None and value < field.minimum) \
            or (field.maximum is not None and value > field.maximum):
        lo, hi = field.minimum, field.maximum
        bounds = (f"a number from {lo:g} to {hi:g}" if lo is not None and hi is not None
                  else f"a number of at most {hi:g}" if hi is not None else "a number")
        raise invalid(("body", field.name), f"{field.name} must be {bounds}", "float_parsing", raw)
    return value


def _too_long(name: str, raw: str, max_chars: int) -> None:
    if len(raw) > max_chars:
        raise invalid(("body", name), f"{name} must be at most {max_chars} characters", "string_too_long")


def _form_text(name: str, raw: str | None, max_chars: int) -> str | None:
    if raw is None:
        return None
    _too_long(name, raw, max_chars)
    try:
        check_text(raw)
    except ValueError as err:
        raise invalid(("body", name), f"{name}: {err}") from None
    return raw


def _form_terms(name: str, raw: str | None, max_chars: int) -> list[str]:
    if raw is None:
        return []
    _too_long(name, raw, max_chars)
    try:
        return split_terms(raw)
    except ValueError as err:
        raise invalid(("body", name), str(err)) from None


def _form_time(name: str, raw: str | None) -> str | None:
    if raw is None:
        return None
    try:
        parse_time(raw, name)
    except ValueError as err:
        raise invalid(("body", name), str(err)) from None
    return raw


def _form_choice(field: FormField, raw: str | None) -> str | None:
    if raw is None or raw in field.choices:
        return raw
    raise invalid(("body", field.name), f"{field.name} must be one of {', '.join(map(repr, field.choices))}",
                  "literal_error", raw)


def form_schema(fields: list[FormField], max_upload_bytes: int, max_text_chars: int) -> dict:
    """The JSON Schema (and the per-part ``encoding``) of a multipart form; unknown fields are refused."""
    properties: dict[str, dict] = {}
    for f in fields:
        if f.kind == "image":
            schema = {"type": "string", "format": "binary", "minLength": 1,
                      "description": f"{f.description}: JPEG, PNG, GIF, WebP, BMP, TIFF, HEIC/HEIF or AVIF (the "
                                     f"content is sniffed; the part's content type and file name are not read),"
                                     f" at most {max_upload_bytes:,} bytes"}
        elif f.kind in ("int", "number"):
            schema = {"type": "integer" if f.kind == "int" else "number", "description": f.description}
            if f.minimum is not None:
                schema["minimum"] = f.minimum
            if f.maximum is not None:
                schema["maximum"] = f.maximum
            if f.default is not None:
                schema["default"] = f.default
        elif f.kind == "text":
            schema = {"type": "string", "minLength": 1, "maxLength": max_text_chars, "description": f.description,
                      "pattern": NOT_BLANK}
        elif f.kind == "time":
            schema = {**TIME_SCHEMA, "description": f.description}
        elif f.kind == "choice":
            schema = {"type": "string", "enum": list(f.choices), "description": f.description}
        else:
            schema = {"type": "string", "minLength": 1, "maxLength": max_text_chars, "description": f.description,
                      "pattern": TERM_LIST}
        properties[f.name] = schema
    return {"type": "object", "properties": properties, "additionalProperties": False,
            "required": [f.name for f in fields if f.required]}


def form_body(fields: list[FormField], max_upload_bytes: int, max_text_chars: int) -> dict:
    return {"schema": form_schema(fields, max_upload_bytes, max_text_chars),
            "encoding": {f.name: {"contentType": ", ".join(IMAGE_TYPES)} for f in fields if f.kind == "image"}}


# --- responses ------------------------------------------------------------------------------------------------------

class FieldError(BaseModel):
    loc: list[str | int] = Field(..., description="where: 'body', 'query' or 'path', then the field")
    msg: str
    type: str


class Error(BaseModel):
    """The one error body of every route."""
    detail: str = Field(..., description="what was wrong, in words")
    errors: list[FieldError] | None = Field(None, description="422 only: the field-level list")


ERROR_MEANINGS = {
    400: "the body cannot be parsed (malformed multipart or JSON bytes), or the image is empty, corrupt or "
         "truncated",
    401: "missing or wrong API key",
    404: "no such gallery image",
    408: "the request body arrived too slowly (JOINTSPACE_BODY_TIMEOUT_S plus 1 s per JOINTSPACE_BODY_MIN_RATE "
         "bytes); the connection is closed",
    409: "the loaded model has no sentence decoder, which this route needs (see /readyz: decoder)",
    413: "the request body or the image is too large (bytes or pixels)",
    415: "an unsupported content type, or an upload that is not an image this service reads",
    422: "a field is missing, of the wrong type, out of range, unknown or blank",
    503: "not ready yet, or overloaded: the request was shed (the queue, the upload buffer or the thumbnail slots "
         "were full, or its deadline passed before work began); retry after Retry-After seconds",
}
RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before retrying", "required": True,
                               "schema": {"type": "integer", "minimum": 1}}}


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    out: dict[int | str, dict[str, Any]] = {}
    for code in codes:
        out[code] = {"model": Error, "description": ERROR_MEANINGS[code]}
        if code == 503:
            out[code]["headers"] = RETRY_AFTER
    return out
