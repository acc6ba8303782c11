"""Alembic migrations produce exactly the schema the models declare, on SQLite and PostgreSQL."""

from __future__ import annotations

import json

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
    "episode_search",
    "run_logged_metrics",
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


def test_search_fields_move_to_episode_search_and_nothing_else_is_lost(tmp_path):
    """0011 moves the search fields 0009 put on episode into episode_search: a step stored at 0010
    keeps its search row, and the rows that reference its episodes (its audit) survive the move."""
    engine = make_engine(f"sqlite:///{tmp_path / 'm.db'}")
    import_models()
    upgrade(engine, "0010")
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO run (id, name, config_json, created_at) "
                "VALUES (1, 'r', '{}', '2026-01-01 00:00:00')"
            )
        )
        conn.execute(
            text(
                "INSERT INTO batch (id, name, source, created_at, n_episodes, meta_json, run_id, step) "
                "VALUES (1, 'r step 3', 'run', '2026-01-01 00:00:00', 1, '{}', 1, 3)"
            )
        )
        conn.execute(
            text(
                "INSERT INTO episode (id, slug, batch_id, position, n_tokens, n_policy, n_turns, score, "
                'passed, truncated, tokens_json, kinds, meta_json, "group", reward, run_id, step, '
                "n_tool_tokens, max_abs_adv, nonpolicy_abs_adv_share, max_ratio, mean_entropy, "
                "n_findings, finding_codes) VALUES (7, 'e7', 1, 0, 5, 3, 1, 1.0, 1, 0, '[]', x'00', "
                "'{}', 'g', 1.0, 1, 3, 2, 0.5, 0.25, 1.5, 0.75, 1, 'E_CODE')"
            )
        )
        conn.execute(
            text("INSERT INTO episode_audit (episode_id, batch_id, reference) VALUES (7, 1, 'grpo')")
        )
    upgrade(engine)
    with engine.connect() as conn:
        row = conn.execute(text("SELECT * FROM episode_search")).mappings().one()
        assert conn.execute(text("SELECT COUNT(*) FROM episode_audit")).scalar_one() == 1
    assert dict(row) == {
        "episode_id": 7,
        "run_id": 1,
        "step": 3,
        "position": 0,
        "batch_id": 1,
        "slug": "e7",
        "group": "g",
        "reward": 1.0,
        "passed": 1,
        "n_tokens": 5,
        "n_tool_tokens": 2,
        "max_abs_adv": 0.5,
        "nonpolicy_abs_adv_share": 0.25,
        "max_ratio": 1.5,
        "mean_entropy": 0.75,
        "n_findings": 1,
        "finding_codes": "E_CODE",
    }
    assert "max_abs_adv" not in {c["name"] for c in inspect(engine).get_columns("episode")}


def test_token_signals_go_back_into_meta_json_on_downgrade(tmp_path):
    """0014 packs meta.token_signals into episode.token_signals; its downgrade puts them back into
    meta_json (where and as they were) before dropping the column, so nothing is lost."""
    from app.core.token_signals import pack_signals, split

    engine = make_engine(f"sqlite:///{tmp_path / 'm.db'}")
    import_models()
    upgrade(engine)
    meta = {"task": "t", "token_signals": {"w": [0.5, None, 1.0], "labels": ["a", "b", "c"]}, "z": 1}
    rest, arrays = split(meta, 3)
    assert arrays is not None
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO batch (id, name, source, created_at, n_episodes, meta_json) "
                "VALUES (1, 'b', 'upload', '2026-01-01 00:00:00', 1, '{}')"
            )
        )
        conn.execute(
            text(
                "INSERT INTO episode (id, slug, batch_id, position, n_tokens, n_policy, n_turns, score, "
                "passed, truncated, tokens_json, kinds, meta_json, token_signals) VALUES (1, 'e1', 1, 0, "
                "3, 3, 1, 0.0, 0, 0, '[]', x'010101', :m, :b)"
            ),
            {"m": json.dumps(rest), "b": pack_signals(arrays)},
        )
    downgrade(engine, "0013")
    assert "token_signals" not in {c["name"] for c in inspect(engine).get_columns("episode")}
    with engine.connect() as conn:
        assert conn.execute(text("SELECT meta_json FROM episode")).scalar_one() == json.dumps(
            meta, separators=(",", ":")
        )
