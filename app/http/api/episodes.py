"""Episode routes: the stored episode, its advantages, deletion."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from sqlmodel import Session

from app.compute import loss_view as lv
from app.compute.advantages import episode_advantages
from app.compute.batch import BatchContext
from app.compute.params import parse_schemes
from app.core import schemes as sc
from app.core.arrays import EpisodeArrays
from app.core.errors import not_found
from app.core.schemas import AdvantagesOut, EpisodeOut, ErrorOut, SignalsOut
from app.core.settings import Settings
from app.core.signals import available_signals, parse_signals, signal_rows
from app.core.trainers import config_query
from app.http.api import losses as loss_api
from app.http.api._json import json_response
from app.http.api.deps import require_write
from app.storage.audits import episode_audit
from app.storage.batch_cache import batch_summary
from app.storage.codecs import episode_arrays, episode_to_native
from app.storage.db import SessionDep
from app.storage.episodes import batch_episodes, episode_trainer_by_slug, episodes_by_slug
from app.storage.models import Batch
from app.storage.store import batch_ref, delete_episode, episode_or_404, get_batch

router = APIRouter(tags=["episodes"])
ERRORS: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorOut},
    413: {"model": ErrorOut},
    422: {"model": ErrorOut},
}


@router.get(
    "/api/episodes/{slug}",
    response_model=EpisodeOut,
    responses=ERRORS,
    summary="The episode as stored (native format)",
)
def get_episode(slug: str, session: SessionDep) -> Response:
    ep = episode_or_404(session, slug)
    body = episode_to_native(ep).model_dump()
    body["slug"] = ep.slug
    body["batch_id"] = ep.batch_id
    b = session.get(Batch, ep.batch_id)
    body["batch_ref"] = batch_ref(b) if b is not None else ep.batch_id  # its slug when unlisted
    return json_response(body)


def batch_context(session: Session, batch_id: int, slug: str, settings: Settings) -> BatchContext:
    """The episode's batch as the outcome schemes need it: the [B] summaries of the batch (read
    once per worker and batch state, app/storage/batch_cache.py); the arrays only on demand. An episode or
    batch deleted meanwhile is a 404, never a 500."""
    batch = get_batch(session, batch_id)
    ctx = None
    if batch is not None:
        summary = batch_summary(session, batch, settings)

        def load_rows(rows: list[int]) -> list[EpisodeArrays]:
            by_row = {i: s for s, i in summary.slugs.items()}
            return [episode_arrays(e) for e in episodes_by_slug(session, batch_id, [by_row[r] for r in rows])]

        ctx = summary.context(
            slug,
            load_all=lambda: [episode_arrays(e) for e in batch_episodes(session, batch_id)],
            load_rows=load_rows,
            max_cells=settings.max_compute_cells,
        )
    if ctx is None:
        raise not_found(f"Episode {slug!r}")
    return ctx


def _number(text: str | None, default: float) -> float:
    try:
        return default if text is None else float(text)
    except ValueError:
        return default


@router.get(
    "/api/episodes/{slug}/advantages",
    response_model=AdvantagesOut,
    responses=ERRORS,
    summary="Per-token advantages under one or more schemes",
)
def get_advantages(
    slug: str,
    request: Request,
    session: SessionDep,
    scheme: list[str] = Query(
        [],
        description="repeat or comma-separate: outcome, oracle, uploaded, or any registry estimator (GET /api/schemes); "
        f"default {','.join(sc.DEFAULT_SCHEMES)}, or for an episode without the inputs one of them reads (critic "
        "values) the first of " + ",".join((*sc.DEFAULT_SCHEMES, *sc.DEFAULT_FILL)) + " that it has",
    ),
    gamma: float = Query(sc.DEFAULT_GAMMA, description="discount per policy step, in [0, 1]"),
    lam: float = Query(sc.DEFAULT_LAM, description="GAE lambda, in [0, 1]"),
    baseline: str = Query(
        sc.DEFAULT_BASELINE, description="baseline of the `outcome` scheme: " + ", ".join(sc.BASELINES)
    ),
    critic: str = Query(sc.DEFAULT_CRITIC, description="upload (the uploaded values) or zero (V = 0)"),
    signal: list[str] = Query(
        [],
        description="per-token signal rows, repeat or comma-separate: logprob, entropy, kl, ratio, token_scores, "
        "token_weights "
        "(left out when the episode lacks their arrays; see `available_signals`)",
    ),
    loss_params: lv.LossParams = Depends(loss_api.loss_params),
) -> Response:
    signals = parse_signals(signal)
    ep = episode_or_404(session, slug)
    arrays = episode_arrays(ep)
    ctx = batch_context(session, ep.batch_id, ep.slug, request.app.state.settings)
    ctx.audit = lambda: episode_audit(session, ep, request.app.state.settings)
    # The trainer's config (its batch's) sets gamma, lambda and its dialects' options that the
    # query does not; a dialect's option is a query key of its own (`scale_rewards=none`).
    given = {**config_query(*episode_trainer_by_slug(session, slug)), **request.query_params}
    gamma = gamma if "gamma" in request.query_params else _number(given.get("gamma"), gamma)
    lam = lam if "lam" in request.query_params else _number(given.get("lam"), lam)
    payload = episode_advantages(
        arrays,
        ctx,
        schemes=scheme,
        gamma=gamma,
        lam=lam,
        baseline=baseline,
        critic=critic,
        as_numpy=True,
        loss=loss_params,
        options=sc.parse_options(parse_schemes(scheme), given),
    )
    payload["params"]["signals"] = signals
    payload["available_signals"] = available_signals(arrays)
    payload["signals"] = signal_rows(arrays, signals, as_numpy=True)
    return json_response(payload)


@router.get(
    "/api/episodes/{slug}/signals",
    response_model=SignalsOut,
    responses=ERRORS,
    summary="Per-token signal rows: logprob, entropy, kl, ratio, token_scores, token_weights (those the episode has data for)",
)
def get_signals(
    slug: str,
    session: SessionDep,
    signal: list[str] = Query(
        [],
        description="repeat or comma-separate: logprob, entropy, kl, ratio, token_scores, token_weights (default: every one available)",
    ),
) -> Response:
    names = parse_signals(signal)
    ep = episode_or_404(session, slug)
    arrays = episode_arrays(ep)
    have = available_signals(arrays)
    rows = signal_rows(arrays, names or have, as_numpy=True)
    return json_response(
        {
            "slug": ep.slug,
            "n_tokens": len(arrays.kinds),
            "available_signals": have,
            "has_advantages": arrays.advantages is not None,
            "signals": rows,
        }
    )


@router.delete(
    "/api/episodes/{slug}",
    status_code=204,
    dependencies=[Depends(require_write)],
    responses={403: {"model": ErrorOut}, 404: {"model": ErrorOut}},
    summary="Delete an episode with the upload's delete token",
)
def remove_episode(
    slug: str,
    session: SessionDep,
    token: str | None = Query(None, description="the delete_token returned by the upload"),
    x_delete_token: str | None = Header(None),
) -> Response:
    delete_episode(session, slug, x_delete_token or token)
    return Response(status_code=204)
