"""Every metric the service reports, defined once: its name, label and format (:data:`METRICS`,
served to the run page in its page state) and the function that computes it (pure numpy).

The batch diagnostics (app/compute/diagnostics.py), a run step's metrics
(app/compute/step_metrics.py) and the simulator's diagnostics (app/sim/diagnostics.py) call these
functions; none of them restates a definition. Score, pass, groups, zero variance and useless
credit are the rules of app/core/domain.py; "policy tokens" are the tokens of kind policy.

A new metric goes here: a :class:`Metric` in :data:`METRICS` (in the run page's figure it belongs
to) and, if it needs more than a mean, a function below; a run step's metric is then fed by
:class:`app.compute.step_metrics.StepMetrics` (tests/app/core/test_metrics.py fails until it is).
Stored metric JSON uses these names, so a name never changes once released.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, TypedDict

import numpy as np

from app.core import domain

# ---- the catalogue ----------------------------------------------------------------------------

Format = Literal["share", "number", "count"]


@dataclass(frozen=True)
class Figure:
    """One figure of the run page's timeline."""

    id: str
    title: str


@dataclass(frozen=True)
class Metric:
    """One reported number.

    ``label``: its name for people, standing alone (tables, preview images); ``legend``: its name
    inside its figure (default ``label``); ``format``: "share" (a fraction, shown as a percent),
    "number" or "count"; ``figure``: the run page figure it is drawn in; ``source``: who computes a
    run step's value, "step" (:class:`app.compute.step_metrics.StepMetrics` at ingest) or "audit"
    (:func:`app.storage.audits.audit_step`, once the step's advantages are audited)."""

    name: str
    label: str
    format: Format
    figure: str
    doc: str
    legend: str = ""
    source: Literal["step", "audit"] = "step"


FIGURES = (
    Figure("outcome", "Outcome"),
    Figure("zero-variance", "Episodes in zero-variance groups (no gradient)"),
    Figure("tokens", "Tokens per episode"),
    Figure("advantages", "Trainer's advantages"),
    Figure("policy", "Entropy and KL to the reference"),
    Figure("mismatch", "Rollout vs training log-probs"),
    Figure("audit", "Audit: findings in the trainer's advantages, by severity"),
    Figure("critic", "Critic: explained variance of the returns"),
    Figure("credit", "Useless-credit share"),
    Figure("loss-removed", "Share of |A| the policy loss removes (training vs rollout log-probs)"),
    Figure("length-bias", "Length bias of the per-token loss weight"),
    Figure("drift", "Token-in/token-out drift: sampled tokens the next prompt re-renders as others"),
)

# The policy loss a run step's loss metrics are computed under (app/compute/loss_view.py,
# estimators.loss_weights): verl 0.9.1's vanilla PPO (clip 0.2, dual clip 3), per token; clipping
# with the training / rollout ratio (verl's bypass mode), masking by token-level IcePop.
STEP_LOSS_ICEPOP = "0.5_2"

