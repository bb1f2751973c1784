"""What the routes that serve gallery files share (``/v1/images/{id}``, ``/v1/videos/{id}`` and its frames): ids
read strictly, validators (``ETag``, ``Last-Modified``), conditional requests (``If-None-Match``,
``If-Modified-Since``, ``If-Range``), byte ranges as RFC 9110 reads them, ``HEAD``, and one JSON error body.

* **Decoding** (:func:`decoded`): thumbnails and frames are made under the media admission (service/decoding.py).
* **Ids** are decimal digits and nothing else — no sign, space, leading zero or underscore (``/v1/videos/%200``,
  ``/v1/videos/+0``, ``/v1/videos/00`` are 422): one URL per resource.
* **Validators**: the ETag is a hash of the file's content hash as indexed, its size and mtime now, the index (its
  id) and generation, and what was made of the file (a thumbnail's size, a frame's time); ``Last-Modified`` is the
  file's mtime. Both are strong: a new generation, or a file changed on disk, changes them.
* **Conditional requests** (RFC 9110 §13): ``If-None-Match`` naming the current ETag (weak comparison) or ``*``,
  or — without ``If-None-Match`` — ``If-Modified-Since`` not older than the file, answer 304 with no body.
* **Ranges** (RFC 9110 §14): one ``bytes=first-last``, ``bytes=first-`` or ``bytes=-suffix`` range is served 206.
  A header the server must or may ignore is ignored and the whole file served 200: another unit, a malformed or
  invalid one (``bytes=5-1``: a last position before the first), several ranges. A range that starts at or past
  the end (or a suffix of 0 bytes) is 416 with ``Content-Range: bytes */SIZE`` and the JSON error body. Positions
  are compared as digit strings, so a 5,000-digit number is just past the end, never an integer-conversion error.
  ``If-Range`` with the current ETag (strong comparison) or the exact ``Last-Modified`` date lets the range
  through; anything else turns it into the whole file.
"""
from __future__ import annotations

import hashlib
import os
import pathlib
import re
from email.utils import formatdate, parsedate_to_datetime
from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BeforeValidator

from ..contract import MAX_ID, Error
from ..decoding import MediaBusy
from ..state import ServiceState

CHUNK = 256 * 1024
RANGE_NOT_SATISFIABLE: dict[int | str, dict] = {          # the OpenAPI entry of what file_response answers 416
    416: {"model": Error, "description": "the Range header starts at or past the end of the file",
          "headers": {"Content-Range": {"schema": {"type": "string"}}}}}
_DIGITS = re.compile(r"0|[1-9][0-9]*")
_RANGE_SPEC = re.compile(r"([0-9]*)-([0-9]*)")


def _strict_id(value: object) -> object:
    """A path id: decimal digits only (no sign, space, leading zero, underscore), so one id has one URL."""
    if isinstance(value, str) and not _DIGITS.fullmatch(value):
        raise ValueError("an id is written in decimal digits, without a sign, spaces or leading zeros")
    return value


ImageId = Annotated[int, Path(ge=0, le=MAX_ID, description="a gallery image's id"), BeforeValidator(_strict_id)]
VideoId = Annotated[int, Path(ge=0, le=MAX_ID, description="a gallery video's id"), BeforeValidator(_strict_id)]


def get_and_head(router: APIRouter, path: str, **spec):
    """A route for ``GET`` and for ``HEAD`` (the same answer's headers alone), each its own operation in the
    OpenAPI document."""
    def register(fn):
        router.get(path, **spec)(fn)
        return router.head(path, **{**spec, "summary": f"{spec['summary']}: its headers alone"})(fn)
    return register


async def decoded(state: ServiceState, cost: int, fn, *args):
    """``fn(*args)`` (a thumbnail, a frame) under the media admission (service/decoding.py), ``cost`` its estimated
    memory; 503 + Retry-After at once when the admission is full."""
    try:
        return await state.media.run(cost, fn, *args)
    except MediaBusy:
        media, retry = state.media, state.settings.retry_after_s
        raise HTTPException(503, f"the service is at capacity: as many frames and thumbnails as it makes at once "
                                 f"({media.limit}, {media.heavy_limit} of them large) are being made already; retry "
                                 f"after {retry} s", headers={"Retry-After": str(retry)}) from None


# --- validators ------------------------------------------------------------------------------------------------

