"""Reading a request body, the same way on every model route (service/api/routing.py): its content type
(multipart/form-data, or JSON: ``application/json`` and any ``application/*+json``; anything else is 415 with what
to send); a JSON body read strictly (no ``NaN``, no integer of hundreds of digits) before FastAPI validates it as
the route's endpoint declares; a multipart form read here and its plain fields validated by the same pydantic model
(service/contract.py ``Form``). Errors are located in the body as FastAPI locates its own: ``["body", field]``."""
from __future__ import annotations

import json
from typing import Any, Literal, TypeVar

from fastapi import HTTPException, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel
from starlette.datastructures import UploadFile

from ..contract import Form, invalid
from ..state import ServiceState

Kind = Literal["json", "form"]
M = TypeVar("M", bound=BaseModel)


def content_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def is_json(media_type: str) -> bool:
    return media_type == "application/json" or (media_type.startswith("application/")
                                                and media_type.endswith("+json"))


def body_kind(request: Request, accepts: tuple[Kind, ...], send: str) -> Kind:
    """Which of the ``accepts`` kinds of body the request carries; 415 saying ``send`` (what to send) when none."""
    media_type = content_type(request)
    if "form" in accepts and media_type == "multipart/form-data":
        return "form"
    if "json" in accepts and is_json(media_type):
        return "json"
    raise HTTPException(415, send)


MAX_INT_DIGITS = 100        # no field takes an integer near this long (ids are int64: 19 digits)


class _TooManyDigits(ValueError):
    def __init__(self, digits: int):
        super().__init__(digits)
        self.digits = digits


def _json_int(text: str) -> int:
    """A JSON integer, read only when it is short: Python refuses to convert long digit strings (over
    ``sys.get_int_max_str_digits()``, 4,300) with a ValueError of its own, and converting one costs time
    quadratic in its length."""
    digits = len(text) - (text[0] == "-")
    if digits > MAX_INT_DIGITS:
        raise _TooManyDigits(digits)
    return int(text)


def _not_json(name: str) -> Any:
    """``NaN``, ``Infinity`` and ``-Infinity``: Python's json reads them, JSON has no such values."""
    raise json.JSONDecodeError(f"{name} is not a JSON value", name, 0)


async def json_value(request: Request) -> Any:
    """The request's JSON value, with FastAPI's own errors for a missing or malformed one; an integer too long to
    be any field's value is 422, nesting deeper than Python's parser goes is 400."""
    body = await request.body()
    if not body:
        raise RequestValidationError([{"type": "missing", "loc": ("body",), "input": None, "msg": "Field required"}])
    try:
        return json.loads(body, parse_int=_json_int, parse_constant=_not_json)
    except _TooManyDigits as err:
        raise RequestValidationError([{"type": "int_parsing", "loc": ("body",), "input": None,
                                       "msg": f"a number in the body has {err.digits:,} digits; integers of more "
                                              f"than {MAX_INT_DIGITS} digits are not read"}]) from None
    except json.JSONDecodeError as err:
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body", err.pos), "input": {},
                                       "msg": "JSON decode error", "ctx": {"error": err.msg}}]) from None
    except (UnicodeDecodeError, RecursionError, ValueError):
        raise HTTPException(400, "There was an error parsing the body") from None


async def read_form(request: Request, state: ServiceState, form: Form[M]) -> tuple[bytes, M]:
    """A multipart form read by ``form``: the ``image`` file's bytes (size-checked) and the other fields validated
    by its model. Unknown fields, a repeated field and a missing image are 422; an empty image is 400; a large
    one 413."""
    limit = state.settings.max_upload_bytes
    async with request.form(max_files=1, max_fields=len(form.fields) + 1) as parts:
        upload = None
        values: dict[str, list[str]] = {}
        for name, value in parts.multi_items():
            form.check_part(name, isinstance(value, UploadFile))
            if isinstance(value, UploadFile):
                upload = value
            else:                       # a plain field (check_part refused one for the image)
                values.setdefault(name, []).append(value)
        if upload is None:
            raise invalid(("body", "image"), "a multipart file field named 'image' is required", "missing")
        data = await upload.read(limit + 1)
    if len(data) > limit:
        raise HTTPException(413, f"image upload larger than {limit:,} bytes")
    if not data:
        raise HTTPException(400, "the image file is empty")
    return data, form.parse(values)
