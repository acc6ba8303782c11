"""HTML pages and their JSON twins.

Every page answers ``?format=json`` (or ``Accept: application/json``) with its data: the view
state parsed from the query string, the JSON API URL the page's script reads, and that API's
answer (fetched in-process, so the twin and the page can never disagree about the numbers).
The HTML itself carries only the initial state; the browser fetches the numbers.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from sqlmodel import Session, col, select

from app.core import losses, metrics, schemes, trainers, urls
from app.core import views as st
from app.core.arrays import json_loads
from app.core.errors import ApiError, error_body
from app.core.signals import catalog as signal_catalog
from app.http.api.runs import compare_refs, compare_run
from app.http.templating import templates
from app.http.web.internal import api_get
from app.http.web.preview import batch_og, episode_og, run_og
from app.http.web.rows import row_groups
from app.http.web.talk import STEPS, step_or_none
from app.storage.db import SessionDep
from app.storage.episodes import episode_inputs_by_slug, episode_trainer_by_slug
from app.storage.models import Batch, Episode, Run
from app.storage.runs import list_runs, run_by_ref, run_ref
from app.storage.store import batch_by_ref, batch_ref

router = APIRouter(include_in_schema=False)
COMPARE_PICKER = 100  # the runs a run page's "Compare with" offers (the newest)


# The episode page's loss controls (verl's parameters; app/core/losses.py, from the loss registry).
LOSS_CHOICES = losses.page_choices()


def wants_json(request: Request) -> bool:
    """True for ``?format=json`` or an Accept header that asks for JSON and not HTML."""
    if request.query_params.get("format") == "json":
        return True
    accept = request.headers.get("accept", "")
    return "application/json" in accept and "text/html" not in accept


async def json_twin(request: Request, page: dict[str, Any], api_url: str | None) -> JSONResponse:
    """The page's data: ``page`` (view state) + ``api`` URL + ``data`` (the API's answer)."""
    out = {**page, "api": api_url}
    status = 200
    if api_url is not None:
        status, body = await api_get(request, api_url)
        if status >= 400:
            # The API's error shape passes through unchanged.
            return JSONResponse(body, status_code=status)
        out["data"] = body
    return JSONResponse(out, status_code=status)


def render(request: Request, name: str, ctx: dict[str, Any], status_code: int = 200) -> HTMLResponse:
    return templates.TemplateResponse(request, name, ctx, status_code=status_code)


def not_found_page(request: Request, what: str) -> HTMLResponse:
    return render(request, "not_found.html", {"what": what}, status_code=404)


def run_of_batch(session: Session, batch_id: int) -> dict[str, Any] | None:
    """{"id", "name", "step"} of the run whose step a batch is, or None (one small query); "id" is
    what the run's URLs carry (its slug when unlisted)."""
    stmt = select(Run, Batch.step).join(Run, col(Run.id) == Batch.run_id).where(Batch.id == batch_id)
    row = session.exec(stmt).first()
    return None if row is None else {"id": run_ref(row[0]), "name": row[0].name, "step": row[1]}


@router.get("/", response_class=HTMLResponse)
async def home(request: Request) -> Response:
    """Home: batches (search ``q``, filter ``source``) and the upload form."""
    q = request.query_params.get("q", "")
    source = request.query_params.get("source", "")
    if source not in urls.HOME_SHOWS:
        source = ""
    api = urls.api_batches(q, *urls.HOME_SHOWS[source])
    page = {"page": "home", "view": {"q": q, "source": source}}
    if wants_json(request):
        return await json_twin(request, page, api)
    # Each "Show" choice's batch list query (without the search), for the script.
    shows = {k: urls.api_batches("", *v).partition("?")[2] for k, v in urls.HOME_SHOWS.items()}
    initial = {**page, "api": api, "shows": shows}
    ctx = {"initial": initial, "q": q, "source": source, "trainers": trainers.known()}
    return render(request, "home.html", ctx)


