"""A batch's stored diagnostics (table ``batch_stats``): computed from its summary columns, before
the write for an upload (:func:`diagnostics_of_rows`) or from the stored rows, by the pure
:func:`app.compute.diagnostics.batch_diagnostics`."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from app.compute.diagnostics import DIAGNOSTICS_ERRORS, batch_diagnostics
from app.core import domain
from app.core.arrays import json_dumps
from app.core.schemas import EpisodeSummary
from app.storage.codecs import episode_arrays
from app.storage.episodes import batch_episodes, batch_summaries
from app.storage.models import BatchStats, Episode


def _turns(rows: list[EpisodeSummary], episodes: Callable[[], Iterable[Any]]) -> dict | None:
    """slug -> (kinds, turn ids) for episodes whose meta has `calls`; ``episodes`` (stored rows)
    is called, and its arrays decoded, only when some have."""

    want = {r.slug for r in rows if '"calls"' in r.meta_json}
    if not want:
        return None
    out = {}
    for ep in episodes():
        if ep.slug in want:
            a = episode_arrays(ep)
            out[ep.slug] = (a.kinds, a.turn_ids)
    return out


def turn_data(session, batch_id: int, rows: list[EpisodeSummary]) -> dict | None:
    """slug -> (kinds, turn ids) for the stored batch's episodes whose meta has `calls`."""
    return _turns(rows, lambda: batch_episodes(session, batch_id))


def diagnostics_of_rows(rows: list[dict]) -> dict | None:
    """The diagnostics of a batch about to be stored, from its prepared episode rows (with their
    slugs, in upload order): what :func:`compute_batch_diagnostics` reads back once they are
    stored, computed before the write so the write transaction stays short. None when they
    cannot be computed (the batch API then computes them when read)."""

    summaries = [
        EpisodeSummary(
            *(
                domain.rewarded(row["reward"], row["rewards"]) if name == "rewarded" else row[name]
                for name in EpisodeSummary._fields
            )
        )
        for row in rows
    ]
    try:
        return batch_diagnostics(summaries, _turns(summaries, lambda: (Episode(**row) for row in rows)))
    except DIAGNOSTICS_ERRORS:
        return None


def compute_batch_diagnostics(session, batch_id: int) -> tuple[dict, int]:
    """(diagnostics, episodes read) of a stored batch, from its summary columns (and the arrays of
    episodes with ``meta.calls`` only)."""
    rows = batch_summaries(session, batch_id)
    return batch_diagnostics(rows, turn_data(session, batch_id, rows)), len(rows)


def store_batch_diagnostics(session, batch_id: int) -> None:
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
