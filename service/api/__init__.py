"""The HTTP API by resource, mounted by service/app.py:

* the model routes, from the table of operations (service/operations.py) by ``routing.py``, which makes one route
  per entry: their handlers in ``search.py`` — ``POST /v1/search/images`` (text, or an image ± words → images)
  and ``/v1/search/captions`` (image → captions) — and ``generate.py`` — ``POST /v1/captions`` and
  ``/v1/paraphrases`` (the sentence decoder);
* ``gallery.py``    — ``GET /v1/folders`` and ``GET /v1/images/{id}`` (the gallery's files and thumbnails);
* ``duplicates.py`` — ``GET /v1/duplicates`` (groups of near-duplicate photos, paged);
* ``videos.py``     — ``GET /v1/videos/{id}`` (a video file, with range requests) and ``/v1/videos/{id}/frame``;
* ``health.py``     — ``/healthz``, ``/readyz``, ``/metrics`` (open even when an API key is set).

What they share: ``deps.py`` (readiness, the API key, load shedding, decoding an image off the event loop) and
``bodies.py`` (reading a request body: its content type, JSON, multipart). The bodies are service/schemas.py's
models, their limits from the settings (service/contract.py); errors are its ``ERROR_MEANINGS``, always JSON
``{"detail": ...}``.
"""
