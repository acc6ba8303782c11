"""GET /api/batches/{id}/audit: the batch's uploaded advantages checked against the registry
(estimators/audit/ through app/compute/audit.py), computed once per batch and cached."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field

from app.core.schemas import ErrorOut
from app.http.api._json import json_response
from app.http.api.batches import BatchRef
from app.storage.audits import batch_audit
from app.storage.db import SessionDep
from app.storage.store import batch_by_ref_or_404

router = APIRouter(tags=["batches"])


class AuditOut(BaseModel):
    """The audit of a batch. ``best_match``: {scheme, params, max_abs_diff, share_within_1e-5} (scheme
    null with ``closest`` and ``message`` when nothing explains the advantages). Each finding:
    {code, severity (error | warning | info), message, episodes (0-based, upload order), slugs,
    tokens ([episode, position], the first 200), token_count, evidence, first {episode, position,
    slug, url}}."""

    best_match: dict[str, Any]
    findings: list[dict[str, Any]]
    searched: int = Field(description="configurations searched")
    n_errors: int = Field(description="findings with severity error")


@router.get(
    "/api/batches/{batch_id}/audit",
    response_model=AuditOut,
    responses={404: {"model": ErrorOut}, 409: {"model": ErrorOut}, 413: {"model": ErrorOut}},
    summary="Audit the batch's uploaded advantages: best-matching configuration and findings",
)
def get_audit(request: Request, session: SessionDep, batch_id: str = BatchRef) -> Response:
    batch = batch_by_ref_or_404(session, batch_id)
    return json_response(batch_audit(session, batch, request.app.state.settings))
