"""Schemathesis hooks for fuzzing the jointspace API (``SCHEMATHESIS_HOOKS=deploy/schemathesis_hooks.py``, or
``hooks`` in deploy/schemathesis.toml).

The upload routes' ``image`` part declares the image types the service reads (``encoding.image.contentType``:
JPEG, PNG, GIF, WebP, BMP, TIFF, HEIC/HEIF, AVIF) and the service sniffs the bytes, so a schema-valid upload is a
real image of one of those types. Schemathesis has no generator for them; these strategies draw small real images
(size, colours and a shape vary) in each format. A second hook works around a false positive of the negative-data
check on forms with a file part (below).
"""
from __future__ import annotations

import io

import schemathesis
from hypothesis import strategies as st
from PIL import Image, ImageDraw

try:                                      # HEIC/HEIF writing (a jointspace dependency); AVIF is Pillow's own
    import pillow_heif
    pillow_heif.register_heif_opener()
except ImportError:  # pragma: no cover - then the HEIC/HEIF generators fail loudly when used
    pass

FORMATS = {"image/jpeg": "JPEG", "image/png": "PNG", "image/gif": "GIF", "image/webp": "WEBP", "image/bmp": "BMP",
           "image/tiff": "TIFF", "image/heic": "HEIF", "image/heif": "HEIF", "image/avif": "AVIF"}


def _encode(fmt: str, width: int, height: int, background: tuple, fill: tuple, box: tuple) -> bytes:
    image = Image.new("RGB", (width, height), background)
    x0, y0, x1, y1 = box
    ImageDraw.Draw(image).ellipse((min(x0, x1) * width // 100, min(y0, y1) * height // 100,
                                   max(x0, x1) * width // 100, max(y0, y1) * height // 100), fill=fill)
    out = io.BytesIO()
    image.save(out, format=fmt)
    return out.getvalue()


_colour = st.tuples(*[st.integers(0, 255)] * 3)
_percent = st.integers(0, 100)


def images(fmt: str) -> st.SearchStrategy[bytes]:
    return st.builds(_encode, st.just(fmt), st.integers(1, 64), st.integers(1, 64), _colour, _colour,
                     st.tuples(_percent, _percent, _percent, _percent))


for media_type, fmt in FORMATS.items():
    schemathesis.openapi.media_type(media_type, images(fmt))


# --- a false positive of schemathesis's negative_data_rejection on multipart bodies with a file part -------------
#
# A multipart text field carries text only: a negative case that turns `add` into the boolean false or null sends
# the text "false" / "null", which is a valid word for the service, so it answers 200. schemathesis means to
# forgive exactly this (checks._form_body_is_valid_as_sent validates the form as it was sent), but it validates
# the file part's raw bytes with jsonschema_rs, which raises on bytes, and the forgiveness is lost for every form
# that has a file. Validating the form with the file part as a placeholder string restores what schemathesis
# intends; nothing else about the check changes. (schemathesis 4.32.5; the attribute is checked so that an upgrade
# that renames it fails here loudly instead of silently.)
from schemathesis.specs.openapi import checks as _checks  # noqa: E402

_form_body_is_valid_as_sent = _checks._form_body_is_valid_as_sent


def _file_parts_as_text(response, case, media_type):
    body = case.body
    if isinstance(body, dict):
        as_text = {k: "<file>" if isinstance(v, (bytes, bytearray)) or hasattr(v, "data") and
                   isinstance(v.data, (bytes, bytearray)) else v for k, v in body.items()}
        if any(as_text[k] is not body[k] for k in body):
            case.body = as_text
            try:
                return _form_body_is_valid_as_sent(response, case, media_type)
            finally:
                case.body = body
    return _form_body_is_valid_as_sent(response, case, media_type)


_checks._form_body_is_valid_as_sent = _file_parts_as_text
