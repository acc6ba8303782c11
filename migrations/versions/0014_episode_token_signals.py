"""episode.token_signals (bytes, nullable): meta.token_signals packed instead of JSON in meta_json

Rows stored before keep their JSON and read the same (app/storage/codecs.py stored_meta). The
downgrade puts every packed blob back into its row's meta_json before it drops the column, so no
signal is lost.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05 11:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.core.arrays import json_dumps, json_loads
from app.core.token_signals import merge

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    if "token_signals" in {c["name"] for c in sa.inspect(op.get_bind()).get_columns("episode")}:
        return
    with op.batch_alter_table("episode", schema=None) as batch_op:
        batch_op.add_column(sa.Column("token_signals", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    conn = op.get_bind()
    episode = sa.table(
        "episode", sa.column("id", sa.Integer), sa.column("meta_json", sa.Text), sa.column("token_signals")
    )
    last = 0
    while True:  # a few hundred rows at a time: a step's rows hold megabytes each
        rows = conn.execute(
            sa.select(episode.c.id, episode.c.meta_json, episode.c.token_signals)
            .where(episode.c.token_signals.is_not(None), episode.c.id > last)
            .order_by(episode.c.id)
            .limit(256)
        ).all()
        if not rows:
            break
        for row_id, meta_json, blob in rows:
            meta = json_dumps(merge(json_loads(meta_json), blob))
            conn.execute(sa.update(episode).where(episode.c.id == row_id).values(meta_json=meta))
        last = rows[-1][0]
    with op.batch_alter_table("episode", schema=None) as batch_op:
        batch_op.drop_column("token_signals")
