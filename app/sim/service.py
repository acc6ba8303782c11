"""Sampling as a service step: a validated request -> episodes (+ critic values) and diagnostics.

Used by POST /api/samples (routes.py) and by `python -m app.sim.make_fixtures`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from app.core.schemas import EpisodeIn
from app.sim.critic import critic_report, critic_values, fit_critic
from app.sim.diagnostics import sim_diagnostics
from app.sim.env import sample_batch, with_mc_turn_values
from app.sim.policy import PolicyParams
from app.sim.tasks import TASKS

# Fresh episodes for the critic's held-out explained variance come from this seed offset.
FRESH_SEED_OFFSET = 1_000_003


class SampleRequest(BaseModel):
    """Body of POST /api/samples."""

    model_config = ConfigDict(extra="forbid")

    env: Literal["bugfix"] = "bugfix"
    n_tasks: int = Field(20, ge=1, le=len(TASKS), description="tasks (groups), the first n of the task set")
    n_per_task: int = Field(8, ge=1, le=64, description="attempts per task (group size G)")
    seed: int = Field(0, ge=0, le=2**31 - 1)
    policy: dict[str, float] = Field(default_factory=dict, description="policy knobs (see PolicyParams)")
    critic: bool = Field(False, description="fit the small critic and store its values in `values`")
    call_cost: float = Field(
        0.0, ge=0.0, le=1.0, description="reward -call_cost on the last token of each call"
    )
    max_calls: int = Field(8, ge=1, le=40, description="recording cut: longer episodes are truncated")
    critic_steps: int = Field(80, ge=1, le=1000, description="Adam steps of the critic fit")
    truth: Literal["exact", "mc"] = Field(
        "exact", description="meta.turn_values: exact (dynamic programming) or Monte Carlo continuations"
    )
    n_rollouts: int = Field(16, ge=1, le=256, description="continuations per turn when truth = mc")
    name: str | None = Field(None, max_length=200)
    visibility: Literal["public", "unlisted"] | None = Field(
        None,
        description="unlisted: never listed or searched, reachable only by the slug in the answer's url "
        "(default: the server's CREDITLENS_DEFAULT_VISIBILITY)",
    )

    @field_validator("policy")
    @classmethod
    def _knobs(cls, v: dict[str, float]) -> dict[str, float]:
        PolicyParams.from_dict(v)  # raises ValueError naming the bad knob
        return v

    def default_name(self) -> str:
        extra = ", critic" if self.critic else ""
        cost = f", cost {self.call_cost:g}" if self.call_cost else ""
        return f"bugfix sample: {self.n_tasks} tasks x {self.n_per_task}, seed {self.seed}{cost}{extra}"


class SampleResult(BaseModel):
    episodes: list[EpisodeIn]
    diagnostics: dict[str, Any]
    meta: dict[str, Any]


def run_sample(req: SampleRequest, progress: Callable[[float], None] | None = None) -> SampleResult:
    """Sample the batch, optionally fit the critic (values go into `values`), compute diagnostics.

    progress(x) is called with x in [0, 1]: sampling is the first part, the critic fit the rest.
    """
    report = progress or (lambda _x: None)
    params = PolicyParams.from_dict(req.policy)
    share = 0.15 if req.critic else 0.95
    episodes = sample_batch(
        req.n_tasks,
        req.n_per_task,
        req.seed,
        params,
        call_cost=req.call_cost,
        max_calls=req.max_calls,
        progress=lambda x: report(share * x),
    )
    if req.truth == "mc":
        episodes = with_mc_turn_values(
            episodes, params, req.n_rollouts, seed=req.seed, call_cost=req.call_cost
        )
    diagnostics = sim_diagnostics(episodes)
    if req.critic:
        fresh = sample_batch(
            req.n_tasks,
            req.n_per_task,
            req.seed + FRESH_SEED_OFFSET,
            params,
            call_cost=req.call_cost,
            max_calls=req.max_calls,
        )
        model, losses = fit_critic(
            episodes, steps=req.critic_steps, seed=req.seed, progress=lambda x: report(0.2 + 0.7 * x)
        )
        diagnostics["critic"] = critic_report(model, episodes, fresh, losses)
        values = critic_values(model, episodes)
        episodes = [
            e.model_copy(update={"values": [round(x, 5) for x in v]})
            for e, v in zip(episodes, values, strict=True)
        ]
    report(1.0)
    meta = {
        "env": req.env,
        "request": req.model_dump(exclude={"name"}),
        "policy": params.to_dict(),
        "diagnostics": diagnostics,
    }
    return SampleResult(episodes=episodes, diagnostics=diagnostics, meta=meta)
