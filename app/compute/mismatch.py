"""Which positions a training-vs-rollout comparison counts: the policy positions both engines
scored.

A trainer fills the positions its loss masks (prompt, tool output, padding) with placeholders —
0.0, NaN, or nothing — and compared against them a log-prob looks tens of nats off, a mismatch
that never happened (miles#2476). So every log-prob and ratio summary of the service counts a
position only when it is a policy token and both log-probs there are present and finite: the
step metrics' ``mean_log_ratio`` and ``max_abs_log_ratio`` (step_metrics.py), the search field
``max_ratio`` (episode_fields.py) and the loss weights behind ``clip_fraction``,
``masked_fraction`` and the batch loss view (loss_view.py), where a position not compared has
ratio 1 (nothing clipped, nothing masked). An upload's log-prob arrays may say "not scored" off
the policy tokens with NaN or null: validation stores those as 0.0 and counts them in
``meta.not_scored`` (app/core/validate.py), and refuses them on a policy token; NaN or a missing
value reaches these functions only from arrays a format kept in ``meta``.
"""

from __future__ import annotations

import numpy as np

F64 = np.float64


def scored(policy: np.ndarray, logprobs: np.ndarray, other: np.ndarray) -> np.ndarray:
    """[T] bool: the policy positions where both ``logprobs`` and ``other`` (the rollout's, or
    the reference's) are finite numbers."""
    both: np.ndarray = np.asarray(policy, dtype=bool) & np.isfinite(logprobs) & np.isfinite(other)
    return both


def log_ratio(policy: np.ndarray, logprobs: np.ndarray, rollout_logprobs: np.ndarray) -> np.ndarray:
    """[k] ``logprobs - rollout_logprobs`` at the k positions :func:`scored` counts, in order."""
    both = scored(policy, logprobs, rollout_logprobs)
    d: np.ndarray = np.asarray(logprobs, dtype=F64)[both] - np.asarray(rollout_logprobs, dtype=F64)[both]
    return d


def comparable(logprobs: np.ndarray, rollout_logprobs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """([T], [T]) float64 log-probs for a loss's ratio: finite values as they are, and at a
    position either engine did not score, no mismatch (the log-prob 0 where it is missing, the
    rollout's equal to it: ratio 1). Finite inputs come back unchanged, bit for bit."""
    lp = np.asarray(logprobs, dtype=F64)
    rlp = np.asarray(rollout_logprobs, dtype=F64)
    has_lp = np.isfinite(lp)
    lp = np.where(has_lp, lp, 0.0)
    return lp, np.where(has_lp & np.isfinite(rlp), rlp, lp)
