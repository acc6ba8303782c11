"""Batch routes: list/search, one batch with diagnostics, one group's baselines, deletion."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import numpy as np
from fastapi import APIRouter, Depends, Header, Path, Query, Request, Response
from sqlmodel import Session

from app.compute import loss_view as lv
from app.compute.diagnostics import GROUP_DETAIL_BASELINES, Diagnostics, group_detail
from app.compute.refusals import check_budget
from app.core import domain, urls
from app.core.arrays import F64, decode, json_loads
from app.core.errors import ApiError, not_found
from app.core.schemas import BatchOut, BatchSummaryOut, EpisodeSummary, ErrorOut, GroupOut
from app.core.settings import Settings
from app.http.api import losses as loss_api
from app.http.api._json import json_response
from app.http.api.deps import require_write, stored_id
from app.storage.audits import audit_blocker
from app.storage.batch_cache import batch_summary, cached_diagnostics
from app.storage.batch_stats import compute_batch_diagnostics
from app.storage.db import SessionDep
from app.storage.episodes import (
    batch_cells,
    batch_loss_rows,
    batch_summaries,
    group_summaries,
    max_credit,
)
from app.storage.models import Batch, BatchStats
from app.storage.store import batch_by_ref_or_404, batch_ref, delete_batch, list_batches
from app.storage.store import get_batch as get_batch_row

router = APIRouter(tags=["batches"])
ERRORS: dict[int | str, dict[str, Any]] = {404: {"model": ErrorOut}, 422: {"model": ErrorOut}}
# A batch in a path: its id when public, its slug when unlisted (an unlisted batch's id is a 404).
BatchRef = Path(description="the batch's id (public batches) or slug (unlisted batches)", max_length=64)


def _iso(t: datetime) -> str:
    """UTC, ISO 8601 with a Z (SQLite hands datetimes back naive, PostgreSQL aware)."""
    if t.tzinfo is not None:
        t = t.astimezone(UTC).replace(tzinfo=None)
    return t.isoformat(timespec="seconds") + "Z"


def summary(b: Batch) -> dict[str, Any]:
    return {
        "id": b.id,
        "name": b.name,
        "source": b.source,
        "created_at": _iso(b.created_at),
        "n_episodes": b.n_episodes,
        "n_episodes_seen": b.n_episodes if b.n_episodes_seen is None else b.n_episodes_seen,
        # Where to read it: by id when public, by its random slug when unlisted.
        "ref": batch_ref(b),
        "url": urls.batch(batch_ref(b)),
        "visibility": b.visibility,
    }


@router.get("/api/batches", response_model=list[BatchSummaryOut], summary="Batches, newest first")
def get_batches(
    session: SessionDep,
    q: str | None = Query(None, description="search in names and sources"),
    source: str | None = Query(None, description="only sources starting with this (upload, sample, demo)"),
    limit: int = Query(100, ge=1, le=1000),
    offset: int = Query(0, ge=0, le=2**31 - 1),
    steps: bool | None = Query(
        None, description="true: only training runs' steps; false: none of them (default: both)"
    ),
) -> list[dict[str, Any]]:
    page = list_batches(session, q=q, source=source, limit=limit, offset=offset, steps=steps)
    return [summary(b) for b in page]


def _episode_row(r: EpisodeSummary) -> dict[str, Any]:
    """The batch API's episode row: the summary without its meta; no outcome reward -> the score
    of its per-token rewards, and null when it has none (nothing is made up)."""
    row = r._asdict()
    del row["meta_json"]
    if r.reward is None:
        row["reward"] = r.score if r.rewarded else None
    return row


# The default and largest page of GET /api/batches/{id}: answers stay bounded however big the batch.
PAGE_DEFAULT = 500
PAGE_MAX = 5000


def _diagnostics(session: Session, b: Batch, settings: Settings) -> Diagnostics:
    """The batch's diagnostics: stored at ingest (batch_stats), read once per worker and batch
    state (app/storage/batch_cache.py); a batch stored before that table existed computes them here."""

    def read() -> tuple[Diagnostics, int]:
        row = session.get(BatchStats, b.id)
        if row is not None and row.n_episodes == b.n_episodes:
            return json_loads(row.diagnostics_json), row.n_episodes
        return compute_batch_diagnostics(session, stored_id(b))

    return cached_diagnostics(session, b, read, settings)


@router.get(
    "/api/batches/{batch_id}",
    response_model=BatchOut,
    responses=ERRORS,
    summary="A batch with diagnostics and one page of its episodes",
)
def get_batch(
    request: Request,
    session: SessionDep,
    batch_id: str = BatchRef,
    limit: int = Query(PAGE_DEFAULT, ge=1, le=PAGE_MAX, description="episodes per page"),
    offset: int = Query(0, ge=0, le=2**31 - 1, description="episodes to skip (upload order)"),
) -> Response:
    b = batch_by_ref_or_404(session, batch_id)
    bid = stored_id(b)
    total = b.n_episodes
    diagnostics = _diagnostics(session, b, request.app.state.settings)
    rows = batch_summaries(session, bid, limit=limit, offset=offset)
    if not rows and offset < total and get_batch_row(session, bid) is None:
        raise not_found(f"Batch {bid}")  # deleted while we read it
    body = summary(b)
    body["meta"] = json_loads(b.meta_json)
    body["episodes"] = [_episode_row(r) for r in rows]
    # The trainer's credit per episode: its largest |A| on a policy token and where (the page ranks
    # episodes by it and links straight to that token); null without uploaded advantages.
    for row, credit in zip(body["episodes"], max_credit(session, bid, limit, offset), strict=False):
        row["max_abs_adv"], row["max_abs_adv_at"] = credit if credit is not None else (None, None)
    wvc = diagnostics.get("whiten_vs_center") or {}
    # The per-episode comparison is paged with the episodes; the aggregates cover the whole batch.
    body["diagnostics"] = {
        **diagnostics,
        "whiten_vs_center": {**wvc, "episodes": wvc.get("episodes", [])[offset : offset + limit]},
    }
    # Whether GET .../audit can answer (the page asks only then): its 409/413 message otherwise.
    blocker = audit_blocker(session, b, request.app.state.settings)
    body["audit"] = {
        "possible": blocker is None,
        "code": None if blocker is None else blocker.code,
        "reason": None if blocker is None else blocker.message,
        "url": urls.api_audit(batch_ref(b)),
    }
    body["total"] = total
    body["limit"] = limit
    body["offset"] = offset
    body["next"] = urls.api_batch(bid, limit, offset + limit) if offset + limit < total else None
    return json_response(body)


@router.get(
    "/api/batches/{batch_id}/loss",
    responses={**ERRORS, 409: {"model": ErrorOut}, 413: {"model": ErrorOut}},
    summary="Per-episode loss weight vs length and the |A| removed by clipping and masking",
)
def get_batch_loss(
    request: Request,
    session: SessionDep,
    batch_id: str = BatchRef,
    params: lv.LossParams = Depends(loss_api.loss_params),
) -> Response:
    b = batch_by_ref_or_404(session, batch_id)
    check_budget(
        batch_cells(session, stored_id(b)) * 8,
        request.app.state.settings.max_compute_cells,
        f"the loss view of this {b.n_episodes}-episode batch",
        "Upload a smaller batch.",
    )
    eps = []
    for row in batch_loss_rows(session, stored_id(b)):
        adv = decode(row.advantages, F64)
        if adv is None:
            raise ApiError(
                409,
                "no_advantages",
                f"episode {row.slug} has no uploaded `advantages`: the loss view weighs the trainer's own.",
                field="advantages",
            )
        policy = decode(row.kinds, np.dtype(np.uint8)) == domain.POLICY
        eps.append(
            (row.slug, row.group, adv, policy, decode(row.logprobs, F64), decode(row.rollout_logprobs, F64))
        )
    return json_response(lv.batch_loss(eps, params))


@router.get(
    "/api/batches/{batch_id}/groups/{group:path}",
    response_model=GroupOut,
    responses=ERRORS,
    summary="One group: each member's outcome advantage under every baseline",
)
def get_group(request: Request, group: str, session: SessionDep, batch_id: str = BatchRef) -> Response:
    b = batch_by_ref_or_404(session, batch_id)
    bid = stored_id(b)
    summary_ = batch_summary(session, b, request.app.state.settings)
    idx = summary_.members(group)
    rows = group_summaries(session, bid, group)
    if len(rows) == len(idx):
        advantages = {name: summary_.advantages(name)[idx] for name in GROUP_DETAIL_BASELINES}
        detail = group_detail(rows, group, advantages)
    else:  # the batch changed between the two reads: compute from one read of it
        detail = group_detail(batch_summaries(session, bid), group)
    if detail is None:
        raise not_found(f"Group {group!r} of batch {bid}")
    # What each attempt did (meta.calls, when the upload says), so the page needs no request per
    # attempt.
    calls = {r.slug: json_loads(r.meta_json or "{}").get("calls") for r in rows if r.group == group}
    for e in detail["episodes"]:
        c = calls.get(e["slug"])
        e["calls"] = c if isinstance(c, list) else None
    return json_response(detail)


@router.delete(
    "/api/batches/{batch_id}",
    status_code=204,
    dependencies=[Depends(require_write)],
    responses={403: {"model": ErrorOut}, 404: {"model": ErrorOut}},
    summary="Delete a batch with its delete token",
)
def remove_batch(
    session: SessionDep,
    batch_id: str = BatchRef,
    token: str | None = Query(None, description="the delete_token returned by the upload"),
    x_delete_token: str | None = Header(None),
) -> Response:
    delete_batch(session, stored_id(batch_by_ref_or_404(session, batch_id)), x_delete_token or token)
    return Response(status_code=204)
