"""Helpers for the service tests: the real app on a temp SQLite FILE through TestClient."""

from __future__ import annotations

import json
import os
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from app.core.settings import Settings
from app.main import create_app

FORMATS = Path(__file__).resolve().parents[2] / "fixtures" / "formats"


def test_database_url(tmp_path: Path) -> str:
    """A fresh database for one test: a SQLite file in tmp_path, or, when the suite is run with
    CREDITLENS_TEST_BACKEND=postgres (tests/deploy/test_postgres_suite.py does), the PostgreSQL
    database at CREDITLENS_TEST_PG_URL with its schema wiped."""
    if os.environ.get("CREDITLENS_TEST_BACKEND") == "postgres":
        url = os.environ["CREDITLENS_TEST_PG_URL"]
        engine = create_engine(url)
        with engine.begin() as conn:
            conn.execute(text("DROP SCHEMA public CASCADE"))
            conn.execute(text("CREATE SCHEMA public"))
        engine.dispose()
        return url
    return f"sqlite:///{tmp_path / 'test.db'}"


def make_client(tmp_path: Path, **overrides) -> TestClient:
    settings = Settings(database_url=test_database_url(tmp_path), **overrides)
    return TestClient(create_app(settings))


def row_counts(client: TestClient) -> tuple[int, int]:
    """(batches, episodes) straight from the database."""
    with client.app.state.engine.connect() as conn:
        b = conn.execute(text("SELECT COUNT(*) FROM batch")).scalar_one()
        e = conn.execute(text("SELECT COUNT(*) FROM episode")).scalar_one()
    return b, e


def jsonl(episodes: list[dict]) -> str:
    return "".join(json.dumps(e) + "\n" for e in episodes)


def episode(reward=1.0, group="g", n_prompt=2, n_policy=3, **extra) -> dict:
    """A small valid native episode: n_prompt prompt tokens then n_policy policy tokens."""
    ep = {
        "tokens": [f"p{i}" for i in range(n_prompt)] + [f"a{i}" for i in range(n_policy)],
        "kinds": ["prompt"] * n_prompt + ["policy"] * n_policy,
        "reward": reward,
        "group": group,
    }
    ep.update(extra)
    return ep


def upload(client: TestClient, episodes: list[dict], **params):
    return client.post("/api/uploads", files={"file": ("eps.jsonl", jsonl(episodes))}, params=params)
