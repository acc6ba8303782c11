"""The API explorers (/docs Swagger UI, /redoc ReDoc) served offline: their assets come from the
fastapi-offline package instead of a CDN, and the bootstrap script is a static file, so the pages
run under the same Content-Security-Policy as every other page."""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import FastAPI
from fastapi.responses import HTMLResponse, Response
from fastapi.staticfiles import StaticFiles

ASSETS = Path(fastapi_offline.__file__).resolve().parent / "static"
# ReDoc's sidebar shows Redocly's logo from their CDN (which the CSP refuses): served with a local
# image instead, so /redoc makes no outside request.
REDOC_CDN_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"
LOCAL_LOGO = "/vendor/docs/favicon.png"


def redoc_script() -> bytes:
    """ReDoc's standalone bundle with its one outside URL (the CDN logo) pointed at a local file."""
    return (ASSETS / "redoc.standalone.js").read_bytes().replace(REDOC_CDN_LOGO.encode(), LOCAL_LOGO.encode())


_SWAGGER = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>creditlens API</title>
<link rel="icon" href="/vendor/docs/favicon.png">
<link rel="stylesheet" href="/vendor/docs/swagger-ui.css"></head>
<body><div id="swagger-ui" data-openapi="/openapi.json"></div>
<script src="/vendor/docs/swagger-ui-bundle.js"></script>
<script src="/static/docs.js"></script></body></html>"""

_REDOC = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>creditlens API (ReDoc)</title>
<link rel="icon" href="/vendor/docs/favicon.png"></head>
<body><redoc spec-url="/openapi.json"></redoc>
<script src="/vendor/docs/redoc.standalone.js"></script></body></html>"""


def install_docs(app: FastAPI) -> None:
    """Mount the local assets and the two explorer pages (create the app with docs_url=None)."""
    script = redoc_script()

    # Before the mount, which would serve the bundle as shipped.
    @app.get("/vendor/docs/redoc.standalone.js", include_in_schema=False)
    def redoc_bundle() -> Response:
        return Response(
            script, media_type="text/javascript", headers={"Cache-Control": "public, max-age=86400"}
        )

    app.mount("/vendor/docs", StaticFiles(directory=str(ASSETS)), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    def swagger() -> HTMLResponse:
        return HTMLResponse(_SWAGGER)

    @app.get("/redoc", include_in_schema=False)
    def redoc() -> HTMLResponse:
        return HTMLResponse(_REDOC)
