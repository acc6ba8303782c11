"""Reading a stored batch's episodes: full rows, rows by slug, and the array-free summaries and scores
the batch API, the diagnostics and the outcome baselines read (selecting only those columns); which
inputs an episode has for the schemes (presence flags, no arrays read)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

import numpy as np
from sqlalchemy import select as sa_select
from sqlmodel import Session, col, func, select

from app.compute.inputs import inputs_of
from app.core.arrays import F64, decode, json_loads
from app.core.domain import POLICY
from app.core.errors import not_found
from app.core.schemas import EpisodeScore, EpisodeSummary
from app.storage.models import Batch, Episode


def batch_episodes(session: Session, batch_id: int) -> list[Episode]:
    """All episodes of a batch in upload order (full rows, arrays included)."""
    stmt = select(Episode).where(Episode.batch_id == batch_id).order_by(col(Episode.position))
    return list(session.exec(stmt).all())


def episodes_by_slug(session: Session, batch_id: int, slugs: list[str]) -> list[Episode]:
    """The batch's episodes with these slugs (full rows), in the order of ``slugs``; 404 when one
    is gone (deleted meanwhile)."""
    found = {
        e.slug: e
        for e in session.exec(
            select(Episode).where(Episode.batch_id == batch_id, col(Episode.slug).in_(slugs))
        ).all()
    }
    missing = [s for s in slugs if s not in found]
    if missing:
        raise not_found(f"Episode {missing[0]!r}")
    return [found[s] for s in slugs]


# A NamedTuple class named after Episode columns, and its rows.
R = TypeVar("R")


def column(name: str) -> Any:
    """The selectable of a summary field: an Episode column, or ``rewarded`` (a reward or per-token
    rewards were uploaded; app.core.domain.rewarded)."""
    if name == "rewarded":
        return (col(Episode.reward).is_not(None) | col(Episode.rewards).is_not(None)).label("rewarded")
    return getattr(Episode, name)


def _rows(
    session: Session, batch_id: int, row: Callable[..., R], limit: int | None = None, offset: int = 0
) -> list[R]:
    """``row`` (a NamedTuple named after Episode columns) for the episodes of a batch, in upload
    order (all, or ``limit`` from ``offset``), selecting only those columns."""
    names: tuple[str, ...] = row._fields  # type: ignore[attr-defined]  # a NamedTuple class has them
    stmt = (
        sa_select(*(column(name) for name in names))
        .where(col(Episode.batch_id) == batch_id)
        .order_by(col(Episode.position))
    )
    if limit is not None:
        stmt = stmt.offset(offset).limit(limit)
    return [row(*r) for r in session.execute(stmt).all()]


def batch_summaries(
    session: Session, batch_id: int, limit: int | None = None, offset: int = 0
) -> list[EpisodeSummary]:
    """The episodes of a batch without their arrays: all, or one page (``limit`` from ``offset``)."""
    return _rows(session, batch_id, EpisodeSummary, limit, offset)


class _Credit(NamedTuple):
    """The columns :func:`max_credit` reads."""

    kinds: bytes
    advantages: bytes | None


def max_credit(
    session: Session, batch_id: int, limit: int | None = None, offset: int = 0
) -> list[tuple[float, int] | None]:
    """Per episode of a batch (all, or ``limit`` from ``offset``), in upload order: the largest
    |uploaded advantage| on its policy tokens and its position (the first, on a tie); None for an
    episode without advantages or policy tokens."""
    out: list[tuple[float, int] | None] = []
    for r in _rows(session, batch_id, _Credit, limit, offset):
        adv = decode(r.advantages, F64) if r.advantages is not None else None
        if adv is None:
            out.append(None)
            continue
        pol = decode(r.kinds, np.dtype(np.uint8)) == POLICY
        mag = np.where(pol, np.abs(adv), -1.0)
        at = int(np.argmax(mag)) if mag.size else 0
        out.append((float(mag[at]), at) if mag.size and mag[at] >= 0 else None)
    return out


def group_summaries(session: Session, batch_id: int, group: str) -> list[EpisodeSummary]:
    """The episodes of one group of a batch without their arrays, in upload order."""
    stmt = (
        sa_select(*(column(name) for name in EpisodeSummary._fields))
        .where(col(Episode.batch_id) == batch_id, col(Episode.group) == group)
        .order_by(col(Episode.position))
    )
    return [EpisodeSummary(*r) for r in session.execute(stmt).all()]


def batch_scores(session: Session, batch_id: int) -> list[EpisodeScore]:
    """What the outcome baselines need of every episode of a batch."""
    return _rows(session, batch_id, EpisodeScore)


class LossRow(NamedTuple):
    """What the batch loss view reads of each episode (its arrays still encoded)."""

    slug: str
    group: str | None
    kinds: bytes
    advantages: bytes | None
    logprobs: bytes | None
    rollout_logprobs: bytes | None


def batch_loss_rows(session: Session, batch_id: int) -> list[LossRow]:
    """The loss view's columns of every episode of a batch, in upload order."""
    return _rows(session, batch_id, LossRow)


def batch_cells(session: Session, batch_id: int) -> int:
    """The batch's tokens over all its episodes (a budget check before reading their arrays)."""
    stmt = select(func.sum(Episode.n_tokens)).where(Episode.batch_id == batch_id)
    return int(session.execute(stmt).scalar_one() or 0)


def episode_trainer_by_slug(session: Session, slug: str) -> tuple[str | None, dict[str, Any]]:
    """(the trainer the episode's batch names, the configuration kept with it) from the batch's
    meta (app/core/trainers.py); (None, {}) when it names none."""
    row = session.execute(
        sa_select(col(Batch.meta_json))
        .join(Episode, col(Episode.batch_id) == col(Batch.id))
        .where(col(Episode.slug) == slug)
    ).first()
    meta = json_loads(row[0] or "{}") if row is not None else {}
    trainer = meta.get("trainer") if isinstance(meta, dict) else None
    config = meta.get("trainer_config") if isinstance(meta, dict) else None
    return (trainer if isinstance(trainer, str) else None), (config if isinstance(config, dict) else {})


def episode_inputs_by_slug(session: Session, slug: str) -> Callable[[str], frozenset[str]] | None:
    """critic -> the inputs episode ``slug`` has for the schemes (app/compute/inputs.py), from
    presence flags of its columns (no array is read); None when there is no such episode."""
    row = session.execute(
        sa_select(
            col(Episode.values).is_not(None),
            col(Episode.logprobs).is_not(None),
            col(Episode.advantages).is_not(None),
            col(Episode.truncated),
            col(Episode.bootstrap_value).is_not(None),
            col(Episode.meta_json),
        ).where(col(Episode.slug) == slug)
    ).first()
    if row is None:
        return None
    values, logprobs, advantages, truncated, boot, meta_json = row
    flags = {
        "values": bool(values),
        "logprobs": bool(logprobs),
        "advantages": bool(advantages),
        "turn_values": json_loads(meta_json or "{}").get("turn_values") is not None,
        "bootstrap": bool(truncated and boot),
    }
    return lambda critic: inputs_of(**flags, critic=critic)
