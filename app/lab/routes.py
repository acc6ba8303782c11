"""The lambda lab: pages `/lab/<figure>`, JSON/CSV API `/api/lab/<figure>`, and `/vendor/plotly.min.js`.

Every page is a shell that fetches its JSON twin (same query string) and draws it with Plotly, showing
progress while the server computes. Results are cached in ``lab_result`` by canonical parameters.
"""

from __future__ import annotations

import csv
import io
import json
import time
from functools import lru_cache

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from sqlalchemy.exc import IntegrityError
from sqlmodel import select

from ..db import SessionDep
from ..errors import ApiError
from ..templating import templates
from .compute import COMPUTE_VERSION, PARAMS, csv_rows, run_figure
from .models import LabResult
from .params import LabParamError, canonical_json, parse

router = APIRouter(tags=["lab"])

PAGES = {
    "lambda": "Bias and variance of the policy gradient across λ",
    "difficulty": "Difficulty bias of std normalisation",
    "horizon": "How far an outcome reaches: (γλ)^L",
    "recovery": "The recovery diagnostic",
}
API_FIGURES = (*PAGES, "oracle")


def _params(figure: str, request: Request) -> dict:
    try:
        return parse(PARAMS[figure], list(request.query_params.multi_items()))
    except LabParamError as exc:
        raise ApiError(exc.status, exc.code, exc.message, field=exc.field) from None


def cached_result(session, figure: str, params: dict) -> tuple[dict, bool]:
    """(result, cache_hit): the stored result for these canonical parameters, or compute and store it."""
    key = canonical_json({**params, "_v": COMPUTE_VERSION})
    row = session.exec(
        select(LabResult).where(LabResult.figure == figure, LabResult.params_json == key)
    ).first()
    if row is not None:
        return json.loads(row.result_json), True
    started = time.perf_counter()
    try:
        result = run_figure(figure, params)
    except LabParamError as exc:
        raise ApiError(exc.status, exc.code, exc.message, field=exc.field) from None
    except ValueError as exc:  # an oracle rejected the combination (e.g. probabilities)
        raise ApiError(422, "invalid_param", str(exc)) from None
    seconds = time.perf_counter() - started
    session.add(
        LabResult(
            figure=figure, params_json=key, result_json=json.dumps(result, allow_nan=False), seconds=seconds
        )
    )
    try:
        session.commit()
    except IntegrityError:  # the same figure was computed concurrently; theirs is as good as ours
        session.rollback()
    return result, False


def _csv(figure: str, result: dict) -> str:
    rows = csv_rows(figure, result)
    fields: list[str] = []
    for r in rows:
        fields.extend(k for k in r if k not in fields)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if v is None else v) for k, v in r.items()})
    return buf.getvalue()


def _api(figure: str, request: Request, session) -> Response:
    fmt = request.query_params.get("format", "json")
    if fmt not in ("json", "csv"):
        raise ApiError(422, "invalid_param", f"format must be json or csv, not {fmt!r}", field="format")
    params = _params(figure, request)
    result, hit = cached_result(session, figure, params)
    headers = {"X-Lab-Cache": "hit" if hit else "miss"}
    if fmt == "csv":
        headers["Content-Disposition"] = f'inline; filename="creditlens-lab-{figure}.csv"'
        return Response(_csv(figure, result), media_type="text/csv; charset=utf-8", headers=headers)
    return JSONResponse({**result, "cached": hit}, headers=headers)


@router.get("/api/lab/lambda", summary="Figure 1: GAE gradient bias and variance across λ (R1)")
def api_lambda(request: Request, session: SessionDep) -> Response:
    return _api("lambda", request, session)


@router.get("/api/lab/difficulty", summary="Figure 2: difficulty bias of std normalisation")
def api_difficulty(request: Request, session: SessionDep) -> Response:
    return _api("difficulty", request, session)


@router.get("/api/lab/horizon", summary="Figure 3: (γλ)^L, token-level vs turn-level")
def api_horizon(request: Request, session: SessionDep) -> Response:
    return _api("horizon", request, session)


@router.get("/api/lab/recovery", summary="Figure 4: recovery diagnostic and credit metrics")
def api_recovery(request: Request, session: SessionDep) -> Response:
    return _api("recovery", request, session)


@router.get("/api/lab/oracle", summary="Exact V, Q, A, visitation, J and E[length] of an oracle MDP")
def api_oracle(request: Request, session: SessionDep) -> Response:
    return _api("oracle", request, session)


# ---- pages -----------------------------------------------------------------------------------------


def _form_fields(figure: str, params: dict) -> list[dict]:
    out = []
    for name, spec in PARAMS[figure].items():
        value = params.get(name, spec.default)
        if isinstance(value, list):
            value = ",".join(_num(v) for v in value)
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
    return templates.TemplateResponse(request, "lab/index.html", {"pages": PAGES})


@router.get("/lab/{figure}", response_class=HTMLResponse, include_in_schema=False)
def lab_page(figure: str, request: Request) -> HTMLResponse:
    if figure not in PAGES:
        raise ApiError(404, "not_found", f"There is no lab figure {figure!r}; try {', '.join(PAGES)}.")
    error = None
    try:
        params = parse(PARAMS[figure], list(request.query_params.multi_items()))
    except LabParamError as exc:
        error = {"message": exc.message, "field": exc.field}
        params = {name: spec.default for name, spec in PARAMS[figure].items()}
    query = request.url.query
    state = {
        "figure": figure,
        "api": f"/api/lab/{figure}" + (f"?{query}" if query else ""),
        "csv": f"/api/lab/{figure}?" + (f"{query}&" if query else "") + "format=csv",
        "params": params,
        "error": error,
    }
    return templates.TemplateResponse(
        request,
        "lab/figure.html",
        {
            "figure": figure,
            "title": PAGES[figure],
            "pages": PAGES,
            "fields": _form_fields(figure, params),
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


@router.get("/vendor/plotly.min.js", include_in_schema=False)
def plotly_js(request: Request) -> Response:
    """plotly.min.js from the installed plotly package (no CDN), cached by browsers for a year."""
    body, etag = _plotly_js()
    headers = {"Cache-Control": "public, max-age=31536000, immutable", "ETag": etag}
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=headers)
    return Response(body, media_type="application/javascript; charset=utf-8", headers=headers)