METRICS_LIST = (
    Metric("pass_rate", "pass rate", "share", "outcome", "share of episodes that pass (domain.passed)"),
    Metric("mean_score", "mean score", "number", "outcome", "mean episode score (domain.score)"),
    Metric(
        "zero_variance_share",
        "zero-variance share",
        "share",
        "zero-variance",
        "share of episodes in zero-variance groups (domain.zero_variance)",
        legend="all",
    ),
    Metric(
        "zero_variance_all_pass_share",
        "zero-variance share, all passed",
        "share",
        "zero-variance",
        "share of episodes in zero-variance groups whose every member passed",
        legend="all passed",
    ),
    Metric(
        "zero_variance_all_fail_share",
        "zero-variance share, all failed",
        "share",
        "zero-variance",
        "share of episodes in zero-variance groups whose every member failed",
        legend="all failed",
    ),
    Metric(
        "mean_policy_tokens",
        "policy tokens per episode",
        "number",
        "tokens",
        "policy tokens per episode",
        legend="policy",
    ),
    Metric(
        "mean_tool_tokens",
        "tool tokens per episode",
        "number",
        "tokens",
        "tool tokens per episode",
        legend="tool",
    ),
    Metric(
        "mean_abs_advantage",
        "mean |A| on policy tokens",
        "number",
        "advantages",
        "mean |A| of the trainer's uploaded advantages on policy tokens",
    ),
    Metric(
        "nonpolicy_advantage_share",
        "share of |A| off policy",
        "share",
        "advantages",
        "share of the total |A| mass on prompt and tool tokens (0 in a healthy run)",
        legend="share of |A| off policy (should be 0)",
    ),
    Metric("mean_entropy", "mean entropy", "number", "policy", "mean per-token entropy on policy tokens"),
    Metric(
        "mean_kl",
        "mean KL (logp − ref)",
        "number",
        "policy",
        "mean of logprob - ref_logprob on policy tokens (the k1 estimate of KL to the reference, "
        "Schulman 2020, 'Approximating KL divergence')",
    ),
    Metric(
        "mean_log_ratio",
        "mean log-ratio",
        "number",
        "mismatch",
        "mean of logprob - rollout_logprob on policy tokens (training vs rollout engine)",
    ),
    Metric(
        "max_abs_log_ratio",
        "max |log-ratio|",
        "number",
        "mismatch",
        "max |logprob - rollout_logprob| on policy tokens",
    ),
    Metric(
        "audit_errors",
        "audit error findings",
        "count",
        "audit",
        "error findings of the audit of the trainer's advantages (estimators/audit/)",
        legend="error findings",
        source="audit",
    ),
    Metric(
        "audit_warnings",
        "audit warning findings",
        "count",
        "audit",
        "warning findings of the audit of the trainer's advantages (estimators/audit/): harmless only "
        "under a condition the audit cannot see (e.g. a loss that masks the tokens)",
        legend="warning findings",
        source="audit",
    ),
    Metric(
        "explained_variance",
        "explained variance",
        "number",
        "critic",
        "1 - Var[G - V] / Var[G] over policy tokens (population variances), V the uploaded values, "
        "G the undiscounted return-to-go of the effective rewards",
    ),
    Metric(
        "useless_credit_share",
        "useless-credit share",
        "share",
        "credit",
        "share of the positive RLOO outcome credit of passing episodes landing on calls that did "
        "not help (domain.useless_credit_share)",
        legend="on calls that did not help",
    ),
    Metric(
        "clip_fraction",
        "|A| removed by PPO clipping",
        "share",
        "loss-removed",
        "share of the policy tokens' |A| whose weight PPO's clipping sets to 0 when the ratio is "
        "exp(logprob - rollout_logprob) (verl 0.9.1 vanilla loss in bypass mode, clip_ratio 0.2, "
        "clip_ratio_c 3): sum |A| over the clipped tokens / sum |A| over policy tokens",
        legend="clipped (bypass PPO, eps 0.2)",
    ),
    Metric(
        "masked_fraction",
        "|A| removed by rollout-correction masking",
        "share",
        "loss-removed",
        "share of the policy tokens' |A| whose weight token-level IcePop masking sets to 0 (the "
        "rollout-correction weight exp(logprob - rollout_logprob) outside [0.5, 2])",
        legend="masked (token IcePop 0.5_2)",
    ),
    Metric(
        "length_bias_slope",
        "length-bias slope",
        "number",
        "length-bias",
        "least-squares slope of y_i / mean(y) against L_i / mean(L) over the episodes with L_i > 0 "
        "policy tokens and sum |A| > 0, y_i = sum |w| / sum |A| over episode i's policy tokens (its "
        "per-token loss weight per unit |A|; the bypass PPO weights of clip_fraction); 0: no length "
        "bias, -1: weight falling like 1 / L (seq-mean-token-mean)",
    ),
    Metric(
        "drift_episode_share",
        "episodes with token drift",
        "share",
        "drift",
        "share of episodes where a turn's prompt re-renders tokens the model sampled as other tokens "
        "(token-in/token-out broken: meta.drift)",
        legend="episodes",
    ),
    Metric(
        "drift_token_share",
        "policy tokens with drift",
        "share",
        "drift",
        "share of policy tokens that a later prompt re-renders as other tokens (sum over meta.drift "
        "of the sampled ids without a counterpart / policy tokens)",
        legend="policy tokens",
    ),
)

