"""prompt history: run_prompt and prompt_step, computed at ingest over every episode of a step

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02 06:55:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Steps stored before this revision have no prompt history.
    have = set(sa.inspect(op.get_bind()).get_table_names())
    if "run_prompt" not in have:
        op.create_table(
            "run_prompt",
            sa.Column("run_id", sa.Integer(), autoincrement=False, nullable=False),
            sa.Column("key", sa.String(length=32), nullable=False),
            sa.Column("prompt", sa.Text(), nullable=False),
            sa.Column("n_tokens", sa.Integer(), nullable=False),
            sa.Column("first_step", sa.Integer(), nullable=False),
            sa.ForeignKeyConstraint(["run_id"], ["run.id"], ondelete="CASCADE"),
            sa.PrimaryKeyConstraint("run_id", "key"),
        )
    if "prompt_step" not in have:
        op.create_table(
            "prompt_step",
            sa.Column("run_id", sa.Integer(), autoincrement=False, nullable=False),
            sa.Column("key", sa.String(length=32), nullable=False),
            sa.Column("step", sa.Integer(), autoincrement=False, nullable=False),
            sa.Column("batch_id", sa.Integer(), nullable=False),
            sa.Column("n", sa.Integer(), nullable=False),
            sa.Column("n_passed", sa.Integer(), nullable=False),
            sa.Column("sum_abs_adv", sa.Float(), nullable=True),
            sa.Column("n_adv_tokens", sa.Integer(), nullable=False),
            sa.Column("n_kept", sa.Integer(), nullable=False),
            sa.Column("group", sa.String(length=512), nullable=True),
            sa.ForeignKeyConstraint(["batch_id"], ["batch.id"], ondelete="CASCADE"),
            sa.ForeignKeyConstraint(["run_id"], ["run.id"], ondelete="CASCADE"),
            sa.PrimaryKeyConstraint("run_id", "key", "step"),
        )
        op.create_index(op.f("ix_prompt_step_batch_id"), "prompt_step", ["batch_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_prompt_step_batch_id"), table_name="prompt_step")
    op.drop_table("prompt_step")
    op.drop_table("run_prompt")
