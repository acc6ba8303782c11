"""Run routes: create and list training runs, post a step (one batch, any upload format), read a
run's stored per-step metrics, delete a run with its delete token."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Header, Path, Query, Request, Response
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from app.core import urls
from app.core.arrays import json_loads
from app.core.errors import ApiError, not_found
from app.core.protocol import check_protocol
from app.core.schemas import (
    CompareOut,
    ErrorOut,
    PromptOut,
    RunConfigIn,
    RunCreatedOut,
    RunEpisodeOut,
    RunIn,
    RunOut,
    RunSummaryOut,
    StepUploadOut,
)
from app.core.trainers import configured
from app.http.api._json import dumps, json_response
from app.http.api.batches import _iso
from app.http.api.deps import client_protocol, require_write, stored_id
from app.http.api.uploads import (
    FormatQuery,
    NameQuery,
    TrainerQuery,
    ingest,
    ingest_thread,
    read_upload,
    run_ingest,
)
from app.storage import logged_metrics as lm
from app.storage import runs as rs
from app.storage.db import SessionDep
from app.storage.episode_search import FIELDS, LIMIT_DEFAULT, LIMIT_MAX, search
from app.storage.models import Run
from app.storage.prompts import list_prompts, prompt_history

router = APIRouter(tags=["runs"])
ERRORS: dict[int | str, dict[str, Any]] = {404: {"model": ErrorOut}, 422: {"model": ErrorOut}}
# GET /api/runs pages: the default and the most a request may ask for (a page is one query).
RUNS_PAGE_DEFAULT = 100
RUNS_PAGE_MAX = 1000
SPARK_STEPS = 100  # the steps a run's sparkline shows (its newest)
TOTAL_DOC = "how many runs match (name), over all pages"
RunId = Path(description="the run's id (public runs) or slug (unlisted runs)", max_length=64)


def _summary(run: Run, n_steps: int, last_step: int | None, stored_bytes: int = 0) -> dict[str, Any]:
    ref = rs.run_ref(run)
    return {
        "id": run.id,
        "ref": ref,
        "visibility": run.visibility,
        "name": run.name,
        "url": urls.run(ref),
        "created_at": _iso(run.created_at),
        "n_steps": n_steps,
        "last_step": last_step,
        "keep": run.keep,
        "keep_every": run.keep_every,
        "stored_bytes": stored_bytes,
    }


def _step_exists(run_id: int | str, step: int) -> ApiError:
    return ApiError(
        409,
        "step_exists",
        f"run {run_id} already has step {step}; nothing was changed. Steps are written once (delete "
        "the run, or log under another step).",
        field="step",
    )


@router.post(
    urls.API_RUNS,
    status_code=201,
    response_model=RunCreatedOut,
    dependencies=[Depends(require_write), Depends(client_protocol)],
    responses={400: {"model": ErrorOut}, 401: {"model": ErrorOut}, 422: {"model": ErrorOut}},
    summary="Create a training run",
)
def create_run(body: RunIn, request: Request, session: SessionDep) -> Response:
    """A new run; post its steps to ``/api/runs/{ref}/steps/{step}`` (``ref``: its id, or its slug
    when unlisted; its steps inherit its visibility). The ``delete_token`` is shown once. A client
    names its wire protocol in ``X-Creditlens-Protocol`` or ``protocol`` (none: 1); one newer than
    this server's is a 400 naming both."""
    check_protocol(body.protocol, "protocol")
    visibility = body.visibility or request.app.state.settings.default_visibility
    config = configured({}, body.config, body.config_text, body.trainer)
    run, token = rs.create_run(session, body.name, config, visibility, body.keep, body.keep_every)
    ref = rs.run_ref(run)
    out = {"id": run.id, "ref": ref, "url": urls.run(ref), "api_url": urls.api_run(ref)}
    out.update(delete_token=token, visibility=run.visibility)
    return json_response(out, status_code=201)


