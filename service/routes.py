"""The ``/v1`` API: text (or an image ± words) → images, image → captions, gallery images, and the decoder routes
(image → generated captions, sentence → paraphrases).

The request bodies, their limits and the OpenAPI document that states them are in service/contract.py; the
routes validate with the same definitions. Errors: service/contract.py ``ERROR_MEANINGS`` (400, 401, 404, 409,
413, 415, 422, 503), always JSON ``{"detail": "..."}``."""
from __future__ import annotations

import asyncio
import json
import pathlib
import re
import secrets
import time

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, Response
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from pydantic import ValidationError
from starlette.datastructures import UploadFile

from .batcher import DeadlineExceeded, Shed
from index.query import MAX_OFFSET, SCORE_RANGES, ImageFilter, UnknownFolderError, format_time, parse_time

from .contract import (AFTER_DESCRIPTION, BEFORE_DESCRIPTION, FOLDER_DESCRIPTION, IMAGE_TYPES, MAX_GENERATED, MAX_ID,
                       MAX_TERMS, OFFSET_DESCRIPTION, FormField, check_text, error_responses, image_field,
                       min_score_description, split_terms)
from .engine import Options
from .images import ImageError, media_type_of, thumbnail, upload_to_pixels
from .middleware import ARRIVAL
from .schemas import (CaptionHit, CaptionResults, Folder, Folders, GeneratedCaptions, GeneratedText, ImageHit,
                      ImageResults, Paraphrases)
from .state import ServiceState

_api_key_header = APIKeyHeader(name="X-API-Key", auto_error=False, description="the key set as JOINTSPACE_API_KEY")
_bearer = HTTPBearer(auto_error=False, description="the key set as JOINTSPACE_API_KEY")


async def service(request: Request) -> ServiceState:
    # dependencies are ``async def`` on purpose: FastAPI runs plain ``def`` ones in a worker thread, a thread
    # hop per request (text search at concurrency 32 on the dev machine: 437 → 556 req/s without it)
    state: ServiceState = request.app.state.service
    if not state.ready:
        detail = f"not ready: {state.error}" if state.error else "not ready: the model and index are loading"
        raise HTTPException(503, detail, headers={"Retry-After": "5"})
    return state


def _given_keys(request: Request) -> list[str | None]:
    """Every credential the request carries: each X-API-Key header, each Authorization header's Bearer token
    (None for an Authorization header of another scheme)."""
    given: list[str | None] = list(request.headers.getlist("x-api-key"))
    for value in request.headers.getlist("authorization"):
        scheme, _, token = value.strip().partition(" ")
        given.append(token.strip() if scheme.lower() == "bearer" and token.strip() else None)
    return given


