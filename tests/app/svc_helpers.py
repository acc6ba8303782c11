"""Helpers for the service tests: the real app on a real database (SQLite file or PostgreSQL) through
TestClient."""

from __future__ import annotations

import json
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import text

from app.core.settings import Settings
from app.main import create_app

FORMATS = Path(__file__).resolve().parents[2] / "fixtures" / "formats"


def make_client(db: str | Path, **overrides) -> TestClient:
    """The app on ``db``: a database URL (the ``db_url`` fixture: SQLite or PostgreSQL, at head), or
    a folder, for a new SQLite file there that the app migrates at start."""
    url = db if isinstance(db, str) else f"sqlite:///{Path(db) / 'test.db'}"
    settings = Settings(database_url=url, **overrides)
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