@router.patch(
    "/api/runs/{run_id}",
    dependencies=[Depends(require_write)],
    responses={**ERRORS, 422: {"model": ErrorOut}},
    summary="Add to a run's configuration (an adapter sends its trainer's config once it has it)",
)
def patch_run(body: RunConfigIn, session: SessionDep, run_id: str = RunId) -> Response:
    """Merge ``config`` (and ``config_text``, read as a configuration file) into the run's
    configuration, setting by setting, and name its ``trainer``; the run's steps posted from now
    on read it (its estimator, options, gamma and lambda). Answers ``{"id", "ref", "config"}``."""
    run = rs.run_by_ref_or_404(session, run_id)
    config = configured(rs.run_config(run), body.config, body.config_text, body.trainer)
    rs.set_run_config(session, run, config)
    return json_response({"id": stored_id(run), "ref": rs.run_ref(run), "config": config})


@router.get(
    urls.API_RUNS,
    response_model=list[RunSummaryOut],
    responses={
        200: {"headers": {"X-Total-Count": {"description": TOTAL_DOC, "schema": {"type": "integer"}}}}
    },
    summary="Runs, newest first",
)
def get_runs(
    session: SessionDep,
    name: str | None = Query(None, description="only runs with exactly this name"),
    limit: int = Query(RUNS_PAGE_DEFAULT, ge=1, le=RUNS_PAGE_MAX, description="runs per page"),
    offset: int = Query(0, ge=0, le=2**31 - 1, description="runs to skip (newest first)"),
    spark: str | None = Query(
        None,
        description="comma-separated step metrics (e.g. pass_rate): each run gets `spark`, those "
        "metrics' last 100 steps as [[step, value], ...] (the home page's sparklines)",
    ),
) -> Response:
    """One page of the public runs (unlisted runs are never listed), with the number of runs the
    pages cover in the ``X-Total-Count`` header (the body stays a plain list)."""
    page = rs.list_runs(session, name=name, limit=limit, offset=offset)
    sizes = rs.stored_bytes(session, [stored_id(r) for r, _, _ in page])
    body = [_summary(*row, sizes.get(stored_id(row[0]), 0)) for row in page]
    names = [n.strip() for n in (spark or "").split(",") if n.strip()]
    if names:
        for out, (run, _, _) in zip(body, page, strict=True):
            series = rs.metrics_series(rs.run_steps(session, stored_id(run)))
            out["spark"] = {n: series.get(n, [])[-SPARK_STEPS:] for n in names}
    response = json_response(body)
    response.headers["X-Total-Count"] = str(rs.count_runs(session, name=name))
    return response


COMPARE_MAX = 8


def compare_refs(session: Session, runs: str | None) -> list[str]:
    """The runs ``runs=`` names, split at its commas except inside a run's name ("a, b" when a
    public run has that name: the longest name that matches wins)."""
    parts = (runs or "").split(",")
    if len(parts) > 8 * COMPARE_MAX:
        parts = parts[: 8 * COMPARE_MAX + 1]  # far too many either way: the count check says so
    refs: list[str] = []
    i = 0
    while i < len(parts):
        j = next(
            (
                j
                for j in range(len(parts), i + 1, -1)
                if rs.count_runs(session, name=",".join(parts[i:j]).strip())
            ),
            i + 1,
        )
        ref = ",".join(parts[i:j]).strip()
        if ref:
            refs.append(ref)
        i = j
    return refs


def _compare_refs(session: Session, runs: str | None) -> list[str]:
    refs = compare_refs(session, runs)
    if len(refs) < 2 or len(refs) > COMPARE_MAX:
        raise ApiError(
            422,
            "bad_compare",
            f"parameter `runs` needs 2 to {COMPARE_MAX} comma-separated run ids, slugs or names (e.g. runs=3,7); "
            f"got {len(refs)}.",
            field="runs",
        )
    if len(set(refs)) < len(refs):
        raise ApiError(422, "bad_compare", "parameter `runs` names a run twice.", field="runs")
    return refs