async def require_api_key(request: Request, key: str | None = Depends(_api_key_header),
                          bearer: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> None:
    """With ``JOINTSPACE_API_KEY`` set (the app then adds this dependency to ``/v1``): the key as ``X-API-Key``
    or as ``Authorization: Bearer`` — either, as the OpenAPI document's two alternative security schemes say."""
    expected = request.app.state.service.settings.api_key
    if expected is None:
        return
    want = expected.get_secret_value().encode()
    matches = [secrets.compare_digest(g.encode(), want) for g in _given_keys(request) if g is not None]
    if not any(matches):
        raise HTTPException(401, "missing or wrong API key (send it as X-API-Key: KEY or Authorization: Bearer KEY)",
                            headers={"WWW-Authenticate": "Bearer"})


router = APIRouter(prefix="/v1")

# error responses per route (the 401 is added to every /v1 route when a key is set: service/app.py)
_POST = (400, 413, 415, 422, 503)


def _shed(err: Shed, state: ServiceState) -> HTTPException:
    why = ("its deadline passed before work on it began" if isinstance(err, DeadlineExceeded)
           else "too many requests are waiting")
    return HTTPException(503, f"the service is overloaded: {why}; retry after {state.settings.retry_after_s} s",
                         headers={"Retry-After": str(state.settings.retry_after_s)})


def _deadline(request: Request, state: ServiceState) -> float | None:
    return state.deadline(request.scope.get("state", {}).get(ARRIVAL))


def _check_deadline(request: Request, state: ServiceState, name: str) -> None:
    """Sheds a request whose deadline has passed before expensive work (decoding an image) is spent on it."""
    deadline = _deadline(request, state)
    if deadline is not None and time.monotonic() >= deadline:
        state.metrics.shed.labels(name, DeadlineExceeded.reason).inc()
        raise _shed(DeadlineExceeded(), state)


async def _submit(batcher, item, state: ServiceState, request: Request):
    try:
        return await batcher.submit(item, deadline=_deadline(request, state))
    except Shed as err:
        raise _shed(err, state) from None


def _invalid(loc: tuple, msg: str, type_: str = "value_error", value=None) -> RequestValidationError:
    return RequestValidationError([{"type": type_, "loc": loc, "msg": msg, "input": value}])


async def _read_form(request: Request, state: ServiceState, spec: list[FormField]) -> tuple[bytes, dict]:
    """A multipart form checked against ``spec`` (the same list its OpenAPI schema is written from): the
    ``image`` file's bytes (size-checked) and the other fields by name — integers, or lists of terms. Unknown
    fields, a repeated field that is not a list, and a missing image are 422; an empty image is 400."""
    kinds = {f.name: f for f in spec}
    async with request.form(max_files=1, max_fields=len(spec)) as form:
        items = list(form.multi_items())
        upload = None
        values: dict[str, list[str]] = {}
        for name, value in items:
            field = kinds.get(name)
            if field is None:
                raise _invalid(("body", name), f"unknown form field {name!r}; the fields are "
                                               f"{', '.join(repr(f.name) for f in spec)}", "extra_forbidden")
            if field.kind == "image":
                if not isinstance(value, UploadFile):
                    raise _invalid(("body", "image"), "the 'image' field must be a file part (with a filename)")
                upload = value
                continue
            if not isinstance(value, str):
                raise _invalid(("body", name), f"{name} must be a plain form field, not a file")
            values.setdefault(name, []).append(value)
        if upload is None:
            raise _invalid(("body", "image"), "a multipart file field named 'image' is required", "missing")
        data = await upload.read(state.settings.max_upload_bytes + 1)
    if len(data) > state.settings.max_upload_bytes:
        raise HTTPException(413, f"image upload larger than {state.settings.max_upload_bytes:,} bytes")
    if not data:
        raise HTTPException(400, "the image file is empty")
    fields: dict = {}
    for field in spec:
        given = values.get(field.name, [])
        if len(given) > 1:
            raise _invalid(("body", field.name), f"{field.name} given {len(given)} times; give it once"
                           + (" (separate words or phrases by commas)" if field.kind == "terms" else ""))
        raw = given[0] if given else None
        if field.kind == "int":
            fields[field.name] = _form_int(field, raw)
        elif field.kind == "terms":
            fields[field.name] = _form_terms(field.name, raw, state) if raw is not None else []
        elif field.kind == "number":
            fields[field.name] = _form_number(field, raw)
        elif field.kind == "text":
            fields[field.name] = _form_text(field.name, raw, state)
        elif field.kind == "time":
            fields[field.name] = _form_time(field.name, raw)
    if fields.get("taken_after") is not None and fields.get("taken_before") is not None:
        if parse_time(fields["taken_after"]) >= parse_time(fields["taken_before"]):
            raise _invalid(("body",), f"taken_after ({fields['taken_after']}) must be earlier than taken_before "
                                      f"({fields['taken_before']}): the date range is empty")
    return data, fields


_NUMBER = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")


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
        raise _invalid(("body", field.name), f"{field.name} must be {bounds}", "float_parsing", raw)
    return value


def _form_text(name: str, raw: str | None, state: ServiceState) -> str | None:
    if raw is None:
        return None
    if len(raw) > state.settings.max_text_chars:
        raise _invalid(("body", name), f"{name} must be at most {state.settings.max_text_chars} characters",
                       "string_too_long")
    try:
        check_text(raw)
    except ValueError as err:
        raise _invalid(("body", name), f"{name}: {err}") from None
    return raw


def _form_time(name: str, raw: str | None) -> str | None:
    if raw is None:
        return None
    try:
        parse_time(raw, name)
    except ValueError as err:
        raise _invalid(("body", name), str(err)) from None
    return raw


def _form_int(field: FormField, raw: str | None) -> int | None:
    if raw is None:
        return field.default
    value = int(raw) if re.fullmatch(r"[+-]?[0-9]{1,20}", raw.strip()) else None
    if value is None or value < field.minimum or (field.maximum is not None and value > field.maximum):
        bounds = (f"an integer from {field.minimum} to {field.maximum}" if field.maximum is not None
                  else f"an integer of at least {field.minimum}")
        raise _invalid(("body", field.name), f"{field.name} must be {bounds}", "int_parsing", raw)
    return value


def _form_terms(name: str, value: str, state: ServiceState) -> list[str]:
    if len(value) > state.settings.max_text_chars:
        raise _invalid(("body", name), f"{name} must be at most {state.settings.max_text_chars} characters",
                       "string_too_long")
    try:
        return split_terms(value)
    except ValueError as err:
        raise _invalid(("body", name), str(err)) from None


def _k_field(state: ServiceState) -> FormField:
    return FormField("k", "int", f"number of results, 1 to {state.settings.max_k}", maximum=state.settings.max_k,
                     default=10)


def _paging_fields(state: ServiceState) -> list[FormField]:
    lo, hi = SCORE_RANGES.get(state.similarity, (None, None))
    return [_k_field(state),
            FormField("offset", "int", OFFSET_DESCRIPTION, minimum=0, maximum=MAX_OFFSET, default=0),
            FormField("min_score", "number", min_score_description(state.similarity), minimum=lo, maximum=hi)]


def _filter_fields() -> list[FormField]:
    return [FormField("folder", "text", FOLDER_DESCRIPTION), FormField("taken_after", "time", AFTER_DESCRIPTION),
            FormField("taken_before", "time", BEFORE_DESCRIPTION)]


def search_images_form(state: ServiceState) -> list[FormField]:
    return [image_field("the query image (query by example: similar gallery images)"),
            FormField("add", "terms", f"words or phrases whose meaning to add, separated by commas (at most "
                                      f"{MAX_TERMS})"),
            FormField("subtract", "terms", f"words or phrases whose meaning to take away, separated by commas (at "
                                           f"most {MAX_TERMS})"),
            *_paging_fields(state), *_filter_fields()]


def search_captions_form(state: ServiceState) -> list[FormField]:
    return [image_field("the image whose captions to rank"), *_paging_fields(state)]


def captions_form(state: ServiceState) -> list[FormField]:
    return [image_field("the image to caption"),
            FormField("n", "int", f"number of captions, 1 to {MAX_GENERATED}", maximum=MAX_GENERATED, default=1),
            FormField("beam_size", "int", "beam width (default: the model's decoder.beam_size); widened to n when "
                                          "smaller", maximum=MAX_GENERATED)]


async def _pixels(data: bytes, state: ServiceState, request: Request, name: str):
    _check_deadline(request, state, name)
    loop = asyncio.get_running_loop()
    try:
        return await loop.run_in_executor(state.decode_pool, upload_to_pixels, data, state.settings.max_pixels,
                                          state.model.preprocess)
    except ImageError as err:
        raise HTTPException(err.status, err.detail) from None


def _content_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def _is_json(content_type: str) -> bool:
    return content_type == "application/json" or (content_type.startswith("application/")
                                                  and content_type.endswith("+json"))


async def _json_object(request: Request):
    """The request's JSON body, with FastAPI's own errors for a missing or malformed one."""
    body = await request.body()
    if not body:
        raise RequestValidationError([{"type": "missing", "loc": ("body",), "input": None, "msg": "Field required"}])
    try:
        return json.loads(body)
    except json.JSONDecodeError as err:
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body", err.pos), "input": {},
                                       "msg": "JSON decode error", "ctx": {"error": err.msg}}]) from None
    except (UnicodeDecodeError, RecursionError):
        raise HTTPException(400, "There was an error parsing the body") from None


