"""episode.ref_logprobs / rollout_logprobs / entropy (float64 bytes) and token_ids (int64 bytes),
all nullable: the trainer's per-token signals and the token ids of an upload

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 12:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COLUMNS = ("ref_logprobs", "rollout_logprobs", "entropy", "token_ids")


def upgrade() -> None:
    # A database made by create_all before migrations existed is stamped 0001 but may already have
    # the columns (app/storage/migrate.py): add only the missing ones.
    have = {c["name"] for c in sa.inspect(op.get_bind()).get_columns("episode")}
    missing = [c for c in _COLUMNS if c not in have]
    if not missing:
        return
    with op.batch_alter_table("episode", schema=None) as batch_op:
        for name in missing:
            batch_op.add_column(sa.Column(name, sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("episode", schema=None) as batch_op:
        for name in reversed(_COLUMNS):
            batch_op.drop_column(name)
