"""batch_audit and episode_audit: the audit of a batch's uploaded advantages, computed once

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 12:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A database made by create_all before migrations existed is stamped 0001 but may already have
    # these tables (app/storage/migrate.py): create them only where they are missing.
    if "batch_audit" in sa.inspect(op.get_bind()).get_table_names():
        return
    op.create_table(
        "batch_audit",
        sa.Column("batch_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("n_episodes", sa.Integer(), nullable=False),
        sa.Column("n_errors", sa.Integer(), nullable=False),
        sa.Column("searched", sa.Integer(), nullable=False),
        sa.Column("result_json", sa.Text(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("created_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["batch_id"], ["batch.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("batch_id"),
    )
    op.create_table(
        "episode_audit",
        sa.Column("episode_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("batch_id", sa.Integer(), nullable=False),
        sa.Column("reference", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["batch_id"], ["batch.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["episode_id"], ["episode.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("episode_id"),
    )
    with op.batch_alter_table("episode_audit", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_episode_audit_batch_id"), ["batch_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("episode_audit", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_episode_audit_batch_id"))
    op.drop_table("episode_audit")
    op.drop_table("batch_audit")
