"""Health and metrics: ``/healthz`` (the process is alive), ``/readyz`` (the model and index are loaded; also what the
web page needs to know) and ``/metrics`` (Prometheus). Open even when an API key is set."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from index.qbnorm import correction
from index.relevance import STRONG

from ..schemas import Health, Ready
from ..state import ServiceState

router = APIRouter(tags=["operations"])


def _state(request: Request) -> ServiceState:
    return request.app.state.service


@router.get("/healthz", response_model=Health, summary="The process is alive")
async def healthz():
    return Health(status="ok")


@router.get("/readyz", response_model=Ready, summary="Model and index are loaded",
            responses={503: {"model": Ready, "description": "not ready: loading, or loading failed"}})
async def readyz(request: Request):
    state = _state(request)
    if not state.ready:
        status = f"error: {state.public_error}" if state.error else state.phase
        return JSONResponse({"status": status, "detail": f"not ready ({status})"}, status_code=503)
    loaded = state.loaded
    images, counts = loaded.gallery.images.ntotal, loaded.gallery.counts
    return Ready(status="ready", model_fingerprint=loaded.model.fingerprint,
                 index_generation=loaded.gallery.generation, images=images, photos=images - counts["moments"],
                 videos=counts["videos"], moments=counts["moments"],
                 captions=loaded.gallery.captions.ntotal, device=str(state.device), decoder=state.has_decoder,
                 api_key_required=state.settings.api_key is not None, max_k=state.settings.max_k,
                 max_text_chars=state.settings.max_text_chars,
                 similarity=state.similarity, search_backend=loaded.gallery.images.backend,
                 image_backend=state.backend,
                 batch_sizes=list(state.shapes.sizes) if state.shapes is not None else None,
                 warmup_seconds=state.warmup_seconds,
                 strong_relevance=STRONG if loaded.gallery.references else None,
                 hubness_correction=correction(loaded.gallery.manifest),
                 worker=state.worker.index if state.worker is not None else None,
                 workers=state.worker.count if state.worker is not None else 1)


@router.get("/metrics", summary="Prometheus metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                             "description": "Prometheus text exposition format"}})
async def prometheus(request: Request):
    metrics = _state(request).metrics
    return Response(metrics.render(), media_type=metrics.content_type)
