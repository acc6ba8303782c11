"""A run's logged metrics: the numbers its trainer wrote to its own metrics log, per step.

``run_logged_metrics`` (app/storage/logged_metrics_models.py, migration 0013): one row per run and step, the step's metrics as JSON text
(``{name: number}``) and what the file was (``source``). They sit beside the run's own step metrics
(computed by creditlens from the episodes, in ``batch.metrics_json``) and never mix with them.
Attaching a log merges by step: each step the file has replaces that step's row whole, steps it
lacks keep theirs; ``replace=True`` drops every earlier row first. Rows go with their run (ON DELETE
CASCADE).
"""

from __future__ import annotations

from sqlalchemy import delete, func
from sqlalchemy import select as sa_select
from sqlmodel import Session, col

from app.core.arrays import json_dumps, json_loads
from app.storage.db import writing
from app.storage.logged_metrics_models import RunLoggedMetrics

# Rows inserted per statement (SQLite binds at most 32,766 parameters; 4 a row).
CHUNK = 2000


def attach(
    session: Session, run_id: int, steps: dict[int, dict[str, float]], source: str, replace: bool = False
) -> int:
    """Store ``steps`` as the run's logged metrics in one transaction (module docstring); returns
    how many of them replaced a step stored before."""
    rows = [
        {"run_id": run_id, "step": s, "metrics_json": json_dumps(m), "source": source[:200]}
        for s, m in steps.items()
    ]
    table = RunLoggedMetrics.__table__  # type: ignore[attr-defined]
    with writing(session):
        try:
            if replace:
                session.execute(delete(RunLoggedMetrics).where(col(RunLoggedMetrics.run_id) == run_id))
                replaced = 0
            else:
                replaced = _existing(session, run_id, list(steps))
                for i in range(0, len(rows), CHUNK):
                    chunk = [r["step"] for r in rows[i : i + CHUNK]]
                    session.execute(
                        delete(RunLoggedMetrics).where(
                            col(RunLoggedMetrics.run_id) == run_id, col(RunLoggedMetrics.step).in_(chunk)
                        )
                    )
            for i in range(0, len(rows), CHUNK):
                session.execute(table.insert(), rows[i : i + CHUNK])
            session.commit()
        except Exception:
            session.rollback()
            raise
    return replaced


def _existing(session: Session, run_id: int, steps: list[int]) -> int:
    n = 0
    for i in range(0, len(steps), CHUNK):
        stmt = (
            sa_select(func.count())
            .select_from(RunLoggedMetrics)
            .where(
                col(RunLoggedMetrics.run_id) == run_id, col(RunLoggedMetrics.step).in_(steps[i : i + CHUNK])
            )
        )
        n += int(session.execute(stmt).scalar_one())
    return n


def count_steps(session: Session, run_id: int) -> int:
    """How many steps of the run have logged metrics."""
    stmt = sa_select(func.count()).select_from(RunLoggedMetrics).where(col(RunLoggedMetrics.run_id) == run_id)
    return int(session.execute(stmt).scalar_one())


def series(
    session: Session, run_id: int, names: set[str] | None = None
) -> tuple[list[str], dict[str, list[list[float]]], list[str], int]:
    """(every metric name in the order the steps first name them, {name: [[step, value], ...]}
    for ``names`` (None: all), the sources in step order, the number of steps)."""
    stmt = (
        sa_select(
            col(RunLoggedMetrics.step), col(RunLoggedMetrics.metrics_json), col(RunLoggedMetrics.source)
        )
        .where(col(RunLoggedMetrics.run_id) == run_id)
        .order_by(col(RunLoggedMetrics.step))
    )
    all_names: dict[str, None] = {}
    out: dict[str, list[list[float]]] = {}
    sources: dict[str, None] = {}
    n = 0
    for step, text, source in session.execute(stmt).all():
        n += 1
        if source:
            sources.setdefault(source)
        for name, value in json_loads(text).items():
            all_names.setdefault(name)
            if names is None or name in names:
                out.setdefault(name, []).append([step, value])
    return list(all_names), out, list(sources), n
