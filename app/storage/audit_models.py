"""The audit's cache tables (issue "Audit"; app/compute/audit.py fills them).

``batch_audit``: one row per batch, the audit's JSON answer as computed, with its number of error
findings as a column (the run timeline counts them per step in one query). ``episode_audit``: one
row per episode, the best match's per-token advantages (float64 bytes, like the episode's own
arrays), read by the episode page's ``uploaded - reference`` row. Both go with their batch
(ON DELETE CASCADE). ``n_episodes`` stamps the batch the audit saw: deleting an episode changes it,
and a stale row is recomputed.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import Column, ForeignKey, Integer, LargeBinary, Text
from sqlmodel import Field, SQLModel


def _now() -> datetime:
    return datetime.now(UTC)


class BatchAudit(SQLModel, table=True):
    """A batch's audit, computed once."""

    __tablename__ = "batch_audit"

    batch_id: int = Field(
        sa_column=Column(
            Integer, ForeignKey("batch.id", ondelete="CASCADE"), primary_key=True, autoincrement=False
        )
    )
    n_episodes: int = 0
    n_errors: int = 0
    searched: int = 0
    result_json: str = Field(sa_column=Column(Text, nullable=False))
    seconds: float = 0.0
    created_at: datetime = Field(default_factory=_now)


class EpisodeAudit(SQLModel, table=True):
    """One episode's reference advantages (the best match, or the closest fit when nothing matches)."""

    __tablename__ = "episode_audit"

    episode_id: int = Field(
        sa_column=Column(
            Integer, ForeignKey("episode.id", ondelete="CASCADE"), primary_key=True, autoincrement=False
        )
    )
    batch_id: int = Field(
        sa_column=Column(Integer, ForeignKey("batch.id", ondelete="CASCADE"), nullable=False, index=True)
    )
    reference: bytes = Field(sa_column=Column(LargeBinary, nullable=False))
