"""The native episode format (what uploads normalise to, what the store returns, what the
JSON Schema at /api/schema/episode documents). One episode per object."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Kind = Literal["prompt", "policy", "tool"]


class EpisodeIn(BaseModel):
    """One multi-turn agent episode, token by token.

    tokens:   the token strings, in order.
    kinds:    same length; "prompt" (prompt/template), "policy" (chosen by the policy) or "tool".
    reward:   outcome reward, placed on the last policy token (added to `rewards` if both given).
    rewards:  per-token rewards (same length), meaningful on policy tokens.
    values:   per-token critic values (same length), meaningful on policy tokens.
    logprobs: per-token log-probabilities of the chosen tokens.
    turn_ids: per-token turn index; default: a turn is a maximal run of policy tokens.
    group:    attempts at the same task share a group label.
    truncated / bootstrap_value: a truncated episode bootstraps from V(final state).
    meta:     free-form metadata (task, per-call annotations, true values, ...).
    """

    model_config = ConfigDict(extra="forbid")

    tokens: list[str]
    kinds: list[Kind]
    reward: float | None = None
    rewards: list[float] | None = None
    values: list[float] | None = None
    logprobs: list[float] | None = None
    turn_ids: list[int] | None = None
    group: str | None = None
    truncated: bool = False
    bootstrap_value: float | None = None
    meta: dict[str, Any] = Field(default_factory=dict)
