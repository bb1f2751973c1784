"""The ``/v1`` API: text (or an image ± words) → images, image → captions, gallery images, and the decoder routes
(image → generated captions, sentence → paraphrases)."""
from __future__ import annotations

import asyncio
import json
import pathlib
import secrets

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, Response
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from pydantic import ValidationError
from starlette.datastructures import ImmutableMultiDict, UploadFile

from .batcher import QueueFull
from .images import ImageError, media_type_of, thumbnail, upload_to_pixels
from .schemas import (MAX_GENERATED, MAX_ID, MAX_TERMS, CaptionHit, CaptionResults, Error, GeneratedCaptions,
                      GeneratedText, ImageHit, ImageIdCompose, ImageIdSearch, ImageResults, Paraphrase, Paraphrases,
                      TextSearch)
from .state import ServiceState

_api_key_header = APIKeyHeader(name="X-API-Key", auto_error=False, description="JOINTSPACE_API_KEY, when set")
_bearer = HTTPBearer(auto_error=False, description="JOINTSPACE_API_KEY, when set")


async def service(request: Request) -> ServiceState:
    # dependencies are ``async def`` on purpose: FastAPI runs plain ``def`` ones in a worker thread, a thread
    # hop per request (text search at concurrency 32 on the dev machine: 437 → 556 req/s without it)
    state: ServiceState = request.app.state.service
    if not state.ready:
        detail = f"not ready: {state.error}" if state.error else "not ready: the model and index are loading"
        raise HTTPException(503, detail, headers={"Retry-After": "5"})
    return state


async def require_api_key(request: Request, key: str | None = Depends(_api_key_header),
                    bearer: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> None:
    expected = request.app.state.service.settings.api_key
    if expected is None:
        return
    given = key or (bearer.credentials if bearer else None)
    if given is None or not secrets.compare_digest(given.encode(), expected.get_secret_value().encode()):
        raise HTTPException(401, "missing or wrong API key (send it as X-API-Key: KEY or Authorization: Bearer KEY)",
                            headers={"WWW-Authenticate": "Bearer"})


ERRORS = {code: {"model": Error} for code in (400, 401, 404, 413, 415, 422, 501, 503)}
router = APIRouter(prefix="/v1", dependencies=[Depends(require_api_key)], responses={401: {"model": Error}})


def _check_k(k: int, state: ServiceState) -> None:
    if k > state.settings.max_k:
        raise RequestValidationError([{"type": "less_than_equal", "loc": ("body", "k"), "input": k,
                                       "msg": f"k must be at most {state.settings.max_k}"}])


async def _submit(batcher, item, state: ServiceState):
    try:
        return await batcher.submit(item)
    except QueueFull:
        raise HTTPException(503, "the service is at capacity: too many requests are waiting; retry shortly",
                            headers={"Retry-After": str(state.settings.retry_after_s)}) from None


_IMAGE_BODY = {
    "requestBody": {"required": True, "content": {
        "multipart/form-data": {"schema": {"type": "object", "required": ["image"], "properties": {
            "image": {"type": "string", "format": "binary", "description": "an image file (JPEG, PNG, …)"},
            "k": {"type": "integer", "default": 10, "minimum": 1}}}},
        "application/json": {"schema": ImageIdSearch.model_json_schema()},
    }}}


async def _read_upload(request: Request, state: ServiceState,
                       max_fields: int = 8) -> tuple[bytes, ImmutableMultiDict]:
    """The ``image`` file of a multipart form (size-checked) and the other form fields (``fields.get(name)``: the
    last value of a field, ``fields.getlist(name)``: every value of a repeated one)."""
    async with request.form(max_files=1, max_fields=max_fields) as form:
        upload = form.get("image")
        if not isinstance(upload, UploadFile):
            raise RequestValidationError([{"type": "missing", "loc": ("body", "image"), "input": None,
                                           "msg": "a multipart file field named 'image' is required"}])
        data = await upload.read(state.settings.max_upload_bytes + 1)
        fields = ImmutableMultiDict([(k, v) for k, v in form.multi_items() if isinstance(v, str)])
    if len(data) > state.settings.max_upload_bytes:
        raise HTTPException(413, f"image upload larger than {state.settings.max_upload_bytes:,} bytes")
    if not data:
        raise HTTPException(400, "the image file is empty")
    return data, fields


def _form_int(fields, name: str, default: int | None, maximum: int | None = None) -> int | None:
    """An integer form field from 1 to ``maximum`` (no bound: any positive integer); ``default`` when absent."""
    raw = fields.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or value < 1 or (maximum is not None and value > maximum):
        bounds = f"an integer from 1 to {maximum}" if maximum is not None else "a positive integer"
        raise RequestValidationError([{"type": "int_parsing", "loc": ("body", name), "input": raw,
                                       "msg": f"{name} must be {bounds}"}])
    return value


def _form_k(fields) -> int:
    return _form_int(fields, "k", 10)


async def _pixels(data: bytes, state: ServiceState):
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
    except UnicodeDecodeError:
        raise HTTPException(400, "There was an error parsing the body") from None


def _validate(model, obj):
    """``model.model_validate(obj)``, its errors located in the body as FastAPI reports them for a body model."""
    try:
        return model.model_validate(obj, from_attributes=True)     # FastAPI's mode: its message for a non-object
    except ValidationError as err:
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])}
                                      for e in err.errors(include_url=False)]) from None


