"""Running and caching the lab's figures (the figures themselves: app/lab/figures/, one module each).

Results are plain JSON (floats, lists, dicts), cached in ``lab_result`` under the figure's
canonical parameters plus its ``VERSION``; a second request with the same parameters is a hit.
"""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime

from sqlalchemy import delete, func, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlmodel import Session, col, select

from app.core.errors import ApiError
from app.core.settings import Settings, get_settings
from app.lab.figures import figures

# Each figure's compute function under its own name, for callers that run one directly (tests, bench).
from app.lab.figures.delayed_horizon import compute as delayed_horizon  # noqa: F401
from app.lab.figures.difficulty import compute as difficulty  # noqa: F401
from app.lab.figures.horizon import compute as horizon  # noqa: F401
from app.lab.figures.lambda_sweep import compute as lambda_sweep  # noqa: F401
from app.lab.figures.recovery import compute as recovery  # noqa: F401
from app.lab.figures.variable_horizon import compute as variable_horizon  # noqa: F401
from app.lab.params import Params, Result, canonical_json
from app.storage.lab_models import LabResult
from estimators.threads import one_thread

# Each figure's query parameters by figure name.
PARAMS = {name: m.PARAMS for name, m in figures().items()}


def run_figure(figure: str, params: Params) -> Result:
    """The figure's ``compute(params)`` on one thread, without autograd (what the API and bench call)."""
    with one_thread():
        return figures()[figure].compute(params)


# Each heavy figure's work (numbers held at once, ~8 bytes each) and what to reduce: measured
# peaks are ~70 float64 per (episode, step) of the lambda sweep and ~160 per recovery episode.
WORK: dict[str, tuple[Callable[[Params], int], str]] = {
    "lambda": (
        lambda p: p["episodes"] * p["horizon"] * (len(p["lams"]) + 64),
        "Reduce `episodes`, `horizon` or the number of `lams`.",
    ),
    "recovery": (lambda p: p["batch"] * 200, "Reduce `batch`."),
}

# A used row's created_at is refreshed at most this often (seconds): eviction is least recently
# used at this resolution, without a database write on every hit.
TOUCH_EVERY = 60.0


def check_work(figure: str, params: Params, budget: int) -> None:
    """ApiError 413 when the figure's work for ``params`` exceeds ``budget`` (CREDITLENS_LAB_MAX_WORK)."""
    if figure not in WORK:
        return
    estimate, reduce = WORK[figure]
    work = estimate(params)
    if work > budget:
        raise ApiError(
            413,
            "work_budget",
            f"this {figure} figure needs about {work:,} numbers in memory at once; the lab's budget is "
            f"{budget:,} (setting CREDITLENS_LAB_MAX_WORK). {reduce}",
        )


def _stored(session: Session, figure: str, key: str) -> LabResult | None:
    return session.exec(
        select(LabResult).where(LabResult.figure == figure, LabResult.params_json == key)
    ).first()


def cached_result(
    session: Session, figure: str, params: Params, settings: Settings | None = None
) -> tuple[Result, bool]:
    """(result, cache_hit): the stored result for these canonical parameters, or compute and store
    it. A miss is first checked against the work budget (413); the cache keeps at most
    ``lab_cache_rows`` rows and ``lab_cache_bytes`` of result JSON, least recently used first out.
    Two requests computing the same key at once both answer: the second insert's uniqueness
    violation is caught and the stored row read back."""
    settings = settings or get_settings()
    key = canonical_json({**params, "_v": figures()[figure].VERSION})
    row = _stored(session, figure, key)
    if row is not None:
        result = json.loads(row.result_json)
        _touch(session, row)
        return result, True
    check_work(figure, params, settings.lab_max_work)
    started = time.perf_counter()
    try:
        result = run_figure(figure, params)
    except ValueError as exc:  # an oracle rejected the combination (e.g. probabilities)
        raise ApiError(422, "invalid_param", str(exc)) from None
    seconds = time.perf_counter() - started
    text = json.dumps(result, allow_nan=False)
    if len(text) > settings.lab_cache_bytes:  # larger than the whole cache: answered, not kept
        return result, False
    session.add(LabResult(figure=figure, params_json=key, result_json=text, seconds=seconds))
    try:
        session.commit()
    except IntegrityError:  # the same figure was computed concurrently; theirs is as good as ours
        session.rollback()
        theirs = _stored(session, figure, key)
        return (json.loads(theirs.result_json) if theirs is not None else result), False
    evict(session, settings.lab_cache_rows, settings.lab_cache_bytes)
    return result, False


def _touch(session: Session, row: LabResult) -> None:
    """Mark a row used (its created_at), at most every TOUCH_EVERY seconds; a failure is harmless."""
    now = datetime.now(UTC)
    created = row.created_at if row.created_at.tzinfo else row.created_at.replace(tzinfo=UTC)
    if (now - created).total_seconds() < TOUCH_EVERY:
        return
    try:
        session.execute(update(LabResult).where(col(LabResult.id) == row.id).values(created_at=now))
        session.commit()
    except SQLAlchemyError:  # e.g. the row was evicted meanwhile, or the database is busy
        session.rollback()


def evict(session: Session, max_rows: int, max_bytes: int) -> int:
    """Delete the least recently used rows beyond ``max_rows`` rows or ``max_bytes`` bytes of
    result JSON; returns how many went."""
    rows = session.execute(
        select(LabResult.id, func.length(LabResult.result_json)).order_by(
            col(LabResult.created_at).desc(), col(LabResult.id).desc()
        )
    ).all()
    kept = total = 0
    drop: list[int] = []
    for rid, n in rows:  # newest use first: keep a prefix, drop the rest
        if not drop and kept < max_rows and total + (n or 0) <= max_bytes:
            kept += 1
            total += n or 0
        else:
            drop.append(rid)
    if drop:
        try:
            session.execute(delete(LabResult).where(col(LabResult.id).in_(drop)))
            session.commit()
        except SQLAlchemyError:  # a concurrent eviction got there first
            session.rollback()
    return len(drop)


def csv_text(figure: str, result: Result) -> str:
    """The figure's CSV twin: its ``csv_rows``, columns in order of first appearance, null as empty."""
    rows = figures()[figure].csv_rows(result)
    fields: list[str] = []
    for r in rows:
        fields.extend(k for k in r if k not in fields)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if v is None else v) for k, v in r.items()})
    return buf.getvalue()
