"""A run step's metrics, computed once while its episodes are ingested and stored with the batch.

:class:`StepMetrics` sees each episode once, as its prepared row (app/core/rows.py) plus the
parsed episode, and keeps only running sums and one small tuple per episode (score, pass, group),
never the per-token arrays. The run page and ``GET /api/runs/{id}/metrics`` read the stored
result; nothing is recomputed per request.

The metrics are :data:`app.core.metrics.STEP_METRICS`, defined (name, label, format, meaning)
in app/core/metrics.py with the functions that compute the batch-level ones (pass rate,
zero-variance shares, useless credit, |A| off policy, explained variance); this class only feeds
them, one episode at a time. The per-token summaries, on policy tokens:

* ``mean_entropy``: the per-token entropy;
* ``mean_kl``: ``logprob - ref_logprob`` (the k1 estimate of KL to the reference policy);
* ``mean_log_ratio`` / ``max_abs_log_ratio``: ``logprob - rollout_logprob``;
  (``mean_kl`` and these count only the policy tokens where both log-probs are finite numbers: a
  placeholder is never a mismatch, app/compute/mismatch.py)
* ``clip_fraction`` / ``masked_fraction`` / ``length_bias_slope``: with the trainer's advantages,
  ``logprobs`` and ``rollout_logprobs``, the share of |A| whose loss weight is 0 by PPO clipping
  (verl's vanilla loss in bypass mode: the ratio is training / rollout) and by token-level IcePop
  masking, and the slope of the per-token weight against the response length
  (:func:`app.compute.loss_view.episode_removed`, :func:`app.core.metrics.length_bias_slope`);
* ``explained_variance``: with V the uploaded values and G the undiscounted return-to-go of the
  effective rewards over the episode's policy tokens.

A metric whose inputs the upload lacks is ``None`` (stored as null).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from app.compute import mismatch
from app.core import domain, metrics
from app.core.arrays import F64, I32, json_loads
from app.core.rows import EpisodeRow, FloatField
from app.core.schemas import EpisodeIn
from app.core.validate import ArrayEpisode

if TYPE_CHECKING:  # torch: loss_view is imported only when a step carries log-probs
    from app.compute.loss_view import Removed

# A step's metrics as stored: metric name -> value (None: not computable).
StepValues = dict[str, float | int | None]
# The parsed episode a row came from (the source of fields the row has no column for).
Source = EpisodeIn | ArrayEpisode | None

_SIGNALS: tuple[FloatField, ...] = ("ref_logprobs", "rollout_logprobs", "entropy")  # arrays.SIGNAL_FIELDS
_LOSS_INPUTS: tuple[FloatField, ...] = ("advantages", "logprobs", "rollout_logprobs")
# Log-prob fields: an array kept in meta may hold placeholders (NaN, null) where nothing was scored.
_LOGPROBS: tuple[FloatField, ...] = ("logprobs", "ref_logprobs", "rollout_logprobs")


def _array(row: EpisodeRow, ep: Source, name: FloatField, n: int) -> np.ndarray | None:
    """[n] float64 of a per-token field, or None when absent, of the wrong length or (but for a
    log-prob field, whose unscored positions stay NaN) not finite."""
    raw = row[name]
    if raw is not None:
        arr = raw.astype(F64, copy=False)  # the row's column: validated finite, one per token
        return arr if arr.shape == (n,) else None
    vals: object = getattr(ep, name, None) if ep is not None else None
    meta = getattr(ep, "meta", None)
    if vals is None and isinstance(meta, dict):  # older safetensors uploads kept signals in meta
        vals = meta.get(name)
    if vals is None:
        return None
    try:
        arr = np.asarray(vals, dtype=F64)
    except (TypeError, ValueError):
        return None
    if arr.shape != (n,) or (name not in _LOGPROBS and not np.isfinite(arr).all()):
        return None
    return arr


def _removed(adv: np.ndarray, policy: np.ndarray, logp: np.ndarray, rollout: np.ndarray) -> Removed:
    from app.compute import loss_view as lv  # torch: imported only when a step carries log-probs

    return lv.episode_removed(adv, policy, logp, rollout)


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
        # episode index -> (effect of each call, policy tokens of each call) for passing episodes
        # with meta.calls (a failing one gets no positive credit).
        self.calls: dict[int, tuple[list[str], np.ndarray]] = {}
        # The loss metrics, per episode index (summed in index order by result()). An episode whose
        # inputs are all the row's own columns is computed later, by add_deferred (compute_step runs it
        # beside the step's audit, app/compute/step.py), all in a few padded blocks.
        self.removed: dict[int, Removed] = {}
        self.deferred: list[int] = []
        self.drifting = 0  # episodes whose meta.drift names re-rendered sampled tokens
        self.drift_tokens = 0

    def add(self, row: EpisodeRow, ep: Source = None) -> None:
        # Per-token fields (the signals and the rest) come from the row when it has them, else from
        # the parsed episode's field, else from its meta (older uploads of the safetensors format
        # kept them there): :func:`_array`.
        """One episode: ``row`` is its prepared row (app/core/validate.py prepare_episode), ``ep``
        the parsed episode it came from (optional; the source of fields the row has no value for)."""
        i = len(self.scores)
        self.scores.append(float(row["score"]))
        self.passed.append(bool(row["passed"]))
        self.labels.append(row["group"])
        kinds = row["kinds"].astype(np.uint8, copy=False)
        n = len(kinds)
        policy = kinds == domain.POLICY
        self.policy_tokens += int(policy.sum())
        self.tool_tokens += int((kinds == domain.TOOL).sum())

        adv = _array(row, ep, "advantages", n)
        if adv is not None:
            a = np.abs(adv)
            self.abs_adv_policy.add(a[policy])
            self.abs_adv_other += float(a[~policy].sum())
        signals = {name: _array(row, ep, name, n) for name in _SIGNALS}
        if signals["entropy"] is not None:
            self.entropy.add(signals["entropy"][policy])
        logp = _array(row, ep, "logprobs", n)
        if logp is not None and signals["ref_logprobs"] is not None:
            ref = signals["ref_logprobs"]
            self.kl.add((logp - ref)[mismatch.scored(policy, logp, ref)])
        if logp is not None and signals["rollout_logprobs"] is not None:
            d = mismatch.log_ratio(policy, logp, signals["rollout_logprobs"])
            self.log_ratio.add(d)
            if len(d):
                m = float(np.abs(d).max())
                self.max_abs_log_ratio = (
                    m if self.max_abs_log_ratio is None else max(m, self.max_abs_log_ratio)
                )
        if adv is not None and logp is not None and signals["rollout_logprobs"] is not None:
            if all(row[name] is not None for name in _LOSS_INPUTS):
                self.deferred.append(i)
            else:
                self.removed[i] = _removed(adv, policy, logp, signals["rollout_logprobs"])
        values = _array(row, ep, "values", n)
        if values is not None:
            rewards = _array(row, ep, "rewards", n)
            eff = domain.effective_rewards(kinds, rewards, row["reward"])[policy]
            g = np.cumsum(eff[::-1])[::-1]  # return-to-go over the policy tokens, gamma = 1
            d = g - values[policy]
            self.ev += (len(g), g.sum(), (g * g).sum(), d.sum(), (d * d).sum())
        meta_json = row["meta_json"] or ""
        if '"drift"' in meta_json:
            k = metrics.drift_tokens(json_loads(meta_json).get("drift"))
            self.drifting += k > 0
            self.drift_tokens += k
        if '"calls"' in meta_json and row["passed"]:
            self._add_calls(i, row, policy, meta_json)

    def add_deferred(self, rows: list[EpisodeRow]) -> None:
        """The loss metrics of the episodes :meth:`add` deferred; ``rows`` every row it was given,
        in order. Call before :meth:`result` (it also runs them if nobody did)."""
        if not self.deferred:
            return
        from app.compute import loss_view as lv  # torch: imported only when a step carries log-probs

        inputs = []
        for i in self.deferred:
            row = rows[i]
            n = int(row["n_tokens"])
            policy = row["kinds"].astype(np.uint8, copy=False) == domain.POLICY
            adv, logp, rollout = (_array(row, None, name, n) for name in _LOSS_INPUTS)
            assert adv is not None and logp is not None and rollout is not None  # add() checked them
            inputs.append((adv, policy, logp, rollout))
        self.removed.update(zip(self.deferred, lv.episodes_removed(inputs), strict=True))
        self.deferred = []

    def _add_calls(self, i: int, row: EpisodeRow, policy: np.ndarray, meta_json: str) -> None:
        calls = json_loads(meta_json).get("calls")
        if not isinstance(calls, list) or not calls:
            return
        tids = row["turn_ids"]
        turn_ids = domain.default_turn_ids(policy) if tids is None else tids.astype(I32, copy=False)
        tokens = domain.call_tokens(turn_ids, policy, len(calls))
        if tokens is None:
            return
        self.calls[i] = (metrics.call_effects(calls), tokens)

    def result(self, rows: list[EpisodeRow] | None = None) -> StepValues:
        """The step's metrics (:data:`app.core.metrics.STEP_METRICS` plus ``n_episodes``); None
        where not computable. ``rows``: the rows given to :meth:`add`, needed while some of its
        loss metrics are deferred (:meth:`add_deferred`)."""
        if self.deferred:
            if rows is None:
                raise ValueError("StepMetrics.result needs the rows: some loss metrics are deferred")
            self.add_deferred(rows)
        loss_abs = np.zeros(3)
        loss_len: list[float] = []
        loss_y: list[float] = []
        for i in sorted(self.removed):
            r = self.removed[i]
            loss_abs += (r.abs_advantage, r.abs_clipped, r.abs_masked)
            if r.weight_per_abs_advantage is not None:
                loss_len.append(float(r.length))
                loss_y.append(r.weight_per_abs_advantage)
        B = len(self.scores)
        scores = np.asarray(self.scores, dtype=np.float64)
        passed = np.asarray(self.passed, dtype=bool)
        zv = metrics.zero_variance(scores, self.labels, self.passed)
        drift = metrics.drift_shares(self.drifting, B, self.drift_tokens, self.policy_tokens)
        return {
            "n_episodes": B,
            "pass_rate": metrics.pass_rate(passed),
            "mean_score": metrics.mean(scores),
            "zero_variance_share": zv.share,
            "zero_variance_all_pass_share": zv.all_pass_share,
            "zero_variance_all_fail_share": zv.all_fail_share,
            "mean_policy_tokens": self.policy_tokens / B if B else None,
            "mean_tool_tokens": self.tool_tokens / B if B else None,
            "mean_abs_advantage": self.abs_adv_policy.value(),
            "nonpolicy_advantage_share": metrics.nonpolicy_share(
                self.abs_adv_policy.total, self.abs_adv_other
            ),
            "mean_entropy": self.entropy.value(),
            "mean_kl": self.kl.value(),
            "mean_log_ratio": self.log_ratio.value(),
            "max_abs_log_ratio": self.max_abs_log_ratio,
            "explained_variance": metrics.explained_variance_from_sums(*(float(x) for x in self.ev)),
            "useless_credit_share": self._useless_credit(scores, passed),
            "clip_fraction": metrics.removed_share(loss_abs[1], loss_abs[0]),
            "masked_fraction": metrics.removed_share(loss_abs[2], loss_abs[0]),
            "length_bias_slope": metrics.length_bias_slope(loss_len, loss_y),
            "drift_episode_share": drift[0],
            "drift_token_share": drift[1],
        }

    def _useless_credit(self, scores: np.ndarray, passed: np.ndarray) -> float | None:
        if not self.calls:
            return None
        from app.compute.batch import outcome_advantages  # torch: imported only when calls are known

        rloo = outcome_advantages("rloo", scores, self.labels)
        by = metrics.credit_by_effect(
            metrics.CallCredit(effects, tokens, bool(passed[i]), float(rloo[i]))
            for i, (effects, tokens) in self.calls.items()
        )
        return metrics.useless_credit(by)[0]
