"""episode.advantages: the trainer's own per-token advantages (float64 bytes, nullable)

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01 11:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A database made by create_all before migrations existed is stamped 0001 but may already have
    # the column (app/storage/migrate.py): add it only where it is missing.
    columns = {c["name"] for c in sa.inspect(op.get_bind()).get_columns("episode")}
    if "advantages" in columns:
        return
    with op.batch_alter_table("episode", schema=None) as batch_op:
        batch_op.add_column(sa.Column("advantages", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("episode", schema=None) as batch_op:
        batch_op.drop_column("advantages")
