"""The API's documentation page: ``GET /docs``, Swagger UI over ``/openapi.json``, served from this app alone.

Swagger UI's files (Swagger UI 5, Apache-2.0, which reads OpenAPI 3.1) come from the static folder of the
``fastapi-offline`` package (a dependency; only its files are used), never from a CDN: the page (``/docs``), its
start-up script (``/docs/init.js``: no inline script) and the two files of Swagger UI it needs
(``/docs/assets/swagger-ui-bundle.js``, ``/docs/assets/swagger-ui.css``, and the icon). Each answer carries a
Content-Security-Policy that lets the page load and fetch nothing but this origin (images also as ``data:``
URLs, which Swagger UI's stylesheet uses for its icons). Paths are relative, so the page also works behind a
proxy that mounts the service under a prefix. FastAPI's own ``/docs`` and ``/redoc`` (which load from a CDN) are
off (service/app.py).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

from fastapi import FastAPI, HTTPException
from fastapi.responses import FileResponse, HTMLResponse, Response

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "font-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"}
ASSETS = {"swagger-ui-bundle.js": "text/javascript", "swagger-ui.css": "text/css", "favicon.png": "image/png"}

PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>jointspace API</title>
<link rel="stylesheet" href="docs/assets/swagger-ui.css">
<link rel="icon" type="image/png" href="docs/assets/favicon.png">
</head>
<body>
<div id="swagger-ui"></div>
<script src="docs/assets/swagger-ui-bundle.js"></script>
<script src="docs/init.js"></script>
</body>
</html>
"""

INIT = """// Swagger UI over this service's OpenAPI document (service/apidocs.py): a file, not an inline script, so the
// page's Content-Security-Policy can allow scripts from this origin only
window.ui = SwaggerUIBundle({
  url: "openapi.json",
  dom_id: "#swagger-ui",
  layout: "BaseLayout",
  deepLinking: true,
  showExtensions: true,
  showCommonExtensions: true,
  validatorUrl: null,
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
});
"""


def swagger_ui_folder() -> Path:
    """The folder of Swagger UI's files in the installed ``fastapi-offline`` package, found without importing it
    (nor ``importlib.resources``: a replica that changed its user may no longer read the standard library's
    folder, docs/deploy.md)."""
    spec = importlib.util.find_spec("fastapi_offline")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("fastapi-offline (a dependency: its static folder holds Swagger UI) is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "static"


def add_docs(app: FastAPI) -> None:
    folder = swagger_ui_folder()

    @app.get("/docs", include_in_schema=False)
    async def docs_page():
        return HTMLResponse(PAGE, headers=_HEADERS)

    @app.get("/docs/init.js", include_in_schema=False)
    async def docs_init():
        return Response(INIT, media_type="text/javascript", headers=_HEADERS)

    @app.get("/docs/assets/{name}", include_in_schema=False)
    async def docs_asset(name: str):
        if name not in ASSETS:
            raise HTTPException(404, "no such documentation asset")
        return FileResponse(folder / name, media_type=ASSETS[name], headers=_HEADERS)
