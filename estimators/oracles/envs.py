"""The oracle MDPs: RecoveryEnv, DelayedEffectEnv and VariableHorizonEnv (the structures of
AgentCreditBench's environments) and the repair MDP R1. Each constructor validates its parameters
(ValueError with a message)."""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

from .mdp import Number, OutcomeSpec, TabularMDP, _check_probability, to_fraction


def recovery_env(q: Number = 1) -> TabularMDP:
    """RecoveryEnv (horizon 2). t=0 in s0: GOOD -> success (reward 1, ends); BAD -> `mistake` (0).
    t=1 in `mistake`: RECOVER -> success with probability q (reward 1), else failure (0); GIVE_UP -> 0.
    Uniform closed forms: V0 = 1/2 + q/4, A(BAD) = q/4 - 1/2, A(RECOVER) = q/2."""
    q = _check_probability(q, "q (recovery-success probability)")

    def available(_t: int, s: str) -> tuple[str, ...]:
        return ("GOOD", "BAD") if s == "s0" else ("RECOVER", "GIVE_UP")

    def transitions(t: int, _s: str, a: str) -> list[OutcomeSpec]:
        if a == "GOOD":
            return [(Fraction(1), None, 1, True, True)]
        if a == "BAD":
            # Taking BAD at t=1 cannot happen on-policy from the start state; it still leads to mistake.
            return [(Fraction(1), "mistake", 0, t + 1 >= 2)]
        if a == "RECOVER":
            return [(q, None, 1, True, True), (1 - q, None, 0, True)]
        return [(Fraction(1), None, 0, True)]

    return TabularMDP(
        "recovery",
        ("s0", "mistake"),
        ("GOOD", "BAD", "RECOVER", "GIVE_UP"),
        2,
        {"s0": Fraction(1)},
        available,
        transitions,
        params={"q": q},
    )


MAX_DELAYED_HORIZON = 64


def delayed_effect_env(
    horizon: int = 3, k: int = 2, p_good: Number = Fraction(4, 5), p_bad: Number = Fraction(1, 5)
) -> TabularMDP:
    """DelayedEffectEnv. t=0: GOOD or BAD (reward 0) sets a latent state; t = 1..H-1: k identical
    distractor actions; the last step ends the episode and pays 1 with the latent success probability.
    Uniform: V0 = (p_good + p_bad)/2, A(GOOD) = (p_good - p_bad)/2 (= +0.3), distractors A = 0."""
    if (
        not isinstance(horizon, int)
        or isinstance(horizon, bool)
        or horizon < 2
        or horizon > MAX_DELAYED_HORIZON
    ):
        raise ValueError(f"horizon must be an integer in [2, {MAX_DELAYED_HORIZON}], not {horizon!r}")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1 or k > 20:
        raise ValueError(f"k (number of distractor actions) must be an integer in [1, 20], not {k!r}")
    p_good = _check_probability(p_good, "p_good")
    p_bad = _check_probability(p_bad, "p_bad")
    distractors = tuple(f"D{i}" for i in range(k))

    def available(_t: int, s: str) -> tuple[str, ...]:
        return ("GOOD", "BAD") if s == "s0" else distractors

    def transitions(t: int, s: str, a: str) -> list[OutcomeSpec]:
        last = t == horizon - 1
        if a in ("GOOD", "BAD"):
            latent = "good" if a == "GOOD" else "bad"
            if last:  # unreachable on-policy (s0 only at t=0); pay as if the latent were resolved
                p = p_good if a == "GOOD" else p_bad
                return [(p, None, 1, True, True), (1 - p, None, 0, True)]
            return [(Fraction(1), latent, 0, False)]
        if not last:
            return [(Fraction(1), s, 0, False)]
        p = p_good if s == "good" else (p_bad if s == "bad" else Fraction(0))
        return [(p, None, 1, True, True), (1 - p, None, 0, True)]

    return TabularMDP(
        "delayed",
        ("s0", "good", "bad"),
        ("GOOD", "BAD", *distractors),
        horizon,
        {"s0": Fraction(1)},
        available,
        transitions,
        params={"horizon": horizon, "k": k, "p_good": p_good, "p_bad": p_bad},
    )


def variable_horizon_env(
    stop_rewards: Sequence[Number] = (0, 2, 1, 3, 0), continue_reward: Number = 0
) -> TabularMDP:
    """VariableHorizonEnv. At each t: STOP (ends, pays stop_rewards[t]) or CONTINUE (pays
    ``continue_reward``, goes on); the last step (t = H-1, H = len(stop_rewards)) forces STOP.
    At STOP probability 1/2 with the default rewards, V0 = 0.8125."""
    if not 1 <= len(stop_rewards) <= 64:
        raise ValueError("stop_rewards must have between 1 and 64 entries")
    rewards = [to_fraction(r, "stop reward") for r in stop_rewards]
    cont = to_fraction(continue_reward, "continue_reward")
    H = len(rewards)

    def available(t: int, _s: str) -> tuple[str, ...]:
        return ("STOP",) if t == H - 1 else ("STOP", "CONTINUE")

    def transitions(t: int, _s: str, a: str) -> list[OutcomeSpec]:
        if a == "STOP":
            return [(Fraction(1), None, rewards[t], True)]
        return [(Fraction(1), "s", cont, False)]

    return TabularMDP(
        "horizon",
        ("s",),
        ("STOP", "CONTINUE"),
        H,
        {"s": Fraction(1)},
        available,
        transitions,
        params={"stop_rewards": rewards, "continue_reward": cont},
    )


REPAIR_ACTIONS = ("read", "edit", "submit")
REPAIR_STATES = ("fresh", "located", "fixed")


def repair_env(cost: Number = Fraction(1, 20), horizon: int = 5) -> TabularMDP:
    """The repair MDP R1. Every call costs ``cost`` (submit included); at most ``horizon`` calls; a
    5th call that is not submit is cut off (truncated) with no further reward.
    read: fresh -> located; edit: located -> fixed (a blind edit in fresh does nothing);
    submit ends: +1 - cost in fixed, -cost otherwise. Uniform: J = 7/4860, E[len] = 211/81,
    P(success) = 32/243."""
    cost = to_fraction(cost, "cost")
    if cost < 0 or cost > 1:
        raise ValueError(f"cost must lie in [0, 1], not {float(cost)!r}")
    if not isinstance(horizon, int) or isinstance(horizon, bool) or horizon < 1 or horizon > 20:
        raise ValueError(f"horizon must be an integer in [1, 20], not {horizon!r}")
    move = {("fresh", "read"): "located", ("located", "edit"): "fixed"}

    def available(_t: int, _s: str) -> tuple[str, ...]:
        return REPAIR_ACTIONS

    def transitions(_t: int, s: str, a: str) -> list[OutcomeSpec]:
        if a == "submit":
            ok = s == "fixed"
            return [(Fraction(1), None, (1 if ok else 0) - cost, True, ok)]
        return [(Fraction(1), move.get((s, a), s), -cost, False)]

    return TabularMDP(
        "repair",
        REPAIR_STATES,
        REPAIR_ACTIONS,
        horizon,
        {"fresh": Fraction(1)},
        available,
        transitions,
        params={"cost": cost, "horizon": horizon},
    )