def compare_run(session: Session, ref: str) -> Run:
    """The run ``ref`` names in ``runs=``: its id or slug, else its exact name when one public run
    has it (404 when none does; 422 when several do: their ids tell them apart)."""
    run = rs.run_by_ref(session, ref)
    if run is not None:
        return run
    named = rs.list_runs(session, name=ref, limit=2)
    if len(named) == 1:
        return named[0][0]
    if named:
        n = rs.count_runs(session, name=ref)
        raise ApiError(
            422,
            "ambiguous_run",
            f"{n} runs are named {ref!r} (in parameter `runs`): give their ids instead.",
            field="runs",
        )
    raise ApiError(404, "not_found", f"Run {ref} (in parameter `runs`) was not found.", field="runs")


# Declared before /api/runs/{run_id}: "compare" is not a run.
@router.get(
    urls.API_RUNS_COMPARE,
    response_model=CompareOut,
    responses=ERRORS,
    summary="Runs side by side: each metric's series per run",
)
def compare_runs(
    session: SessionDep,
    runs: str | None = Query(
        None, description="2 to 8 runs, comma-separated: ids (public runs), slugs, or exact names"
    ),
) -> Response:
    """``{"runs": [{id, ref, name, url, n_steps}], "metrics": {"metric": [series of run 1, series
    of run 2, ...]}}`` with each series ``[[step, value], ...]`` (empty where a run has no value),
    in the order of ``runs``. A run the caller may not read (unknown, or unlisted named by id) is a
    404 naming the parameter."""
    out_runs: list[dict[str, Any]] = []
    series: list[dict[str, list[list[float]]]] = []
    for ref in _compare_refs(session, runs):
        run = compare_run(session, ref)
        if any(o["id"] == run.id for o in out_runs):
            raise ApiError(422, "bad_compare", "parameter `runs` names a run twice.", field="runs")
        steps = rs.run_steps(session, stored_id(run))
        r = rs.run_ref(run)
        out_runs.append({"id": run.id, "ref": r, "name": run.name, "url": urls.run(r), "n_steps": len(steps)})
        series.append(rs.metrics_series(steps))
    names = list(dict.fromkeys(name for s in series for name in s))
    metrics = {name: [s.get(name, []) for s in series] for name in names}
    return json_response({"runs": out_runs, "metrics": metrics})


@router.get(
    "/api/runs/{run_id}",
    response_model=RunOut,
    responses=ERRORS,
    summary="A run with every step's metrics (computed at ingest)",
)
def get_run(session: SessionDep, run_id: str = RunId) -> Response:
    run = rs.run_by_ref_or_404(session, run_id)
    steps = rs.run_steps(session, stored_id(run))
    size = sum(s.stored_bytes or 0 for s in steps)
    body = _summary(run, len(steps), steps[-1].step if steps else None, size)
    body["config"] = json_loads(run.config_json)
    # Whether the page asks for the trainer's own metrics (GET .../logged-metrics) at all.
    body["n_logged_steps"] = lm.count_steps(session, stored_id(run))
    # The steps' stored metrics are JSON text already: spliced in as stored rather than parsed
    # and serialised again (that was most of this answer's time for a 1,000-step run).
    head = dumps(body)[:-1]
    steps_json = b",".join(_step_json(s) for s in steps)
    return Response(head + b',"steps":[' + steps_json + b"]}", media_type="application/json")


def _step_json(s: rs.StepRow) -> bytes:
    ref = s.batch_ref
    row = {
        "step": s.step,
        "batch_id": s.batch_id,
        "batch_ref": ref,
        "url": urls.batch(ref),
        "n_episodes": s.n_episodes,
        "n_episodes_seen": s.n_episodes if s.n_episodes_seen is None else s.n_episodes_seen,
        "n_episodes_kept": s.n_episodes,
        "stored_bytes": s.stored_bytes or 0,
    }
    metrics = s.metrics_json.encode() if s.metrics_json else b"{}"
    return dumps(row)[:-1] + b',"metrics":' + metrics + b"}"


