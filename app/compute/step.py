"""Everything a batch stores, computed before anything is written; app/storage/store.py only
writes the answer.

* :func:`prepare_batch` (an upload, ``POST /api/uploads``; the simulator's and the demo's
  batches): every episode validated and prepared as it streams in (app/core/validate.py), and
  the batch's diagnostics (app/compute/diagnostics.py).
* :func:`compute_step` (a run step, ``POST /api/runs/{id}/steps/{n}``): the same, and over every
  episode of the step, before retention drops any: the step's metrics (step_metrics.py), its
  audit (step_audit.py), each episode's search fields (episode_fields.py) and the prompt history
  (prompts.py); then which episodes are kept in full (retention.py), and the audit as the kept
  ones see it.

The audit runs in a thread of its own beside the rest (torch releases the GIL): on two cores a
step at real size costs about the audit, not the sum (bench/README.md, "A run step at real size").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.compute.diagnostics import DIAGNOSTICS_ERRORS, Diagnostics, TurnData, batch_diagnostics
from app.compute.episode_fields import EpisodeFields, add_findings, episode_fields
from app.compute.prompts import PromptStep, count_kept, prompt_steps
from app.compute.retention import choose
from app.compute.step_audit import kept_audit, step_audit_beside
from app.compute.step_metrics import StepMetrics, StepValues
from app.core import domain
from app.core.arrays import turn_ids_of
from app.core.errors import ApiError
from app.core.metrics import AUDIT_ERRORS, AUDIT_WARNINGS
from app.core.rows import EpisodeRow
from app.core.schemas import EpisodeIn, EpisodeSummary
from app.core.settings import Settings
from app.core.validate import ArrayEpisode, prepare_episode

# One episode of an upload as the formats hand it over: (its file line or None, the episode).
Item = tuple[int | None, EpisodeIn | ArrayEpisode]
# Makes a new episode share slug (the store's: app/storage/store.py new_slug).
NewSlug = Callable[[], str]


@dataclass
class PreparedBatch:
    """A batch ready to be written: every episode's prepared row and share slug in upload order
    (a row's index is its ``position``), the batch's diagnostics over all of them (None when they
    cannot be computed: the batch API then computes them when read) and the indices of the rows
    stored in full (every one for an upload)."""

    rows: list[EpisodeRow]
    slugs: list[str]
    diagnostics: Diagnostics | None
    kept: list[int]

    @property
    def n_seen(self) -> int:
        """The episodes the batch had before retention."""
        return len(self.slugs)


@dataclass
class KeptAudit:
    """A step's audit as its stored batch sees it: the answer renumbered over the kept episodes
    (:func:`app.compute.step_audit.kept_audit`), their reference advantages ([T] float64 each, in
    kept order) and the seconds the audit of every episode took."""

    body: dict[str, object]
    refs: list[np.ndarray]
    seconds: float
    n_errors: int


@dataclass
class RunStep:
    """What a run step stores: its batch (with retention's ``kept``), its metrics
    (:data:`app.core.metrics.STEP_METRICS`, ``n_episodes`` and, when audited, ``audit_errors``),
    its audit (None: not audited), the kept episodes' search fields (in kept order) and its
    prompt history (over every episode)."""

    batch: PreparedBatch
    metrics: StepValues
    audit: KeptAudit | None
    fields: list[EpisodeFields]
    prompts: list[PromptStep]


def too_many(n: int, settings: Settings) -> ApiError:
    """413: more episodes than one upload may hold."""
    return ApiError(
        413,
        "too_many_episodes",
        f"the upload has {n} episodes; the limit is {settings.max_episodes_per_upload} "
        "per upload (setting CREDITLENS_MAX_EPISODES_PER_UPLOAD). Split the file.",
    )


def prepared_rows(
    items: Iterable[Item], settings: Settings | None, metrics: StepMetrics | None = None
) -> list[EpisodeRow]:
    """Every episode of ``items`` validated and prepared, in order; each one is encoded as it is
    parsed, so only compact rows are held, never every episode's Python lists at once.
    ``metrics``: fed each episode as it comes (with the parsed episode, the source of fields the
    row has no column for). 413 beyond the upload's episode limit, 422 for no episode."""
    rows: list[EpisodeRow] = []
    limit = settings.max_episodes_per_upload if settings is not None else None
    for i, (line, ep) in enumerate(items):
        if settings is not None and limit is not None and i >= limit:
            raise too_many(i + 1 + sum(1 for _ in items), settings)
        rows.append(prepare_episode(ep, episode=i + 1, line=line, settings=settings))
        if metrics is not None:
            metrics.add(rows[-1], ep)
    if not rows:
        raise ApiError(422, "empty_upload", "the upload holds no episodes.")
    return rows


def rows_diagnostics(rows: list[EpisodeRow], slugs: list[str]) -> Diagnostics | None:
    """The diagnostics of a batch about to be stored, from its prepared rows: what the batch API
    reads back from the stored rows (app/storage/batch_stats.py), computed before the write so
    the write transaction stays short. None when they cannot be computed."""
    summaries = [
        EpisodeSummary(
            slug,
            row["group"],
            row["reward"],
            row["score"],
            row["passed"],
            row["n_tokens"],
            row["task"],
            domain.rewarded(row["reward"], row["rewards"]),
            row["meta_json"],
        )
        for row, slug in zip(rows, slugs, strict=True)
    ]
    turns: TurnData = {}
    for row, slug in zip(rows, slugs, strict=True):
        if '"calls"' in row["meta_json"]:  # the credit-by-effect figures read their turns
            kinds = row["kinds"]
            turns[slug] = (kinds, turn_ids_of(kinds == domain.POLICY, row["turn_ids"]))
    try:
        return batch_diagnostics(summaries, turns or None, sum(int(row["n_policy"]) for row in rows))
    except DIAGNOSTICS_ERRORS:
        return None


def prepare_batch(items: Iterable[Item], *, settings: Settings | None, new_slug: NewSlug) -> PreparedBatch:
    """An upload's batch: its rows, slugs and diagnostics; every row is kept."""
    rows = prepared_rows(items, settings)
    slugs = [new_slug() for _ in rows]
    return PreparedBatch(rows, slugs, rows_diagnostics(rows, slugs), list(range(len(rows))))


def compute_step(
    items: Iterable[Item],
    *,
    settings: Settings | None,
    keep: int | None,
    step: int,
    new_slug: NewSlug,
    trainer: str | None = None,
    options: dict[str, dict[str, Any]] | None = None,
) -> RunStep:
    """Everything a run step stores (see the module docstring). ``keep``: the run's episodes
    kept in full per step (None: all); ``step`` seeds retention's random choice, so a re-post of
    the step keeps the same episodes. ``trainer``: the one the step names (the audit ranks its
    dialects first, and tries ``options``, its configuration's, beside their defaults)."""
    metrics = StepMetrics()
    rows = prepared_rows(items, settings, metrics)
    # The audit (torch, which releases the GIL) runs in a second thread while this one computes
    # the loss metrics, the per-episode search fields and the prompt history: on two cores the
    # step costs about the longer of the two, not their sum. Both only read the rows.
    with step_audit_beside(rows, settings, trainer, options) as audited:
        metrics.add_deferred(rows)
        fields = [episode_fields(row) for row in rows]
        prompts = prompt_steps(rows)
        audit = audited()
    values = metrics.result()
    n_errors = 0
    if audit is not None:
        add_findings(fields, audit.body["findings"])
        n_errors = sum(1 for f in audit.body["findings"] if f["severity"] == "error")
        values[AUDIT_ERRORS] = n_errors
        values[AUDIT_WARNINGS] = sum(1 for f in audit.body["findings"] if f["severity"] == "warning")
    kept = list(range(len(rows)))
    if keep is not None and len(rows) > keep:
        kept = choose(
            [r["group"] for r in rows],
            [f.flagged for f in fields],
            [f.max_abs_adv for f in fields],
            [r["reward"] for r in rows],
            keep,
            seed=step,
        )
        count_kept(prompts, set(kept))
    slugs = [new_slug() for _ in rows]
    batch = PreparedBatch(rows, slugs, rows_diagnostics(rows, slugs), kept)
    kept_view = None
    if audit is not None:
        body = kept_audit(audit.body, kept, [slugs[i] for i in kept], [rows[i]["kinds"] for i in kept])
        refs = [audit.refs[i] for i in kept]
        kept_view = KeptAudit(body, refs, audit.seconds, int(body["n_errors"]))
    return RunStep(batch, values, kept_view, [fields[i] for i in kept], prompts)
