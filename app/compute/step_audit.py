"""A run step's audit, computed at ingest over every episode of the step (before retention drops
any), and its answer restricted to the episodes that are kept.

The step is audited when every episode carries the trainer's advantages and the step is within
the audit's budget (``audit_max_cells``); else not (the step is stored all the same, as before).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.compute.audit import decorate, run_audit, token_meta
from app.compute.episode_fields import row_arrays
from app.core.rows import EpisodeRow
from app.core.settings import Settings

DEFAULT_MAX_CELLS = Settings.model_fields["audit_max_cells"].default


@dataclass
class StepAudit:
    """The audit of every episode of a step: the engine's answer (indices over the step's
    episodes in upload order), each episode's reference advantages, and the seconds it took."""

    body: dict[str, Any]
    refs: list[np.ndarray]
    seconds: float


def step_audit(
    rows: list[EpisodeRow],
    settings: Settings | None,
    trainer: str | None = None,
    options: dict[str, dict[str, Any]] | None = None,
) -> StepAudit | None:
    """The audit of a step's prepared rows, or None when it cannot be audited. ``trainer``: the
    one the step names (its dialects first); ``options``: their options, as its config sets them."""
    if not rows or any(r["advantages"] is None for r in rows):
        return None
    cells = len(rows) * max(int(r["n_tokens"]) for r in rows)
    if cells > (settings.audit_max_cells if settings is not None else DEFAULT_MAX_CELLS):
        return None
    arrays = [row_arrays(r) for r in rows]
    for a, r in zip(arrays, rows, strict=True):  # meta.drift, meta.mask_misaligned
        a.meta = token_meta(r["meta_json"])
    t0 = time.perf_counter()
    turn_ids = all(r["turn_ids"] is not None for r in rows)
    body, refs = run_audit(arrays, turn_ids=turn_ids, trainer=trainer, options=options)
    return StepAudit(body=body, refs=refs, seconds=time.perf_counter() - t0)


@contextmanager
def step_audit_beside(
    rows: list[EpisodeRow],
    settings: Settings | None,
    trainer: str | None = None,
    options: dict[str, dict[str, Any]] | None = None,
) -> Iterator[Callable[[], StepAudit | None]]:
    """:func:`step_audit` started in a thread of its own; yields the function that waits for its
    answer. Torch releases the GIL, so the caller's work runs beside it on another core. (The
    thread has the process's torch threads, one by default: on these 2-core machines the audit
    took 2.4-2.6 s on one torch thread and 2.9-3.0 s on two, bench/retention.py's step.)"""
    with ThreadPoolExecutor(1, thread_name_prefix="creditlens-step-audit") as pool:
        yield pool.submit(step_audit, rows, settings, trainer, options).result


def kept_audit(
    body: dict[str, Any], kept: list[int], slugs: list[str], kinds: list[np.ndarray]
) -> dict[str, Any]:
    """The audit answer as the stored batch sees it: each finding's ``episodes`` and ``tokens``
    renumbered over the kept episodes (the others left out; ``n_episodes_seen``: how many of the
    step's episodes it named), with slugs and links (:func:`app.compute.audit.decorate`).
    ``n_errors`` counts every error finding of the step."""
    index = {old: new for new, old in enumerate(kept)}
    findings = []
    for f in body["findings"]:
        g = dict(f)
        g["n_episodes_seen"] = len(f["episodes"])
        g["episodes"] = [index[e] for e in f["episodes"] if e in index]
        g["tokens"] = [[index[e], p] for e, p in f["tokens"] if e in index]
        findings.append(g)
    return decorate({**body, "findings": findings}, slugs, kinds)