METRICS: dict[str, Metric] = {m.name: m for m in METRICS_LIST}
# The metrics a run step stores at ingest (StepMetrics.result() gives exactly these + n_episodes).
STEP_METRICS = tuple(m.name for m in METRICS_LIST if m.source == "step")
AUDIT_ERRORS = METRICS["audit_errors"].name
AUDIT_WARNINGS = METRICS["audit_warnings"].name


def run_figures() -> list[dict[str, Any]]:
    """The run page's figures for its page state: [{id, title, percent, metrics: [{name, label,
    format}]}] in drawing order; ``percent`` when every metric of the figure is a share."""
    out = []
    for f in FIGURES:
        ms = [m for m in METRICS_LIST if m.figure == f.id]
        out.append(
            {
                "id": f.id,
                "title": f.title,
                "percent": all(m.format == "share" for m in ms),
                "metrics": [{"name": m.name, "label": m.legend or m.label, "format": m.format} for m in ms],
            }
        )
    return out


def labels() -> dict[str, str]:
    """Metric name -> its standalone label (tables, preview images)."""
    return {m.name: m.label for m in METRICS_LIST}


# ---- the definitions --------------------------------------------------------------------------


def pass_rate(passed: Sequence[bool] | np.ndarray) -> float | None:
    """Share of episodes that pass; None for no episodes."""
    p = np.asarray(passed, dtype=bool)
    return float(p.mean()) if len(p) else None


def mean(values: Sequence[float] | np.ndarray) -> float | None:
    """The mean; None for no values."""
    v = np.asarray(values, dtype=np.float64)
    return float(v.mean()) if len(v) else None


class ZeroVarianceGroup(NamedTuple):
    group: str | None
    n: int
    all: Literal["pass", "fail", "mixed"]  # every member passed / failed / some of each


class ZeroVariance(NamedTuple):
    """Zero-variance groups of a batch and the shares of episodes in them (None: no episodes)."""

    groups: list[ZeroVarianceGroup]
    share: float | None
    all_pass_share: float | None
    all_fail_share: float | None


def zero_variance(scores: np.ndarray, labels: Sequence[str | None], passed: Sequence[bool]) -> ZeroVariance:
    """The batch's zero-variance groups (:func:`app.core.domain.zero_variance`) in order of first
    appearance, and the shares of its episodes in them, in all-pass ones and in all-fail ones."""
    s = np.asarray(scores, dtype=np.float64)
    p = np.asarray(passed, dtype=bool)
    out = []
    for key, members in domain.groups(labels).items():
        if domain.zero_variance(s[members]):
            ps = p[members]
            verdict: Literal["pass", "fail", "mixed"] = (
                "pass" if ps.all() else ("fail" if not ps.any() else "mixed")
            )
            out.append(ZeroVarianceGroup(domain.group_label(key), len(members), verdict))
    B = len(s)

    def share(gs: Iterable[ZeroVarianceGroup]) -> float | None:
        return sum(g.n for g in gs) / B if B else None

    return ZeroVariance(
        out,
        share(out),
        share(g for g in out if g.all == "pass"),
        share(g for g in out if g.all == "fail"),
    )


def call_effects(calls: Sequence[Any]) -> list[str]:
    """The effect of each of ``meta.calls`` ("other" when a call names none)."""
    return [c.get("effect", "other") if isinstance(c, dict) else "other" for c in calls]


