"""visibility: batch.visibility/slug and run.visibility/slug (public or unlisted)

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 13:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("batch", "run")


def upgrade() -> None:
    # A database made by create_all before migrations existed is stamped 0001 but may already have
    # this revision's schema (app/storage/migrate.py): add only what is missing.
    insp = sa.inspect(op.get_bind())
    for table in TABLES:
        if "visibility" in {c["name"] for c in insp.get_columns(table)}:
            continue
        with op.batch_alter_table(table, schema=None) as batch_op:
            # Existing rows stay public (reachable by id, as before).
            batch_op.add_column(
                sa.Column(
                    "visibility",
                    sqlmodel.sql.sqltypes.AutoString(length=16),
                    nullable=False,
                    server_default="public",
                )
            )
            batch_op.add_column(sa.Column("slug", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=True))
            batch_op.create_index(batch_op.f(f"ix_{table}_visibility"), ["visibility"], unique=False)
            batch_op.create_index(batch_op.f(f"ix_{table}_slug"), ["slug"], unique=True)


def downgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_index(batch_op.f(f"ix_{table}_slug"))
            batch_op.drop_index(batch_op.f(f"ix_{table}_visibility"))
            batch_op.drop_column("slug")
            batch_op.drop_column("visibility")
