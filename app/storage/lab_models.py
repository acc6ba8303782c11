"""Lab result cache table (owned by the lambda lab).

One row per (figure, canonical parameters JSON): the figure's result JSON as computed. A second
request with the same parameters (in any order, with defaults spelled out or not) is a cache hit.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import Column, Text, UniqueConstraint
from sqlmodel import Field, SQLModel


def _now() -> datetime:
    return datetime.now(UTC)


class LabResult(SQLModel, table=True):
    """A cached lab figure. ``params_json`` includes the compute version, so stale rows never match."""

    __tablename__ = "lab_result"
    __table_args__ = (UniqueConstraint("figure", "params_json", name="uq_lab_result_figure_params"),)

    id: int | None = Field(default=None, primary_key=True)
    figure: str = Field(max_length=32, index=True)
    # Canonical JSON is short (a handful of numbers); Text keeps PostgreSQL and SQLite alike.
    params_json: str = Field(sa_column=Column(Text, nullable=False))
    result_json: str = Field(sa_column=Column(Text, nullable=False))
    seconds: float = 0.0
    created_at: datetime = Field(default_factory=_now)
