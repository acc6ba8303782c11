"""logged metrics: run_logged_metrics, a trainer's own metrics log attached to its run, per step

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05 10:20:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    if "run_logged_metrics" in set(sa.inspect(op.get_bind()).get_table_names()):
        return
    op.create_table(
        "run_logged_metrics",
        sa.Column("run_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("step", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("metrics_json", sa.Text(), nullable=False),
        sa.Column("source", sa.String(length=200), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["run.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "step"),
    )


def downgrade() -> None:
    op.drop_table("run_logged_metrics")