def _validate(model, obj):
    """``model.model_validate(obj)``, its errors located in the body as FastAPI reports them for a body model."""
    try:
        return model.model_validate(obj, from_attributes=True)     # FastAPI's mode: its message for a non-object
    except ValidationError as err:
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])}
                                      for e in err.errors(include_url=False)]) from None


def _no_composition(state: ServiceState) -> None:
    if getattr(state.model, "attention", None) is not None:
        raise HTTPException(409, "query composition (an image ± words) needs a model that embeds an image as one "
                                 "vector; the loaded model uses region attention (STT-ATT)")


def _gallery_file(image_id: int, state: ServiceState) -> pathlib.Path:
    """The file of a gallery image; 404 when the id is unknown or the file is gone."""
    row = state.gallery.meta.image(image_id)
    if row is None:
        raise HTTPException(404, f"no gallery image with id {image_id}")
    path = pathlib.Path(row.path)
    if not path.is_file():
        raise HTTPException(404, f"gallery image {image_id} is no longer on disk")
    return path


async def _gallery_pixels(image_id: int, state: ServiceState, request: Request):
    """A gallery image's file, decoded and preprocessed like an upload; 404 when unknown or gone."""
    path = _gallery_file(image_id, state)
    _check_deadline(request, state, "compose")
    loop = asyncio.get_running_loop()
    try:
        return await loop.run_in_executor(state.decode_pool, upload_to_pixels, path, state.settings.max_pixels,
                                          state.model.preprocess)
    except ImageError as err:
        raise HTTPException(404 if err.status == 415 else err.status,
                            f"gallery image {image_id}: {err.detail}") from None


