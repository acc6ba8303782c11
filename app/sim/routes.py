"""POST /api/samples (sync, or a background job with progress) and the GET /sample page."""

from __future__ import annotations

import secrets
import threading
import time
from typing import Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel
from sqlmodel import Session

from app.api.deps import require_write
from app.db import SessionDep
from app.errors import ApiError, error_body
from app.store import CreatedEpisode, create_batch
from app.templating import templates

from .policy import PolicyParams
from .service import SampleRequest, run_sample
from .tasks import TASKS

router = APIRouter(tags=["samples"])


class SampleOut(BaseModel):
    """201 body of POST /api/samples (and of a finished job, plus state/progress)."""

    batch_id: int
    url: str
    episodes: list[CreatedEpisode]
    delete_token: str
    diagnostics: dict[str, Any]


class JobStarted(BaseModel):
    job_id: str
    url: str


class JobOut(BaseModel):
    """A background sampling job: state queued|running|done|error, progress 0..1."""

    job_id: str
    state: Literal["queued", "running", "done", "error"]
    progress: float
    batch_id: int | None = None
    url: str | None = None
    episodes: list[CreatedEpisode] | None = None
    delete_token: str | None = None
    diagnostics: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


# Background jobs live in this process's memory: a job id is a random token, finished jobs are
# kept for an hour (enough for the page that started them to pick up the result).
_JOBS: dict[str, dict[str, Any]] = {}
_JOBS_LOCK = threading.Lock()
_JOB_TTL_S = 3600.0


def _store(session: Session, req: SampleRequest, settings, progress=None) -> dict:
    result = run_sample(req, progress)
    created = create_batch(
        session,
        result.episodes,
        name=req.name or req.default_name(),
        source=f"sample:{req.env}",
        meta=result.meta,
        settings=settings,
    )
    return {
        "batch_id": created.batch_id,
        "url": f"/b/{created.batch_id}",
        "episodes": [e.model_dump() for e in created.episodes],
        "delete_token": created.delete_token,
        "diagnostics": result.diagnostics,
    }


def _run_job(job_id: str, engine, req: SampleRequest, settings) -> None:
    def progress(x: float) -> None:
        with _JOBS_LOCK:
            _JOBS[job_id]["progress"] = round(min(max(x, 0.0), 1.0) * 0.98, 4)

    with _JOBS_LOCK:
        _JOBS[job_id]["state"] = "running"
    try:
        with Session(engine) as session:
            out = _store(session, req, settings, progress)
        update = {"state": "done", "progress": 1.0, **out}
    except ApiError as e:
        update = {"state": "error", "error": e.body()["error"]}
    except Exception as e:  # reported to the page that polls; the server keeps running
        update = {
            "state": "error",
            "error": error_body(500, "sample_failed", f"sampling failed: {e}")["error"],
        }
    with _JOBS_LOCK:
        _JOBS[job_id].update(update, finished=time.time())


def _prune() -> None:
    now = time.time()
    with _JOBS_LOCK:
        for k in [k for k, j in _JOBS.items() if j.get("finished") and now - j["finished"] > _JOB_TTL_S]:
            del _JOBS[k]


# Synchronous requests answer within seconds; anything larger runs as a background job.
SYNC_MAX_EPISODES = 320
SYNC_MAX_MC_CONTINUATIONS = 10_240
SYNC_MAX_CRITIC_STEPS = 300


def _sync_budget_exceeded(req: SampleRequest) -> str | None:
    """Why a synchronous request is too big, or None."""
    episodes = req.n_tasks * req.n_per_task
    if episodes > SYNC_MAX_EPISODES:
        return f"{episodes} episodes (more than {SYNC_MAX_EPISODES})"
    if req.truth == "mc" and episodes * req.n_rollouts > SYNC_MAX_MC_CONTINUATIONS:
        return (
            f"{episodes * req.n_rollouts} Monte Carlo continuations (more than {SYNC_MAX_MC_CONTINUATIONS})"
        )
    if req.critic and req.critic_steps > SYNC_MAX_CRITIC_STEPS:
        return f"{req.critic_steps} critic steps (more than {SYNC_MAX_CRITIC_STEPS})"
    return None


@router.post(
    "/api/samples",
    status_code=201,
    response_model=SampleOut,
    dependencies=[Depends(require_write)],
    summary="Sample a BugFix batch from the simulator and store it",
    responses={
        201: {
            "description": "the stored batch: batch_id, url, episodes [{id, slug, url}], delete_token, diagnostics"
        },
        202: {"model": JobStarted, "description": "with ?async=true: the job to poll"},
        413: {"description": "too large to answer synchronously: use ?async=true"},
        422: {"description": "bad parameters (the one error shape)"},
    },
)
def post_samples(
    req: SampleRequest,
    request: Request,
    session: SessionDep,
    run_async: bool = Query(False, alias="async", description="run in the background and return a job id"),
):
    """Sample `n_tasks` groups of `n_per_task` attempts with the given policy knobs and seed,
    optionally fit the critic (its values go into each episode's `values`), store the batch
    (diagnostics, including the critic's, in the batch meta) and return it."""
    settings = request.app.state.settings
    if run_async:
        _prune()
        job_id = secrets.token_urlsafe(16)
        with _JOBS_LOCK:
            _JOBS[job_id] = {"job_id": job_id, "state": "queued", "progress": 0.0, "created": time.time()}
        threading.Thread(
            target=_run_job, args=(job_id, request.app.state.engine, req, settings), daemon=True
        ).start()
        return JSONResponse({"job_id": job_id, "url": f"/api/samples/jobs/{job_id}"}, status_code=202)
    too_big = _sync_budget_exceeded(req)
    if too_big:
        raise ApiError(
            413,
            "use_async",
            f"{too_big}: too much work to answer in one request. Send it with ?async=true "
            "and poll the job (the /sample page does this and shows progress).",
        )
    try:
        return JSONResponse(_store(session, req, settings), status_code=201)
    except ValueError as e:
        raise ApiError(422, "invalid_sample", str(e)) from e


@router.get(
    "/api/samples/jobs/{job_id}",
    response_model=JobOut,
    summary="State and progress of a background sampling job",
)
def get_job(job_id: str) -> dict:
    """{"state": queued|running|done|error, "progress": 0..1, and when done: batch_id, url,
    episodes, diagnostics; on error: error}."""
    with _JOBS_LOCK:
        job = _JOBS.get(job_id)
        if job is None:
            raise ApiError(
                404, "not_found", "no such sampling job (jobs are kept for an hour after they finish)."
            )
        return {k: v for k, v in job.items() if k not in ("created", "finished")}


@router.get("/api/samples/options", summary="Tasks and policy knobs the sampler accepts, with defaults")
def sample_options() -> dict:
    return {
        "envs": ["bugfix"],
        "tasks": [{"name": t.name, "bug": t.bug, "skill": t.skill} for t in TASKS],
        "policy": PolicyParams().to_dict(),
        "defaults": SampleRequest().model_dump(),
    }


@router.get("/sample", response_class=HTMLResponse, include_in_schema=False)
def sample_page(request: Request):
    return templates.TemplateResponse(
        request,
        "sample.html",
        {
            "policy": PolicyParams().to_dict(),
            "defaults": SampleRequest().model_dump(),
            "n_tasks_max": len(TASKS),
        },
    )
