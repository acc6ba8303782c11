"""Reading a run's prompt history (tables in app/storage/prompt_models.py, filled at ingest)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlmodel import Session, col

from app.storage.models import Batch
from app.storage.prompt_models import PromptStepRow, RunPrompt
from app.storage.store import UNLISTED


def _step(r: Any) -> dict[str, Any]:
    batch_ref = r.slug if r.visibility == UNLISTED and r.slug else r.batch_id
    return {
        "step": r.step,
        "n": r.n,
        "pass_rate": r.n_passed / r.n if r.n else None,
        "mean_abs_adv": r.sum_abs_adv / r.n_adv_tokens
        if r.sum_abs_adv is not None and r.n_adv_tokens
        else None,
        "batch_id": r.batch_id,
        "batch_ref": batch_ref,
        "group": r.group,
        "n_kept": r.n_kept,
    }


def _steps(session: Session, run_id: int, keys: list[str]) -> dict[str, list[dict[str, Any]]]:
    stmt = (
        select(
            col(PromptStepRow.key),
            col(PromptStepRow.step),
            col(PromptStepRow.n),
            col(PromptStepRow.n_passed),
            col(PromptStepRow.sum_abs_adv),
            col(PromptStepRow.n_adv_tokens),
            col(PromptStepRow.batch_id),
            col(PromptStepRow.group),
            col(PromptStepRow.n_kept),
            col(Batch.visibility),
            col(Batch.slug),
        )
        .join(Batch, col(Batch.id) == col(PromptStepRow.batch_id))
        .where(col(PromptStepRow.run_id) == run_id, col(PromptStepRow.key).in_(keys))
        .order_by(col(PromptStepRow.key), col(PromptStepRow.step))
    )
    out: dict[str, list[dict[str, Any]]] = {k: [] for k in keys}
    for r in session.execute(stmt).all():
        out[r.key].append(_step(r))
    return out


def list_prompts(session: Session, run_id: int, limit: int, offset: int) -> tuple[list[dict[str, Any]], int]:
    """One page of the run's prompts, the most often seen first (then the earliest), each with
    its steps; and how many prompts the run has."""
    total = session.execute(
        select(func.count()).select_from(RunPrompt).where(col(RunPrompt.run_id) == run_id)
    ).scalar_one()
    n_steps = func.count().label("n_steps")
    page = session.execute(
        select(col(PromptStepRow.key), n_steps, func.min(PromptStepRow.step).label("first"))
        .where(col(PromptStepRow.run_id) == run_id)
        .group_by(col(PromptStepRow.key))
        .order_by(n_steps.desc(), func.min(PromptStepRow.step), col(PromptStepRow.key))
        .offset(offset)
        .limit(limit)
    ).all()
    keys = [r.key for r in page]
    found = session.execute(
        select(col(RunPrompt.key), col(RunPrompt.prompt)).where(
            col(RunPrompt.run_id) == run_id, col(RunPrompt.key).in_(keys)
        )
    )
    texts: dict[str, str] = {key: prompt for key, prompt in found.all()}
    steps = _steps(session, run_id, keys)
    return [{"key": k, "prompt": texts.get(k, ""), "steps": steps[k]} for k in keys], int(total)


def prompt_history(session: Session, run_id: int, key: str) -> dict[str, Any] | None:
    """One prompt of the run with every step it was in, or None."""
    row = session.get(RunPrompt, (run_id, key)) if len(key) <= 32 else None
    if row is None:
        return None
    return {
        "key": key,
        "prompt": row.prompt,
        "n_tokens": row.n_tokens,
        "steps": _steps(session, run_id, [key])[key],
    }
