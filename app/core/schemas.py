"""The native episode format (what uploads normalise to, what the store returns, what the
JSON Schema at /api/schema/episode documents). One episode per object."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, field_validator

Kind = Literal["prompt", "policy", "tool"]


class EpisodeIn(BaseModel):
    """One multi-turn agent episode, token by token.

    tokens:   the token strings, in order.
    kinds:    same length; "prompt" (prompt/template), "policy" (chosen by the policy) or "tool".
    reward:   outcome reward, placed on the last policy token (added to `rewards` if both given).
    rewards:  per-token rewards (same length), meaningful on policy tokens.
    values:   per-token critic values (same length), meaningful on policy tokens.
    logprobs: per-token log-probabilities of the chosen tokens.
    advantages: per-token advantages the trainer itself computed (same length; shown as the
              scheme "uploaded"). ``meta.uploaded_advantages`` is read the same way.
    ref_logprobs: per-token log-probabilities under the reference policy (same length).
    rollout_logprobs: per-token log-probabilities under the rollout engine (vLLM, SGLang).
              In these three log-prob fields a position the policy does not train (prompt,
              tool) may hold null or NaN: "not scored" (stored as 0, counted in
              ``meta.not_scored``); on a policy token a non-finite value is refused.
    entropy:  per-token entropy of the policy at each position.
    token_ids: per-token tokenizer ids (non-negative integers).
    turn_ids: per-token turn index; default: a turn is a maximal run of policy tokens.
    turn_states: one anchor-state string per turn (GiGPO's step groups; null = unknown state);
              stored in ``meta.turn_states``, which is read the same way. Default: the
              observation before each turn (the prompt for the first one).
    group:    attempts at the same task share a group label.
    truncated / bootstrap_value: a truncated episode bootstraps from V(final state).
    meta:     free-form metadata (task, per-call annotations, true values, ...);
              ``meta.special_tokens`` lists the positions of special tokens.
    """

    model_config = ConfigDict(extra="forbid")

    tokens: list[str]
    kinds: list[Kind]
    reward: float | None = None
    rewards: list[float] | None = None
    values: list[float] | None = None
    logprobs: Sequence[float | None] | None = None
    advantages: list[float] | None = None
    ref_logprobs: Sequence[float | None] | None = None
    rollout_logprobs: Sequence[float | None] | None = None
    entropy: list[float] | None = None
    token_ids: list[int] | None = None
    turn_ids: list[int] | None = None
    turn_states: list[str | None] | None = None
    group: str | None = None
    truncated: bool = False
    bootstrap_value: float | None = None
    meta: dict[str, Any] = Field(default_factory=dict)

    @field_validator("group")
    @classmethod
    def _no_nul(cls, v: str | None) -> str | None:
        # A group label is an indexed text column; PostgreSQL text cannot hold NUL characters.
        if v is not None and "\x00" in v:
            raise ValueError("must not contain NUL (\\u0000) characters")
        return v


# ---------------------------------------------------------------------------------------------
# Public output shapes of the JSON API (documented in /docs; pinned by the contracts).


class CreatedEpisodeOut(BaseModel):
    id: int
    slug: str
    url: str


class UploadOut(BaseModel):
    """201 answer of POST /api/uploads. ``delete_token`` is shown once; keep it to delete later."""

    batch_id: int
    episodes: list[CreatedEpisodeOut]
    delete_token: str
    visibility: Literal["public", "unlisted"]
    url: str = Field(description="the batch's page (by slug when unlisted: its id answers 404)")
    api_url: str
    warnings: list[str] = Field(
        default_factory=list,
        description="what the reader noted: roles kept as prompt, rewards not found (and the keys "
        "looked at), records skipped",
    )


class EpisodeOut(EpisodeIn):
    """GET /api/episodes/{slug}: the stored episode in the native format, plus where it lives."""

    model_config = ConfigDict(extra="allow")
    slug: str
    batch_id: int


class SchemeOut(BaseModel):
    name: str
    label: str
    kind: str
    advantages: list[float | None]
    # Per-token by-products of the scheme (e.g. gigpo's step_group_size), null off-policy.
    extras: dict[str, list[float | None]] | None = None


class SignalOut(BaseModel):
    """One per-token signal row (app/core/signals.py): values on policy tokens, null elsewhere.
    scale: sequential (entropy, logprob), diverging (kl, around 0), ratio (around 1, log scale)."""

    name: str
    label: str
    scale: str
    values: list[float | None]


class SignalsOut(BaseModel):
    """GET /api/episodes/{slug}/signals."""

    slug: str | None
    n_tokens: int
    available_signals: list[str]
    has_advantages: bool
    signals: list[SignalOut]


class TurnOut(BaseModel):
    turn: int
    start: int
    end: int
    text: str
    reward: float
    value: float | None
    effect: str | None
    means: dict[str, float]
    # With the `loss_weights` row: this call's share of the episode's |weight|.
    loss_share: float | None = None


class AdvantagesOut(BaseModel):
    """GET /api/episodes/{slug}/advantages. Per-token arrays have one entry per token; null marks
    off-policy positions (prompt, tool), which carry no advantage."""

    slug: str | None
    batch_id: int | None
    group: str | None
    n_tokens: int
    params: dict[str, Any]
    episode: dict[str, Any]
    tokens: list[str]
    kinds: list[Kind]
    turn_ids: list[int | None]
    rewards: list[float]
    values: list[float | None] | None
    td: list[float | None]
    schemes: list[SchemeOut]
    turns: list[TurnOut]
    # The trainer's own advantages were uploaded (the `uploaded` row is on offer; it has a value
    # on every token, prompt and tool included).
    has_advantages: bool = False
    # False: the episode was uploaded without a reward (nor per-token rewards), so every computed
    # scheme (and td) is null on every token: there is no outcome to give credit for.
    rewarded: bool = True
    # Signal rows: those asked for with `signal=` that the episode has data for.
    available_signals: list[str] = []
    signals: list[SignalOut] = []
    # With the `loss_weights` row: its loss, agg, rollout_is, rollout_is_threshold, bypass,
    # advantages_from, ratio_from, per-token TokenState flags `states`, `marks`, `n_zeroed`,
    # `abs_advantage_zeroed_share` (app/compute/loss_view.py).
    loss: dict[str, Any] | None = None


class BatchSummaryOut(BaseModel):
    id: int
    name: str
    source: str
    created_at: str
    n_episodes: int
    n_episodes_seen: int = Field(
        description="episodes the upload had: more than n_episodes when a run's keep stored only some"
    )
    ref: int | str = Field(description="what its URLs carry: the id when public, the slug when unlisted")
    url: str
    visibility: Literal["public", "unlisted"]


class BatchEpisodeOut(BaseModel):
    slug: str
    group: str | None
    reward: float | None
    score: float
    passed: bool
    n_tokens: int
    task: str | None
    # False: uploaded without any reward (reward null); its advantages are not shown.
    rewarded: bool = True
    # The trainer's largest |advantage| on a policy token and its position (null without them).
    max_abs_adv: float | None = None
    max_abs_adv_at: int | None = None


class AuditAvailability(BaseModel):
    """Whether ``GET /api/batches/{id}/audit`` can answer: when not, its 409 / 413 ``code`` and
    ``reason`` (the message it would answer), so a page never asks for a failing audit."""

    possible: bool
    code: str | None
    reason: str | None
    url: str


class BatchOut(BatchSummaryOut):
    """GET /api/batches/{id}: the batch, one page of its episodes and its diagnostics.

    ``total`` episodes in all; ``episodes`` (and ``diagnostics.whiten_vs_center.episodes``) hold
    ``limit`` of them from ``offset``; ``next`` is the URL of the following page (null on the last)."""

    meta: dict[str, Any]
    episodes: list[BatchEpisodeOut]
    diagnostics: dict[str, Any]
    audit: AuditAvailability
    total: int
    limit: int
    offset: int
    next: str | None


class GroupOut(BaseModel):
    """GET /api/batches/{id}/groups/{group}: every member's outcome advantage under each baseline."""

    group: str
    episodes: list[dict[str, Any]]
    zero_variance: bool
    why: str | None


class ErrorDetail(BaseModel):
    status: int
    code: str
    message: str
    line: int | None = None
    episode: int | None = None
    field: str | None = None


class ErrorOut(BaseModel):
    """The one shape of every 4xx answer."""

    error: ErrorDetail


# ---- runs (POST /api/runs, GET /api/runs[/{id}[/metrics]], POST /api/runs/{id}/steps/{step}) ----


class RunConfigIn(BaseModel):
    """PATCH /api/runs/{id}: more of the run's configuration, merged into what it has."""

    model_config = ConfigDict(extra="forbid")
    config: dict[str, Any] = Field(default_factory=dict)
    config_text: str | None = Field(
        None,
        max_length=2 * 1024 * 1024,
        description="a configuration file's text, read as POST /api/runs reads it (YAML, TOML, arguments, JSON)",
    )
    trainer: str | None = Field(None, description="the trainer whose advantages the run's steps carry")


class RunIn(BaseModel):
    """POST /api/runs: a training run's name and its configuration (any JSON object)."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=512)
    config: dict[str, Any] = Field(default_factory=dict)
    config_text: str | None = Field(
        None,
        max_length=2 * 1024 * 1024,
        description="the trainer's configuration file as it is on disk: verl's Hydra `.hydra/config.yaml` (its "
        "`${...}` interpolations resolved) or `overrides.yaml`, OpenRLHF's `--key value` arguments, or JSON. Read "
        "by the server and merged under `config` (whose settings win, key by key); a 422 names the line it cannot read.",
    )
    visibility: Literal["public", "unlisted"] | None = Field(
        None, description="unlisted: never listed, reachable only by its slug (default: the server's setting)"
    )
    keep: int | None = Field(
        None,
        gt=0,
        le=2**31 - 1,
        description="episodes kept in full per step (whole groups: flagged ones first, then the largest "
        "|A| and the extremes of reward, then random); metrics, audit and prompt history still count every "
        "episode. Default: every episode is kept.",
    )
    keep_every: int | None = Field(
        None,
        gt=0,
        le=2**31 - 1,
        description="thin older steps: once a newer step is stored, only steps that are multiples of "
        "keep_every keep their episodes (their metrics stay). Default: no thinning.",
    )
    trainer: str | None = Field(
        None,
        description="the trainer whose advantages the steps carry: verl, trl, openrlhf, skyrl, areal, nemo_rl, "
        "prime_rl or slime (GET /api/trainers); `config` then says which of its estimators ran (its "
        "adv_estimator / advantage_estimator key, gamma and lambda). Kept in the run's config as `trainer`.",
    )
    protocol: int | None = Field(
        None,
        description="the client's wire protocol version (none: 1; the X-Creditlens-Protocol header says the "
        "same); newer than the server's is a 400 naming both",
    )


class RunCreatedOut(BaseModel):
    """201 answer of POST /api/runs. ``delete_token`` is shown once; keep it to delete the run."""

    id: int
    url: str
    delete_token: str
    ref: int | str
    api_url: str
    visibility: Literal["public", "unlisted"]


class RunSummaryOut(BaseModel):
    id: int
    ref: int | str
    name: str
    url: str
    visibility: Literal["public", "unlisted"]
    created_at: str
    n_steps: int
    last_step: int | None = Field(None, description="the highest step logged so far (null: none yet)")
    keep: int | None = Field(None, description="episodes kept in full per step (null: all)")
    keep_every: int | None = Field(None, description="older steps thinned to multiples of this (null: none)")
    stored_bytes: int = Field(0, description="bytes the run's stored rows take (arrays, tokens, meta)")


class RunStepOut(BaseModel):
    """One step of a run: its batch and the metrics computed when it was ingested."""

    step: int
    batch_id: int
    batch_ref: int | str
    url: str
    n_episodes: int
    n_episodes_seen: int = Field(description="episodes the step had (every one is in its metrics)")
    n_episodes_kept: int = Field(description="episodes stored in full (0 once thinned by keep_every)")
    stored_bytes: int = Field(0, description="bytes the step's stored rows take")
    metrics: dict[str, float | int | None]


class RunOut(RunSummaryOut):
    """GET /api/runs/{id}: the run, its config and every step's stored metrics."""

    config: dict[str, Any]
    n_logged_steps: int = Field(
        0, description="steps with the trainer's own logged metrics (GET /api/runs/{id}/logged-metrics)"
    )
    steps: list[RunStepOut]


class CompareRunOut(BaseModel):
    id: int
    ref: int | str
    name: str
    url: str
    n_steps: int


class CompareOut(BaseModel):
    """GET /api/runs/compare: each metric's series ``[[step, value], ...]`` per run, in the order
    of ``runs``."""

    runs: list[CompareRunOut]
    metrics: dict[str, list[list[list[float]]]]


class PromptStepOut(BaseModel):
    """One step a prompt was in: over all its episodes at that step (kept or not)."""

    step: int
    n: int
    pass_rate: float | None
    mean_abs_adv: float | None = Field(description="mean |A| on the policy tokens of its episodes")
    batch_id: int
    batch_ref: int | str
    batch_url: str
    group: str | None
    n_kept: int = Field(description="of its episodes, how many are stored in full")
    group_url: str | None = Field(description="the group's page, when its episodes are kept")


class PromptOut(BaseModel):
    """A prompt of a run (GET /api/runs/{id}/prompts): keyed by its tokens."""

    key: str
    prompt: str
    url: str
    steps: list[PromptStepOut]


class RunEpisodeOut(BaseModel):
    """One kept episode of a run in GET /api/runs/{id}/episodes: its search fields."""

    slug: str
    url: str
    step: int | None
    batch_id: int
    batch_ref: int | str
    batch_url: str
    group: str | None
    reward: float | None
    passed: bool
    n_tokens: int
    n_tool_tokens: int | None
    max_abs_adv: float | None
    nonpolicy_abs_adv_share: float | None
    max_ratio: float | None
    mean_entropy: float | None
    n_findings: int | None
    findings: list[str] = Field(description="codes of the audit findings naming the episode")


class StepUploadOut(UploadOut):
    """201 answer of POST /api/runs/{id}/steps/{step}: the uploads answer plus the step. ``episodes``
    lists the kept episodes."""

    step: int
    n_episodes_seen: int = Field(description="episodes the step had (every one is in its metrics)")
    n_episodes_kept: int = Field(description="episodes stored in full (the run's keep)")


class EpisodeSummary(NamedTuple):
    """One episode of a batch without its arrays: the stored columns of the batch API's episode
    row (:class:`BatchEpisodeOut`'s leading fields, in its order; the API adds the rest) plus the
    meta JSON the diagnostics read. Its fields are the columns batch_summaries selects."""

    slug: str
    group: str | None
    reward: float | None
    score: float
    passed: bool
    n_tokens: int
    task: str | None
    rewarded: bool
    meta_json: str


class EpisodeScore(NamedTuple):
    """What the outcome baselines need of each episode of a batch."""

    slug: str
    group: str | None
    score: float


class TrainerCaseOut(BaseModel):
    """One canonical episode of ``GET /api/trainers``: row 0 of a small batch built to show one
    thing trainers handle differently (estimators/conformance.py)."""

    key: str
    title: str
    text: str
    kinds: list[str]
    rewards: list[float]
    values: list[float]
    rows: int
    groups: list[str]
    row_rewards: list[float]
    truncated: dict[int, float]


class TrainerCellOut(BaseModel):
    """One dialect on one case: row 0's advantages, its reference's, the policy positions where
    they differ, or the error the trainer's code raises on that batch."""

    advantages: list[float | None] | None
    reference: list[float | None] | None
    departs: list[int]
    error: str | None


class TrainerEstimatorOut(BaseModel):
    """A trainer's estimator as its dialect reproduces it."""

    name: str
    label: str
    description: str
    kind: str
    reads: list[str]
    params: dict[str, Any]
    reference: str | None
    departs_codes: list[str]
    cases: dict[str, TrainerCellOut]


class TrainerOut(BaseModel):
    """A trainer, the version its dialects reproduce, and its estimators."""

    key: str
    name: str
    version: str
    estimators: list[TrainerEstimatorOut]


class TrainersOut(BaseModel):
    """``GET /api/trainers``: every trainer's dialects on the canonical episodes, computed live."""

    gamma: float
    lam: float
    cases: list[TrainerCaseOut]
    trainers: list[TrainerOut]