def _check_text(text: str, field: str, state: ServiceState, what: str | None = None) -> None:
    if len(text) > state.settings.max_text_chars:
        raise RequestValidationError([{"type": "string_too_long", "loc": ("body", field), "input": "…",
                                       "msg": f"{what or field} must be at most {state.settings.max_text_chars} "
                                              f"characters"}])


def _form_terms(fields) -> tuple[list[str], list[str]]:
    """The ``add`` and ``subtract`` words of a composition form: repeated fields and/or comma-separated lists."""
    terms = {}
    for name in ("add", "subtract"):
        terms[name] = [part.strip() for value in fields.getlist(name) for part in value.split(",")]
        if any(not t for t in terms[name]):
            raise RequestValidationError([{"type": "value_error", "loc": ("body", name), "input": fields.getlist(name),
                                           "msg": "words to add or subtract must not be empty or only whitespace"}])
    return terms["add"], terms["subtract"]


def _check_terms(add: list[str], subtract: list[str], state: ServiceState) -> None:
    if len(add) + len(subtract) > MAX_TERMS:
        raise RequestValidationError([{"type": "too_long", "loc": ("body", "add"), "input": len(add) + len(subtract),
                                       "msg": f"at most {MAX_TERMS} words or phrases to add and subtract in all"}])
    for name, terms in (("add", add), ("subtract", subtract)):
        for term in terms:
            _check_text(term, name, state, "each word or phrase")