@router.get("/e/{slug}", response_class=HTMLResponse)
async def episode_page(request: Request, slug: str, session: SessionDep) -> Response:
    """One episode: stacked token strips, controls, per-call table. State = query string."""
    q = dict(request.query_params)
    # The episode's inputs decide its default rows (no critic-reading row without critic values),
    # so the page's first request is one the API answers (app/compute/inputs.py).
    inputs = episode_inputs_by_slug(session, slug)
    # The trainer its batch names: its dialect and that dialect's reference under the upload.
    trainer, config = episode_trainer_by_slug(session, slug)
    dialect = trainers.dialect_of(trainer, config)
    rows = [] if dialect is None else [dialect, *filter(None, [schemes.reference_of(dialect)])]
    # Its config's gamma, lambda and dialect options, unless the link says otherwise.
    q = {**trainers.config_query(trainer, config), **q}
    view = st.EpisodeView.from_query(q, set(schemes.names()), inputs, rows)
    api = urls.api_advantages(slug, view)
    page = {"page": "episode", "slug": slug, "view": view.to_dict(), "query": view.query()}
    if wants_json(request):
        return await json_twin(request, page, api)
    # Only the small columns: the page needs to know the episode exists and its task.
    head = session.exec(
        select(Episode.task, Episode.n_tokens, Episode.batch_id).where(Episode.slug == slug)
    ).first()
    if head is None:
        return not_found_page(request, f"Episode {slug}")
    initial = {
        **page,
        "api": api,
        "episode_api": urls.api_episode(slug),
        "schemes": schemes.client_config(),
        "query_keys": st.QUERY_KEYS,
        "signals": signal_catalog(),
        # The link asked for rows that read critic values the episode lacks: shown with V = 0.
        "critic_fallback": q.get("critic") is None and view.critic == schemes.NO_CRITIC,
    }
    nums = {"gamma": st.fmt_num(view.gamma), "lam": st.fmt_num(view.lam)}
    ctx = {"initial": initial, "slug": slug, "view": view, "nums": nums, "task": head[0]}
    ctx["loss_choices"] = LOSS_CHOICES
    # Every registered loss grouped by trainer, with its controls (static/episode.js draws them).
    ctx["losses"] = initial["losses"] = losses.client_config()
    ctx["row_groups"] = row_groups(view.schemes)
    b = session.get(Batch, head[2])
    ref = batch_ref(b) if b is not None else head[2]  # an unlisted batch is linked by its slug
    initial["batch_ref"] = ref
    ctx.update(batch_id=ref, run=run_of_batch(session, head[2]))
    ctx["og"] = episode_og(request, session, slug)
    return render(request, "episode.html", ctx)


def _ref_param(ref: str) -> int | str:
    """A batch/run path segment as the URL builders take it: an id as an int, a slug as is."""
    return int(ref) if ref.isascii() and ref.isdigit() and len(ref) < 20 else ref


@router.get("/b/{batch_id}", response_class=HTMLResponse)
async def batch_page(request: Request, batch_id: str, session: SessionDep) -> Response:
    """One batch (by id when public, by slug when unlisted): diagnostics (Plotly) and its episodes."""
    ref = _ref_param(batch_id)
    api = urls.api_batch(ref)
    page = {"page": "batch", "batch_id": ref, "view": {"q": request.query_params.get("q", "")}}
    if wants_json(request):
        return await json_twin(request, page, api)
    b = batch_by_ref(session, ref)
    if b is None:
        return not_found_page(request, f"Batch {batch_id}")
    assert b.id is not None  # a stored row has its id
    og = batch_og(request, session, b.id, ref)
    # Every registered loss, grouped by trainer, with its parameters and defaults (static/batch.js);
    # a batch that names its trainer opens on the loss its config says it trained with.
    loss_config = losses.client_config()
    meta = json_loads(b.meta_json or "{}")
    trained_with = None
    if isinstance(meta, dict) and isinstance(meta.get("trainer"), str):
        cfg = meta.get("trainer_config")
        cfg = cfg if isinstance(cfg, dict) else None
        trained = trainers.loss_of(meta["trainer"], cfg)
        if trained is not None and trained in loss_config["losses"]:
            loss_config = {**loss_config, "default": trained}
        trained_with = trainers.summary(meta["trainer"], cfg, trained)
    initial = {**page, "api": api, "losses": loss_config}
    ctx = {"initial": initial, "batch_id": ref, "og": og, "losses": loss_config, "batch_name": b.name}
    ctx["trained_with"] = trained_with
    return render(request, "batch.html", {**ctx, "run": run_of_batch(session, b.id)})


# Declared before /r/{run_id}: "compare" is not a run.
@router.get(urls.RUN_COMPARE, response_class=HTMLResponse)
async def compare_page(request: Request, session: SessionDep, runs: str = "") -> Response:
    """Runs side by side (by id, slug or name): where they differ at their last step, and every
    metric over the steps, one colour per run, links back to each."""
    refs = compare_refs(session, runs)  # a run's name may hold a comma
    api = urls.api_compare(refs)
    page = {
        "page": "compare",
        "runs": refs,
        "view": {"runs": runs, "smooth": request.query_params.get("smooth")},
    }
    if wants_json(request):
        return await json_twin(request, page, api)
    names = []
    for ref in refs:  # the title names the runs; the page's request says what is wrong, if anything
        try:
            names.append(compare_run(session, ref).name)
        except ApiError:
            names.append(ref)
    initial = {**page, "api": api, "labels": metrics.labels(), "figures": metrics.run_figures()}
    return render(
        request, "compare.html", {"initial": initial, "refs": refs, "names": names or ["compare runs"]}
    )


