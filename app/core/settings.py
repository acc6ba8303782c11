"""Settings, read from CREDITLENS_* environment variables (pydantic-settings), validated at start-up."""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.core.resources import default_data_dir


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CREDITLENS_", extra="ignore")

    database_url: str = Field(default=f"sqlite:///{default_data_dir() / 'creditlens.db'}")
    # Upload limits: each answers 413 with a message when exceeded.
    max_upload_bytes: int = Field(default=256 * 1024 * 1024, gt=0)
    # A raw upload body is received in segments of this size. One longer than a segment, in a
    # format read line by line (a prime-rl step's rank file), is read while it arrives and never
    # held whole; others are joined and read once all of it is here. The first segment must hold
    # the upload's first record (detection reads it).
    upload_segment_bytes: int = Field(default=8 * 1024 * 1024, ge=4096)
    max_tokens_per_episode: int = Field(default=131_072, gt=0)
    max_episodes_per_upload: int = Field(default=20_000, gt=0)
    # The audit's work budget: episodes x longest episode's tokens of one batch (it works on the
    # padded [B, T] batch, ~150 bytes per cell at its peak). Above it, GET .../audit answers 413.
    audit_max_cells: int = Field(default=4 * 1024 * 1024, gt=0)
    # A `tokenizer.json` sent with an upload of token ids (large vocabularies are ~10-35 MB).
    max_tokenizer_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    # Optional write token: when set, uploads, samples and deletes need `Authorization: Bearer <token>`.
    write_token: str | None = None
    # Optional read token: when set, the whole server is private. Every page and API answer needs
    # it (`Authorization: Bearer <token>` for the API, a sign-in cookie for the browser), except
    # /healthz and /static (app/http/access.py). The write token, when set, also reads.
    read_token: str | None = None
    # The visibility of an upload, run or sample that does not say: public (listed, by id) or
    # unlisted (never listed or searched, reachable only through its random slug).
    default_visibility: Literal["public", "unlisted"] = "public"
    # Load the demo fixtures into an empty database on start.
    demo: bool = False
    # torch intra-op threads in the server. Per-request tensors are small ([1, T]); on a 2-core
    # machine 1 thread is ~2.5x cheaper per request than letting torch fan out (bench/ingest.py).
    torch_threads: int = Field(default=1, ge=1)
    # Requests whose Python runs at once in one server process (the thread pool of sync routes).
    # One process runs one thread at a time (the GIL): more threads add no throughput, they make
    # every request in flight slower. With 40 (the default of the ASGI stack) a loaded server
    # served 20% fewer requests than one client sending them one by one, with second-long tails
    # (bench/load.py). Scale with `--workers` (one per core), not with threads.
    worker_threads: int = Field(default=4, ge=1, le=256)
    # Uploads parsed and stored at once per process, out of their own share of threads: they are
    # the longest requests, and the database takes one writer at a time anyway. Reads never
    # wait behind more than this many uploads.
    ingest_threads: int = Field(default=1, ge=1, le=64)
    # Work budgets: beyond one, the request answers 413 saying what to reduce.
    # Numbers (float64) one advantages request may hold at once (64 MB by default); an episode at
    # the token limit with every registry scheme fits.
    max_compute_cells: int = Field(default=8_000_000, gt=0)
    # Lab figures: numbers one computation may hold at once (app/lab/compute.py WORK; ~300 MB).
    lab_max_work: int = Field(default=36_000_000, gt=0)
    # Lab result cache: at most this many rows and bytes of result JSON; least recently used go first.
    lab_cache_rows: int = Field(default=500, gt=0)
    lab_cache_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    # Per-batch summaries ([B] scores, groups, lengths) kept in memory per worker, in episodes.
    batch_cache_episodes: int = Field(default=200_000, gt=0)
    # The compiled one-pass GAE kernel (estimators/native.py); off = the vectorised torch path.
    native: bool = True
    # Background jobs (app/storage/jobs.py): runner threads per process, how often an idle process looks
    # for queued jobs, how long a running job may go without a heartbeat before it counts as lost
    # (re-queued once, then failed), and how long a finished job's result stays readable.
    job_workers: int = Field(default=2, ge=1, le=64)
    job_poll_s: float = Field(default=1.0, gt=0, le=60)
    job_heartbeat_timeout_s: float = Field(default=60.0, gt=0, le=86_400)
    job_ttl_s: float = Field(default=3600.0, gt=0)

    @field_validator("read_token", "write_token")
    @classmethod
    def _no_blank_token(cls, v: str | None) -> str | None:
        # An empty variable means "not set", never "the empty token".
        return v if v and v.strip() else None

    @field_validator("database_url")
    @classmethod
    def _known_scheme(cls, v: str) -> str:
        if not (v.startswith("sqlite") or v.startswith("postgresql")):
            raise ValueError("CREDITLENS_DATABASE_URL must be a sqlite:// or postgresql+psycopg:// URL")
        return v


@lru_cache
def get_settings() -> Settings:
    return Settings()