class CallCredit(NamedTuple):
    """One episode whose ``meta.calls`` describe its turns: each call's effect and policy tokens,
    whether it passed, its outcome (RLOO) advantage and, optionally, each call's oracle turn
    advantage (:func:`app.core.domain.oracle_turn_advantages`)."""

    effects: list[str]
    tokens: np.ndarray  # [K] int
    passed: bool
    advantage: float
    oracle: np.ndarray | None = None  # [K]


def call_credit(
    calls: Any,
    turn_ids: np.ndarray,
    policy: np.ndarray,
    passed: bool,
    advantage: float,
    oracle: np.ndarray | None = None,
) -> CallCredit | None:
    """The :class:`CallCredit` of one episode, or None when ``calls`` is not a non-empty list or
    does not describe the episode's turns (:func:`app.core.domain.call_tokens`)."""
    if not isinstance(calls, list) or not calls:
        return None
    tokens = domain.call_tokens(turn_ids, policy, len(calls))
    if tokens is None:
        return None
    if oracle is not None and len(oracle) != len(calls):
        oracle = None
    return CallCredit(call_effects(calls), tokens, bool(passed), float(advantage), oracle)


class EffectCredit(TypedDict):
    """One call effect's row of :func:`credit_by_effect`."""

    calls: int
    tokens: int
    credit: float
    call_credit: float
    share: float
    call_share: float
    mean_outcome_advantage: float
    mean_oracle_advantage: float | None


def credit_by_effect(episodes: Iterable[CallCredit], order: Sequence[str] = ()) -> dict[str, EffectCredit]:
    """Per call effect, over the calls of ``episodes`` (effects of ``order`` first, the others in
    order of appearance):

    - ``calls``, ``tokens``: how many calls, and their policy tokens;
    - ``credit``: the positive outcome credit they receive, token-weighted
      (:func:`app.core.domain.positive_credit`), ``share`` its share of all effects' credit;
    - ``call_credit``: the same counting each call once (the episode's advantage per call of a
      passing episode with advantage > 0), ``call_share`` its share;
    - ``mean_outcome_advantage``: the mean outcome advantage of the calls' episodes;
    - ``mean_oracle_advantage``: the mean oracle turn advantage of the calls that have one (None
      without), which says what the call was really worth.

    Shares are 0 when no positive credit was handed out; {} for no calls."""
    acc: dict[str, dict[str, float]] = {}
    for ep in episodes:
        credit = domain.positive_credit(ep.passed, ep.advantage, ep.tokens)
        per_call = ep.advantage if ep.passed and ep.advantage > 0 else 0.0
        for k, effect in enumerate(ep.effects):
            e = acc.setdefault(
                effect,
                {
                    "calls": 0,
                    "tokens": 0,
                    "credit": 0.0,
                    "call_credit": 0.0,
                    "adv": 0.0,
                    "oracle": 0.0,
                    "n_oracle": 0,
                },
            )
            e["calls"] += 1
            e["tokens"] += int(ep.tokens[k])
            e["credit"] += float(credit[k])
            e["call_credit"] += per_call
            e["adv"] += ep.advantage
            if ep.oracle is not None:
                e["oracle"] += float(ep.oracle[k])
                e["n_oracle"] += 1
    total = sum(e["credit"] for e in acc.values())
    total_calls = sum(e["call_credit"] for e in acc.values())
    keys = [e for e in order if e in acc] + [e for e in acc if e not in order]
    return {
        k: {
            "calls": int(acc[k]["calls"]),
            "tokens": int(acc[k]["tokens"]),
            "credit": acc[k]["credit"],
            "call_credit": acc[k]["call_credit"],
            "share": acc[k]["credit"] / total if total > 0 else 0.0,
            "call_share": acc[k]["call_credit"] / total_calls if total_calls > 0 else 0.0,
            "mean_outcome_advantage": acc[k]["adv"] / acc[k]["calls"],
            "mean_oracle_advantage": acc[k]["oracle"] / acc[k]["n_oracle"] if acc[k]["n_oracle"] else None,
        }
        for k in keys
    }


