"""A batch's stored diagnostics (table ``batch_stats``), by the pure
:func:`app.compute.diagnostics.batch_diagnostics`: computed before the write for an upload
(:func:`app.compute.step.rows_diagnostics`), and here from the stored rows' summary columns when
one of its episodes is deleted (or, without a stored row, when the batch is read)."""

from __future__ import annotations

from sqlalchemy import func
from sqlmodel import Session, select

from app.compute.diagnostics import DIAGNOSTICS_ERRORS, Diagnostics, TurnData, batch_diagnostics
from app.core.arrays import json_dumps
from app.core.schemas import EpisodeSummary
from app.storage.codecs import episode_arrays
from app.storage.episodes import batch_episodes, batch_summaries
from app.storage.models import BatchStats, Episode


def turn_data(session: Session, batch_id: int, rows: list[EpisodeSummary]) -> TurnData | None:
    """slug -> (kinds, turn ids) for the stored batch's episodes whose meta has `calls`; their
    arrays are read and decoded only when some have."""
    want = {r.slug for r in rows if '"calls"' in r.meta_json}
    if not want:
        return None
    out: TurnData = {}
    for ep in batch_episodes(session, batch_id):
        if ep.slug in want:
            a = episode_arrays(ep)
            out[ep.slug] = (a.kinds, a.turn_ids)
    return out


def compute_batch_diagnostics(session: Session, batch_id: int) -> tuple[Diagnostics, int]:
    """(diagnostics, episodes read) of a stored batch, from its summary columns (and the arrays of
    episodes with ``meta.calls`` only)."""
    rows = batch_summaries(session, batch_id)
    policy = None
    if any('"drift"' in r.meta_json for r in rows):  # the denominator of drift_token_share
        total = session.exec(select(func.sum(Episode.n_policy)).where(Episode.batch_id == batch_id)).one()
        policy = int(total or 0)
    return batch_diagnostics(rows, turn_data(session, batch_id, rows), policy), len(rows)


def store_batch_diagnostics(session: Session, batch_id: int) -> None:
    """Compute the batch's diagnostics and write them to ``batch_stats`` in the session's
    transaction (the caller commits); an emptied batch gets no row."""

    old = session.get(BatchStats, batch_id)
    try:
        diag, n = compute_batch_diagnostics(session, batch_id)
    except DIAGNOSTICS_ERRORS:
        # Never lose an upload to its diagnostics: without a row the batch API computes them.
        if old is not None:
            session.delete(old)
        return
    if n == 0:
        if old is not None:
            session.delete(old)
        return
    if old is None:
        session.add(BatchStats(batch_id=batch_id, n_episodes=n, diagnostics_json=json_dumps(diag)))
    else:
        old.n_episodes, old.diagnostics_json = n, json_dumps(diag)
