"""runs: table run; batch.run_id, batch.step (unique per run) and batch.metrics_json

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 12:20:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A database made by create_all before migrations existed is stamped 0001 but may already have
    # this revision's schema (app/storage/migrate.py): create only what is missing.
    insp = sa.inspect(op.get_bind())
    if "run" not in insp.get_table_names():
        op.create_table(
            "run",
            sa.Column("id", sa.Integer(), nullable=False),
            sa.Column("name", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
            sa.Column("config_json", sa.Text(), nullable=False),
            sa.Column("created_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
            sa.Column("delete_token_hash", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=True),
            sa.PrimaryKeyConstraint("id"),
        )
        with op.batch_alter_table("run", schema=None) as batch_op:
            batch_op.create_index(batch_op.f("ix_run_created_at"), ["created_at"], unique=False)
            batch_op.create_index(batch_op.f("ix_run_name"), ["name"], unique=False)
    if "run_id" in {c["name"] for c in insp.get_columns("batch")}:
        return
    # batch_alter_table: SQLite cannot add a foreign key or a constraint in place, so Alembic
    # copies the table there; PostgreSQL gets plain ALTER TABLE statements.
    with op.batch_alter_table("batch", schema=None) as batch_op:
        batch_op.add_column(sa.Column("run_id", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("step", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("metrics_json", sa.Text(), nullable=True))
        batch_op.create_index(batch_op.f("ix_batch_run_id"), ["run_id"], unique=False)
        batch_op.create_foreign_key("fk_batch_run_id_run", "run", ["run_id"], ["id"])
        batch_op.create_unique_constraint("uq_batch_run_step", ["run_id", "step"])


def downgrade() -> None:
    with op.batch_alter_table("batch", schema=None) as batch_op:
        batch_op.drop_constraint("uq_batch_run_step", type_="unique")
        batch_op.drop_constraint("fk_batch_run_id_run", type_="foreignkey")
        batch_op.drop_index(batch_op.f("ix_batch_run_id"))
        batch_op.drop_column("metrics_json")
        batch_op.drop_column("step")
        batch_op.drop_column("run_id")
    with op.batch_alter_table("run", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_run_name"))
        batch_op.drop_index(batch_op.f("ix_run_created_at"))
    op.drop_table("run")
