"""Alembic migrations produce exactly the schema the models declare, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlmodel import SQLModel

from app.storage.db import import_models, make_engine
from app.storage.migrate import downgrade, upgrade

TABLES = {
    "alembic_version",
    "batch",
    "episode",
    "lab_result",
    "job",
    "batch_audit",
    "episode_audit",
    "run",
    "batch_stats",
    "run_prompt",
    "prompt_step",
}


def _reset_pg(engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))


def _check_roundtrip(engine) -> None:
    import_models()
    upgrade(engine)
    upgrade(engine)  # idempotent: a second worker finds the schema at head
    assert set(inspect(engine).get_table_names()) == TABLES
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), SQLModel.metadata)
        version = conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one()
    assert diff == [], f"models and migrations disagree: {diff}"
    assert version  # stamped at head
    downgrade(engine, "base")
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    upgrade(engine)
    assert set(inspect(engine).get_table_names()) == TABLES


def test_sqlite_migrations_match_models(tmp_path):
    _check_roundtrip(make_engine(f"sqlite:///{tmp_path / 'm.db'}"))


@pytest.mark.postgres
def test_postgres_migrations_match_models(pg_url):
    engine = make_engine(pg_url)
    _reset_pg(engine)
    try:
        _check_roundtrip(engine)
    finally:
        _reset_pg(engine)
        engine.dispose()


def test_database_made_before_migrations_is_adopted(tmp_path):
    """A file created by create_all (before Alembic) is stamped, not recreated: its rows survive."""
    engine = make_engine(f"sqlite:///{tmp_path / 'old.db'}")
    import_models()
    # The tables that existed before migrations (later tables come from their own revisions), and
    # `run`, which today's batch table references (its revision adopts it as it finds it).
    old = [SQLModel.metadata.tables[t] for t in ("batch", "episode", "lab_result", "run")]
    SQLModel.metadata.create_all(engine, tables=old)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO batch (name, source, created_at, n_episodes, meta_json) "
                "VALUES ('kept', 'upload', '2026-01-01 00:00:00', 0, '{}')"
            )
        )
    upgrade(engine)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT name FROM batch")).scalar_one() == "kept"
        assert conn.execute(text("SELECT COUNT(*) FROM alembic_version")).scalar_one() == 1
