"""The run store's queries: create, list, read and delete training runs; a run's steps are batches
(``batch.run_id``, ``batch.step``) stored by :func:`app.storage.store.create_batch_streaming` with their
metrics (app/compute/step_metrics.py) already computed.

Reading a run never touches episodes: one query returns every step's batch id and stored metrics.
"""

from __future__ import annotations

import secrets
from typing import Any, NamedTuple, TypeVar

from sqlalchemy import Select, delete, func, update
from sqlalchemy import select as sa_select
from sqlalchemy.orm import aliased
from sqlmodel import Session, col, select

from app.core.arrays import json_dumps, json_loads
from app.core.errors import not_found
from app.core.validate import text_column
from app.storage.db import writing
from app.storage.models import Batch, BatchStats, Episode, Run, saved_id
from app.storage.prompt_models import PromptStepRow
from app.storage.store import (
    PUBLIC,
    UNLISTED,
    hash_token,
    new_slug,
    require_delete_token,
    row_by_id,
    row_by_ref,
    row_by_ref_or_404,
)


class StepRow(NamedTuple):
    """One step of a run as stored: its batch and its metrics (JSON text, or None)."""

    step: int
    batch_id: int
    n_episodes: int
    metrics_json: str | None
    batch_visibility: str = PUBLIC
    batch_slug: str | None = None
    n_episodes_seen: int | None = None
    stored_bytes: int | None = None

    @property
    def batch_ref(self) -> int | str:
        """What the step's batch URLs carry (its slug when unlisted)."""
        return self.batch_slug if self.batch_visibility == UNLISTED and self.batch_slug else self.batch_id


def create_run(
    session: Session,
    name: str,
    config: dict[str, Any],
    visibility: str = PUBLIC,
    keep: int | None = None,
    keep_every: int | None = None,
) -> tuple[Run, str]:
    """Store a new run; returns it and its delete token (shown once; only the hash is stored).
    ``visibility``: public, or unlisted (reachable only by its slug; its steps inherit it).
    ``keep``: episodes kept in full per step; ``keep_every``: the thinning of older steps."""
    token = secrets.token_urlsafe(24)
    run = Run(
        name=text_column(name) or "",
        config_json=json_dumps(config),
        delete_token_hash=hash_token(token),
        visibility=visibility,
        slug=new_slug(),
        keep=keep,
        keep_every=keep_every,
    )
    session.add(run)
    session.commit()
    session.refresh(run)
    return run, token


def run_config(run: Run) -> dict[str, Any]:
    """The run's configuration as stored (``trainer`` among its keys when the run names one)."""
    cfg = json_loads(run.config_json or "{}")
    return cfg if isinstance(cfg, dict) else {}


def set_run_config(session: Session, run: Run, config: dict[str, Any]) -> None:
    """Replace the run's configuration (its steps read it when they are posted)."""
    run.config_json = json_dumps(config)
    session.add(run)
    session.commit()


def get_run(session: Session, run_id: int) -> Run | None:
    return row_by_id(session, Run, run_id)


def run_ref(run: Run) -> int | str:
    """What a run's URLs carry: its slug when unlisted (its id answers 404), else its id."""
    return run.slug if run.visibility == UNLISTED and run.slug else saved_id(run)


def run_by_ref(session: Session, ref: int | str) -> Run | None:
    """The run a URL names: a public run by its integer id, any run by its slug (an unlisted run's
    id names nothing)."""
    return row_by_ref(session, Run, ref)


def run_by_ref_or_404(session: Session, ref: int | str) -> Run:
    """:func:`run_by_ref`, or ApiError 404 (the same answer for "unlisted" and "no such run")."""
    return row_by_ref_or_404(session, Run, ref, "Run")


def run_or_404(session: Session, run_id: int) -> Run:
    run = get_run(session, run_id)
    if run is None:
        raise not_found(f"Run {run_id}")
    return run


# A select over runs (the page of runs, or their count).
RunSelect = TypeVar("RunSelect", bound=Select[Any])


def _listed(stmt: RunSelect, name: str | None) -> RunSelect:
    """``stmt`` narrowed to the runs a list shows: public ones (unlisted runs are never listed),
    with exactly ``name`` when given."""
    stmt = stmt.where(col(Run.visibility) == PUBLIC)
    return stmt if name is None else stmt.where(col(Run.name) == name)


def list_runs(
    session: Session, *, name: str | None = None, limit: int = 100, offset: int = 0
) -> list[tuple[Run, int, int | None]]:
    """(run, number of steps, last step or None), newest first; ``name``: only runs with exactly
    that name. One query; the step counts are aggregated only for the page's runs."""
    listed = _listed(select(Run), name)
    page = (
        listed.order_by(col(Run.created_at).desc(), col(Run.id).desc()).offset(offset).limit(limit).subquery()
    )
    steps = (
        select(col(Batch.run_id), func.count().label("n"), func.max(Batch.step).label("last"))
        .where(col(Batch.run_id).in_(select(page.c.id)))
        .group_by(col(Batch.run_id))
        .subquery()
    )
    run = aliased(Run, page)
    stmt = (
        select(run, func.coalesce(steps.c.n, 0), steps.c.last)
        .outerjoin(steps, steps.c.run_id == run.id)
        .order_by(col(run.created_at).desc(), col(run.id).desc())
    )
    return [(r, int(n), last) for r, n, last in session.exec(stmt).all()]


