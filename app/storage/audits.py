"""The audit's cache: a stored batch's audit answer computed once (tables ``batch_audit`` and
``episode_audit``, app/storage/audit_models.py) by the pure :func:`app.compute.audit.run_audit`, its
error count per run step, and an episode's best-match row for the episode page.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import case, func
from sqlmodel import Session, col, select

from app.compute.audit import decorate, marks_of, no_advantages, run_audit, token_meta, too_big
from app.core import domain
from app.core.arrays import F64, I32, EpisodeArrays, decode, json_dumps, json_loads, turn_ids_of
from app.core.errors import ApiError, not_found
from app.core.metrics import AUDIT_ERRORS, AUDIT_WARNINGS
from app.core.packing import pack
from app.core.settings import Settings
from app.core.trainers import trainer_options
from app.storage.audit_models import BatchAudit, EpisodeAudit
from app.storage.models import Batch, Episode, saved_id


@dataclass
class _Shape:
    n: int
    t_max: int
    missing: int
    first_missing: int | None


def _shape(session: Session, batch_id: int) -> _Shape:
    """Episodes, longest episode and episodes without advantages, from the columns (no decoding)."""
    n, t_max, missing = session.execute(
        select(
            func.count(),
            func.max(Episode.n_tokens),
            func.sum(case((col(Episode.advantages).is_(None), 1), else_=0)),
        ).where(Episode.batch_id == batch_id)
    ).one()
    first = None
    if missing:  # 1-based index of the first episode without advantages, in upload order
        lacking = select(func.min(Episode.position)).where(
            Episode.batch_id == batch_id, col(Episode.advantages).is_(None)
        )
        first = session.execute(
            select(func.count()).where(
                Episode.batch_id == batch_id, col(Episode.position) <= lacking.scalar_subquery()
            )
        ).scalar_one()
    return _Shape(int(n or 0), int(t_max or 0), int(missing or 0), first)


_COLUMNS: tuple[str, ...] = (
    "id",
    "slug",
    "kinds",
    "rewards",
    "values",
    "advantages",
    "turn_ids",
    "reward",
    "group",
)
_COLUMNS += ("truncated", "bootstrap_value", "logprobs", "rollout_logprobs")
_COLUMNS += ("meta_json",)  # meta.drift and meta.mask_misaligned: the token findings


def _load(session: Session, batch_id: int) -> tuple[list[int], list[str], list[EpisodeArrays], bool]:
    """(ids, slugs, arrays, every episode uploaded turn ids) of a batch in upload order, reading only
    the columns the audit needs (not the tokens or meta; the log-probs for the loss findings)."""
    stmt = (
        select(*(getattr(Episode, c) for c in _COLUMNS))
        .where(Episode.batch_id == batch_id)
        .order_by(col(Episode.position))
    )
    ids: list[int] = []
    slugs: list[str] = []
    arrays: list[EpisodeArrays] = []
    all_tids = True
    for r in session.execute(stmt):
        row = dict(zip(_COLUMNS, r, strict=True))
        kinds = decode(row["kinds"], np.dtype(np.uint8))
        tids = decode(row["turn_ids"], I32)
        all_tids &= tids is not None
        ids.append(row["id"])
        slugs.append(row["slug"])
        arrays.append(
            EpisodeArrays(
                tokens=[],
                kinds=kinds,
                rewards=domain.effective_rewards(kinds, decode(row["rewards"], F64), row["reward"]),
                values=decode(row["values"], F64),
                logprobs=decode(row["logprobs"], F64),
                rollout_logprobs=decode(row["rollout_logprobs"], F64),
                turn_ids=turn_ids_of(kinds == domain.POLICY, tids),
                advantages=decode(row["advantages"], F64),
                reward=row["reward"],
                group=row["group"],
                truncated=row["truncated"],
                bootstrap_value=row["bootstrap_value"],
                meta=token_meta(row["meta_json"]),
            )
        )
    return ids, slugs, arrays, all_tids


def _cached(session: Session, batch: Batch) -> BatchAudit | None:
    row = session.get(BatchAudit, batch.id)
    if row is not None and row.n_episodes != batch.n_episodes:
        return None  # an episode was deleted since: the indices moved
    return row


def audit_blocker(session: Session, batch: Batch, settings: Settings) -> ApiError | None:
    """Why the batch's audit cannot be computed, as the error :func:`batch_audit` would raise
    (409 no advantages, 413 too large), or None when it can (or is cached). One aggregate query
    over the batch's columns, no decoding: the batch API says it up front, so the page never
    requests an audit it knows will fail."""
    if _cached(session, batch) is not None:
        return None
    where = f"batch {batch.id}"
    shape = _shape(session, saved_id(batch))
    if shape.n == 0 or shape.missing:
        return no_advantages(shape.missing or 0, shape.n, shape.first_missing, where)
    if shape.n * shape.t_max > settings.audit_max_cells:
        return too_big(shape.n, shape.t_max, settings, where)
    return None


def batch_audit(session: Session, batch: Batch, settings: Settings) -> dict[str, Any]:
    """The batch's audit answer: from the cache, else computed, stored and returned.

    409 when episodes lack advantages; 413 beyond ``settings.audit_max_cells``."""
    row = _cached(session, batch)
    if row is not None:
        cached: dict[str, Any] = json_loads(row.result_json)
        return cached
    blocker = audit_blocker(session, batch, settings)
    if blocker is not None:
        raise blocker
    ids, slugs, arrays, all_turn_ids = _load(session, saved_id(batch))
    t0 = time.perf_counter()
    meta = json_loads(batch.meta_json or "{}")
    trainer, options = trainer_options(meta)
    body, refs = run_audit(arrays, turn_ids=all_turn_ids, trainer=trainer, options=options)
    seconds = time.perf_counter() - t0
    body = decorate(body, slugs, [a.kinds for a in arrays])
    del arrays
    _store(session, batch, body, ids, refs, seconds)
    return body


def _store(
    session: Session,
    batch: Batch,
    body: dict[str, Any],
    ids: list[int],
    refs: list[np.ndarray],
    seconds: float,
) -> None:
    """Replace the batch's cached audit (a concurrent request may have stored the same one first)."""
    from sqlalchemy import delete, insert
    from sqlalchemy.exc import IntegrityError

    try:
        session.execute(delete(EpisodeAudit).where(col(EpisodeAudit.batch_id) == batch.id))
        session.execute(delete(BatchAudit).where(col(BatchAudit.batch_id) == batch.id))
        session.execute(
            insert(BatchAudit),
            [
                {
                    "batch_id": batch.id,
                    "n_episodes": batch.n_episodes,
                    "n_errors": body["n_errors"],
                    "searched": body["searched"],
                    "result_json": json_dumps(body),
                    "seconds": seconds,
                }
            ],
        )
        session.execute(
            insert(EpisodeAudit),
            [
                {"episode_id": i, "batch_id": batch.id, "reference": pack(r.astype(F64))}
                for i, r in zip(ids, refs, strict=True)
            ],
        )
        session.commit()
    except IntegrityError:
        session.rollback()  # stored by another request meanwhile: theirs is the same audit


