"""A run step's metrics, computed once while its episodes are ingested and stored with the batch.

:class:`StepMetrics` sees each episode once, as the store's row (numeric arrays as bytes) plus the
parsed episode, and keeps only running sums and one small tuple per episode (score, pass, group),
never the per-token arrays. The run page and ``GET /api/runs/{id}/metrics`` read the stored
result; nothing is recomputed per request.

Definitions (score, pass, groups, zero variance, useless credit: app/core/domain.py; "policy tokens"
are the tokens of kind policy):

* ``pass_rate``, ``mean_score``: over episodes.
* ``zero_variance_share``: share of episodes in zero-variance groups, split into
  ``zero_variance_all_pass_share`` and ``zero_variance_all_fail_share`` by whether every member
  of the group passed or every member failed.
* ``mean_policy_tokens``, ``mean_tool_tokens``: tokens of that kind per episode.
* ``mean_abs_advantage``: mean |A| of the trainer's uploaded advantages on policy tokens;
  ``nonpolicy_advantage_share``: the share of the total |A| mass that sits on prompt and tool
  tokens (0 in a healthy run: only generated tokens carry a gradient).
* ``mean_entropy``: mean per-token entropy on policy tokens.
* ``mean_kl``: mean of ``logprob - ref_logprob`` on policy tokens (the k1 estimate of KL to the
  reference policy, Schulman 2020, "Approximating KL divergence").
* ``mean_log_ratio`` / ``max_abs_log_ratio``: ``logprob - rollout_logprob`` on policy tokens, the
  mismatch between the training and the rollout engine's probabilities.
* ``explained_variance``: ``1 - Var[G - V] / Var[G]`` over policy tokens (population variances,
  as ``estimators.explained_variance``), with V the uploaded values and G the undiscounted
  return-to-go of the effective rewards over the episode's policy tokens.
* ``useless_credit_share``: :func:`app.core.domain.useless_credit_share` of the positive RLOO outcome
  credit of passing episodes whose ``meta.calls`` describe their turns (as the batch diagnostics).

A metric whose inputs the upload lacks is ``None`` (stored as null).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from app.core import domain
from app.core.arrays import F64, I32, decode, json_loads

# The per-token signals a step may carry; read from the store row (bytes) when the store has a
# column for them, else from the parsed episode's field, else from its meta (older uploads of the
# safetensors format kept them there).
SIGNALS = ("entropy", "ref_logprobs", "rollout_logprobs")

METRICS = (
    "pass_rate",
    "mean_score",
    "zero_variance_share",
    "zero_variance_all_pass_share",
    "zero_variance_all_fail_share",
    "mean_policy_tokens",
    "mean_tool_tokens",
    "mean_abs_advantage",
    "nonpolicy_advantage_share",
    "mean_entropy",
    "mean_kl",
    "mean_log_ratio",
    "max_abs_log_ratio",
    "explained_variance",
    "useless_credit_share",
)


def _array(row: dict, ep: Any, name: str, n: int) -> np.ndarray | None:
    """[n] float64 of a per-token field, or None when absent, of the wrong length or not finite."""
    raw = row.get(name)
    if isinstance(raw, np.ndarray | bytes | bytearray | memoryview):
        arr = decode(raw, F64)  # a store row's column: validated finite, one per token
        return arr if arr.shape == (n,) else None
    else:
        vals = getattr(ep, name, None) if ep is not None else None
        if vals is None and ep is not None and isinstance(getattr(ep, "meta", None), dict):
            vals = ep.meta.get(name)
        if vals is None:
            return None
        try:
            arr = np.asarray(vals, dtype=F64)
        except (TypeError, ValueError):
            return None
    if arr.shape != (n,) or not np.isfinite(arr).all():
        return None
    return arr


class _Mean:
    """A running mean (None when nothing was added)."""

    __slots__ = ("total", "n")

    def __init__(self) -> None:
        self.total = 0.0
        self.n = 0

    def add(self, x: np.ndarray) -> None:
        self.total += float(x.sum())
        self.n += len(x)

    def value(self) -> float | None:
        return self.total / self.n if self.n else None


class StepMetrics:
    """Accumulates one step's metrics over its episodes (see the module docstring)."""

    def __init__(self) -> None:
        self.scores: list[float] = []
        self.passed: list[bool] = []
        self.labels: list[str | None] = []
        self.policy_tokens = 0
        self.tool_tokens = 0
        self.abs_adv_policy = _Mean()
        self.abs_adv_other = 0.0
        self.entropy = _Mean()
        self.kl = _Mean()
        self.log_ratio = _Mean()
        self.max_abs_log_ratio: float | None = None
        # Explained variance from sums: n, sum G, sum G^2, sum (G-V), sum (G-V)^2.
        self.ev = np.zeros(5)
        # episode index -> [(effect, policy tokens of the call)] for episodes with meta.calls.
        self.calls: dict[int, list[tuple[str, int]]] = {}

    def add(self, row: dict, ep: Any = None) -> None:
        """One episode: ``row`` is its store row (app/core/validate.py prepare_episode), ``ep`` the
        parsed episode it came from (optional; the source of fields the row has no column for)."""
        i = len(self.scores)
        self.scores.append(float(row["score"]))
        self.passed.append(bool(row["passed"]))
        self.labels.append(row.get("group"))
        kinds = decode(row["kinds"], np.dtype(np.uint8))
        n = len(kinds)
        policy = kinds == domain.POLICY
        self.policy_tokens += int(policy.sum())
        self.tool_tokens += int((kinds == domain.TOOL).sum())

        adv = _array(row, ep, "advantages", n)
        if adv is not None:
            a = np.abs(adv)
            self.abs_adv_policy.add(a[policy])
            self.abs_adv_other += float(a[~policy].sum())
        signals = {name: _array(row, ep, name, n) for name in SIGNALS}
        if signals["entropy"] is not None:
            self.entropy.add(signals["entropy"][policy])
        logp = _array(row, ep, "logprobs", n)
        if logp is not None and signals["ref_logprobs"] is not None:
            self.kl.add((logp - signals["ref_logprobs"])[policy])
        if logp is not None and signals["rollout_logprobs"] is not None:
            d = (logp - signals["rollout_logprobs"])[policy]
            self.log_ratio.add(d)
            if len(d):
                m = float(np.abs(d).max())
                self.max_abs_log_ratio = (
                    m if self.max_abs_log_ratio is None else max(m, self.max_abs_log_ratio)
                )
        values = _array(row, ep, "values", n)
        if values is not None:
            rewards = _array(row, ep, "rewards", n)
            eff = domain.effective_rewards(kinds, rewards, row.get("reward"))[policy]
            g = np.cumsum(eff[::-1])[::-1]  # return-to-go over the policy tokens, gamma = 1
            d = g - values[policy]
            self.ev += (len(g), g.sum(), (g * g).sum(), d.sum(), (d * d).sum())
        meta_json = row.get("meta_json") or ""
        if '"calls"' in meta_json and row["passed"]:
            self._add_calls(i, row, policy, meta_json)

    def _add_calls(self, i: int, row: dict, policy: np.ndarray, meta_json: str) -> None:
        calls = json_loads(meta_json).get("calls")
        if not isinstance(calls, list) or not calls:
            return
        tids = row.get("turn_ids")
        turn_ids = domain.default_turn_ids(policy) if tids is None else decode(tids, I32)
        tokens = domain.call_tokens(turn_ids, policy, len(calls))
        if tokens is None:
            return
        self.calls[i] = [
            (c.get("effect", "other") if isinstance(c, dict) else "other", int(t))
            for c, t in zip(calls, tokens, strict=True)
        ]

    def result(self) -> dict[str, float | int | None]:
        """The step's metrics (:data:`METRICS` plus ``n_episodes``); None where not computable."""
        B = len(self.scores)
        scores = np.asarray(self.scores, dtype=np.float64)
        passed = np.asarray(self.passed, dtype=bool)
        zv = zv_pass = zv_fail = 0
        for members in domain.groups(self.labels).values():
            if domain.zero_variance(scores[members]):
                zv += len(members)
                zv_pass += len(members) if passed[members].all() else 0
                zv_fail += len(members) if not passed[members].any() else 0
        adv_total = self.abs_adv_policy.total + self.abs_adv_other
        n, sg, sg2, sd, sd2 = self.ev
        var_g = sg2 / n - (sg / n) ** 2 if n else 0.0
        var_d = sd2 / n - (sd / n) ** 2 if n else 0.0
        out: dict[str, float | int | None] = {
            "n_episodes": B,
            "pass_rate": float(passed.mean()) if B else None,
            "mean_score": float(scores.mean()) if B else None,
            "zero_variance_share": zv / B if B else None,
            "zero_variance_all_pass_share": zv_pass / B if B else None,
            "zero_variance_all_fail_share": zv_fail / B if B else None,
            "mean_policy_tokens": self.policy_tokens / B if B else None,
            "mean_tool_tokens": self.tool_tokens / B if B else None,
            "mean_abs_advantage": self.abs_adv_policy.value(),
            "nonpolicy_advantage_share": self.abs_adv_other / adv_total if adv_total > 0 else None,
            "mean_entropy": self.entropy.value(),
            "mean_kl": self.kl.value(),
            "mean_log_ratio": self.log_ratio.value(),
            "max_abs_log_ratio": self.max_abs_log_ratio,
            # A relative tolerance: the sums' rounding must not turn constant returns into noise.
            "explained_variance": float(1 - max(var_d, 0.0) / var_g)
            if var_g > 1e-12 * max(1.0, sg2 / max(n, 1))
            else None,
            "useless_credit_share": self._useless_credit(scores, passed),
        }
        return out

    def _useless_credit(self, scores: np.ndarray, passed: np.ndarray) -> float | None:
        if not self.calls:
            return None
        from app.compute.advantages import outcome_advantages  # torch: imported only when calls are known

        rloo = outcome_advantages("rloo", scores, self.labels)
        by: dict[str, float] = {}
        for i, calls in self.calls.items():
            credit = domain.positive_credit(bool(passed[i]), float(rloo[i]), np.array([t for _, t in calls]))
            for (effect, _), c in zip(calls, credit, strict=True):
                by[effect] = by.get(effect, 0.0) + float(c)
        return domain.useless_credit_share(by)
