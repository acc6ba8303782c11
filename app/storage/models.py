"""Database tables (owned by the service backend).

An episode's per-token arrays live in its own row, never one row per token:

* ``tokens_packed``: the token strings as one JSON text, zstd-compressed (app/core/packing.py);
  rows stored before migration 0009 have the plain JSON in ``tokens_json`` instead ("" when packed).
* numeric arrays in ``LargeBinary`` columns (BLOB on SQLite, BYTEA on PostgreSQL), each packed by
  app/core/packing.py: lossless to the bit, float32 when the values are float32, byte-shuffled and
  zstd-compressed, kind codes and turn ids as runs. Read as ``kinds`` uint8 codes,
  ``rewards``/``values``/``logprobs``/``advantages``/``ref_logprobs``/``rollout_logprobs``/
  ``entropy`` float64, ``turn_ids`` and ``token_ids`` int32 (app/storage/codecs.py). Rows stored
  before migration 0009 hold the plain little-endian arrays, and still read.
* ``token_signals`` (migration 0014): ``meta.token_signals``, a format's other per-token number
  lists, packed the same way (app/core/token_signals.py) and left out of ``meta_json``; rows
  stored before it keep them in ``meta_json``, and read the same.

Per-episode summaries (``score``, ``reward``, ``passed``, ``n_tokens``, ``group``, ``task``) are
columns so batch diagnostics and group baselines never need to decode the arrays. A run step's
kept episodes also have a row in ``episode_search`` (migration 0011): the fields of
``GET /api/runs/{id}/episodes``, computed at ingest (app/compute/episode_fields.py), in a narrow
table of their own, so a search never reads past an episode's arrays (SQLite stores a row's
columns in order, and reading one after a large array walks the array's overflow pages).
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import BigInteger, Column, ForeignKey, Index, Integer, LargeBinary, Text, UniqueConstraint
from sqlmodel import Field, SQLModel


def _now() -> datetime:
    return datetime.now(UTC)


class Run(SQLModel, table=True):
    """A training run: its steps are batches (``batch.run_id``, ``batch.step``)."""

    __tablename__ = "run"

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(default="", index=True)
    config_json: str = Field(default="{}", sa_column=Column(Text, nullable=False))
    created_at: datetime = Field(default_factory=_now, index=True)
    # sha256 of the delete token returned once at creation (the token itself is never stored).
    delete_token_hash: str | None = Field(default=None, max_length=64)
    # Added by migration 0008: public (listed, reachable by id) or unlisted (never listed or
    # searched; reachable only through ``slug``, 144 random bits like an episode's share slug).
    visibility: str = Field(
        default="public", index=True, max_length=16, sa_column_kwargs={"server_default": "public"}
    )
    slug: str | None = Field(default=None, index=True, unique=True, max_length=64)
    # Added by migration 0009: episodes kept in full per step (None: every one), and the thinning
    # of older steps (None: none; K: once a newer step is stored, only steps that are multiples of
    # K keep their episodes).
    keep: int | None = None
    keep_every: int | None = None


class Batch(SQLModel, table=True):
    """One upload or one sample run: a set of episodes, compared within their groups. A run's step
    is a batch with ``run_id`` and ``step``; its per-step metrics are computed once at ingest and
    kept in ``metrics_json`` (app/compute/step_metrics.py)."""

    __tablename__ = "batch"
    # NULL run ids are distinct in a unique constraint (SQLite and PostgreSQL): plain uploads never
    # collide; two posts of one step of one run do, and the database decides which one wins.
    __table_args__ = (UniqueConstraint("run_id", "step", name="uq_batch_run_step"),)

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(default="", index=True)
    source: str = Field(default="upload", index=True)
    created_at: datetime = Field(default_factory=_now, index=True)
    n_episodes: int = 0
    meta_json: str = Field(default="{}", sa_column=Column(Text, nullable=False))
    # sha256 of the delete token returned once at creation (the token itself is never stored).
    delete_token_hash: str | None = Field(default=None, max_length=64)
    # Added by migration 0003 (runs).
    run_id: int | None = Field(default=None, foreign_key="run.id", index=True)
    step: int | None = None
    metrics_json: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    # Added by migration 0008 (see Run.visibility): an unlisted batch is reachable only by its slug.
    visibility: str = Field(
        default="public", index=True, max_length=16, sa_column_kwargs={"server_default": "public"}
    )
    slug: str | None = Field(default=None, index=True, unique=True, max_length=64)
    # Added by migration 0009: the episodes the step had before retention (None: n_episodes, all
    # of them kept) and the bytes its stored rows take (arrays, tokens, meta, audit references).
    n_episodes_seen: int | None = None
    stored_bytes: int | None = Field(default=None, sa_column=Column(BigInteger, nullable=True))


class Episode(SQLModel, table=True):
    """One multi-turn episode with its per-token arrays stored compactly (see module docstring)."""

    __tablename__ = "episode"

    id: int | None = Field(default=None, primary_key=True)
    slug: str = Field(index=True, unique=True, max_length=64)
    batch_id: int = Field(foreign_key="batch.id", index=True)
    position: int = 0  # order within the batch
    group: str | None = Field(default=None, index=True, max_length=512)
    task: str | None = Field(default=None, max_length=512)
    n_tokens: int = 0
    n_policy: int = 0
    n_turns: int = 0
    reward: float | None = None  # the outcome reward as uploaded
    score: float = 0.0  # sum of effective rewards on policy tokens (what group baselines compare)
    passed: bool = False
    truncated: bool = False
    bootstrap_value: float | None = None
    tokens_json: str = Field(sa_column=Column(Text, nullable=False))
    tokens_packed: bytes | None = Field(default=None, sa_column=Column(LargeBinary, nullable=True))
    kinds: bytes = Field(sa_column=Column(LargeBinary, nullable=False))
    rewards: bytes | None = Field(default=None, sa_column=Column(LargeBinary, nullable=True))
    values: bytes | None = Field(default=None, sa_column=Column(LargeBinary, nullable=True))
    logprobs: bytes | None = Field(default=None, sa_column=Column(LargeBinary, nullable=True))
    turn_ids: bytes | None = Field(default=None, sa_column=Column(LargeBinary, nullable=True))
    # The trainer's own advantages, on every token (added by migration 0002).
    advantages: bytes | None = Field(default=None, sa_column=Column(LargeBinary, nullable=True))
    # Per-token signals and token ids as the trainer logged them (added by migration 0004).
    ref_logprobs: bytes | None = Field(default=None, sa_column=Column(LargeBinary, nullable=True))
    rollout_logprobs: bytes | None = Field(default=None, sa_column=Column(LargeBinary, nullable=True))
    entropy: bytes | None = Field(default=None, sa_column=Column(LargeBinary, nullable=True))
    token_ids: bytes | None = Field(default=None, sa_column=Column(LargeBinary, nullable=True))
    meta_json: str = Field(default="{}", sa_column=Column(Text, nullable=False))
    # meta.token_signals packed (added by migration 0014; None: none, or a row stored before it).
    token_signals: bytes | None = Field(default=None, sa_column=Column(LargeBinary, nullable=True))


# The numeric search fields of an episode (columns of ``EpisodeSearch``): the covering index
# holds them all, and a page of search results shows them.
SEARCH_NUMBERS = (
    "reward",
    "passed",
    "n_tokens",
    "n_tool_tokens",
    "max_abs_adv",
    "nonpolicy_abs_adv_share",
    "max_ratio",
    "mean_entropy",
    "n_findings",
)


class EpisodeSearch(SQLModel, table=True):
    """A run step's kept episode as ``GET /api/runs/{id}/episodes`` searches it (migration 0011):
    the episode's own summary columns copied beside the fields computed at ingest
    (app/compute/episode_fields.py). Goes with its episode (ON DELETE CASCADE)."""

    __tablename__ = "episode_search"
    __table_args__ = (
        # The step order's index, with every numeric search field after it (migration 0012): a
        # filter or sort on any of them over a run reads this index alone, not one table row per
        # episode (bench/retention.py: 52 -> 23 ms of SQLite over a 1,000-step run's 64,000).
        Index(
            "ix_episode_search_run_step_fields",
            "run_id",
            "step",
            "position",
            *SEARCH_NUMBERS,
        ),
        Index("ix_episode_search_run_max_abs_adv", "run_id", "max_abs_adv"),
        Index("ix_episode_search_run_reward", "run_id", "reward"),
    )

    episode_id: int = Field(
        sa_column=Column(
            Integer, ForeignKey("episode.id", ondelete="CASCADE"), primary_key=True, autoincrement=False
        )
    )
    run_id: int = Field(sa_column=Column(Integer, ForeignKey("run.id", ondelete="CASCADE"), nullable=False))
    step: int
    position: int
    batch_id: int = Field(
        sa_column=Column(Integer, ForeignKey("batch.id", ondelete="CASCADE"), nullable=False)
    )
    slug: str = Field(max_length=64)
    group: str | None = Field(default=None, max_length=512)
    reward: float | None = None
    passed: bool = False
    n_tokens: int = 0
    n_tool_tokens: int = 0
    max_abs_adv: float | None = None
    nonpolicy_abs_adv_share: float | None = None
    max_ratio: float | None = None
    mean_entropy: float | None = None
    n_findings: int = 0
    finding_codes: str = Field(default="", sa_column=Column(Text, nullable=False, server_default=""))


def saved_id(row: Run | Batch | Episode) -> int:
    """The id of a row the database has stored (flushed or read back): never None then."""
    if row.id is None:
        raise RuntimeError(f"{type(row).__name__} has no id yet: it is not stored")
    return row.id


class Job(SQLModel, table=True):
    """A background job (e.g. an async sampling request) that any worker process can run or report.

    ``token`` is the public id (random, unguessable); ``id`` orders the queue. A worker claims a
    queued row (``state`` -> running, ``worker`` = "host:pid:nonce", ``attempts`` + 1), refreshes
    ``heartbeat_at`` while it runs, and writes ``result_json`` or ``error_json`` when it ends
    (see app/storage/jobs.py).
    """

    __tablename__ = "job"

    id: int | None = Field(default=None, primary_key=True)
    token: str = Field(index=True, unique=True, max_length=64)
    kind: str = Field(max_length=32)
    state: str = Field(default="queued", index=True, max_length=16)  # queued|running|done|error
    params_json: str = Field(default="{}", sa_column=Column(Text, nullable=False))
    progress: float = 0.0
    result_json: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    error_json: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    attempts: int = 0
    worker: str | None = Field(default=None, max_length=128)
    heartbeat_at: datetime | None = None
    created_at: datetime = Field(default_factory=_now)
    finished_at: datetime | None = Field(default=None, index=True)


class BatchStats(SQLModel, table=True):
    """A batch's diagnostics (app/compute/diagnostics.py), computed when it is stored and again when one of
    its episodes is deleted, so the batch API never recomputes them. ``n_episodes``: the batch
    state they describe (a row for another state is ignored)."""

    __tablename__ = "batch_stats"

    batch_id: int = Field(foreign_key="batch.id", primary_key=True)
    n_episodes: int = 0
    diagnostics_json: str = Field(sa_column=Column(Text, nullable=False))
