"""Shared helpers of the adversarial tests: apps on temp SQLite files, database checksums,
real server processes."""

from __future__ import annotations

import atexit
import hashlib
import shutil
import tempfile
from pathlib import Path

from fastapi import FastAPI
from sqlalchemy import inspect, text
from sqlalchemy.engine import Engine
from sqlmodel import Session

from app.core.settings import Settings
from app.main import create_app
from app.storage.db import init_db
from app.storage.store import load_demo

ROOT = Path(__file__).resolve().parents[2]


def fuzz_app(**overrides) -> FastAPI:
    """The real app on a fresh temp SQLite file with its tables and the demo batches in place
    (schemathesis' ASGI transport does not run the lifespan)."""
    folder = Path(tempfile.mkdtemp(prefix="creditlens-fuzz-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    app = create_app(Settings(database_url=f"sqlite:///{folder / 'fuzz.db'}", **overrides))
    init_db(app.state.engine)
    with Session(app.state.engine) as session:
        load_demo(session)
    return app


def db_fingerprint(engine: Engine) -> dict[str, tuple[int, str]]:
    """table -> (row count, sha256 of every row in primary-key order): equal fingerprints mean
    the database content is unchanged."""
    out = {}
    insp = inspect(engine)
    with engine.connect() as conn:
        for table in sorted(insp.get_table_names()):
            pk = insp.get_pk_constraint(table)["constrained_columns"] or [
                c["name"] for c in insp.get_columns(table)
            ]
            order = ", ".join(f'"{c}"' for c in pk)
            h = hashlib.sha256()
            n = 0
            for row in conn.execute(text(f'SELECT * FROM "{table}" ORDER BY {order}')):
                h.update(repr(tuple(row)).encode())
                n += 1
            out[table] = (n, h.hexdigest())
    return out


# ---- real server processes (shared with the other suites: tests/live_server.py) -------------------

from tests.live_server import Server, cpu_seconds, free_port  # noqa: E402,F401