async def _options(state: ServiceState, k: int, offset: int = 0, min_score: float | None = None,
                   folder: str | None = None, taken_after: str | None = None, taken_before: str | None = None,
                   subtract=()) -> Options:
    """A search's :class:`Options`; a filter is resolved to the image ids it lets through (off the event loop: the
    first filter of a generation reads its photo table). A folder without images: 404."""
    flt = ImageFilter.parse(folder, taken_after, taken_before)       # already validated: no ValueError here
    allowed = None
    if flt.active:
        loop = asyncio.get_running_loop()
        try:
            allowed = await loop.run_in_executor(state.decode_pool, state.gallery.allowed_ids, flt)
        except UnknownFolderError as err:
            raise HTTPException(404, err.public) from None
    return Options(k=k, offset=offset, min_score=min_score, allowed=allowed, subtract=tuple(subtract))


def _image_hits(hits, state: ServiceState, root: str) -> list[ImageHit]:
    gallery = state.gallery
    rows = gallery.meta.images([i for i, _ in hits])
    out = []
    for i, s in hits:
        row = rows.get(i)
        out.append(ImageHit(id=i, score=s, uri=f"{root}/v1/images/{i}",
                            taken=format_time(row.taken) if row else None,
                            folder=gallery.photos.relative(row.folder) if row and row.folder else None,
                            width=row.width if row else None, height=row.height if row else None))
    return out


@router.post("/search/images", response_model=ImageResults, responses=error_responses(*_POST, 404, 409),
             summary="Text → gallery images, or a photo (± words) → similar gallery images; best first, filtered, "
                     "paged",
             description="JSON `{\"text\", \"subtract\", \"k\", ...}`: images for a sentence, minus the meaning "
                         "of the `subtract` words. Query by example and composition (W2VV §IV-C): multipart "
                         "`image` (+ `add`, `subtract`, `k`, ...) — an uploaded photo — or JSON `{\"image_id\", "
                         "\"add\", \"subtract\", \"k\", ...}` for a gallery image: images like the query image, "
                         "with the meaning of the `add` words added and of the `subtract` words taken away. Every "
                         "form also takes `offset` and `min_score` (paging and threshold) and the filters `folder`, "
                         "`taken_after`, `taken_before` (applied inside the index search: the best `k` of the "
                         "images that pass). An unknown folder is 404; an empty date range 422. A model with region "
                         "attention (STT-ATT) cannot compose: 409.")
