"""episode search: the (run_id, step, position) index widened by every numeric search field, so a
filter or sort on any of them reads the index alone, not one table row per episode of the run

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03 09:10:00.000000
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The same list as app/storage/models.py EpisodeSearch (a migration keeps its own copy).
COVERING = [
    "run_id",
    "step",
    "position",
    "reward",
    "passed",
    "n_tokens",
    "n_tool_tokens",
    "max_abs_adv",
    "nonpolicy_abs_adv_share",
    "max_ratio",
    "mean_entropy",
    "n_findings",
]


def upgrade() -> None:
    op.drop_index("ix_episode_search_run_step", table_name="episode_search")
    op.create_index("ix_episode_search_run_step_fields", "episode_search", COVERING)


def downgrade() -> None:
    op.drop_index("ix_episode_search_run_step_fields", table_name="episode_search")
    op.create_index("ix_episode_search_run_step", "episode_search", ["run_id", "step", "position"])
