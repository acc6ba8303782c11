"""Schema migrations (Alembic) for SQLite and PostgreSQL, run on start and by `creditlens migrate`.

Several workers may start at once: PostgreSQL serialises them with an advisory lock, SQLite files
with a lock file beside the database, so exactly one of them migrates and the others find the
schema at head.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection, Engine

from app.core.resources import alembic_ini

_PG_LOCK_KEY = 7_216_300_1


def alembic_config() -> Config:
    return Config(str(alembic_ini()))


@contextlib.contextmanager
def _sqlite_file_lock(engine: Engine) -> Iterator[None]:
    db = engine.url.database
    if not db or db == ":memory:":
        yield
        return
    lock_path = Path(db).with_name(Path(db).name + ".migrate-lock")
    with lock_path.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _run(conn: Connection, cfg: Config, revision: str) -> None:
    cfg.attributes["connection"] = conn
    tables = set(inspect(conn).get_table_names())
    if "episode" in tables and "alembic_version" not in tables:
        # A database made before migrations existed (create_all): its schema is the first revision.
        command.stamp(cfg, "0001")
    command.upgrade(cfg, revision)


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the database at ``engine`` to ``revision`` (idempotent; safe to call from every worker)."""
    cfg = alembic_config()
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_LOCK_KEY})
            _run(conn, cfg, revision)
        return
    with _sqlite_file_lock(engine), engine.begin() as conn:
        _run(conn, cfg, revision)


def downgrade(engine: Engine, revision: str = "base") -> None:
    cfg = alembic_config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, revision)