def _no_composition_501(state: ServiceState) -> None:
    if getattr(state.model, "attention", None) is not None:
        raise HTTPException(501, "query composition (an image ± words) needs a model that embeds an image as one "
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


async def _gallery_pixels(image_id: int, state: ServiceState):
    """A gallery image's file, decoded and preprocessed like an upload; 404 when unknown or gone."""
    path = _gallery_file(image_id, state)
    loop = asyncio.get_running_loop()
    try:
        return await loop.run_in_executor(state.decode_pool, upload_to_pixels, path, state.settings.max_pixels,
                                          state.model.preprocess)
    except ImageError as err:
        raise HTTPException(404 if err.status == 415 else err.status,
                            f"gallery image {image_id}: {err.detail}") from None


_SEARCH_IMAGES_BODY = {
    "requestBody": {"required": True, "content": {
        "application/json": {"schema": {"oneOf": [TextSearch.model_json_schema(),
                                                  ImageIdCompose.model_json_schema()]}},
        "multipart/form-data": {"schema": {"type": "object", "required": ["image"], "properties": {
            "image": {"type": "string", "format": "binary", "description": "the query image (JPEG, PNG, …)"},
            "add": {"type": "array", "items": {"type": "string"}, "maxItems": MAX_TERMS,
                    "description": "words or phrases whose meaning to add; repeat the field or separate by commas"},
            "subtract": {"type": "array", "items": {"type": "string"}, "maxItems": MAX_TERMS,
                         "description": "words or phrases whose meaning to take away (likewise)"},
            "k": {"type": "integer", "default": 10, "minimum": 1}}}},
    }}}


@router.post("/search/images", response_model=ImageResults, responses=ERRORS, openapi_extra=_SEARCH_IMAGES_BODY,
             summary="Text → gallery images, or an image ± words (query composition) → gallery images; best first",
             description="JSON `{\"text\", \"k\"}`: images for a sentence. Query composition (W2VV §IV-C): "
                         "multipart `image` (+ `add`, `subtract`, `k`), or JSON `{\"image_id\", \"add\", "
                         "\"subtract\", \"k\"}` for a gallery image: images like the query image, with the "
                         "meaning of the `add` words added and of the `subtract` words taken away.")
async def search_images(request: Request, state: ServiceState = Depends(service)):
    content_type = _content_type(request)
    if content_type == "multipart/form-data":
        data, fields = await _read_upload(request, state, max_fields=2 * MAX_TERMS + 8)
        k = _form_k(fields)
        _check_k(k, state)
        add, subtract = _form_terms(fields)
        _check_terms(add, subtract, state)
        _no_composition_501(state)
        pixels = await _pixels(data, state)
        hits = await _submit(state.compose_batcher, (pixels, tuple(add), tuple(subtract), k), state)
    elif _is_json(content_type):
        obj = await _json_object(request)
        if isinstance(obj, dict) and "image_id" in obj:
            body = _validate(ImageIdCompose, obj)
            _check_k(body.k, state)
            _check_terms(body.add, body.subtract, state)
            _no_composition_501(state)
            pixels = await _gallery_pixels(body.image_id, state)
            hits = await _submit(state.compose_batcher, (pixels, tuple(body.add), tuple(body.subtract), body.k),
                                 state)
        else:
            body = _validate(TextSearch, obj)
            _check_k(body.k, state)
            _check_text(body.text, "text", state)
            hits = await _submit(state.text_batcher, (body.text, body.k), state)
    else:
        raise HTTPException(415, "send JSON {\"text\": ..., \"k\": ...}, or for a composed query multipart/form-data "
                                 "with an 'image' file (and optional 'add', 'subtract', 'k') or JSON "
                                 "{\"image_id\": ..., \"add\": [...], \"subtract\": [...], \"k\": ...}")
    root = request.scope.get("root_path", "")
    return ImageResults(results=[ImageHit(id=i, score=s, uri=f"{root}/v1/images/{i}") for i, s in hits])


@router.post("/search/captions", response_model=CaptionResults, responses=ERRORS, openapi_extra=_IMAGE_BODY,
             summary="Image (upload, or a gallery image id) → captions of the corpus, best first")
async def search_captions(request: Request, state: ServiceState = Depends(service)):
    content_type = _content_type(request)
    if content_type == "multipart/form-data":
        data, fields = await _read_upload(request, state)
        k = _form_k(fields)
        _check_k(k, state)
        pixels = await _pixels(data, state)
        hits = await _submit(state.image_batcher, (pixels, k), state)
    elif content_type == "application/json":
        try:
            body = ImageIdSearch.model_validate_json(await request.body())
        except ValidationError as err:
            raise RequestValidationError(err.errors(include_url=False)) from None
        _check_k(body.k, state)
        loop = asyncio.get_running_loop()
        try:
            hits = await loop.run_in_executor(state.compute_pool, state.engine.search_image_id, body.image_id, body.k)
        except KeyError:
            raise HTTPException(404, f"no gallery image with id {body.image_id}") from None
    else:
        raise HTTPException(415, "send multipart/form-data with an 'image' file (and optional 'k'), "
                                 "or JSON {\"image_id\": ..., \"k\": ...}")
    rows = state.gallery.meta.captions([i for i, _ in hits])
    return CaptionResults(results=[CaptionHit(caption=rows[i].text, score=s, id=i) for i, s in hits if i in rows])


@router.get("/images/{image_id}", responses={**ERRORS, 200: {"content": {"image/*": {}}}},
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


def _decoder_or_501(state: ServiceState, what: str) -> None:
    if not state.has_decoder:
        raise HTTPException(501, f"{what} needs a model with a sentence decoder (Show, Translate and Tell); the "
                                 f"loaded model '{state.model.cfg.get('name', '')}' was trained without one "
                                 f"(decoder.enabled: false): serve an STT model, e.g. one trained with "
                                 f"configs/stt.yaml")


def _generated(results) -> list[GeneratedText]:
    return [GeneratedText(text=text, score=score) for text, score in results]


_CAPTIONS_BODY = {"requestBody": {"required": True, "content": {
    "multipart/form-data": {"schema": {"type": "object", "required": ["image"], "properties": {
        "image": {"type": "string", "format": "binary", "description": "an image file (JPEG, PNG, …)"},
        "n": {"type": "integer", "default": 1, "minimum": 1, "maximum": MAX_GENERATED,
              "description": "number of captions"},
        "beam_size": {"type": "integer", "minimum": 1, "maximum": MAX_GENERATED,
                      "description": "beam width (default: the model's decoder.beam_size); widened to n when "
                                     "smaller"}}}}}}}


@router.post("/captions", response_model=GeneratedCaptions, responses=ERRORS, openapi_extra=_CAPTIONS_BODY,
             summary="Image → generated captions, best first (needs a model with a decoder)")
async def captions(request: Request, state: ServiceState = Depends(service)):
    _decoder_or_501(state, "caption generation")
    if _content_type(request) != "multipart/form-data":
        raise HTTPException(415, "send multipart/form-data with an 'image' file (and optional 'n', 'beam_size')")
    data, fields = await _read_upload(request, state)
    n = _form_int(fields, "n", 1, MAX_GENERATED)
    beam_size = _form_int(fields, "beam_size", None, MAX_GENERATED)
    pixels = await _pixels(data, state)
    results = await _submit(state.caption_batcher, (pixels, n, beam_size), state)
    return GeneratedCaptions(captions=_generated(results))


@router.post("/paraphrases", response_model=Paraphrases, responses=ERRORS,
             summary="Sentence → paraphrases, best first, never the sentence itself (needs a model with a decoder)")
async def paraphrases(body: Paraphrase, state: ServiceState = Depends(service)):
    _decoder_or_501(state, "paraphrase generation")
    _check_text(body.text, "text", state)
    results = await _submit(state.paraphrase_batcher, (body.text, body.n, body.beam_size), state)
    return Paraphrases(paraphrases=_generated(results))
