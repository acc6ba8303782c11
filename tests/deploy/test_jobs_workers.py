"""Sampling jobs under a real `uvicorn --workers 2` on SQLite and on PostgreSQL (when
CREDITLENS_TEST_PG_URL is set): any worker answers a poll, a job whose worker is killed (-9) is
re-queued and finished by a worker that lives, and a job that loses its worker twice ends as an
error saying so."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from app.sim.routes import JobOut
from app.storage.db import make_engine
from tests.deploy.jobs_helpers import fresh_pg_database
from tests.live_server import Server

pytestmark = pytest.mark.slow

# A lost worker is noticed after 4 s without a heartbeat (the default is a minute).
JOB_ENV = {"CREDITLENS_JOB_HEARTBEAT_TIMEOUT_S": "4", "CREDITLENS_JOB_POLL_S": "0.5"}
# Seconds of work: long enough to be killed while it runs, short enough to finish a test.
LONG_JOB = {"n_tasks": 20, "n_per_task": 32, "truth": "mc", "n_rollouts": 32, "seed": 3}


@pytest.fixture(params=["sqlite", "postgres"])
def served(request, tmp_path):
    """(server, engine on its database) for a 2-worker server on a fresh database."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'jobs.db'}"
        yield from _serve(tmp_path, url)
    else:
        with fresh_pg_database() as url:
            yield from _serve(tmp_path, url)


def _serve(tmp_path, url):
    server = Server(tmp_path / "jobs.db", tmp_path / "server.log", CREDITLENS_DATABASE_URL=url, **JOB_ENV)
    server.extra_args = ["--workers", "2"]
    server.start(timeout=240)
    engine = make_engine(url)
    try:
        yield server, engine
    finally:
        server.stop()
        engine.dispose()


def _row(engine, token: str):
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT state, attempts, worker, error_json FROM job WHERE token = :t"), {"t": token}
        ).one()


def _wait_row(engine, token: str, cond, timeout: float = 300.0, what: str = ""):
    deadline = time.monotonic() + timeout
    while True:
        row = _row(engine, token)
        if cond(row):
            return row
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {tuple(row)}"
        time.sleep(0.02)


def _worker_pid(server: Server, worker: str) -> int:
    """The pid in a job's worker id ("host:pid:nonce"), checked to be one of this server's workers
    (a child of the uvicorn supervisor we started)."""
    pid = int(worker.split(":")[1])
    stat = Path(f"/proc/{pid}/stat").read_text()
    assert int(stat.rsplit(")", 1)[1].split()[1]) == server.pid, (pid, server.pid)
    return pid


def _submit(server: Server, body: dict) -> tuple[str, str]:
    r = httpx.post(f"{server.base}/api/samples?async=true", json=body, timeout=30)
    assert r.status_code == 202, r.text
    return r.json()["job_id"], server.base + r.json()["url"]


def _poll(url: str) -> dict:
    """One poll on a new connection (so it may reach either worker). A worker killed by the test
    may drop the connection it had just accepted: such polls are retried, never answered wrongly."""
    for _ in range(20):
        try:
            r = httpx.get(url, timeout=30)
        except httpx.TransportError:
            continue
        assert r.status_code == 200, r.text
        return r.json()
    raise AssertionError("no answer to 20 polls")


def test_any_worker_answers_polls(served):
    server, engine = served
    token, url = _submit(server, {"n_tasks": 4, "n_per_task": 4, "seed": 11})
    states, progress = [], []
    deadline = time.monotonic() + 300
    while True:  # every poll answers 200 whichever worker takes it; never a 404
        r = httpx.get(url, timeout=30)
        assert r.status_code == 200, r.text
        job = r.json()
        assert job["job_id"] == token
        states.append(job["state"])
        progress.append(job["progress"])
        if job["state"] in ("done", "error") and len(states) >= 30:
            break
        assert time.monotonic() < deadline, states[-5:]
        time.sleep(0.05)
    assert job["state"] == "done", job
    assert progress == sorted(progress) and progress[-1] == 1.0
    finished = [httpx.get(url, timeout=30).json() for _ in range(30)]
    assert all(f == job for f in finished)  # the same answer from both workers
    assert httpx.get(f"{server.base}/api/batches/{job['batch_id']}", timeout=30).json()["n_episodes"] == 16
    assert set(job) == set(JobOut.model_fields) and job["error"] is None  # the shape JobOut declares
    missing = httpx.get(f"{server.base}/api/samples/jobs/{token[:-1]}x", timeout=30)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    row = _row(engine, token)
    assert tuple(row[:2]) == ("done", 1)
    _worker_pid(server, row.worker)


def test_a_job_whose_worker_is_killed_is_finished_by_another(served):
    server, engine = served
    token, url = _submit(server, LONG_JOB)
    row = _wait_row(engine, token, lambda r: r.state == "running", what="the job to start")
    first = _worker_pid(server, row.worker)
    os.kill(first, signal.SIGKILL)
    assert _poll(url)["state"] in ("running", "queued")  # the other worker answers meanwhile
    row = _wait_row(engine, token, lambda r: r.state in ("done", "error"), what="the job to finish")
    assert row.state == "done", row.error_json
    assert row.attempts == 2  # run once, re-queued once after the heartbeat stopped
    assert _worker_pid(server, row.worker) != first
    job = _poll(url)
    assert job["state"] == "done" and job["progress"] == 1.0
    batch = httpx.get(f"{server.base}/api/batches/{job['batch_id']}", timeout=30).json()
    assert batch["n_episodes"] == 20 * 32


def test_a_job_that_loses_its_worker_twice_ends_as_an_error(served):
    server, engine = served
    token, url = _submit(server, LONG_JOB)
    row = _wait_row(engine, token, lambda r: r.state == "running", what="the first attempt")
    first = _worker_pid(server, row.worker)
    os.kill(first, signal.SIGKILL)
    row = _wait_row(
        engine, token, lambda r: r.state == "running" and r.attempts == 2, what="the second attempt"
    )
    second = _worker_pid(server, row.worker)
    assert second != first
    os.kill(second, signal.SIGKILL)
    row = _wait_row(engine, token, lambda r: r.state in ("done", "error"), what="the job to end")
    assert row.state == "error" and row.attempts == 2
    job = _poll(url)
    assert job["state"] == "error"
    err = job["error"]
    assert err == json.loads(row.error_json)
    assert err["code"] == "job_lost" and err["status"] == 500
    assert "stopped twice" in err["message"] and "no heartbeat for 4 s" in err["message"]
    # The server still serves, with the supervisor's replacement workers.
    assert httpx.get(f"{server.base}/healthz", timeout=30).status_code == 200
