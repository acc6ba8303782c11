"""The lab's routes: pages `/lab/<figure>`, JSON/CSV API `/api/lab/<figure>`, and the
vendored Plotly bundles `/vendor/plotly.min.js` and `/vendor/plotly-basic.min.js`.

Every page is a shell that fetches its JSON twin (same query string) and draws it with Plotly, showing
progress while the server computes. One handler serves every figure of app/lab/figures/.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from sqlmodel import Session

from app.core import urls
from app.core.errors import ApiError
from app.core.resources import static_dir
from app.http.templating import templates
from app.lab.compute import cached_result, csv_text
from app.lab.figures import Figure, figures, pages
from app.lab.params import Params, parse
from app.storage.db import SessionDep

router = APIRouter(tags=["lab"])


def figure_api(figure: str, request: Request, session: Session) -> Response:
    """The figure's result for the request's query: JSON, or CSV with ``format=csv``."""
    fmt = request.query_params.get("format", "json")
    if fmt not in ("json", "csv"):
        raise ApiError(422, "invalid_param", f"format must be json or csv, not {fmt!r}", field="format")
    params = parse(figures()[figure].PARAMS, list(request.query_params.multi_items()))
    result, hit = cached_result(session, figure, params, request.app.state.settings)
    headers = {"X-Lab-Cache": "hit" if hit else "miss"}
    if fmt == "csv":
        headers["Content-Disposition"] = f'inline; filename="creditlens-lab-{figure}.csv"'
        return Response(csv_text(figure, result), media_type="text/csv; charset=utf-8", headers=headers)
    return JSONResponse({**result, "cached": hit}, headers=headers)


def _endpoint(figure: str) -> Callable[[Request, SessionDep], Response]:
    def endpoint(request: Request, session: SessionDep) -> Response:
        return figure_api(figure, request, session)

    return endpoint


def _add_api_routes() -> None:
    # One path per figure (not a path parameter): /docs lists each figure with its summary, and an
    # unknown figure is the service's ordinary 404.
    for name, mod in figures().items():
        router.add_api_route(
            urls.api_lab(name), _endpoint(name), methods=["GET"], summary=mod.SUMMARY, name=f"api_{name}"
        )


_add_api_routes()


# ---- pages -----------------------------------------------------------------------------------------


def _form_fields(mod: Figure, params: Params) -> list[dict[str, Any]]:
    out = []
    for name, spec in mod.PARAMS.items():
        value = params.get(name, spec.default)
        if isinstance(value, list):
            value = ",".join(v if isinstance(v, str) else _num(v) for v in value)
        elif isinstance(value, float):
            value = _num(value)
        out.append(
            {
                "name": name,
                "value": value,
                "kind": spec.kind,
                "choices": list(spec.choices),
                "help": spec.help,
            }
        )
    return out


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(float(x))


@router.get("/lab", response_class=HTMLResponse, include_in_schema=False)
def lab_index(request: Request) -> HTMLResponse:
    return templates.TemplateResponse(request, "lab/index.html", {"pages": pages()})


@router.get("/lab/{figure}", response_class=HTMLResponse, include_in_schema=False)
def lab_page(figure: str, request: Request) -> HTMLResponse:
    titles = pages()
    if figure not in titles:
        raise ApiError(404, "not_found", f"There is no lab figure {figure!r}; try {', '.join(titles)}.")
    mod = figures()[figure]
    error = None
    try:
        params = parse(mod.PARAMS, list(request.query_params.multi_items()))
    except ApiError as exc:
        error = {"message": exc.message, "field": exc.field}
        params = {name: spec.default for name, spec in mod.PARAMS.items()}
    query = request.url.query
    state = {
        "figure": figure,
        "api": urls.api_lab(figure, query),
        "csv": urls.api_lab(figure, query, fmt="csv"),
        "params": params,
        "error": error,
    }
    return templates.TemplateResponse(
        request,
        "lab/figure.html",
        {
            "figure": figure,
            "title": mod.TITLE,
            "intro": mod.INTRO,
            "pages": titles,
            "fields": _form_fields(mod, params),
            "state": state,
            "error": error,
        },
        status_code=422 if error else 200,
    )


# ---- vendored Plotly ---------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _plotly_js() -> tuple[bytes, str]:
    import plotly  # noqa: PLC0415
    from plotly.offline import get_plotlyjs  # noqa: PLC0415

    return get_plotlyjs().encode(), f'"plotly-{plotly.__version__}"'


@lru_cache(maxsize=1)
def _plotly_basic_js() -> tuple[bytes, str]:
    # static/vendor/ holds plotly.js's own "basic" dist bundle, of the plotly.js version the
    # installed plotly package bundles (a test keeps the two in step).
    body = (static_dir() / "vendor" / "plotly-basic.min.js").read_bytes()
    return body, f'"plotly-basic-{hashlib.sha256(body).hexdigest()[:16]}"'


def _immutable_js(request: Request, body: bytes, etag: str) -> Response:
    """A script cached by browsers for a year (its URL changes only with a new release)."""
    headers = {"Cache-Control": "public, max-age=31536000, immutable", "ETag": etag}
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=headers)
    return Response(body, media_type="application/javascript; charset=utf-8", headers=headers)


@router.get(urls.PLOTLY, include_in_schema=False)
def plotly_js(request: Request) -> Response:
    """plotly.min.js from the installed plotly package (no CDN), cached by browsers for a year."""
    return _immutable_js(request, *_plotly_js())


@router.get(urls.PLOTLY_BASIC, include_in_schema=False)
def plotly_basic_js(request: Request) -> Response:
    """Plotly's basic bundle (scatter, bar, pie): 1.2 MB instead of 4.8 MB, for the run page."""
    return _immutable_js(request, *_plotly_basic_js())