@router.get(
    "/api/runs/{run_id}/metrics",
    response_model=dict[str, list[list[float]]],
    responses=ERRORS,
    summary='A run\'s metrics as series: {"metric": [[step, value], ...]}',
)
def get_run_metrics(session: SessionDep, run_id: str = RunId) -> Response:
    run = rs.run_by_ref_or_404(session, run_id)
    return json_response(rs.metrics_series(rs.run_steps(session, stored_id(run))))


PROMPTS_PAGE_MAX = 1000


def _prompt_out(run_ref: int | str, p: dict[str, Any]) -> dict[str, Any]:
    for s in p["steps"]:
        kept = s["n_kept"] > 0 and s["group"] is not None
        s["group_url"] = urls.group(s["batch_ref"], s["group"]) if kept else None
        s["batch_url"] = urls.batch(s["batch_ref"])
    return {**p, "url": urls.run_prompt(run_ref, p["key"])}


@router.get(
    "/api/runs/{run_id}/prompts",
    response_model=list[PromptOut],
    responses={
        **ERRORS,
        200: {
            "headers": {"X-Total-Count": {"description": "prompts of the run", "schema": {"type": "integer"}}}
        },
    },
    summary="A run's prompts followed across its steps (computed at ingest over every episode)",
)
def get_run_prompts(
    session: SessionDep,
    run_id: str = RunId,
    limit: int = Query(20, ge=1, le=PROMPTS_PAGE_MAX, description="prompts per page"),
    offset: int = Query(0, ge=0, le=2**31 - 1, description="prompts skipped (the most often seen first)"),
) -> Response:
    """Each prompt (keyed by its tokens, not a trainer's per-step ids) with, per step it was in, its
    episodes ``n``, ``pass_rate``, ``mean_abs_adv`` and ``batch_id``; the most often seen first."""
    run = rs.run_by_ref_or_404(session, run_id)
    page, total = list_prompts(session, stored_id(run), limit, offset)
    ref = rs.run_ref(run)
    response = json_response([_prompt_out(ref, p) for p in page])
    response.headers["X-Total-Count"] = str(total)
    return response


@router.get(
    "/api/runs/{run_id}/prompts/{key}",
    response_model=PromptOut,
    responses=ERRORS,
    summary="One prompt of a run with every step it was in",
)
def get_run_prompt(session: SessionDep, run_id: str = RunId, key: str = Path(max_length=64)) -> Response:
    run = rs.run_by_ref_or_404(session, run_id)
    p = prompt_history(session, stored_id(run), key)
    if p is None:
        raise not_found(f"Prompt {key!r} of run {run_id}")
    return json_response(_prompt_out(rs.run_ref(run), p))


SEARCH_DOC = (
    "Filters: FIELD__OP=value (or FIELD=value for eq), all of them applying, over the fields "
    + ", ".join(FIELDS)
    + "; operators eq, ne, gt, lt on numbers, eq, ne, contains on group, eq, ne on passed; findings is "
    "the number of audit findings naming the episode (contains: their codes)."
)


@router.get(
    "/api/runs/{run_id}/episodes",
    response_model=list[RunEpisodeOut],
    responses={
        **ERRORS,
        200: {
            "headers": {"X-Total-Count": {"description": "episodes matching", "schema": {"type": "integer"}}}
        },
    },
    summary="Search and sort a run's kept episodes (fields stored at ingest)",
    description=SEARCH_DOC,
)
def search_run_episodes(
    request: Request,
    session: SessionDep,
    run_id: str = RunId,
    # sort, limit and offset are declared for /docs and read by `search` from the query string
    # together with the FIELD__OP filters, which no signature can list.
    sort: str | None = Query(  # noqa: ARG001
        None, description="FIELD or -FIELD (descending); default: step, then upload order"
    ),
    limit: str | None = Query(  # noqa: ARG001
        None, description=f"episodes per page, 1 to {LIMIT_MAX} (default {LIMIT_DEFAULT})"
    ),
    offset: str | None = Query(None, description="episodes skipped (default 0)"),  # noqa: ARG001
) -> Response:
    """One page of the run's kept episodes, with the number matching in ``X-Total-Count``."""
    run = rs.run_by_ref_or_404(session, run_id)
    page = search(session, stored_id(run), list(request.query_params.multi_items()))
    for row in page.rows:
        row["url"] = urls.episode(row["slug"])
        row["batch_url"] = urls.batch(row["batch_ref"])
    response = json_response(page.rows)
    response.headers["X-Total-Count"] = str(page.total)
    return response