def count_runs(session: Session, *, name: str | None = None) -> int:
    """How many runs :func:`list_runs` pages through (public ones; ``name``: with that name)."""
    return int(session.exec(_listed(select(func.count()).select_from(Run), name)).one())


def run_steps(session: Session, run_id: int) -> list[StepRow]:
    """Every step of a run in step order: one query over the batch table (no episodes)."""
    stmt = (
        sa_select(
            col(Batch.step),
            col(Batch.id),
            col(Batch.n_episodes),
            col(Batch.metrics_json),
            col(Batch.visibility),
            col(Batch.slug),
            col(Batch.n_episodes_seen),
            col(Batch.stored_bytes),
        )
        .where(col(Batch.run_id) == run_id)
        .order_by(col(Batch.step))
    )
    return [StepRow(*r) for r in session.execute(stmt).all()]


def stored_bytes(session: Session, run_ids: list[int]) -> dict[int, int]:
    """run id -> the bytes its steps' stored rows take (one query)."""
    if not run_ids:
        return {}
    stmt = (
        select(col(Batch.run_id), func.coalesce(func.sum(Batch.stored_bytes), 0))
        .where(col(Batch.run_id).in_(run_ids))
        .group_by(col(Batch.run_id))
    )
    return {int(r): int(b) for r, b in session.execute(stmt).all()}


def thin_steps(session: Session, run_id: int, newest: int, every: int) -> list[int]:
    """``keep_every``: drop the episodes of the run's steps older than ``newest`` that are not
    multiples of ``every`` (their metrics, diagnostics, audit counts and prompt history stay; the
    batch keeps its row with 0 episodes). Returns the thinned steps."""
    stmt = select(Batch.id, Batch.step).where(
        Batch.run_id == run_id, col(Batch.step) < newest, Batch.n_episodes > 0, col(Batch.step) % every != 0
    )
    found = session.execute(stmt).all()
    if not found:
        return []
    ids = [b for b, _ in found]
    with writing(session):
        try:
            # Their audit references go by ON DELETE CASCADE.
            session.execute(delete(Episode).where(col(Episode.batch_id).in_(ids)))
            session.execute(update(Batch).where(col(Batch.id).in_(ids)).values(n_episodes=0, stored_bytes=0))
            # What was computed of them at ingest still describes the step as it came.
            session.execute(update(BatchStats).where(col(BatchStats.batch_id).in_(ids)).values(n_episodes=0))
            session.execute(
                update(PromptStepRow).where(col(PromptStepRow.batch_id).in_(ids)).values(n_kept=0)
            )
            session.commit()
        except Exception:
            session.rollback()
            raise
    return sorted(s for _, s in found)


def step_batch_id(session: Session, run_id: int, step: int) -> int | None:
    """The batch id of a run's step, or None."""
    stmt = select(Batch.id).where(Batch.run_id == run_id, Batch.step == step)
    return session.exec(stmt).first()


def metrics_series(steps: list[StepRow]) -> dict[str, list[list[float]]]:
    """{"metric": [[step, value], ...]} over the steps, steps without a value left out (and a
    metric no step has a value for); metrics in the order the steps first name them."""
    out: dict[str, list[list[float]]] = {}
    for s in steps:
        for name, value in (json_loads(s.metrics_json) if s.metrics_json else {}).items():
            series = out.setdefault(name, [])
            if value is not None:
                series.append([s.step, value])
    return {name: series for name, series in out.items() if series}


def check_run_token(run: Run, token: str | None) -> None:
    """ApiError 403 unless ``token`` is the delete token returned when the run was created."""
    require_delete_token(run.delete_token_hash, token, "the run's creation")


def delete_run(session: Session, run_id: int, token: str | None) -> None:
    """Delete a run with its steps' batches and their episodes, in one transaction."""
    run = run_or_404(session, run_id)
    check_run_token(run, token)
    batch_ids = select(Batch.id).where(Batch.run_id == run_id)
    with writing(session):
        try:
            session.execute(delete(Episode).where(col(Episode.batch_id).in_(batch_ids)))
            # The batches' stored diagnostics (their audits go by ON DELETE CASCADE).
            session.execute(delete(BatchStats).where(col(BatchStats.batch_id).in_(batch_ids)))
            session.execute(delete(Batch).where(col(Batch.run_id) == run_id))
            session.execute(delete(Run).where(col(Run.id) == run_id))
            session.commit()
        except Exception:
            session.rollback()
            raise
