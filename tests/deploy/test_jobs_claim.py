"""The job table's protocol (app/storage/jobs.py) on a real SQLite file, and on PostgreSQL when
CREDITLENS_TEST_PG_URL is set: concurrent claimants each get distinct jobs, lost workers are
re-queued once and then failed, finished jobs expire, a pool runs handlers and records how
they ended."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text, update

from app.core.errors import ApiError
from app.storage import jobs
from app.storage.db import init_db, make_engine
from tests.deploy.jobs_helpers import fresh_pg_database


@pytest.fixture(params=["sqlite", "postgres"])
def engine(request, tmp_path):
    if request.param == "sqlite":
        eng = make_engine(f"sqlite:///{tmp_path / 'jobs.db'}")
        init_db(eng)
        yield eng
        eng.dispose()
        return
    with fresh_pg_database() as url:
        eng = make_engine(url)
        init_db(eng)
        yield eng
        eng.dispose()


def _claim_all(engine, n_threads: int) -> list[list[int]]:
    """n_threads threads, released together, each claiming until the queue is empty."""
    got: list[list[int]] = [[] for _ in range(n_threads)]
    start = threading.Barrier(n_threads)
    errors: list[BaseException] = []

    def claimant(i: int) -> None:
        try:
            start.wait()
            while (job := jobs.claim(engine, f"test:{i}:x")) is not None:
                got[i].append(job.id)
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=claimant, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    return got


def test_concurrent_claimants_each_get_distinct_jobs(engine):
    tokens = [jobs.submit(engine, "noop", {"i": i}) for i in range(60)]
    got = _claim_all(engine, 8)
    claimed = [j for g in got for j in g]
    with engine.connect() as conn:
        ids = [r[0] for r in conn.execute(text("SELECT id FROM job ORDER BY id"))]
        rows = conn.execute(text("SELECT state, attempts, worker FROM job")).all()
    assert len(tokens) == len(set(tokens)) == 60
    assert sorted(claimed) == ids  # every job claimed, none twice
    assert all(s == "running" and a == 1 and w.startswith("test:") for s, a, w in rows)
    # Each claimant took its jobs in queue order.
    assert all(g == sorted(g) for g in got)


def _age_heartbeats(engine, seconds: float) -> None:
    old = datetime.now(UTC) - timedelta(seconds=seconds)
    with engine.begin() as conn:
        conn.execute(update(jobs._T).where(jobs._T.c.state == "running").values(heartbeat_at=old))


def test_a_lost_job_is_requeued_once_then_failed(engine):
    token = jobs.submit(engine, "noop", {})
    first = jobs.claim(engine, "host:1:a")
    assert first is not None and first.attempts == 1
    assert jobs.reap(engine, 30) == (0, 0)  # fresh heartbeat: left alone
    _age_heartbeats(engine, 31)
    assert jobs.reap(engine, 30) == (1, 0)
    assert jobs.poll(engine, token)["state"] == "queued"
    # The first worker's late answer is dropped: it no longer holds the job.
    assert jobs.finish(engine, first.id, "host:1:a", result={"x": 1}) is False
    second = jobs.claim(engine, "host:2:b")
    assert second is not None and second.id == first.id and second.attempts == 2
    assert jobs.heartbeat(engine, "host:2:b") == 1
    _age_heartbeats(engine, 31)
    assert jobs.reap(engine, 30) == (0, 1)
    view = jobs.poll(engine, token)
    assert view["state"] == "error" and view["error"]["code"] == "job_lost"
    assert "stopped twice" in view["error"]["message"] and view["error"]["status"] == 500
    assert jobs.claim(engine, "host:3:c") is None


def test_finished_jobs_expire(engine):
    done = jobs.submit(engine, "noop", {})
    queued = jobs.submit(engine, "noop", {})
    job = jobs.claim(engine, "host:1:a")
    assert jobs.finish(engine, job.id, "host:1:a", result={"batch_id": 7}) is True
    assert jobs.poll(engine, done, ttl_s=60) == {
        "job_id": done,
        "state": "done",
        "progress": 1.0,
        "batch_id": 7,
    }
    old = datetime.now(UTC) - timedelta(seconds=120)
    with engine.begin() as conn:
        conn.execute(update(jobs._T).where(jobs._T.c.token == done).values(finished_at=old))
    assert jobs.poll(engine, done, ttl_s=60) is None  # hidden at once, deleted by the sweep
    assert jobs.expire(engine, 60) == 1
    assert jobs.poll(engine, done) is None
    assert jobs.poll(engine, queued, ttl_s=60)["state"] == "queued"  # unfinished jobs never expire


@jobs.register("test_echo")
def _echo(params, ctx):
    ctx.progress(0.5)
    if params.get("raise") == "api":
        raise ApiError(422, "bad_thing", "the thing was bad")
    if params.get("raise") == "other":
        raise RuntimeError("boom")
    return {"echo": params["x"]}


def _wait_finished(engine, token: str, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        view = jobs.poll(engine, token)
        if view["state"] in ("done", "error"):
            return view
        assert time.monotonic() < deadline, view
        time.sleep(0.02)


def test_pool_runs_jobs_and_records_how_they_ended(engine):
    pool = jobs.JobPool(engine, size=2, poll_s=0.2, heartbeat_timeout_s=30, ttl_s=60)
    try:
        ok = pool.submit("test_echo", {"x": [1, 2]})  # starts the pool
        api = pool.submit("test_echo", {"x": 0, "raise": "api"})
        other = pool.submit("test_echo", {"x": 0, "raise": "other"})
        unknown = pool.submit("no_such_kind", {})
        assert _wait_finished(engine, ok) == {"job_id": ok, "state": "done", "progress": 1.0, "echo": [1, 2]}
        err = _wait_finished(engine, api)["error"]
        assert (err["status"], err["code"], err["message"]) == (422, "bad_thing", "the thing was bad")
        err = _wait_finished(engine, other)["error"]
        assert err["status"] == 500 and err["code"] == "test_echo_failed" and "boom" in err["message"]
        assert _wait_finished(engine, unknown)["error"]["code"] == "unknown_job"
        assert len([t for t in threading.enumerate() if t.name.startswith("creditlens-job-")]) == 3
    finally:
        pool.stop()
    assert not [t for t in threading.enumerate() if t.name.startswith("creditlens-job-")]


def test_pool_stop_hands_running_jobs_back(engine):
    """An orderly shutdown stops a running job at its next progress report and puts it back in
    the queue, the attempt not counted; the pool's threads are gone."""
    reports = []

    @jobs.register("test_forever")
    def _forever(_params, ctx):
        for i in range(100_000):  # bounded, in case stopping did not work
            reports.append(i)
            ctx.progress(0.5)
            time.sleep(0.001)
        return {"finished": True}

    pool = jobs.JobPool(engine, size=1, poll_s=0.2, heartbeat_timeout_s=30, ttl_s=60)
    token = pool.submit("test_forever", {})
    deadline = time.monotonic() + 60
    while not reports:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    pool.stop(grace_s=30)
    assert not [t for t in threading.enumerate() if t.name.startswith("creditlens-job-")]
    assert len(reports) < 100_000
    with engine.connect() as conn:
        row = conn.execute(text("SELECT state, attempts, worker FROM job")).one()
    assert tuple(row) == ("queued", 0, None)
    assert jobs.poll(engine, token)["state"] == "queued"


@pytest.mark.parametrize(
    "name,value",
    [
        ("job_workers", 0),
        ("job_workers", 65),
        ("job_poll_s", 0),
        ("job_heartbeat_timeout_s", -1),
        ("job_ttl_s", 0),
    ],
)
def test_job_settings_are_validated(name, value):
    from pydantic import ValidationError

    from app.core.settings import Settings

    with pytest.raises(ValidationError, match=name):
        Settings(**{name: value})
    defaults = Settings()
    assert (defaults.job_workers, defaults.job_poll_s, defaults.job_heartbeat_timeout_s) == (2, 1.0, 60.0)
