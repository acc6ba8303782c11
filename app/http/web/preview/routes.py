"""The preview routes: ``/e/{slug}/preview.png``, ``/b/{batch_id}/preview.png`` and
``/r/{run_id}/preview.png``, drawn from our own JSON API (fetched in-process) and cached on disk."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response

from app.core import urls
from app.core.errors import ApiError
from app.http.web.internal import api_get
from app.http.web.preview.cache import cache_for, cache_key
from app.http.web.preview.draw import draw_batch, draw_episode, draw_run
from app.http.web.preview.og import short_num

router = APIRouter(include_in_schema=False)


def _raise_for(status: int, body: Any, what: str, field: str) -> None:
    """The API's refusal as the image's: 404 "does not exist" only when the API said so (404);
    any other error keeps its status, code and message (the thing exists, its image cannot be drawn)."""
    if status < 400 and body is not None:
        return
    if status == 404 or body is None:
        raise ApiError(404, "not_found", f"{what} does not exist.", field=field)
    err = (body or {}).get("error") or {}
    raise ApiError(
        status,
        err.get("code") or "preview_failed",
        f"no preview of {what}: {err.get('message') or 'its data could not be read'}",
        field=err.get("field") or field,
    )


async def episode_preview_data(request: Request, slug: str) -> dict[str, Any]:
    """What the episode image shows, from the advantages API with the default view."""

    # The episode's default view, as a link without parameters shows it (critic-free rows for an
    # episode without critic values).
    status, body = await api_get(request, urls.api_advantages(slug))
    _raise_for(status, body, f"episode {slug!r}", "slug")
    kinds = body["kinds"]
    ep = body.get("episode") or {}
    title = ep.get("task") or f"Episode {slug}"
    n_policy = sum(k == "policy" for k in kinds)
    subtitle = f"reward {short_num(ep.get('reward'))} · {len(kinds)} tokens ({n_policy} policy)"
    if body.get("group"):
        subtitle += f" · group {body['group']}"
    rows = [(s["label"], s["advantages"]) for s in body["schemes"]]
    return {"title": title, "subtitle": subtitle, "kinds": kinds, "rows": rows}


async def batch_preview_data(request: Request, batch_id: int | str) -> dict[str, Any]:

    status, body = await api_get(request, urls.api_batch(batch_id))
    _raise_for(status, body, f"batch {batch_id}", "batch_id")
    diag = body.get("diagnostics") or {}
    counts = (diag.get("reward_histogram") or {}).get("counts") or []
    adv = [e.get("group_center") for e in (diag.get("whiten_vs_center") or {}).get("episodes") or []]
    pr = diag.get("pass_rate")
    sub = f"{body.get('n_episodes', len(adv))} episodes · {len(diag.get('groups') or [])} groups"
    if pr is not None:
        sub += f" · pass rate {pr:.0%}"
    return {"title": body.get("name") or f"Batch {batch_id}", "subtitle": sub, "counts": counts, "adv": adv}


def _png_response(data: bytes, key: str, request: Request) -> Response:
    etag = f'"{key}"'
    headers = {"cache-control": "public, max-age=300", "etag": etag}
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=headers)
    return Response(data, media_type="image/png", headers=headers)


async def _cached(request: Request, kind: str, drawn: dict[str, Any], draw: Callable[[], bytes]) -> Response:
    key = cache_key(kind, drawn)
    cache = cache_for(request)
    data = cache.get(key)
    if data is None:
        data = await run_in_threadpool(draw)
        await run_in_threadpool(cache.put, key, data)
    return _png_response(data, key, request)


@router.get("/e/{slug}/preview.png")
async def episode_preview(request: Request, slug: str) -> Response:
    """The episode's link-preview image (1200×630 PNG)."""
    d = await episode_preview_data(request, slug)
    return await _cached(
        request, "episode", d, lambda: draw_episode(d["title"], d["subtitle"], d["kinds"], d["rows"])
    )


@router.get("/b/{batch_id}/preview.png")
async def batch_preview(request: Request, batch_id: str) -> Response:
    """The batch's link-preview image (1200×630 PNG); by id when public, by slug when unlisted."""
    ref = int(batch_id) if batch_id.isascii() and batch_id.isdigit() and len(batch_id) < 20 else batch_id
    d = await batch_preview_data(request, ref)
    return await _cached(
        request, "batch", d, lambda: draw_batch(d["title"], d["subtitle"], d["counts"], d["adv"])
    )


async def run_preview_data(request: Request, run_id: int | str) -> dict[str, Any]:
    """What the run image shows, from the run's API answer (metrics stored at ingest)."""

    status, body = await api_get(request, urls.api_run(run_id))
    _raise_for(status, body, f"run {run_id}", "run_id")
    steps = body.get("steps") or []
    series: dict[str, list[list[float]]] = {}
    for s in steps:
        for k, v in (s.get("metrics") or {}).items():
            if isinstance(v, int | float) and math.isfinite(v):
                series.setdefault(k, []).append([s["step"], v])
    sub = f"training run · {len(steps)} step{'s' if len(steps) != 1 else ''}"
    if steps:
        sub += f" · last step {steps[-1]['step']}"
    return {"title": body.get("name") or f"Run {run_id}", "subtitle": sub, "series": series}


@router.get("/r/{run_id}/preview.png")
async def run_preview(request: Request, run_id: str) -> Response:
    """The run's link-preview image (1200×630 PNG)."""
    d = await run_preview_data(request, run_id)
    return await _cached(request, "run", d, lambda: draw_run(d["title"], d["series"], d["subtitle"]))
