"""episode search in a narrow table of its own: episode_search (a run step's kept episodes and
their search fields); the search columns and indexes that 0009 added to episode move there

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02 15:10:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# What 0009 added to episode for the search (reading one of them after an episode's large arrays
# made SQLite walk the arrays' overflow pages).
SEARCH_COLUMNS = [
    ("run_id", sa.Integer()),
    ("step", sa.Integer()),
    ("n_tool_tokens", sa.Integer()),
    ("max_abs_adv", sa.Float()),
    ("nonpolicy_abs_adv_share", sa.Float()),
    ("max_ratio", sa.Float()),
    ("mean_entropy", sa.Float()),
    ("n_findings", sa.Integer()),
    ("finding_codes", sa.Text()),
]
EPISODE_INDEXES = {
    "ix_episode_run_step": ["run_id", "step"],
    "ix_episode_run_max_abs_adv": ["run_id", "max_abs_adv"],
    "ix_episode_run_reward": ["run_id", "reward"],
}


def upgrade() -> None:
    bind = op.get_bind()
    insp = sa.inspect(bind)
    if "episode_search" not in set(insp.get_table_names()):
        op.create_table(
            "episode_search",
            sa.Column("episode_id", sa.Integer(), autoincrement=False, nullable=False),
            sa.Column("run_id", sa.Integer(), nullable=False),
            sa.Column("step", sa.Integer(), nullable=False),
            sa.Column("position", sa.Integer(), nullable=False),
            sa.Column("batch_id", sa.Integer(), nullable=False),
            sa.Column("slug", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
            sa.Column("group", sqlmodel.sql.sqltypes.AutoString(length=512), nullable=True),
            sa.Column("reward", sa.Float(), nullable=True),
            sa.Column("passed", sa.Boolean(), nullable=False),
            sa.Column("n_tokens", sa.Integer(), nullable=False),
            sa.Column("n_tool_tokens", sa.Integer(), nullable=False),
            sa.Column("max_abs_adv", sa.Float(), nullable=True),
            sa.Column("nonpolicy_abs_adv_share", sa.Float(), nullable=True),
            sa.Column("max_ratio", sa.Float(), nullable=True),
            sa.Column("mean_entropy", sa.Float(), nullable=True),
            sa.Column("n_findings", sa.Integer(), nullable=False),
            sa.Column("finding_codes", sa.Text(), server_default="", nullable=False),
            sa.ForeignKeyConstraint(["batch_id"], ["batch.id"], ondelete="CASCADE"),
            sa.ForeignKeyConstraint(["episode_id"], ["episode.id"], ondelete="CASCADE"),
            sa.ForeignKeyConstraint(["run_id"], ["run.id"], ondelete="CASCADE"),
            sa.PrimaryKeyConstraint("episode_id"),
        )
        op.create_index("ix_episode_search_run_step", "episode_search", ["run_id", "step", "position"])
        op.create_index("ix_episode_search_run_max_abs_adv", "episode_search", ["run_id", "max_abs_adv"])
        op.create_index("ix_episode_search_run_reward", "episode_search", ["run_id", "reward"])
    have = {c["name"] for c in insp.get_columns("episode")}
    if "run_id" in have:
        # Steps stored since 0009 keep their search rows.
        op.execute(
            'INSERT INTO episode_search (episode_id, run_id, step, position, batch_id, slug, "group", '
            "reward, passed, n_tokens, n_tool_tokens, max_abs_adv, nonpolicy_abs_adv_share, "
            "max_ratio, mean_entropy, n_findings, finding_codes) "
            'SELECT id, run_id, step, position, batch_id, slug, "group", reward, passed, n_tokens, '
            "COALESCE(n_tool_tokens, 0), max_abs_adv, nonpolicy_abs_adv_share, max_ratio, "
            "mean_entropy, COALESCE(n_findings, 0), COALESCE(finding_codes, '') FROM episode "
            "WHERE run_id IS NOT NULL AND step IS NOT NULL "
            "AND id NOT IN (SELECT episode_id FROM episode_search)"
        )
    indexes = {i["name"] for i in insp.get_indexes("episode")}
    for name in EPISODE_INDEXES:
        if name in indexes:
            op.drop_index(name, table_name="episode")
    # ALTER TABLE ... DROP COLUMN in place (SQLite >= 3.35), not batch mode's copy of the table:
    # with foreign keys on, dropping the old copy would cascade to every row referencing an episode.
    for name, _ in SEARCH_COLUMNS:
        if name in have:
            op.drop_column("episode", name)


def downgrade() -> None:
    with op.batch_alter_table("episode", schema=None) as batch_op:
        for name, type_ in SEARCH_COLUMNS:
            batch_op.add_column(sa.Column(name, type_, nullable=True))
    for name, columns in EPISODE_INDEXES.items():
        op.create_index(name, "episode", columns, unique=False)
    op.execute(
        "UPDATE episode SET "
        + ", ".join(
            f"{name} = (SELECT s.{name} FROM episode_search s WHERE s.episode_id = episode.id)"
            for name, _ in SEARCH_COLUMNS
        )
    )
    op.drop_table("episode_search")
