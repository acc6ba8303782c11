"""A run's logged metrics: attach a trainer's own metrics log to a run, and read it back as series.

``POST /api/runs/{id}/logged-metrics`` takes the file as ``POST /api/uploads`` does (multipart
``file``, or the raw bytes), reads it (app/ingest/_metrics_logs.py) and stores it per step
(app/storage/logged_metrics.py), merged by step; ``GET`` answers its series. These are the
trainer's numbers, kept apart from the step metrics creditlens computes from the episodes.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from pydantic import BaseModel, Field

from app.core import urls
from app.core.errors import ApiError
from app.core.schemas import ErrorOut
from app.http.api._json import json_response
from app.http.api.deps import client_protocol, require_write, stored_id
from app.http.api.uploads import ingest_thread, read_upload
from app.ingest._metrics_logs import MetricsLog, read
from app.storage import logged_metrics as lm
from app.storage import runs as rs
from app.storage.db import SessionDep

router = APIRouter(tags=["runs"])
RunId = Path(description="the run's id (public runs) or slug (unlisted runs)", max_length=64)
SKIPPED_NAMED = 20  # the skipped metrics an answer names (with their counts)


class LoggedMetricsAttachedOut(BaseModel):
    """What ``POST /api/runs/{id}/logged-metrics`` stored."""

    run_id: int
    ref: int | str
    url: str = Field(description="GET it back here")
    source: str = Field(description="what the file was, as read (and its file name when sent)")
    trainer: str | None = Field(description="the trainer the file's shape or metric names point to")
    n_records: int = Field(description="records read (lines, log_history entries)")
    n_steps: int = Field(description="steps stored from this file")
    first_step: int
    last_step: int
    n_metrics: int
    metrics: list[str] = Field(description="the metric names, in the order the file first names them")
    n_skipped: int = Field(description="values that were not finite numbers, skipped")
    skipped: dict[str, int] = Field(description=f"the first {SKIPPED_NAMED} skipped metrics: values skipped")
    records_without_step: int = Field(description="records with no step, skipped")
    replaced_steps: int = Field(description="steps stored before that this file's replaced")
    n_steps_stored: int = Field(description="the run's logged steps now, from every file attached")


class LoggedMetricsOut(BaseModel):
    """A run's logged metrics as series."""

    n_steps: int
    sources: list[str]
    names: list[str] = Field(description="every logged metric, in the order the steps first name them")
    metrics: dict[str, list[list[float]]] = Field(description='{"name": [[step, value], ...]}')


@router.post(
    "/api/runs/{run_id}/logged-metrics",
    status_code=201,
    response_model=LoggedMetricsAttachedOut,
    dependencies=[Depends(require_write), Depends(client_protocol)],
    responses={code: {"model": ErrorOut} for code in (400, 401, 403, 404, 413, 422)},
    summary="Attach a trainer's own metrics log to a run (verl, TRL, prime-rl, W&B history, ...)",
)
async def post_logged_metrics(
    request: Request,
    session: SessionDep,
    run_id: str = RunId,
    replace: bool = Query(False, description="drop the run's logged metrics first (default: merge by step)"),
) -> Response:
    """The file as ``POST /api/uploads`` takes it (multipart ``file`` or raw bytes; JSON, JSONL, a
    JSON array, or their gzip): verl's file logger lines, TRL's ``trainer_state.json``, prime-rl's
    ``metrics.jsonl``, a W&B history export, or any JSON lines with a step and numbers. Merged by
    step: a step of the file replaces that step's logged metrics whole; ``replace=true`` drops the
    others. Values that are not numbers are skipped and counted; a line that is not JSON is a 422
    naming it; nothing is stored on error."""
    run = rs.run_by_ref_or_404(session, run_id)
    rid, ref = stored_id(run), rs.run_ref(run)
    body = await read_upload(request, None, None)
    log: MetricsLog = await ingest_thread(request, read, body.data)
    source = log.shape + (f" · {body.filename}" if body.filename else "")
    replaced = await ingest_thread(request, lm.attach, session, rid, log.steps, source, replace)
    total = lm.count_steps(session, rid)
    names = log.names
    out = LoggedMetricsAttachedOut(
        run_id=rid,
        ref=ref,
        url=urls.api_run(ref) + "/logged-metrics",
        source=source,
        trainer=log.trainer,
        n_records=log.n_records,
        n_steps=len(log.steps),
        first_step=min(log.steps),
        last_step=max(log.steps),
        n_metrics=len(names),
        metrics=names,
        n_skipped=log.n_skipped,
        skipped=dict(sorted(log.skipped.items(), key=lambda kv: -kv[1])[:SKIPPED_NAMED]),
        records_without_step=log.records_without_step,
        replaced_steps=replaced,
        n_steps_stored=total,
    )
    return json_response(out.model_dump(), status_code=201)


@router.get(
    "/api/runs/{run_id}/logged-metrics",
    response_model=LoggedMetricsOut,
    responses={code: {"model": ErrorOut} for code in (404, 422)},
    summary="A run's logged metrics (the trainer's own numbers) as series",
)
def get_logged_metrics(
    session: SessionDep,
    run_id: str = RunId,
    names: str | None = Query(
        None,
        description="only these metrics (comma-separated; empty: none, just the list of names); "
        "default: every one",
        max_length=20000,
    ),
) -> Response:
    """``{"n_steps", "sources", "names", "metrics": {"name": [[step, value], ...]}}`` in step
    order; ``{}`` metrics and no names for a run without any."""
    run = rs.run_by_ref_or_404(session, run_id)
    wanted = None if names is None else {n.strip() for n in names.split(",") if n.strip()}
    if wanted is not None and len(wanted) > 1000:
        raise ApiError(422, "bad_names", "parameter `names` lists more than 1000 metrics.", field="names")
    all_names, series, sources, n = lm.series(session, stored_id(run), wanted)
    return json_response({"n_steps": n, "sources": sources, "names": all_names, "metrics": series})
