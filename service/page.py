"""The web search page: ``GET /`` (``static/index.html``) and its assets under ``/static``.

Plain HTML, CSS and ES modules served by the app itself: no CDN, no build step. The page reads ``/readyz`` to
learn whether the service is ready, whether ``/v1`` needs an API key and whether the model has a decoder, then
calls the ``/v1`` API like any other client. The page and its assets stay open when an API key is set (they hold
no data); its Content-Security-Policy lets it load nothing from anywhere but this origin.
"""
from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).resolve().parent / "static"
CSP = ("default-src 'self'; img-src 'self' blob:; style-src 'self'; script-src 'self'; connect-src 'self'; "
       "object-src 'none'; base-uri 'self'; form-action 'self'; frame-ancestors 'none'")


def add_page(app: FastAPI) -> None:
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/", include_in_schema=False)
    async def page():
        return FileResponse(STATIC / "index.html", media_type="text/html", headers={
            "Cache-Control": "no-cache", "Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff"})
