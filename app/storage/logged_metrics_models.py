"""The logged metrics' table (app/storage/logged_metrics.py reads and writes it; migration 0013)."""

from __future__ import annotations

from sqlalchemy import Column, ForeignKey, Integer, String, Text
from sqlmodel import Field, SQLModel


class RunLoggedMetrics(SQLModel, table=True):
    """One step of a trainer's own metrics log, attached to its run."""

    __tablename__ = "run_logged_metrics"

    run_id: int = Field(
        sa_column=Column(
            Integer, ForeignKey("run.id", ondelete="CASCADE"), primary_key=True, autoincrement=False
        )
    )
    step: int = Field(sa_column=Column(Integer, primary_key=True, autoincrement=False))
    metrics_json: str = Field(sa_column=Column(Text, nullable=False))
    source: str | None = Field(default=None, sa_column=Column(String(200), nullable=True))
