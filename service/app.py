"""The FastAPI application factory: ``create_app(settings)``.

Routes: the ``/v1`` API (service/routes.py), plus ``/healthz`` (process alive), ``/readyz`` (model and index
loaded; also what the web page needs to know) and ``/metrics`` (Prometheus), which stay open when an API key is
set, and the web search page at ``GET /`` (service/page.py). OpenAPI at ``/docs``. Every error is JSON
``{"detail": "..."}``.
"""
from __future__ import annotations

import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from . import __version__
from .metrics import Metrics, MetricsMiddleware
from .middleware import BodyLimitMiddleware, InFlightMiddleware
from .page import add_page
from .routes import router
from .schemas import Health, Ready
from .settings import Settings
from .state import ServiceState

log = logging.getLogger("jointspace.service")
BODY_SLACK = 1024 * 1024        # multipart framing and form fields on top of the image bytes


def create_app(settings: Settings | None = None, model=None, gallery=None) -> FastAPI:
    """The app. ``model``/``gallery`` already loaded are used as they are; otherwise ``settings.model`` and
    ``settings.index`` are loaded in the background after start-up (``/readyz`` says when)."""
    settings = settings or Settings()
    metrics = Metrics()
    state = ServiceState(settings, metrics, model=model, gallery=gallery)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await state.start()
        try:
            yield
        finally:
            await state.stop()

    app = FastAPI(title="jointspace", version=__version__, lifespan=lifespan,
                  description="Image–text retrieval in a common vector space: search a photo gallery with a "
                              "sentence, rank captions for an image.")
    app.state.service = state
    app.include_router(router)
    _add_operational_routes(app, state, metrics)
    add_page(app)
    _add_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware, limit=settings.max_upload_bytes + BODY_SLACK)
    app.add_middleware(InFlightMiddleware, counts=state.inflight)
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    return app


def _add_operational_routes(app: FastAPI, state: ServiceState, metrics: Metrics) -> None:
    @app.get("/healthz", response_model=Health, tags=["operations"], summary="The process is alive")
    async def healthz():
        return Health(status="ok")

    @app.get("/readyz", response_model=Ready, tags=["operations"], summary="Model and index are loaded",
             responses={503: {"model": Ready}})
    async def readyz():
        if not state.ready:
            status = f"error: {state.error}" if state.error else "loading"
            return JSONResponse({"status": status, "detail": f"not ready ({status})"}, status_code=503)
        return Ready(status="ready", model_fingerprint=state.model.fingerprint,
                     index_generation=state.gallery.generation, images=state.gallery.images.ntotal,
                     captions=state.gallery.captions.ntotal, device=str(state.device),
                     decoder=state.has_decoder, api_key_required=state.settings.api_key is not None,
                     max_k=state.settings.max_k)

    @app.get("/metrics", tags=["operations"], summary="Prometheus metrics", response_class=Response)
    async def prometheus():
        return Response(metrics.render(), media_type=metrics.content_type)


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
