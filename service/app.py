"""The FastAPI application factory: ``create_app(settings)``, the one place that mounts the API's routers.

Routes (service/api/, one module per resource): the ``/v1`` API — the model routes of the table of operations
(service/operations.py: search, ``/v1/search/images`` and ``/v1/search/captions``, and the decoder,
``/v1/captions`` and ``/v1/paraphrases``), the gallery (``/v1/folders``, ``/v1/images/{id}``), its
near-duplicates (``/v1/duplicates``) and its videos (``/v1/videos/{id}``, ``/v1/videos/{id}/frame``) — plus
``/healthz``, ``/readyz`` and ``/metrics``, which stay open when an API key is set, and the web search page at ``GET /`` (service/page.py). OpenAPI at ``/openapi.json``
(``/docs``: Swagger UI from the app's own files, service/apidocs.py) is FastAPI's, generated from the routes'
declarations, which are made for this app's settings: its limits (the bound request models, ``?size=`` up to
``max_thumbnail``), its error responses, and API-key security only when a key is set (service/contract.py). Every error is JSON ``{"detail": "..."}``. A ``Host`` the service is not
configured for is answered 421, and no other origin may read it unless configured (service/trust.py).
"""
from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from typing import Sequence

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from . import __version__
from .metrics import Metrics, MetricsMiddleware
from .contract import error_responses
from .middleware import BodyMiddleware, InFlightMiddleware
from .page import add_page
from .apidocs import add_docs
from .api import duplicates as duplicates_api
from .api import gallery as gallery_api
from .api import health as health_api
from .api import videos as videos_api
from .api.deps import api_key_schemes, require_api_key
from .api.routing import Route, ServedTable, queues
from .operations import OPERATIONS
from .settings import Settings
from .state import ServiceState
from .trust import OriginMiddleware, TrustedHostMiddleware, allowed_hosts, cors_origins, split_names
from .workers import Worker

log = logging.getLogger("jointspace.service")
BODY_SLACK = 1024 * 1024        # multipart framing and form fields on top of the image bytes


def create_app(settings: Settings | None = None, model=None, gallery=None,
               operations: Sequence[Route] = OPERATIONS, worker: Worker | None = None) -> FastAPI:
    """The app. ``model``/``gallery`` already loaded are used as they are; otherwise ``settings.model`` and
    ``settings.index`` are loaded in the background after start-up (``/readyz`` says when). ``operations``: the
    table of the model's routes (service/operations.py). ``worker``: this app is one worker of ``serve --workers
    N`` (service/workers.py), its admission counted for the whole service."""
    settings = settings or Settings()
    metrics = Metrics()
    state = ServiceState(settings, metrics, model=model, gallery=gallery, queues=queues(operations), worker=worker)
    table = ServedTable(operations, settings, state.similarity)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await state.start()
        try:
            if worker is not None:      # one of several workers takes connections only once it can answer them
                await state.until_loaded()
            yield
        finally:
            await state.stop()

    # FastAPI's own /docs and /redoc load their scripts from a CDN: off, /docs is served from this app's files
    app = FastAPI(title="jointspace", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
               swagger_ui_oauth2_redirect_url=None,
               description="Image–text retrieval in a common vector space: search a photo gallery with a "
                           "sentence, rank captions for an image.")
    app.state.service, app.state.operations = state, table
    # security is declared, and enforced, only when there is a key
    keyed = settings.api_key is not None
    for router, check in ((table.router(), api_key_schemes),        # the model routes' class checks it itself
                          (gallery_api.router(settings.max_thumbnail), require_api_key),
                          (videos_api.router(settings.max_thumbnail), require_api_key),
                          (duplicates_api.router, require_api_key)):
        app.include_router(router, dependencies=[Depends(check)] if keyed else None,
                           responses=error_responses(400, 401, 429) if keyed else None)
    app.include_router(health_api.router)
    add_page(app)
    add_docs(app)
    _add_error_handlers(app)
    # outermost last: metrics see every request; a body is received whole before admission counts its request
    app.add_middleware(InFlightMiddleware, counts=state.inflight, admission=table.admission, limit=settings.max_queue,
                       retry_after_s=settings.retry_after_s, metrics=metrics,
                       shared=worker.admission if worker is not None else None)
    app.add_middleware(BodyMiddleware, limit=settings.max_upload_bytes + BODY_SLACK, timeout_s=settings.body_timeout_s,
                       min_rate=settings.body_min_rate, buffer_bytes=settings.upload_buffer_bytes,
                       peer_bytes=settings.upload_peer_bytes, retry_after_s=settings.retry_after_s, metrics=metrics)
    origins = cors_origins(settings.cors_origins)
    if origins:
        app.add_middleware(CORSMiddleware, allow_origins=origins, allow_methods=["GET", "POST"],
                           allow_headers=["content-type", "x-api-key", "authorization"],
                           expose_headers=["etag", "retry-after"], max_age=600)
    # a cross-site POST is refused before its body is read (trust.py: a page elsewhere cannot post to this service)
    app.add_middleware(OriginMiddleware, origins=[*split_names(settings.allowed_origins), *origins])
    app.add_middleware(TrustedHostMiddleware, hosts=allowed_hosts(settings.allowed_hosts, settings.host))
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    return app


def _validation_message(errors) -> str:
    parts = []
    for err in errors:
        loc = ".".join(str(x) for x in err.get("loc", ()) if x not in ("body", "query", "path")) or "request"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    return "; ".join(parts)


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        errors = [{k: v for k, v in e.items() if k in ("loc", "msg", "type")} for e in exc.errors()]
        return JSONResponse({"detail": _validation_message(errors), "errors": errors}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception):
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse({"detail": "internal error"}, status_code=500)