@router.post(
    "/api/runs/{run_id}/steps/{step}",
    status_code=201,
    response_model=StepUploadOut,
    dependencies=[Depends(require_write), Depends(client_protocol)],
    responses={**ERRORS, 400: {"model": ErrorOut}, 409: {"model": ErrorOut}, 413: {"model": ErrorOut}},
    summary="Post one step of a run (takes exactly what POST /api/uploads takes)",
)
async def post_step(
    request: Request,
    session: SessionDep,
    run_id: str = RunId,
    step: int = Path(ge=0, lt=2**31, description="the training step (a non-negative integer)"),
    format: str | None = FormatQuery,
    name: str | None = NameQuery,
    trainer: str | None = TrainerQuery,
) -> Response:
    """The step's episodes in any upload format (multipart, JSON or raw bytes with ``?format=``),
    stored as one batch with the step's metrics. 409 when the run already has this step: nothing
    is changed (two concurrent posts of one step: the database's unique constraint lets one in)."""
    # What the step stores is computed by app.compute.step.compute_step (metrics, audit, search
    # fields, prompt history, retention); app/storage/store.py only writes it.
    run = rs.run_by_ref_or_404(session, run_id)
    ref, rid = run_id, stored_id(run)
    if rs.step_batch_id(session, rid, step) is not None:
        raise _step_exists(ref, step)  # before reading the body: a client's retry costs nothing
    run_name, visibility = run.name, run.visibility  # a step inherits its run's visibility
    keep, keep_every = run.keep, run.keep_every
    run_config = rs.run_config(run)  # ... and its trainer, with the config naming its estimator
    body = await read_upload(request, format, name, trainer=trainer, stream=True)
    settings = request.app.state.settings
    run_trainer = run_config.get("trainer") if isinstance(run_config.get("trainer"), str) else None
    try:
        out = await run_ingest(
            request,
            body,
            lambda rest: ingest(
                session,
                body,
                settings,
                default_name=f"{run_name} · step {step}",
                run_id=rid,
                step=step,
                visibility=visibility,
                keep=keep,
                trainer=run_trainer,
                trainer_config=run_config,
                rest=rest,
            ),
        )
    except IntegrityError:
        # Another post of this step won the race (or the run was deleted meanwhile).
        if rs.get_run(session, rid) is None:
            rs.run_or_404(session, rid)
        raise _step_exists(ref, step) from None
    # The step's audit (its error findings are in the timeline) was computed at ingest, over every
    # episode. Older steps are thinned now that a newer one is stored.
    if keep_every is not None:
        await ingest_thread(request, rs.thin_steps, session, rid, step, keep_every)
    out["n_episodes_kept"] = len(out["episodes"])
    return json_response({**out, "step": step}, status_code=201)


@router.delete(
    "/api/runs/{run_id}",
    status_code=204,
    dependencies=[Depends(require_write)],
    responses={403: {"model": ErrorOut}, 404: {"model": ErrorOut}},
    summary="Delete a run, its steps' batches and their episodes, with the run's delete token",
)
def remove_run(
    session: SessionDep,
    run_id: str = RunId,
    token: str | None = Query(None, description="the delete_token returned when the run was created"),
    x_delete_token: str | None = Header(None),
) -> Response:
    rs.delete_run(session, stored_id(rs.run_by_ref_or_404(session, run_id)), x_delete_token or token)
    return Response(status_code=204)