def etag(*parts: object) -> str:
    """A strong entity tag: a hash of ``parts``."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(f"{part}\0".encode())
    return f'"{digest.hexdigest()[:32]}"'


def validators(content: str, info: os.stat_result, index_id: str, generation: str, variant: object) -> dict[str, str]:
    """``ETag`` and ``Last-Modified`` of a gallery file (``content``: its content hash as indexed) or of what is
    made of it (``variant``: a thumbnail's size, a frame's time and size; ``"file"`` for the file itself)."""
    return {"ETag": etag(content, info.st_size, info.st_mtime_ns, index_id, generation, variant),
            "Last-Modified": formatdate(int(info.st_mtime), usegmt=True)}


def _tags(header: str) -> list[str]:
    return [t.strip() for t in header.split(",") if t.strip()]


def not_modified(request: Request, headers: dict[str, str]) -> bool:
    """Whether a GET or HEAD is answered 304: ``If-None-Match`` names the current ETag (weak comparison) or is
    ``*``; without ``If-None-Match``, ``If-Modified-Since`` is no older than ``Last-Modified``."""
    if request.method not in ("GET", "HEAD"):
        return False
    if_none_match = request.headers.get("if-none-match")
    if if_none_match is not None:
        tags = _tags(if_none_match)
        return "*" in tags or any(t.removeprefix("W/") == headers["ETag"] for t in tags)
    since = _date(request.headers.get("if-modified-since"))
    modified = _date(headers.get("Last-Modified"))
    return since is not None and modified is not None and modified <= since


def _date(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def _if_range_holds(request: Request, headers: dict[str, str]) -> bool:
    """No ``If-Range``, or one naming the current representation: the ETag (strong comparison: a weak tag never
    matches) or exactly the ``Last-Modified`` date."""
    value = request.headers.get("if-range")
    if value is None:
        return True
    value = value.strip()
    if value.startswith(('"', "W/")):
        return value == headers["ETag"]
    return value == headers.get("Last-Modified")


# --- byte ranges -----------------------------------------------------------------------------------------------

class Unsatisfiable(ValueError):
    """A range that starts at or past the end of the file (416)."""


def _number(digits: str) -> tuple[int, str]:
    """A key that orders digit strings as the numbers they write, whatever their length (no integer made)."""
    digits = digits.lstrip("0") or "0"
    return len(digits), digits


def _position(digits: str, size: int) -> int:
    """A position written in ``digits``, capped at ``size``."""
    return size if _number(digits) >= _number(str(size)) else int(digits)


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """``Range`` → ``(first, last)`` inclusive, clipped to the file; None to send the whole file (no header,
    another unit, several ranges, a malformed or invalid one). :class:`Unsatisfiable` when the one range cannot
    be served (module docstring)."""
    if header is None:
        return None
    unit, sep, spec = header.partition("=")
    if not sep or unit.strip().lower() != "bytes" or "," in spec:
        return None
    m = _RANGE_SPEC.fullmatch(spec.strip())
    if m is None or not (m.group(1) or m.group(2)):
        return None
    first, last = m.group(1), m.group(2)
    if not first:                                   # the last N bytes
        n = _position(last, size)
        if n == 0:
            raise Unsatisfiable("a suffix range of 0 bytes")
        return size - n, size - 1
    if last and _number(last) < _number(first):    # last before first: an invalid range, ignored
        return None
    start = _position(first, size)
    if start >= size:
        raise Unsatisfiable(f"the range starts at or past the end of the {size:,}-byte file")
    return start, min(_position(last, size), size - 1) if last else size - 1


def _chunks(path: pathlib.Path, first: int, last: int):
    with open(path, "rb") as fh:
        fh.seek(first)
        left = last - first + 1
        while left > 0:
            block = fh.read(min(CHUNK, left))
            if not block:
                return
            left -= len(block)
            yield block


def file_response(request: Request, path: pathlib.Path, size: int, media: str, headers: dict[str, str]) -> Response:
    """The file at ``path`` (``size`` bytes) as the request asks: 304 when not modified, 206 for a range it may
    have, 416 (JSON) for one past the end, else 200; ``HEAD`` gets the headers alone. ``headers`` carry the
    validators (:func:`validators`) and the caching headers."""
    headers = {**headers, "Accept-Ranges": "bytes"}
    if not_modified(request, headers):
        return Response(status_code=304, headers=headers)
    try:
        wanted = byte_range(request.headers.get("range"), size) if _if_range_holds(request, headers) else None
    except Unsatisfiable as err:
        return JSONResponse({"detail": f"range not satisfiable: {err}"}, status_code=416,
                            headers={"Content-Range": f"bytes */{size}"})
    first, last = wanted if wanted is not None else (0, size - 1)
    headers["Content-Length"] = str(last - first + 1)
    status = 200
    if wanted is not None:
        status = 206
        headers["Content-Range"] = f"bytes {first}-{last}/{size}"
    if request.method == "HEAD" or size == 0:
        return Response(status_code=status, headers=headers, media_type=media)
    return StreamingResponse(_chunks(path, first, last), status_code=status, media_type=media, headers=headers)