def audit_step(session: Session, batch_id: int, settings: Settings) -> int | None:
    """Audit a run step's batch when its episodes carry the trainer's advantages, and store the
    number of error and warning findings in the step's metrics as ``audit_errors`` and
    ``audit_warnings`` (app/core/metrics.py; so
    the run timeline reads
    it with the other metrics, in one query). None when the step cannot be audited (no
    advantages, or beyond the audit's budget): the step is stored all the same."""
    batch = session.get(Batch, batch_id)
    if batch is None:
        return None
    try:
        body = batch_audit(session, batch, settings)
    except ApiError as exc:
        if exc.status in (409, 413):
            return None
        raise
    batch = session.get(Batch, batch_id)
    if batch is None:  # deleted meanwhile
        return None
    n_errors = int(body["n_errors"])
    n_warnings = sum(1 for f in body["findings"] if f["severity"] == "warning")
    metrics = json_loads(batch.metrics_json) if batch.metrics_json else {}
    batch.metrics_json = json_dumps({**metrics, AUDIT_ERRORS: n_errors, AUDIT_WARNINGS: n_warnings})
    session.add(batch)
    session.commit()
    return n_errors


def error_count(session: Session, batch_id: int) -> int | None:
    """The batch's number of error findings from its cached audit (one query), or None when the
    batch has not been audited (or changed since)."""
    row = session.execute(
        select(BatchAudit.n_errors, BatchAudit.n_episodes, Batch.n_episodes)
        .join(Batch, col(Batch.id) == col(BatchAudit.batch_id))
        .where(col(BatchAudit.batch_id) == batch_id)
    ).first()
    if row is None or row[1] != row[2]:
        return None
    return int(row[0])


def error_counts(session: Session, batch_ids: Sequence[int]) -> dict[int, int]:
    """batch id -> its number of error findings, for the batches whose audit is cached and current
    (one query for a run's steps; batches not audited yet are absent)."""
    if not batch_ids:
        return {}
    rows = session.execute(
        select(BatchAudit.batch_id, BatchAudit.n_errors)
        .join(Batch, col(Batch.id) == col(BatchAudit.batch_id))
        .where(
            col(BatchAudit.batch_id).in_(list(batch_ids)), col(BatchAudit.n_episodes) == col(Batch.n_episodes)
        )
    ).all()
    return {int(b): int(n) for b, n in rows}


@dataclass
class EpisodeAuditView:
    """What the episode page shows of the audit: the reference [T], and per finding its code,
    severity and the positions it names in this episode."""

    reference: np.ndarray
    best_match: dict[str, Any]
    marks: list[dict[str, Any]]


def episode_audit(session: Session, ep: Episode, settings: Settings) -> EpisodeAuditView:
    """The audit of ``ep``'s batch (computed and cached if needed), seen from ``ep``."""
    batch = session.get(Batch, ep.batch_id)
    if batch is None:  # deleted meanwhile
        raise not_found(f"Episode {ep.slug!r}")
    body = batch_audit(session, batch, settings)
    row = session.get(EpisodeAudit, ep.id)
    if row is None:  # deleted meanwhile (its audit goes with it)
        raise not_found(f"Episode {ep.slug!r}")
    index = session.execute(
        select(func.count()).where(Episode.batch_id == ep.batch_id, col(Episode.position) < ep.position)
    ).scalar_one()
    return EpisodeAuditView(
        reference=decode(row.reference, F64),
        best_match=body["best_match"],
        marks=marks_of(body, int(index)),
    )