@router.get("/r/{run_id}", response_class=HTMLResponse)
async def run_page(request: Request, run_id: str, session: SessionDep) -> Response:
    """One training run: its config and the timeline of every stored step metric (Plotly); a
    click on a point opens that step's batch. Reads the run's one API answer, never episodes."""
    ref = _ref_param(run_id)
    api = urls.api_run(ref)
    page: dict[str, Any] = {"page": "run", "run_id": ref, "view": {}}
    if wants_json(request):
        return await json_twin(request, page, api)
    run = run_by_ref(session, ref)
    if run is None:
        return not_found_page(request, f"Run {ref}")
    # The metrics' names, labels and formats (app/core/metrics.py): the page draws what they say.
    initial = {**page, "api": api, "figures": metrics.run_figures(), "labels": metrics.labels()}
    ctx: dict[str, Any] = {"initial": initial, "run_id": ref, "name": run.name}
    config = json_loads(run.config_json or "{}")
    named = config.get("trainer") if isinstance(config, dict) else None
    if isinstance(named, str):
        ctx["trained_with"] = trainers.summary(named, config, trainers.loss_of(named, config))
    # "Compare with": the other public runs by name, newest first, in the HTML (no request).
    ctx["others"] = [
        {"ref": run_ref(r), "name": r.name, "n_steps": n}
        for r, n, _ in list_runs(session, limit=COMPARE_PICKER)
        if r.id != run.id
    ]
    return render(request, "run.html", {**ctx, "og": run_og(request, session, ref)})


@router.get("/r/{run_id}/prompts/{key}", response_class=HTMLResponse)
async def run_prompt_page(request: Request, run_id: str, key: str, session: SessionDep) -> Response:
    """One prompt of a run followed over the steps: its pass rate and credit per step (Plotly),
    and a link to its group at each step whose episodes are kept."""
    ref = _ref_param(run_id)
    api = urls.api_run_prompt(ref, key)
    page: dict[str, Any] = {"page": "run_prompt", "run_id": ref, "key": key, "view": {}}
    if wants_json(request):
        return await json_twin(request, page, api)
    run = run_by_ref(session, ref)
    if run is None:
        return not_found_page(request, f"Run {ref}")
    initial = {**page, "api": api, "run_url": urls.run(ref)}
    return render(
        request, "run_prompt.html", {"initial": initial, "run_id": ref, "name": run.name, "key": key}
    )


@router.get("/b/{batch_id}/g/{group}", response_class=HTMLResponse)
async def group_page(request: Request, batch_id: str, group: str, session: SessionDep) -> Response:
    """One group: the G attempts side by side under every group baseline."""
    ref = _ref_param(batch_id)
    api = urls.api_group(ref, group)
    page: dict[str, Any] = {"page": "group", "batch_id": ref, "group": group, "view": {}}
    if wants_json(request):
        return await json_twin(request, page, api)
    b = batch_by_ref(session, ref)
    if b is None:  # an unlisted batch's group by id: 404 too
        return not_found_page(request, f"Batch {ref}")
    initial = {**page, "api": api, "batch_api": urls.api_batch(ref), "schemes": schemes.client_config()}
    initial["batch_name"] = b.name
    ctx = {"initial": initial, "batch_id": ref, "batch_name": b.name}
    return render(request, "group.html", {**ctx, "group": group})


@router.get(urls.TRAINERS, response_class=HTMLResponse)
async def trainers_page(request: Request) -> Response:
    """Every trainer's dialects on the canonical episodes, as token strips beside the reference."""
    page = {"page": "trainers", "view": {}}
    if wants_json(request):
        return await json_twin(request, page, urls.API_TRAINERS)
    return render(request, "trainers.html", {"initial": {**page, "api": urls.API_TRAINERS}})


@router.get("/talk", response_class=HTMLResponse)
async def talk_start(request: Request) -> Response:
    """Talk mode starts at step 1 (a redirect keeps one URL per step)."""
    suffix = "?format=json" if wants_json(request) else ""
    return RedirectResponse(urls.talk(1) + suffix, status_code=307)


@router.get("/talk/{step}", response_class=HTMLResponse)
async def talk_step(request: Request, step: int) -> Response:
    """Talk step ``step`` (1-based): full screen, large type; keys step through."""
    s = step_or_none(step)
    n = len(STEPS)
    if s is None:
        if wants_json(request):
            body = error_body(404, "not_found", f"talk mode has steps 1 to {n}", field="step")
            return JSONResponse(body, status_code=404)
        return RedirectResponse(urls.talk(min(max(step, 1), n)), status_code=307)
    page = {
        "page": "talk",
        "step": step,
        "n_steps": n,
        "title": s.title,
        "paragraphs": s.paragraphs,
        "view": s.view,
        "links": [{"href": h, "text": t} for h, t in s.links],
        "prev": urls.talk(step - 1) if step > 1 else None,
        "next": urls.talk(step + 1) if step < n else None,
    }
    if wants_json(request):
        return JSONResponse(page)
    initial = {**page, "schemes": schemes.client_config(), "query_keys": st.QUERY_KEYS}
    return render(request, "talk.html", {"initial": initial, "s": s, "step": step, "n": n, "page": page})
