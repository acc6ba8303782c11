"""The SQLite writer path (app/storage/db.py ``writing``) and the diagnostics stored with an upload.

One writer at a time: while a request holds the write turn, the process's lock is taken and the
file lock beside the database cannot be had by another process (``--workers 2``). The batch
diagnostics, computed from the rows before the write, are exactly what reading the stored batch
back computes."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import pytest
from sqlmodel import Session

from app.storage import db
from app.storage.batch_stats import compute_batch_diagnostics
from app.storage.models import BatchStats
from tests.app.svc_helpers import make_client

DEMO = Path(__file__).resolve().parents[3] / "fixtures" / "demo"


def test_the_write_turn_excludes_threads_and_processes(tmp_path):
    engine = db.make_engine(f"sqlite:///{tmp_path / 'w.db'}")
    writer = db._WRITERS[engine]
    other = os.open(f"{tmp_path / 'w.db'}.writer", os.O_RDWR | os.O_CREAT)
    try:
        with Session(engine) as session:
            with db.writing(session):
                assert writer.lock.locked()
                with pytest.raises(BlockingIOError):  # another process's open of the lock file
                    fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
            assert not writer.lock.locked()
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free again once the turn ends
            fcntl.flock(other, fcntl.LOCK_UN)
            # A failing transaction gives the turn back too.
            with pytest.raises(RuntimeError), db.writing(session):
                raise RuntimeError("boom")
            assert not writer.lock.locked()
    finally:
        os.close(other)
        engine.dispose()


def test_postgres_has_no_writer_lock():
    engine = db.make_engine("postgresql+psycopg://u:p@127.0.0.1:1/none")
    assert engine not in db._WRITERS
    engine.dispose()


@pytest.mark.parametrize("name", sorted(p.name for p in DEMO.glob("*.jsonl")))
def test_stored_diagnostics_are_those_of_the_stored_batch(db_url, name):
    with make_client(db_url) as client:
        r = client.post(
            "/api/uploads",
            content=(DEMO / name).read_bytes(),
            params={"format": "native", "name": name},
            headers={"content-type": "application/octet-stream"},
        )
        assert r.status_code == 201, r.text
        batch_id = r.json()["batch_id"]
        with Session(client.app.state.engine) as session:
            stored = json.loads(session.get(BatchStats, batch_id).diagnostics_json)
            read_back, n = compute_batch_diagnostics(session, batch_id)
        assert n == len(r.json()["episodes"])
        assert stored == json.loads(json.dumps(read_back))
