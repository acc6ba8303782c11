"""runs at scale: packed tokens, retention (run.keep, run.keep_every, batch.n_episodes_seen,
batch.stored_bytes) and a run step's episode search fields

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02 06:20:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _columns() -> dict[str, list[sa.Column]]:
    return {
        "run": [
            sa.Column("keep", sa.Integer(), nullable=True),
            sa.Column("keep_every", sa.Integer(), nullable=True),
        ],
        "batch": [
            sa.Column("n_episodes_seen", sa.Integer(), nullable=True),
            sa.Column("stored_bytes", sa.BigInteger(), nullable=True),
        ],
        "episode": [
            sa.Column("tokens_packed", sa.LargeBinary(), nullable=True),
            sa.Column("run_id", sa.Integer(), nullable=True),
            sa.Column("step", sa.Integer(), nullable=True),
            sa.Column("n_tool_tokens", sa.Integer(), nullable=True),
            sa.Column("max_abs_adv", sa.Float(), nullable=True),
            sa.Column("nonpolicy_abs_adv_share", sa.Float(), nullable=True),
            sa.Column("max_ratio", sa.Float(), nullable=True),
            sa.Column("mean_entropy", sa.Float(), nullable=True),
            sa.Column("n_findings", sa.Integer(), nullable=True),
            sa.Column("finding_codes", sa.Text(), nullable=True),
        ],
    }


INDEXES = {
    "ix_episode_run_step": ["run_id", "step"],
    "ix_episode_run_max_abs_adv": ["run_id", "max_abs_adv"],
    "ix_episode_run_reward": ["run_id", "reward"],
}


def upgrade() -> None:
    # Rows stored before this revision keep their plain arrays and JSON tokens (app/packing.py
    # reads both) and have no search fields. A database made by create_all before migrations
    # existed may already have these columns (app/migrate.py): add only what is missing.
    insp = sa.inspect(op.get_bind())
    for table, columns in _columns().items():
        have = {c["name"] for c in insp.get_columns(table)}
        missing = [c for c in columns if c.name not in have]
        if not missing:
            continue
        with op.batch_alter_table(table, schema=None) as batch_op:
            for column in missing:
                batch_op.add_column(column)
    have = {i["name"] for i in sa.inspect(op.get_bind()).get_indexes("episode")}
    for name, columns in INDEXES.items():
        if name not in have:
            op.create_index(name, "episode", columns, unique=False)


def downgrade() -> None:
    for name in INDEXES:
        op.drop_index(name, table_name="episode")
    for table, columns in _columns().items():
        with op.batch_alter_table(table, schema=None) as batch_op:
            for column in columns:
                batch_op.drop_column(column.name)