def useless_credit(by_effect: dict[str, EffectCredit]) -> tuple[float | None, float | None]:
    """(token-weighted, per-call) :func:`app.core.domain.useless_credit_share` of a
    :func:`credit_by_effect` answer; None where no positive credit was handed out."""
    return (
        domain.useless_credit_share({k: e["credit"] for k, e in by_effect.items()}),
        domain.useless_credit_share({k: e["call_credit"] for k, e in by_effect.items()}),
    )


def nonpolicy_share(abs_on_policy: float, abs_off_policy: float) -> float | None:
    """Share of the total |A| mass on prompt and tool tokens; None when there is no |A| at all."""
    total = abs_on_policy + abs_off_policy
    return abs_off_policy / total if total > 0 else None


def explained_variance_from_sums(n: float, sg: float, sg2: float, sd: float, sd2: float) -> float | None:
    """``1 - Var[G - V] / Var[G]`` (population variances, as ``estimators.explained_variance``)
    from running sums over tokens: n, sum G, sum G^2, sum (G - V), sum (G - V)^2. None when the
    returns are constant (up to a relative tolerance: the sums' rounding must not turn constant
    returns into noise)."""
    if not n:
        return None
    var_g = sg2 / n - (sg / n) ** 2
    var_d = sd2 / n - (sd / n) ** 2
    if var_g <= 1e-12 * max(1.0, sg2 / n):
        return None
    return float(1 - max(var_d, 0.0) / var_g)


def removed_share(abs_removed: float, abs_total: float) -> float | None:
    """Share of the policy tokens' |A| mass whose loss weight is 0 (clipped or masked): ``sum |A|
    over the removed tokens / sum |A| over policy tokens``; None when there is no |A| at all."""
    return float(abs_removed / abs_total) if abs_total > 0 else None


def length_bias_slope(
    lengths: Sequence[float] | np.ndarray, per_token: Sequence[float] | np.ndarray
) -> float | None:
    """The least-squares slope of ``per_token / mean(per_token)`` against ``lengths / mean(lengths)``
    ([B] each; pass only episodes with a length > 0 and some |A|): scale-free, so any aggregation's
    constant factor cancels. 0 when the per-token weight does not depend on the length; about -1
    when it falls like 1 / L around the mean length. None for fewer than 2 episodes, equal lengths
    or no weight at all."""
    x = np.asarray(lengths, dtype=np.float64)
    y = np.asarray(per_token, dtype=np.float64)
    if len(x) < 2 or x.mean() <= 0 or y.mean() <= 0:
        return None
    x, y = x / x.mean(), y / y.mean()
    dx = x - x.mean()
    var = float((dx * dx).sum())
    if var <= 1e-12 * len(x):
        return None
    return float((dx * (y - y.mean())).sum() / var)


def drift_tokens(drift: Any) -> int:
    """How many sampled tokens an episode's ``meta.drift`` (a list of turns) says a later prompt
    re-renders as other tokens; 0 for anything else."""
    if not isinstance(drift, list):
        return 0
    n = 0
    for d in drift:
        if isinstance(d, dict):
            at, differing = d.get("at"), d.get("differing")
            n += len(at) if isinstance(at, list) else int(differing) if isinstance(differing, int) else 0
    return n


def drift_shares(
    n_drifting: int, n_episodes: int, drifted_tokens: int, policy_tokens: int | None
) -> tuple[float | None, float | None]:
    """(share of episodes with drift, share of policy tokens with drift); None without episodes or,
    for the token share, without the policy token count."""
    eps = n_drifting / n_episodes if n_episodes else None
    toks = drifted_tokens / policy_tokens if policy_tokens else (0.0 if eps == 0.0 else None)
    return eps, toks
