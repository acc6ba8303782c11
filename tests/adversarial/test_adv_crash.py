"""Crash safety: kill -9 a real server process in the middle of a large upload.

A real ``uvicorn`` process on a temp SQLite file receives a large streamed upload (N episodes x T
tokens); the process is killed with SIGKILL (a) half-way through receiving the body, (a2) after
the body arrived but before any write, (b) while it writes the batch (the SQLite write-ahead log is
growing), and (c) right after it answered 201. After each
kill the database passes ``PRAGMA integrity_check`` and the upload is all there (one batch row and
all N episodes) or not there at all (no batch row, no episode row); data stored before is intact,
and a restarted server serves it.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.adversarial.adv_helpers import Server, cpu_seconds

# The size: 3000 episodes x 2000 tokens, ~100 MB of JSONL, a write transaction of ~60 MB.
# CREDITLENS_CRASH_EPISODES / CREDITLENS_CRASH_TOKENS change it (e.g. smaller on a slow machine).
N_EPISODES = int(os.environ.get("CREDITLENS_CRASH_EPISODES", "3000"))
N_TOKENS = int(os.environ.get("CREDITLENS_CRASH_TOKENS", "2000"))

pytestmark = pytest.mark.slow


def _line(k: int) -> bytes:
    n_prompt = 100
    ep = {
        "tokens": [f"t{i}" for i in range(N_TOKENS)],
        "kinds": ["prompt"] * n_prompt + ["policy"] * (N_TOKENS - n_prompt),
        "reward": float(k % 2),
        "group": f"g{k % 50}",
    }
    return (json.dumps(ep) + "\n").encode()


LINES = [_line(0), _line(1)]


def big_body(chunk: int = 1 << 20):
    """The upload, streamed in ~1 MiB chunks (never held whole in the client)."""
    buf = bytearray()
    for k in range(N_EPISODES):
        buf += LINES[k % 2]
        if len(buf) >= chunk:
            yield bytes(buf)
            buf.clear()
    if buf:
        yield bytes(buf)


class Upload(threading.Thread):
    """POST the big body in a thread; records the answer or the connection error."""

    def __init__(self, base: str, name: str) -> None:
        super().__init__(daemon=True)
        self.base, self.name = base, name
        self.status: int | None = None
        self.error: Exception | None = None
        self.sent = threading.Event()
        self.half = threading.Event()

    def _body(self):
        size = 0
        total = len(LINES[0]) * N_EPISODES
        for chunk in big_body():
            yield chunk
            size += len(chunk)
            if size >= total // 2:
                self.half.set()
        self.sent.set()

    def run(self) -> None:
        try:
            r = httpx.post(
                f"{self.base}/api/uploads",
                params={"name": self.name, "format": "native"},
                content=self._body(),
                headers={"content-type": "application/octet-stream"},
                timeout=300,
            )
            self.status = r.status_code
        except httpx.HTTPError as e:
            self.error = e


def check_db(db: Path, name: str, seed_rows: list) -> str:
    """Integrity ok; the batch ``name`` is all there or absent; the seed rows unchanged.

    Returns "present" or "absent"."""
    con = sqlite3.connect(db)  # opening the file after the crash replays/discards the WAL
    try:
        assert con.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert con.execute("PRAGMA foreign_key_check").fetchall() == []
        batches = con.execute("SELECT id, n_episodes FROM batch WHERE name = ?", (name,)).fetchall()
        orphans = con.execute("SELECT COUNT(*) FROM episode WHERE batch_id NOT IN (SELECT id FROM batch)")
        assert orphans.fetchone()[0] == 0
        seed_now = con.execute("SELECT slug, tokens_json, kinds FROM episode WHERE batch_id = 1").fetchall()
        assert seed_now == seed_rows
        if not batches:
            n_eps = con.execute("SELECT COUNT(*) FROM episode WHERE batch_id <> 1").fetchone()[0]
            assert n_eps == 0, "episode rows without their batch"
            return "absent"
        assert len(batches) == 1
        batch_id, n = batches[0]
        stored = con.execute("SELECT COUNT(*), SUM(n_tokens) FROM episode WHERE batch_id = ?", (batch_id,))
        assert stored.fetchone() == (N_EPISODES, N_EPISODES * N_TOKENS)
        assert n == N_EPISODES
        return "present"
    finally:
        con.close()


def _wal_size(db: Path) -> int:
    wal = db.with_name(db.name + "-wal")
    return wal.stat().st_size if wal.exists() else 0


@pytest.fixture
def servers():
    """Every server the test starts; killed at the end even when an assertion fails."""
    started: list[Server] = []
    yield started
    for srv in started:
        srv.kill()


def test_kill_9_mid_upload_leaves_all_or_nothing(tmp_path, servers):
    db = tmp_path / "crash.db"
    log = tmp_path / "server.log"
    outcomes = {}

    def start() -> Server:
        srv = Server(db, log)
        servers.append(srv)
        return srv.start()

    # Seed data that must survive every crash.
    srv = start()
    seed = {"tokens": ["q", " a", " b"], "kinds": ["prompt", "policy", "policy"], "reward": 1.0}
    r = httpx.post(f"{srv.base}/api/uploads", json=seed, timeout=60)
    assert r.status_code == 201, r.text
    seed_slug = r.json()["episodes"][0]["slug"]
    con = sqlite3.connect(db)
    seed_rows = con.execute("SELECT slug, tokens_json, kinds FROM episode WHERE batch_id = 1").fetchall()
    con.close()
    assert len(seed_rows) == 1

    # (a) Killed while receiving: half the body is on the wire.
    up = Upload(srv.base, "crash-receive")
    up.start()
    assert up.half.wait(120), "the body was not sent"
    srv.kill()
    up.join(30)
    assert up.status is None and up.error is not None
    outcomes["receive"] = check_db(db, "crash-receive", seed_rows)
    assert outcomes["receive"] == "absent"

    # (a2) Killed while parsing: the whole body is sent, the write has not started.
    srv = start()
    up = Upload(srv.base, "crash-parse")
    up.start()
    assert up.sent.wait(120), "the body was not sent"
    wal0 = _wal_size(db)
    cpu0 = cpu_seconds(srv.pid)
    while cpu_seconds(srv.pid) - cpu0 < 0.05 and up.is_alive():
        time.sleep(0.005)
    pre_write = _wal_size(db) == wal0
    alive = up.is_alive()
    srv.kill()
    up.join(30)
    assert alive and pre_write, "the kill did not land between receiving and writing"
    outcomes["parse"] = check_db(db, "crash-parse", seed_rows)
    assert outcomes["parse"] == "absent"

    # (b) Killed while writing: the write-ahead log grows as the transaction spills its pages.
    srv = start()
    wal0 = _wal_size(db)
    up = Upload(srv.base, "crash-write")
    up.start()
    deadline = time.monotonic() + 240
    while _wal_size(db) < wal0 + (2 << 20) and up.is_alive() and time.monotonic() < deadline:
        time.sleep(0.005)
    grew = _wal_size(db) - wal0
    alive = up.is_alive()
    srv.kill()
    up.join(30)
    assert alive and grew >= (2 << 20), f"the kill did not land mid-write (WAL +{grew} bytes)"
    # Either way all or nothing (2 MB into a ~60 MB transaction, it is almost always "absent").
    outcomes["write"] = check_db(db, "crash-write", seed_rows)

    # (c) Killed right after the 201: a committed upload survives the crash whole.
    srv = start()
    up = Upload(srv.base, "crash-after")
    up.start()
    up.join(300)
    assert up.status == 201, (up.status, up.error, srv.log()[-2000:])
    srv.kill()
    outcomes["after"] = check_db(db, "crash-after", seed_rows)
    assert outcomes["after"] == "present"

    print("crash outcomes:", outcomes)

    # A restarted server serves the data (the WAL left by the crash is recovered on open).
    srv = start()
    r = httpx.get(f"{srv.base}/api/episodes/{seed_slug}", timeout=30)
    assert r.status_code == 200 and r.json()["tokens"] == seed["tokens"]
    batches = httpx.get(f"{srv.base}/api/batches", params={"q": "crash"}, timeout=30).json()
    expected = ["crash-after"] + (["crash-write"] if outcomes["write"] == "present" else [])
    assert sorted(b["name"] for b in batches) == sorted(expected)
    assert all(b["n_episodes"] == N_EPISODES for b in batches)
    srv.stop()