async def search_images(request: Request, state: ServiceState = Depends(service)):
    content_type = _content_type(request)
    if content_type == "multipart/form-data":
        data, fields = await _read_form(request, state, search_images_form(state))
        _no_composition(state)
        opts = await _options(state, fields["k"], fields["offset"], fields["min_score"], fields["folder"],
                              fields["taken_after"], fields["taken_before"])
        pixels = await _pixels(data, state, request, "compose")
        hits = await _submit(state.compose_batcher, (pixels, tuple(fields["add"]), tuple(fields["subtract"]), opts),
                             state, request)
    elif _is_json(content_type):
        obj = await _json_object(request)
        if isinstance(obj, dict) and "image_id" in obj:
            body = _validate(state.bodies.ImageIdCompose, obj)
            _no_composition(state)
            opts = await _options(state, body.k, body.offset, body.min_score, body.folder, body.taken_after,
                                  body.taken_before)
            pixels = await _gallery_pixels(body.image_id, state, request)
            hits = await _submit(state.compose_batcher, (pixels, tuple(body.add), tuple(body.subtract), opts),
                                 state, request)
        else:
            body = _validate(state.bodies.TextSearch, obj)
            opts = await _options(state, body.k, body.offset, body.min_score, body.folder, body.taken_after,
                                  body.taken_before, body.subtract)
            hits = await _submit(state.text_batcher, (body.text, opts), state, request)
    else:
        raise HTTPException(415, "send JSON {\"text\": ..., \"k\": ...}, or for a composed query multipart/form-data "
                                 "with an 'image' file (and optional 'add', 'subtract', 'k') or JSON "
                                 "{\"image_id\": ..., \"add\": [...], \"subtract\": [...], \"k\": ...}")
    return ImageResults(results=_image_hits(hits, state, request.scope.get("root_path", "")))


@router.post("/search/captions", response_model=CaptionResults, responses=error_responses(*_POST, 404),
             summary="Image (upload, or a gallery image id) → captions of the corpus, best first (paged, with a "
                     "threshold)")
async def search_captions(request: Request, state: ServiceState = Depends(service)):
    content_type = _content_type(request)
    if content_type == "multipart/form-data":
        data, fields = await _read_form(request, state, search_captions_form(state))
        opts = Options(k=fields["k"], offset=fields["offset"], min_score=fields["min_score"])
        pixels = await _pixels(data, state, request, "image")
        hits = await _submit(state.image_batcher, (pixels, opts), state, request)
    elif _is_json(content_type):
        body = _validate(state.bodies.ImageIdSearch, await _json_object(request))
        _check_deadline(request, state, "direct")
        opts = Options(k=body.k, offset=body.offset, min_score=body.min_score)
        loop = asyncio.get_running_loop()
        try:
            hits = await loop.run_in_executor(state.compute_pool, state.engine.search_image_id, body.image_id, opts)
        except KeyError:
            raise HTTPException(404, f"no gallery image with id {body.image_id}") from None
    else:
        raise HTTPException(415, "send multipart/form-data with an 'image' file (and optional 'k'), "
                                 "or JSON {\"image_id\": ..., \"k\": ...}")
    rows = state.gallery.meta.captions([i for i, _ in hits])
    return CaptionResults(results=[CaptionHit(caption=rows[i].text, score=s, id=i) for i, s in hits if i in rows])


@router.get("/folders", response_model=Folders, responses=error_responses(503),
            summary="The gallery's folders (for the folder filter), with how many images each holds directly")
