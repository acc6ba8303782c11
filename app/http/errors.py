"""The FastAPI handlers that answer every error in the one shape of app/core/errors.py: ApiError,
HTTPException (404 for unknown routes included) and request validation errors; a 404 on an HTML
page renders the HTML 404 page."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.core.errors import ApiError, error_body
from app.http.templating import templates

_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "too_large",
    415: "unsupported_media_type",
    422: "invalid",
    429: "too_many_requests",
}


def _loc_field(loc: tuple[Any, ...]) -> str | None:
    # FastAPI locations look like ("query", "gamma") or ("body", "episodes", 0, "tokens").
    parts = [str(p) for p in loc if p not in ("query", "body", "path", "header", "cookie")]
    return ".".join(parts) or None


def _html_not_found(request: Request) -> Response | None:
    """The HTML 404 page when a 404 comes from an HTML page's route and the client asks for HTML
    (a browser); else None (the one JSON error shape)."""
    route = request.scope.get("route")
    if getattr(route, "response_class", None) is not HTMLResponse:
        return None
    if request.query_params.get("format") == "json" or "text/html" not in request.headers.get("accept", ""):
        return None
    return templates.TemplateResponse(request, "not_found.html", {"what": request.url.path}, status_code=404)


def install_error_handlers(app: FastAPI) -> None:
    """Make ApiError, HTTPException (incl. 404 for unknown routes) and request validation errors
    all answer in the one shape; a 404 on an HTML page's route renders the HTML 404 page."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> Response:
        if exc.status == 404 and (page := _html_not_found(request)) is not None:
            return page
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _HTTP_CODES.get(exc.status_code, "error")
        if exc.status_code == 404 and exc.detail in (None, "Not Found"):
            message = f"There is nothing at {request.url.path}; see /docs for the API."
        else:
            message = str(exc.detail)
        return JSONResponse(
            error_body(exc.status_code, code, message), status_code=exc.status_code, headers=exc.headers
        )

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {}
        field = _loc_field(tuple(first.get("loc", ())))
        msg = first.get("msg", "invalid request")
        message = f"parameter `{field}`: {msg}" if field else msg
        if len(errors) > 1:
            message += f" (and {len(errors) - 1} more problem(s))"
        return JSONResponse(error_body(422, "invalid_request", message, field=field), status_code=422)
