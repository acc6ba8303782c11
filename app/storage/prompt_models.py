"""The prompt history's tables (app/compute/prompts.py computes their rows at ingest).

``run_prompt``: one row per prompt a run has seen (its key and text). ``prompt_step``: one row per
step and prompt: how many episodes, how many passed, the |A| sum and token count behind
``mean_abs_adv``, the group they were in and how many were kept. Both go with their run or step
(ON DELETE CASCADE). Added by migration 0010.
"""

from __future__ import annotations

from sqlalchemy import Column, Float, ForeignKey, Integer, String, Text
from sqlmodel import Field, SQLModel


def _run_part_of_key() -> Column[int]:
    """A new ``run_id`` column: part of the table's primary key, its rows deleted with their run."""
    return Column(Integer, ForeignKey("run.id", ondelete="CASCADE"), primary_key=True, autoincrement=False)


class RunPrompt(SQLModel, table=True):
    """A prompt of a run, by its key."""

    __tablename__ = "run_prompt"

    run_id: int = Field(sa_column=_run_part_of_key())
    key: str = Field(sa_column=Column(String(32), primary_key=True))
    prompt: str = Field(sa_column=Column(Text, nullable=False))
    n_tokens: int = 0
    first_step: int = 0


class PromptStepRow(SQLModel, table=True):
    """One prompt at one step of a run."""

    __tablename__ = "prompt_step"

    run_id: int = Field(sa_column=_run_part_of_key())
    key: str = Field(sa_column=Column(String(32), primary_key=True))
    step: int = Field(sa_column=Column(Integer, primary_key=True, autoincrement=False))
    batch_id: int = Field(
        sa_column=Column(Integer, ForeignKey("batch.id", ondelete="CASCADE"), nullable=False, index=True)
    )
    n: int = 0
    n_passed: int = 0
    sum_abs_adv: float | None = Field(default=None, sa_column=Column(Float, nullable=True))
    n_adv_tokens: int = 0
    n_kept: int = 0
    group: str | None = Field(default=None, sa_column=Column(String(512), nullable=True))
