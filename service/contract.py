"""The HTTP contract: how a request body is read and documented, and the rules its fields share.

The request bodies are pydantic models, one per request (service/schemas.py). Their limits that come from the
app — ``k`` up to ``JOINTSPACE_MAX_K``, text up to ``JOINTSPACE_MAX_TEXT_CHARS`` characters, … — are
:class:`Bound` fields, given their numbers once per app by :func:`bind` (:class:`Limits`, from the settings). A
JSON body is validated by its model, whose JSON Schema the OpenAPI document at ``/openapi.json`` shows. A
multipart form's plain fields are validated by the same model (:class:`Form`: each value, a string, is converted
by the type the model's schema gives its field), and the form's schema in the document is that model's schema as
form fields, plus the ``image`` file part and its accepted types. So every bound, pattern and cross-field rule is
written once, and what the document allows is what the server accepts. An operation of the table of operations
(service/operations.py) names its body as :class:`Json` or :class:`Upload` (a form), bound per app.

Rules that JSON Schema spells differently from Python are written once, as a pattern both sides use:
``NOT_BLANK`` (text must contain a character that is not whitespace — whitespace as Python's ``str.isspace`` and
ECMAScript's ``\\s`` count it, listed by code point, so every regex engine reads the class alike) and ``TERM`` (a
word or phrase to add or subtract: not blank, no comma). Integers of a JSON body are JSON integers: ``5`` and
``5.0``, never ``"5"`` or ``true``.
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from types import GenericAlias
from typing import Annotated, Any, Callable, ClassVar, Generic, Literal, TypeVar

from fastapi.exceptions import RequestValidationError
from pydantic import (AfterValidator, BaseModel, BeforeValidator, Field, ValidationError, ValidationInfo,
                      WithJsonSchema, create_model)
from pydantic_core import ErrorDetails

from index.query import SCORE_RANGES, parse_time

from .settings import Settings

# ids are FAISS/SQLite int64, assigned from 0 up; the API takes them up to 2**53 - 1, the largest integer every JSON
# reader holds exactly (RFC 7493, I-JSON) — and FastAPI's OpenAPI document writes a bound as a float
MAX_ID = 2 ** 53 - 1
IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp", "image/bmp", "image/tiff", "image/heic",
               "image/heif", "image/avif")

# whitespace: str.isspace() and ECMAScript \s together, by code point (\ufeff is ECMAScript-only)
_WS = ("\\t\\n\\u000b\\f\\r\\u001c-\\u001f \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f"
       "\\u3000\\ufeff")
NOT_BLANK = f"[^{_WS}]"                          # searched: somewhere a character that is not whitespace
_PHRASE = f"[^,]*[^,{_WS}][^,]*"                  # not blank, no comma
TERM = f"^{_PHRASE}$"
_NOT_BLANK_RE, _TERM_RE = re.compile(NOT_BLANK), re.compile(TERM)


def term_list(max_terms: int) -> str:
    """The pattern of a form field of 1 to ``max_terms`` comma-separated words or phrases."""
    return f"^{_PHRASE}(,{_PHRASE}){{0,{max_terms - 1}}}$"


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


def check_time(value: str, info: ValidationInfo) -> str:
    """A filter time: a date or an RFC 3339 date-time (``index.query.parse_time``); kept as given."""
    parse_time(value, info.field_name or "the time")
    return value


# a date or an RFC 3339 date-time: what parse_time reads, exactly
TIME_SCHEMA = {"anyOf": [{"type": "string", "format": "date"}, {"type": "string", "format": "date-time"}]}
Time = Annotated[str, WithJsonSchema(TIME_SCHEMA), AfterValidator(check_time)]


def json_int_field(**constraints) -> Any:
    """An integer with ``Field`` constraints (they must come before the validator to reach the JSON Schema)."""
    return Annotated[int, Field(**constraints), BeforeValidator(json_int)]


def text_field(max_chars: int) -> Any:
    """Text of at most ``max_chars`` characters, not blank."""
    # minLength is what the pattern implies; the blank check says it in its own words ("must not be empty ...")
    return Annotated[str, Field(max_length=max_chars, json_schema_extra={"minLength": 1, "pattern": NOT_BLANK}),
                     AfterValidator(check_text)]


def terms_field(max_chars: int, max_terms: int) -> Any:
    """A list of at most ``max_terms`` words or phrases, each of at most ``max_chars`` characters."""
    term = Annotated[str, Field(max_length=max_chars, json_schema_extra={"minLength": 1, "pattern": TERM}),
                     AfterValidator(check_term)]
    return Annotated[GenericAlias(list, (term,)), Field(max_length=max_terms)]    # the term's limits known now


# --- limits from the app -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Limits:
    """The numbers the request bodies' :class:`Bound` fields take: the app's settings, and the served model's
    similarity (which bounds ``min_score``)."""
    max_k: int
    max_text_chars: int
    max_terms: int
    max_generated: int
    similarity: str

    @classmethod
    def of(cls, settings: Settings, similarity: str = "cosine") -> Limits:
        return cls(settings.max_k, settings.max_text_chars, settings.max_terms, settings.max_generated, similarity)

    @property
    def score_bounds(self) -> dict[str, float]:
        """``ge``/``le`` of ``min_score`` (cosine: −1 to 1; order: at most 0)."""
        lo, hi = SCORE_RANGES.get(self.similarity, (None, None))
        return {k: v for k, v in (("ge", lo), ("le", hi)) if v is not None}

    def describe(self, text: str) -> str:
        """``text`` with the limits named in it (``{max_k}``, ``{score_range}``, …) filled in."""
        lo, hi = SCORE_RANGES.get(self.similarity, (None, None))
        score_range = f"{lo:g} to {hi:g}" if lo is not None else f"at most {hi:g}"
        return text.format(**dataclasses.asdict(self), score_range=score_range)


@dataclass(frozen=True)
class Bound:
    """Marks a request field whose type depends on the app's :class:`Limits`: ``make(limits)`` is that type. The
    field's description may name the limits (``"1 to {max_k}"``). A model with such a field validates only once
    :func:`bind` has given it its limits (its class sets ``defer_build``, and an unbound field refuses to build)."""
    make: Callable[[Limits], Any]

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        raise TypeError("a field bounded by the app's limits: validate with the bound model (service.contract.bind, "
                        "or service.schemas.request_models)")


M = TypeVar("M", bound=BaseModel)


def bind(model: type[M], limits: Limits) -> type[M]:
    """``model`` with its :class:`Bound` fields given these limits: a subclass of the same name, which the routes
    validate with and the OpenAPI document shows."""
    fields: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        bound = next((m for m in info.metadata if isinstance(m, Bound)), None)
        if bound is not None:
            fields[name] = (bound.make(limits), Field(info.default, examples=info.examples,
                                                      description=limits.describe(info.description or "")))
    out = create_model(model.__name__, __base__=model, __doc__=model.__doc__, __module__=model.__module__,
                       **fields)
    out.model_config = {**model.model_config, "defer_build": False}     # built now, not on its first request
    out.model_rebuild(force=True)
    return out


# --- multipart forms ----------------------------------------------------------------------------------------------

def invalid(loc: tuple, msg: str, type_: str = "value_error", value: Any = None) -> RequestValidationError:
    """A 422 for one field, located and typed as FastAPI reports its own validation errors."""
    return RequestValidationError([{"type": type_, "loc": loc, "msg": msg, "input": value}])


def _not_null(schema: dict) -> dict:
    """A field's JSON Schema without its ``null`` alternative (a form field is absent instead) and title."""
    out = {k: v for k, v in schema.items() if k not in ("anyOf", "title")}
    if "anyOf" in schema:
        options = [s for s in schema["anyOf"] if s != {"type": "null"}]
        out.update(options[0] if len(options) == 1 else {"anyOf": options})
    return out


