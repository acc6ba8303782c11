"""Per-batch summaries computed once per worker and reused: the [B] columns the outcome schemes
read (scores, groups, policy lengths), their [B] advantages per scheme, and the batch diagnostics.

A batch's episodes never change after the upload except by deletion, which lowers
``n_episodes``; so (id, created_at, n_episodes) names one state of a batch, and a cached entry
under an older key is simply never asked for again (LRU eviction removes it). The cache is bounded
by the episodes it holds: the app's setting ``batch_cache_episodes`` (CREDITLENS_BATCH_CACHE_EPISODES),
passed in by each call with the app's settings.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, NamedTuple, TypeVar

import numpy as np
from sqlmodel import Session, col, select

from app.compute.batch import BatchSummary
from app.compute.diagnostics import Diagnostics
from app.core import domain
from app.core.settings import Settings
from app.storage.episodes import column
from app.storage.models import Batch, Episode


class _Cols(NamedTuple):
    slug: str
    group: str | None
    score: float
    n_policy: int
    n_tokens: int
    rewarded: bool


V = TypeVar("V")


class LRU(Generic[V]):
    """A thread-safe least-recently-used map bounded by the total ``weight`` of its values (the
    bound is given with each value: the caller's settings)."""

    def __init__(self) -> None:
        self._data: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._lock = threading.Lock()
        self._weight = 0

    def get(self, key: Hashable) -> V | None:
        with self._lock:
            hit = self._data.get(key)
            if hit is None:
                return None
            self._data.move_to_end(key)
            return hit[0]

    def put(self, key: Hashable, value: V, weight: int, limit: int) -> None:
        with self._lock:
            if key in self._data:
                self._weight -= self._data.pop(key)[1]
            if weight > limit:  # larger than the whole cache: not kept
                return
            self._data[key] = (value, weight)
            self._weight += weight
            while self._weight > limit and self._data:
                _, (_, w) = self._data.popitem(last=False)
                self._weight -= w

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._weight = 0

    def __len__(self) -> int:
        return len(self._data)


_SUMMARIES: LRU[BatchSummary] = LRU()
_DIAGNOSTICS: LRU[Diagnostics] = LRU()


def batch_key(session: Session, batch: Batch) -> tuple[str, int | None, str, int]:
    """The key of one state of a batch (see the module docstring) in one database."""
    return (str(session.get_bind().engine.url), batch.id, str(batch.created_at), batch.n_episodes)


def batch_summary(session: Session, batch: Batch, settings: Settings) -> BatchSummary:
    """The batch's :class:`~app.compute.batch.BatchSummary`, read from its columns once per state."""
    key = batch_key(session, batch)
    hit = _SUMMARIES.get(key)
    if hit is not None:
        return hit
    stmt = (
        select(*(column(n) for n in _Cols._fields))
        .where(Episode.batch_id == batch.id)
        .order_by(col(Episode.position))
    )
    rows = [_Cols(*r) for r in session.execute(stmt).all()]
    groups = [r.group for r in rows]
    summary = BatchSummary(
        slugs={r.slug: i for i, r in enumerate(rows)},
        groups=groups,
        scores=np.array([r.score for r in rows], dtype=np.float64),
        lengths=np.array([r.n_policy for r in rows], dtype=np.int64),
        n_tokens=np.array([r.n_tokens for r in rows], dtype=np.int64),
        gids=domain.group_ids(groups),
        rewarded=np.array([bool(r.rewarded) for r in rows], dtype=bool),
    )
    # Only a complete state is cached: a delete between reading the batch row and its episodes
    # gives fewer rows than n_episodes, and that answer must not be reused.
    if len(rows) == batch.n_episodes:
        _SUMMARIES.put(key, summary, max(len(rows), 1), settings.batch_cache_episodes)
    return summary


def cached_diagnostics(
    session: Session, batch: Batch, compute: Callable[[], tuple[Diagnostics, int]], settings: Settings
) -> Diagnostics:
    """The batch's diagnostics: ``compute()`` -> (diagnostics, episodes read) once per state."""
    key = batch_key(session, batch)
    hit = _DIAGNOSTICS.get(key)
    if hit is not None:
        return hit
    diag, n = compute()
    if n == batch.n_episodes:
        _DIAGNOSTICS.put(key, diag, max(n, 1), settings.batch_cache_episodes)
    return diag


def clear() -> None:
    """Forget every cached batch (tests)."""
    _SUMMARIES.clear()
    _DIAGNOSTICS.clear()
