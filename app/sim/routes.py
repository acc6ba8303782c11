"""POST /api/samples (sync, or a background job with progress) and the GET /sample page."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel
from sqlmodel import Session

from app.core.errors import ApiError
from app.core.settings import Settings
from app.http.api.deps import require_write
from app.http.templating import templates
from app.sim.policy import PolicyParams
from app.sim.service import SampleRequest, run_sample
from app.sim.tasks import TASKS
from app.storage import jobs
from app.storage.db import SessionDep
from app.storage.store import CreatedEpisode, create_batch

router = APIRouter(tags=["samples"])


class SampleOut(BaseModel):
    """201 body of POST /api/samples (and of a finished job, plus state/progress)."""

    batch_id: int
    url: str
    episodes: list[CreatedEpisode]
    delete_token: str
    diagnostics: dict[str, Any]
    visibility: Literal["public", "unlisted"] = "public"
    api_url: str | None = None


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


def _store(
    session: Session,
    req: SampleRequest,
    settings: Settings,
    progress: Callable[[float], None] | None = None,
) -> dict[str, Any]:
    result = run_sample(req, progress)
    created = create_batch(
        session,
        result.episodes,
        name=req.name or req.default_name(),
        source=f"sample:{req.env}",
        meta=result.meta,
        settings=settings,
        visibility=req.visibility or settings.default_visibility,
    )
    return {
        "batch_id": created.batch_id,
        "url": created.url,
        "api_url": created.api_url,
        "visibility": created.visibility,
        "episodes": [e.model_dump() for e in created.episodes],
        "delete_token": created.delete_token,
        "diagnostics": result.diagnostics,
    }


# Background sampling jobs are rows of the job table (app/storage/jobs.py): any worker process runs them
# and any answers a poll; a job id is a random token, finished jobs are kept for CREDITLENS_JOB_TTL_S.
@jobs.register("sample")
def _sample_job(params: dict[str, Any], ctx: jobs.JobContext) -> dict[str, Any]:
    req = SampleRequest.model_validate(params)
    try:
        with Session(ctx.engine) as session:
            return _store(session, req, ctx.settings, ctx.progress)
    except (ApiError, jobs.JobReleased):
        raise
    except Exception as e:  # reported to the page that polls; the server keeps running
        raise ApiError(500, "sample_failed", f"sampling failed: {e}") from e


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
) -> JSONResponse:
    """Sample `n_tasks` groups of `n_per_task` attempts with the given policy knobs and seed,
    optionally fit the critic (its values go into each episode's `values`), store the batch
    (diagnostics, including the critic's, in the batch meta) and return it."""
    settings = request.app.state.settings
    if run_async:
        job_id = request.app.state.jobs.submit("sample", req.model_dump(mode="json"))
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
def get_job(job_id: str, request: Request) -> dict[str, Any]:
    """{"state": queued|running|done|error, "progress": 0..1, and when done: batch_id, url,
    episodes, diagnostics; on error: error}. Any worker process answers."""
    ttl = request.app.state.settings.job_ttl_s
    job = jobs.poll(request.app.state.engine, job_id, ttl)
    if job is None:
        kept = "an hour" if ttl == 3600 else f"{ttl:g} seconds"
        raise ApiError(
            404, "not_found", f"no such sampling job (jobs are kept for {kept} after they finish)."
        )
    return job


@router.get("/api/samples/options", summary="Tasks and policy knobs the sampler accepts, with defaults")
def sample_options() -> dict[str, Any]:
    return {
        "envs": ["bugfix"],
        "tasks": [{"name": t.name, "bug": t.bug, "skill": t.skill} for t in TASKS],
        "policy": PolicyParams().to_dict(),
        "defaults": SampleRequest().model_dump(),
    }


@router.get("/sample", response_class=HTMLResponse, include_in_schema=False)
def sample_page(request: Request) -> Response:
    return templates.TemplateResponse(
        request,
        "sample.html",
        {
            "policy": PolicyParams().to_dict(),
            "defaults": SampleRequest().model_dump(),
            "n_tasks_max": len(TASKS),
        },
    )
