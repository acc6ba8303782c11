"""Background jobs in the database, so any worker process can run them and any can answer a poll.

A job is a row of ``job`` (app/storage/models.py). Its life:

* ``submit`` inserts it as ``queued`` with a random, unguessable token (its public id).
* A worker thread ``claim``s the oldest queued row: one UPDATE ... RETURNING that sets it
  ``running``, stamps the worker id ("host:pid:nonce") and a heartbeat, and counts the attempt.
  PostgreSQL picks the row with ``FOR UPDATE SKIP LOCKED`` (claimants never wait on each other);
  SQLite runs the statement under its single write lock, and ``AND state = 'queued'`` makes a
  second claimant of the same row update nothing.
* While it runs, its process refreshes ``heartbeat_at`` (``heartbeat``) and writes ``progress``.
* It ends ``done`` with ``result_json`` or ``error`` with ``error_json`` (``finish``); only the
  worker that holds the claim can finish it.
* ``reap``: a running job whose heartbeat is older than the timeout lost its worker (killed,
  machine gone): it is queued again once, and the second time it is failed with a message.
* ``expire``: finished jobs are deleted after a TTL; ``poll`` already hides them.

Every process runs a ``JobPool``: a bounded number of runner threads (``CREDITLENS_JOB_WORKERS``)
that claim and run jobs, woken at once by a submit in the same process and otherwise looking for
queued rows every ``CREDITLENS_JOB_POLL_S`` seconds (a cheap read; the write lock is taken only
when something is queued), and one housekeeping thread (heartbeats, reaping, expiry).

Delivery is at least once: a job re-run after its worker died may repeat side effects the first
run had already committed (a sampling job can store its batch twice).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import delete, insert, select, update
from sqlalchemy.engine import Engine

from app.core.errors import ApiError, error_body
from app.storage.models import Job

log = logging.getLogger("creditlens.jobs")

# A job runs at most this many times: the first claim and one re-queue after its worker died.
MAX_ATTEMPTS = 2
# Progress is written at most this often per job (each write is a small UPDATE).
_PROGRESS_EVERY_S = 0.25
_EXPIRE_EVERY_S = 60.0

_T = Job.metadata.tables["job"]


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass
class JobContext:
    """What a handler gets besides its parameters: the database, the settings, a progress hook."""

    engine: Engine
    settings: Any
    token: str
    progress: Callable[[float], None]


Handler = Callable[[dict[str, Any], JobContext], dict[str, Any]]
HANDLERS: dict[str, Handler] = {}


def register(kind: str) -> Callable[[Handler], Handler]:
    """Decorator: ``handler(params, ctx) -> result dict`` runs jobs of ``kind``. Raise ``ApiError``
    for a failure the client should see as is; any other exception becomes a 500 job error."""

    def deco(fn: Handler) -> Handler:
        HANDLERS[kind] = fn
        return fn

    return deco


@dataclass
class ClaimedJob:
    id: int
    token: str
    kind: str
    params: dict[str, Any]
    attempts: int


def submit(engine: Engine, kind: str, params: dict[str, Any]) -> str:
    """Queue a job of ``kind`` with JSON-serialisable ``params``; returns its token."""
    token = secrets.token_urlsafe(16)
    with engine.begin() as conn:
        conn.execute(
            insert(_T).values(
                token=token,
                kind=kind,
                state="queued",
                params_json=json.dumps(params),
                progress=0.0,
                attempts=0,
                created_at=_now(),
            )
        )
    return token


def claim(engine: Engine, worker: str) -> ClaimedJob | None:
    """Take the oldest queued job for ``worker`` (state -> running), or None when none is queued.

    Exactly one claimant gets each job: see the module docstring."""
    with engine.connect() as conn:  # a plain read first: idle polls never take the write lock
        if conn.execute(select(_T.c.id).where(_T.c.state == "queued").limit(1)).first() is None:
            return None
    oldest = (
        select(_T.c.id)
        .where(_T.c.state == "queued")
        .order_by(_T.c.id)
        .limit(1)
        .with_for_update(skip_locked=True)  # PostgreSQL; compiles to nothing on SQLite
        .scalar_subquery()
    )
    stmt = (
        update(_T)
        .where(_T.c.id == oldest, _T.c.state == "queued")
        .values(state="running", worker=worker, heartbeat_at=_now(), attempts=_T.c.attempts + 1)
        .returning(_T.c.id, _T.c.token, _T.c.kind, _T.c.params_json, _T.c.attempts)
    )
    with engine.begin() as conn:
        row = conn.execute(stmt).first()
    if row is None:
        return None
    return ClaimedJob(row.id, row.token, row.kind, json.loads(row.params_json), row.attempts)


def heartbeat(engine: Engine, worker: str) -> int:
    """Refresh the heartbeat of every job ``worker`` is running; returns how many."""
    with engine.begin() as conn:
        res = conn.execute(
            update(_T).where(_T.c.worker == worker, _T.c.state == "running").values(heartbeat_at=_now())
        )
    return res.rowcount


def set_progress(engine: Engine, job_id: int, worker: str, progress: float) -> bool:
    """Record progress (0..1) of a job ``worker`` holds (a heartbeat too); False if it lost the job."""
    with engine.begin() as conn:
        res = conn.execute(
            update(_T)
            .where(_T.c.id == job_id, _T.c.worker == worker, _T.c.state == "running")
            .values(progress=progress, heartbeat_at=_now())
        )
    return res.rowcount == 1


def finish(
    engine: Engine,
    job_id: int,
    worker: str,
    *,
    result: dict[str, Any] | None = None,
    error: dict[str, Any] | None = None,
) -> bool:
    """End a job ``worker`` holds as done (``result``) or error (``error``, the error-shape dict).

    False when the worker no longer holds it (it was reaped and re-queued meanwhile)."""
    now = _now()
    if error is None:
        values = {"state": "done", "progress": 1.0, "result_json": json.dumps(result or {})}
    else:
        values = {"state": "error", "error_json": json.dumps(error)}
    with engine.begin() as conn:
        res = conn.execute(
            update(_T)
            .where(_T.c.id == job_id, _T.c.worker == worker, _T.c.state == "running")
            .values(**values, finished_at=now, heartbeat_at=now)
        )
    return res.rowcount == 1


def release(engine: Engine, worker: str) -> int:
    """Put the jobs ``worker`` is still running back in the queue, not counting the attempt (an
    orderly shutdown is not a crash). Returns how many."""
    with engine.begin() as conn:
        res = conn.execute(
            update(_T)
            .where(_T.c.worker == worker, _T.c.state == "running")
            .values(state="queued", worker=None, heartbeat_at=None, attempts=_T.c.attempts - 1)
        )
    return res.rowcount


def lost_worker_error(timeout_s: float) -> dict[str, Any]:
    """The error of a job whose worker stopped twice without finishing it."""
    body: dict[str, Any] = error_body(
        500,
        "job_lost",
        f"the worker process running this job stopped twice without finishing it (no heartbeat "
        f"for {timeout_s:g} s, after {MAX_ATTEMPTS} attempts). The job is not retried again: "
        "submit it anew, smaller if it may have run the server out of memory.",
    )["error"]
    return body


def reap(engine: Engine, timeout_s: float) -> tuple[int, int]:
    """Running jobs with no heartbeat for ``timeout_s``: re-queue those with attempts left, fail
    the others. Returns (re-queued, failed). Safe to run from every process at once."""
    cutoff = _now() - timedelta(seconds=timeout_s)
    stale = (_T.c.state == "running", _T.c.heartbeat_at < cutoff)
    with engine.connect() as conn:
        if conn.execute(select(_T.c.id).where(*stale).limit(1)).first() is None:
            return 0, 0
    with engine.begin() as conn:
        requeued = conn.execute(
            update(_T)
            .where(*stale, _T.c.attempts < MAX_ATTEMPTS)
            .values(state="queued", worker=None, heartbeat_at=None)
        ).rowcount
        failed = conn.execute(
            update(_T)
            .where(*stale, _T.c.attempts >= MAX_ATTEMPTS)
            .values(state="error", error_json=json.dumps(lost_worker_error(timeout_s)), finished_at=_now())
        ).rowcount
    if requeued or failed:
        log.warning("jobs whose worker stopped: %d re-queued, %d failed", requeued, failed)
    return requeued, failed


def expire(engine: Engine, ttl_s: float) -> int:
    """Delete jobs that finished more than ``ttl_s`` ago; returns how many."""
    cutoff = _now() - timedelta(seconds=ttl_s)
    with engine.begin() as conn:
        return conn.execute(delete(_T).where(_T.c.finished_at < cutoff)).rowcount


def poll(engine: Engine, token: str, ttl_s: float | None = None) -> dict[str, Any] | None:
    """The public view of job ``token``: {job_id, state, progress} plus the result's keys when
    done, or ``error`` on error. None when there is no such job (or it expired)."""
    with engine.connect() as conn:
        row = conn.execute(select(_T).where(_T.c.token == token)).first()
    if row is None:
        return None
    if ttl_s is not None and row.finished_at is not None:
        finished = row.finished_at if row.finished_at.tzinfo else row.finished_at.replace(tzinfo=UTC)
        if finished < _now() - timedelta(seconds=ttl_s):
            return None
    out: dict[str, Any] = {"job_id": row.token, "state": row.state, "progress": row.progress}
    if row.state == "done" and row.result_json:
        out.update(json.loads(row.result_json))
    if row.state == "error" and row.error_json:
        out["error"] = json.loads(row.error_json)
    return out


class JobReleased(Exception):
    """Raised inside a handler (at its next progress report) when its pool is stopping: the job
    goes back to the queue for another worker instead of holding up the shutdown."""


def run(
    engine: Engine, job: ClaimedJob, worker: str, settings: Any, stop: threading.Event | None = None
) -> str:
    """Run a claimed job's handler and record how it ended; returns the final state ("done",
    "error", or "released" when ``stop`` was set while it ran: then nothing is recorded)."""
    last = {"p": 0.0, "t": 0.0}

    def progress(x: float) -> None:
        if stop is not None and stop.is_set():
            raise JobReleased
        # Scaled to 0.98: the last 2% is storing the result; 1.0 means done.
        p = round(min(max(float(x), 0.0), 1.0) * 0.98, 4)
        now = time.monotonic()
        if p <= last["p"] or now - last["t"] < _PROGRESS_EVERY_S:
            return
        last.update(p=p, t=now)
        try:
            set_progress(engine, job.id, worker, p)
        except Exception:  # progress is best effort; the job goes on
            log.exception("could not record the progress of job %s", job.id)

    handler = HANDLERS.get(job.kind)
    try:
        if handler is None:
            raise ApiError(500, "unknown_job", f"no handler for jobs of kind {job.kind!r}")
        result = handler(job.params, JobContext(engine, settings, job.token, progress))
        ended = finish(engine, job.id, worker, result=result)
        state = "done"
    except JobReleased:
        return "released"
    except ApiError as e:
        ended = finish(engine, job.id, worker, error=e.body()["error"])
        state = "error"
    except Exception as e:  # reported to whoever polls; the worker keeps running
        log.exception("job %s (%s) failed", job.id, job.kind)
        err = error_body(500, f"{job.kind}_failed", f"the {job.kind} job failed: {e}")["error"]
        ended = finish(engine, job.id, worker, error=err)
        state = "error"
    if not ended:
        log.warning("job %s was taken from this worker before it finished; its result is dropped", job.id)
    return state


@dataclass
class JobPool:
    """This process's job runners: ``size`` threads claiming and running jobs, and housekeeping.

    ``start`` and ``stop`` are called by the app's lifespan; ``submit`` also starts the pool if
    nothing did (an app driven without its lifespan still runs its jobs)."""

    engine: Engine
    size: int = 2
    poll_s: float = 1.0
    heartbeat_timeout_s: float = 60.0
    ttl_s: float = 3600.0
    settings: Any = None
    worker_id: str = field(
        default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
    )

    def __post_init__(self) -> None:
        self._cond = threading.Condition()
        self._kicks = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._running: set[int] = set()
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, engine: Engine, settings: Any) -> JobPool:
        return cls(
            engine,
            size=settings.job_workers,
            poll_s=settings.job_poll_s,
            heartbeat_timeout_s=settings.job_heartbeat_timeout_s,
            ttl_s=settings.job_ttl_s,
            settings=settings,
        )

    @property
    def started(self) -> bool:
        return bool(self._threads)

    def start(self) -> None:
        """Start the runner threads and the housekeeping thread (idempotent)."""
        with self._lock:
            if self._threads:
                return
            # A forked worker must not share its parent's identity (the pid is part of it).
            if f":{os.getpid()}:" not in self.worker_id:
                self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
            # A fresh stop event per start: threads of an earlier stop() that are still finishing
            # a job see theirs set and exit.
            self._stop = threading.Event()
            targets = [self._runner] * self.size + [self._housekeeping]
            for i, target in enumerate(targets):
                name = f"creditlens-job-{i}" if i < self.size else "creditlens-job-housekeeping"
                t = threading.Thread(target=target, args=(self._stop,), name=name, daemon=True)
                t.start()
                self._threads.append(t)

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop claiming; running jobs stop at their next progress report (``JobReleased``), the
        threads get up to ``grace_s`` to exit, and this worker's unfinished jobs go back to the
        queue for another worker, the attempt not counted (threads are daemons: a handler that
        never reports progress does not hold the exit)."""
        with self._lock:
            threads, self._threads = self._threads, []
        if not threads:
            return
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        deadline = time.monotonic() + grace_s
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        try:
            if release(self.engine, self.worker_id):
                log.warning("jobs still running at shutdown were queued again for another worker")
        except Exception:
            log.exception("could not release this worker's jobs at shutdown")

    def submit(self, kind: str, params: dict[str, Any]) -> str:
        """Queue a job and wake one of this process's runners; returns the job's token."""
        token = submit(self.engine, kind, params)
        self.start()
        with self._cond:
            self._kicks += 1
            self._cond.notify()
        return token

    def _runner(self, stop: threading.Event) -> None:
        while not stop.is_set():
            job = None
            try:
                job = claim(self.engine, self.worker_id)
            except Exception:
                log.exception("claiming a job failed")
            if job is None:
                with self._cond:
                    if self._kicks == 0 and not stop.is_set():
                        self._cond.wait(self.poll_s)
                    self._kicks = max(0, self._kicks - 1)
                continue
            with self._lock:
                self._running.add(job.id)
            try:
                run(self.engine, job, self.worker_id, self.settings, stop)
            except Exception:  # the database went away mid-job: the reaper will re-queue it
                log.exception("running job %s failed", job.id)
            finally:
                with self._lock:
                    self._running.discard(job.id)

    def _housekeeping(self, stop: threading.Event) -> None:
        interval = min(max(self.heartbeat_timeout_s / 4, 0.05), 5.0)
        next_expire = 0.0
        while not stop.wait(interval):
            try:
                with self._lock:
                    busy = bool(self._running)
                if busy:
                    heartbeat(self.engine, self.worker_id)
                reap(self.engine, self.heartbeat_timeout_s)
                if time.monotonic() >= next_expire:
                    expire(self.engine, self.ttl_s)
                    next_expire = time.monotonic() + _EXPIRE_EVERY_S
            except Exception:
                log.exception("job housekeeping failed")
