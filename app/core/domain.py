"""The service's domain definitions, each stated once: token kinds, score, pass, groups,
zero-variance groups, turn spans, useless credit and the oracle advantage.

The store, the batch diagnostics, the simulator, the compute layer and the CLI import these; none
of them restates a rule. Arrays are numpy, shape [T] for one episode's tokens.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence

import numpy as np

# ---- token kinds ------------------------------------------------------------------------------

KIND_NAMES = ("prompt", "policy", "tool")
KIND_CODES = {name: i for i, name in enumerate(KIND_NAMES)}
PROMPT, POLICY, TOOL = 0, 1, 2


def policy_mask(kinds: np.ndarray | Sequence[str]) -> np.ndarray:
    """[T] bool: True on policy tokens. ``kinds``: uint8 codes or kind names."""
    arr = np.asarray(kinds)
    if arr.dtype.kind in "US" or arr.dtype == object:
        return np.asarray(arr == "policy")
    return np.asarray(arr == POLICY)


# ---- score and pass ---------------------------------------------------------------------------


def effective_rewards(kinds: np.ndarray, rewards: np.ndarray | None, reward: float | None) -> np.ndarray:
    """[T] float64: the per-token rewards plus the outcome ``reward`` on the last policy token."""
    out = np.zeros(len(kinds), dtype=np.float64) if rewards is None else np.array(rewards, dtype=np.float64)
    if reward is not None:
        idx = np.flatnonzero(policy_mask(kinds))
        if len(idx):
            out[idx[-1]] += reward
    return out


def rewarded(reward: float | None, rewards: object | None) -> bool:
    """An episode has an outcome when it was uploaded with a ``reward`` or per-token ``rewards``.
    One with neither (``reward: null``) has none: its score is 0 only for want of one, so no
    advantage of it is shown (the advantages API gives null on every token and says so)."""
    return reward is not None or rewards is not None


def score(kinds: np.ndarray, effective: np.ndarray) -> float:
    """An episode's score: the sum of its effective rewards on policy tokens (outcome included).
    This is the number group baselines compare."""
    return float(np.asarray(effective, dtype=np.float64)[policy_mask(kinds)].sum())


def passed(reward: float | None, score: float) -> bool:
    """Pass: the outcome ``reward`` (or, without one, the episode's score) is > 0."""
    return (reward if reward is not None else score) > 0


# ---- groups -----------------------------------------------------------------------------------


def group_label(key: Hashable) -> str | None:
    """The label of a group key (None for an ungrouped episode's group of one)."""
    return None if isinstance(key, tuple) else key  # type: ignore[return-value]


def groups(labels: Iterable[str | None]) -> dict[Hashable, list[int]]:
    """Group key -> member indices, in order of first appearance. The key is the group label, or,
    for an episode without one, ``(index,)``: a group of its own. A tuple never equals a string,
    so an ungrouped episode never joins a group labelled e.g. "#3"."""
    out: dict[Hashable, list[int]] = {}
    for i, g in enumerate(labels):
        out.setdefault(g if g is not None else (i,), []).append(i)
    return out


def group_ids(labels: Sequence[str | None]) -> np.ndarray:
    """[B] int64 group ids (0, 1, ... by first appearance); each ungrouped episode gets its own."""
    out = np.empty(len(labels), dtype=np.int64)
    for gid, members in enumerate(groups(labels).values()):
        out[members] = gid
    return out


ZERO_VARIANCE_TOL = 1e-12


def zero_variance(scores: np.ndarray) -> bool:
    """A zero-variance group: two or more members whose scores are all equal (max - min < 1e-12),
    so every group baseline gives each of them advantage 0. A group of one is not one."""
    s = np.asarray(scores, dtype=np.float64)
    return len(s) >= 2 and float(s.max() - s.min()) < ZERO_VARIANCE_TOL


# ---- turns ------------------------------------------------------------------------------------


def default_turn_ids(policy: np.ndarray) -> np.ndarray:
    """[T] int32: a turn is a maximal run of policy tokens (one model call); -1 off-policy."""
    p = np.asarray(policy, dtype=bool)
    starts = p & ~np.concatenate(([False], p[:-1]))
    turns = np.cumsum(starts, dtype=np.int64) - 1
    return np.where(p, turns, -1).astype(np.int32)


def turn_spans(policy: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of each maximal run of policy tokens (the turns of :func:`default_turn_ids`)."""
    p = np.asarray(policy, dtype=np.int8)
    d = np.diff(np.concatenate(([0], p, [0])))
    return list(zip(np.flatnonzero(d == 1).tolist(), np.flatnonzero(d == -1).tolist(), strict=True))


def oracle_turn_advantages(
    turn_ids: np.ndarray,
    policy: np.ndarray,
    effective: np.ndarray,
    turn_values: Sequence[float],
    *,
    truncated: bool = False,
    bootstrap_value: float | None = None,
    gamma: float = 1.0,
) -> np.ndarray | None:
    """[K] the oracle turn advantage A_k = r_k + gamma * V_{k+1} - V_k, with r_k the effective
    rewards of turn k's policy tokens (outcome on the last turn) and V the true turn-start values;
    V after the last turn is 0 when the episode terminated, the bootstrap value when truncated.
    None when ``turn_values`` does not have one value per turn."""
    p = np.asarray(policy, dtype=bool)
    t = turn_ids[p]
    n_turns = int(t.max()) + 1 if len(t) else 0
    if len(turn_values) != n_turns:
        return None
    r = np.bincount(t, weights=np.asarray(effective, dtype=np.float64)[p], minlength=n_turns)
    v = np.asarray(turn_values, dtype=np.float64)
    last = (bootstrap_value or 0.0) if truncated else 0.0
    return r + gamma * np.append(v[1:], last) - v


# ---- useless credit ---------------------------------------------------------------------------

# Call effects that move an episode towards success; every other effect is "useless".
USEFUL_EFFECTS = ("decisive_edit", "submit")


def call_tokens(turn_ids: np.ndarray, policy: np.ndarray, n_calls: int) -> np.ndarray | None:
    """[n_calls] policy tokens of each call (call k = turn k), or None when the episode's number of
    turns differs from ``n_calls`` (its ``meta.calls`` does not describe these tokens, so its
    credit is left out rather than misattributed)."""
    t = turn_ids[np.asarray(policy, dtype=bool)]
    if len(t) == 0 or int(t.max()) + 1 != n_calls:
        return None
    return np.bincount(t, minlength=n_calls)


def positive_credit(passed: bool, advantage: float, tokens: np.ndarray) -> np.ndarray:
    """Per call, the positive outcome credit it receives: the episode's outcome advantage times the
    call's policy tokens (what the policy gradient sums), for a passing episode whose advantage is
    > 0; zero otherwise."""
    if not passed or advantage <= 0:
        return np.zeros(len(tokens))
    return advantage * np.asarray(tokens, dtype=np.float64)


def useless_credit_share(credit_by_effect: Mapping[str, float]) -> float | None:
    """Of the positive outcome credit that passing episodes hand out (:func:`positive_credit`,
    token-weighted, summed per call effect), the share landing on calls whose effect is not in
    :data:`USEFUL_EFFECTS`; None when no positive credit was handed out."""
    total = sum(credit_by_effect.values())
    if total <= 0:
        return None
    return sum(v for e, v in credit_by_effect.items() if e not in USEFUL_EFFECTS) / total