def _form_field(schema: dict) -> dict:
    """A field's JSON Schema as a form field's: no ``null`` default, and a list of words or phrases as one string
    of them separated by commas."""
    schema = {k: v for k, v in schema.items() if not (k == "default" and v in (None, []))}
    if schema.get("type") != "array":
        return schema
    examples = {"examples": [",".join(e) for e in schema["examples"]]} if "examples" in schema else {}
    return {"type": "string", "minLength": 1, "maxLength": schema["items"]["maxLength"],
            "pattern": term_list(schema["maxItems"]), "description": f"{schema['description']}, separated by commas",
            **examples}


_INT = re.compile(r"[+-]?[0-9]{1,20}")
_NUMBER = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")


def _bound_text(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


class Form(Generic[M]):
    """A multipart form: an ``image`` file part (described as ``image``) and the plain fields of ``model``, each
    given at most once. A form's values are strings: each is converted by the type the model's JSON Schema gives
    its field — an integer, a number, a list of words or phrases (one value, separated by commas), else the string
    itself — and the whole form is then validated by ``model``, as its JSON body would be. Errors are located
    ``("body", field)``; a number's error names its bounds."""

    def __init__(self, model: type[M], image: str):
        self.model, self.image = model, image
        schema = model.model_json_schema()
        fields = {name: _not_null(prop) for name, prop in schema["properties"].items()}
        self.kinds = {name: prop.get("type") for name, prop in fields.items()}
        self.fields = {name: _form_field(prop) for name, prop in fields.items()}
        self.required = ["image", *schema.get("required", [])]

    def openapi(self, max_upload_bytes: int) -> dict:
        """The form's request body in the OpenAPI document: its JSON Schema and the image part's ``encoding``."""
        image = {"type": "string", "format": "binary", "minLength": 1,
                 "description": f"{self.image}: JPEG, PNG, GIF, WebP, BMP, TIFF, HEIC/HEIF or AVIF (the content is "
                                f"sniffed; the part's content type and file name are not read), at most "
                                f"{max_upload_bytes:,} bytes"}
        return {"schema": {"type": "object", "properties": {"image": image, **self.fields},
                           "additionalProperties": False, "required": self.required},
                "encoding": {"image": {"contentType": ", ".join(IMAGE_TYPES)}}}

    def check_part(self, name: str, is_file: bool) -> None:
        """A part named ``name`` fills a field of the form: 422 for an unknown field, a file where a plain field
        goes or a plain field where the image goes."""
        if name != "image" and name not in self.fields:
            names = ", ".join(repr(n) for n in ("image", *self.fields))
            raise invalid(("body", name), f"unknown form field {name!r}; the fields are {names}", "extra_forbidden")
        if name == "image" and not is_file:
            raise invalid(("body", "image"), "the 'image' field must be a file part (with a filename)")
        if name != "image" and is_file:
            raise invalid(("body", name), f"{name} must be a plain form field, not a file")

    def parse(self, values: dict[str, list[str]]) -> M:
        """The plain fields (every value given for each name) validated by the model; 422 for a field given more
        than once, a value that is not of its field's type or out of its bounds, and whatever the model refuses."""
        data: dict[str, Any] = {}
        for name, given in values.items():
            if len(given) > 1:
                raise invalid(("body", name), f"{name} given {len(given)} times; give it once"
                              + (" (separate words or phrases by commas)" if self.kinds[name] == "array" else ""))
            data[name] = self._value(name, given[0])
        try:
            return self.model.model_validate(data)
        except ValidationError as err:
            raise RequestValidationError([self._located(e) for e in err.errors(include_url=False)]) from None

    def _value(self, name: str, raw: str) -> Any:
        kind = self.kinds[name]
        if kind in ("integer", "number"):
            pattern, number = (_INT, int) if kind == "integer" else (_NUMBER, float)
            value = number(raw) if pattern.fullmatch(raw.strip()) else None
            if value is None or not math.isfinite(value):
                raise RequestValidationError([self._number_error(name, raw)])
            return value
        if kind == "array":
            limit = self.fields[name]["maxLength"]
            if len(raw) > limit:
                raise invalid(("body", name), f"{name} must be at most {limit} characters", "string_too_long")
            return [term.strip() for term in raw.split(",")]
        return raw

    def _located(self, error: ErrorDetails) -> dict:
        name = str(error["loc"][0]) if error["loc"] else None     # a list item: located at its field
        if name is not None and self.kinds[name] in ("integer", "number"):
            return self._number_error(name, error["input"])
        return {**error, "loc": ("body",) if name is None else ("body", name)}

    def _number_error(self, name: str, value: Any) -> dict:
        field = self.fields[name]
        lo, hi = field.get("minimum"), field.get("maximum")
        what = "an integer" if field["type"] == "integer" else "a number"
        bounds = (f" from {_bound_text(lo)} to {_bound_text(hi)}" if lo is not None and hi is not None
                  else f" of at least {_bound_text(lo)}" if lo is not None
                  else f" of at most {_bound_text(hi)}" if hi is not None else "")
        return {"type": "int_parsing" if field["type"] == "integer" else "float_parsing", "loc": ("body", name),
                "msg": f"{name} must be {what}{bounds}", "input": value}


# --- a body as an operation declares it ------------------------------------------------------------------------

@dataclass(frozen=True)
class Json(Generic[M]):
    """A JSON body validated by ``model``. On a route that takes several JSON bodies, the object's keys choose
    one: the body whose ``when`` key the object has, else the one without a ``when`` (the document states them as
    ``oneOf``: each model refuses the other's fields)."""
    model: type[M]
    when: str | None = None
    kind: ClassVar[Literal["json"]] = "json"

    def bind(self, limits: Limits) -> type[M]:
        return bind(self.model, limits)


@dataclass(frozen=True)
class Upload(Generic[M]):
    """A multipart form (:class:`Form`): an ``image`` file part, described as ``image``, and ``model``'s fields."""
    model: type[M]
    image: str
    kind: ClassVar[Literal["form"]] = "form"

    def bind(self, limits: Limits) -> Form[M]:
        return Form(bind(self.model, limits), self.image)


@dataclass(frozen=True)
class Uploaded(Generic[M]):
    """A multipart form as read: the image's bytes and the other fields, validated."""
    image: bytes
    fields: M


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
         "truncated, or the request carries two X-API-Key headers or two Bearer tokens",
    401: "missing or wrong API key",
    404: "no such gallery image",
    408: "the request body arrived too slowly (JOINTSPACE_BODY_TIMEOUT_S plus 1 s per JOINTSPACE_BODY_MIN_RATE "
         "bytes); the connection is closed",
    409: "the loaded model has no sentence decoder, which this route needs (see /readyz: decoder)",
    413: "the request body or the image is too large (bytes or pixels)",
    415: "an unsupported content type, or an upload that is not an image this service reads",
    422: "a field is missing, of the wrong type, out of range, unknown or blank",
    429: "too many wrong API keys from this client address: retry after Retry-After seconds",
    503: "not ready yet, or overloaded: the request was shed (the queue, the upload buffer or the thumbnail slots "
         "were full, or its deadline passed before work began); retry after Retry-After seconds",
}
RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before retrying", "required": True,
                               "schema": {"type": "integer", "minimum": 1}}}


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    out: dict[int | str, dict[str, Any]] = {}
    for code in codes:
        out[code] = {"model": Error, "description": ERROR_MEANINGS[code]}
        if code in (429, 503):
            out[code]["headers"] = RETRY_AFTER
    return out