async def folders(state: ServiceState = Depends(service)):
    loop = asyncio.get_running_loop()
    photos = await loop.run_in_executor(state.decode_pool, lambda: state.gallery.photos)
    return Folders(folders=[Folder(folder=f, images=n) for f, n in photos.folder_counts()])


@router.get("/images/{image_id}", responses={**error_responses(404, 422, 503), 200: {
                "content": {t: {"schema": {"type": "string", "format": "binary"}} for t in IMAGE_TYPES},
                "description": "the image file (its sniffed type), or with ?size= a JPEG thumbnail"}},
            response_class=Response, summary="A gallery image file, or a JPEG thumbnail with ?size=")
async def get_image(image_id: int = Path(..., ge=0, le=MAX_ID), state: ServiceState = Depends(service),
                    size: int | None = Query(None, ge=16, description="longest side of a JPEG thumbnail")):
    if size is not None and size > state.settings.max_thumbnail:
        raise RequestValidationError([{"type": "less_than_equal", "loc": ("query", "size"), "input": size,
                                       "msg": f"size must be at most {state.settings.max_thumbnail}"}])
    path = _gallery_file(image_id, state)
    headers = {"Cache-Control": "public, max-age=3600"}
    if size is None:
        return FileResponse(path, media_type=media_type_of(path), headers=headers)
    loop = asyncio.get_running_loop()
    try:
        data, media = await loop.run_in_executor(state.decode_pool, thumbnail, path, size, state.settings.max_pixels)
    except ImageError as err:
        raise HTTPException(404 if err.status == 415 else err.status, f"gallery image {image_id}: {err.detail}")
    return Response(data, media_type=media, headers=headers)


def _needs_decoder(state: ServiceState, what: str) -> None:
    if not state.has_decoder:
        raise HTTPException(409, f"{what} needs a model with a sentence decoder (Show, Translate and Tell); the "
                                 f"loaded model '{state.model.cfg.get('name', '')}' was trained without one "
                                 f"(decoder.enabled: false): serve an STT model, e.g. one trained with "
                                 f"configs/stt.yaml")


def _generated(results) -> list[GeneratedText]:
    return [GeneratedText(text=text, score=score) for text, score in results]


DECODER_NOTE = ("Needs a model with a sentence decoder (Show, Translate and Tell; `/readyz` says `\"decoder\": "
                "true`); with any other model this route answers 409 and says why.")


@router.post("/captions", response_model=GeneratedCaptions, responses=error_responses(*_POST, 409),
             summary="Image → generated captions, best first (needs a model with a decoder)",
             description=DECODER_NOTE, openapi_extra={"x-requires-decoder": True})
async def captions(request: Request, state: ServiceState = Depends(service)):
    _needs_decoder(state, "caption generation")
    if _content_type(request) != "multipart/form-data":
        raise HTTPException(415, "send multipart/form-data with an 'image' file (and optional 'n', 'beam_size')")
    data, fields = await _read_form(request, state, captions_form(state))
    pixels = await _pixels(data, state, request, "caption")
    results = await _submit(state.caption_batcher, (pixels, fields["n"], fields["beam_size"]), state, request)
    return GeneratedCaptions(captions=_generated(results))


@router.post("/paraphrases", response_model=Paraphrases, responses=error_responses(*_POST, 409),
             summary="Sentence → paraphrases, best first, never the sentence itself (needs a model with a decoder)",
             description=DECODER_NOTE, openapi_extra={"x-requires-decoder": True})
async def paraphrases(request: Request, state: ServiceState = Depends(service)):
    _needs_decoder(state, "paraphrase generation")
    if not _is_json(_content_type(request)):
        raise HTTPException(415, "send JSON {\"text\": ..., \"n\": ..., \"beam_size\": ...}")
    body = _validate(state.bodies.Paraphrase, await _json_object(request))
    results = await _submit(state.paraphrase_batcher, (body.text, body.n, body.beam_size), state, request)
    return Paraphrases(paraphrases=_generated(results))
