"""The latent dynamics of a BugFix episode and the parametrised stochastic policy that acts in it.

The latent state is small on purpose, so that true values can be solved exactly (truth.py):

    located  the agent has read the file (it then names the right edit op more often)
    fixed    the planted bug is fixed (decides the hidden tests, hence the outcome)
    hacked   the visible tests were hard-coded (the exploit: visible tests pass, hidden ones do not)
    known    what the agent knows about the visible tests: UNKNOWN (untouched and untested),
             CHANGED (code changed since the last test), PASS or FAIL (the last test's result)

The policy sees (located, known), not `fixed`: like a real agent, it learns whether an edit worked
only by testing. Its action logits are the knobs of :class:`PolicyParams`; the edit op is right with
probability sigmoid(skill), where skill = task.skill * skill_scale + skill_shift (+ read_bonus once
the file was read), all divided by the temperature.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import NamedTuple

from app.sim.tasks import OPS, Task

UNKNOWN, PASS, FAIL, CHANGED = 0, 1, 2, 3

# Call kinds the policy chooses between, in a fixed order (the order matters for determinism).
KINDS: tuple[str, ...] = ("read", "edit", "test", "hardcode_tests", "submit")

EFFECTS: tuple[str, ...] = ("decisive_edit", "wrong_edit", "read", "test", "exploit", "submit", "other")


class State(NamedTuple):
    """Latent state at a turn boundary (before the next call)."""

    located: bool = False
    fixed: bool = False
    hacked: bool = False
    known: int = UNKNOWN


START = State()
ALL_STATES: tuple[State, ...] = tuple(
    State(lo, fx, hk, kn)
    for lo in (False, True)
    for fx in (False, True)
    for hk in (False, True)
    for kn in (UNKNOWN, PASS, FAIL, CHANGED)
)


@dataclass(frozen=True)
class PolicyParams:
    """Knobs of the simulated agent. Logits are added, then divided by `temperature`.

    skill_scale, skill_shift: skill on a task = task.skill * skill_scale + skill_shift (a logit).
    read_bonus:        skill added once the agent has read the file.
    read_propensity:   logit of `read` (minus 2.5 once the file was read).
    edit_propensity:   logit of `edit` (+1 after a failed test, -3 after a passing one, -3 right
                       after a change).
    test_propensity:   logit of `test` (+1 after a change, -2.5 when the last test is current).
    exploit_propensity: logit of `hardcode_tests` (+1 after a failed test, -3 after a passing one,
                       -1 right after a change).
    submit_propensity: logit of `submit` (+3.5 after a passing test, -1.5 after a failed one, -1
                       before any change or test).
    temperature:       divides every logit (higher = more random agent).
    """

    skill_scale: float = 1.0
    skill_shift: float = 0.5
    read_bonus: float = 1.0
    read_propensity: float = -1.5
    edit_propensity: float = 2.0
    test_propensity: float = -1.0
    exploit_propensity: float = -2.0
    submit_propensity: float = 1.0
    temperature: float = 1.0

    @classmethod
    def from_dict(cls, d: dict[str, float] | None) -> PolicyParams:
        """Build from a (partial) dict; unknown keys raise ValueError naming them."""
        d = dict(d or {})
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown policy knob(s) {unknown}; known: {sorted(names)}")
        p = cls(**{k: float(v) for k, v in d.items()})
        for f in fields(cls):
            v = getattr(p, f.name)
            if not math.isfinite(v) or abs(v) > 50:
                raise ValueError(f"policy knob {f.name} must be a finite number in [-50, 50], got {v}")
        if p.temperature < 0.05:
            raise ValueError("policy knob temperature must be at least 0.05")
        return p

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def _softmax(logits: list[float]) -> list[float]:
    m = max(logits)
    e = [math.exp(x - m) for x in logits]
    s = sum(e)
    return [x / s for x in e]


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def kind_probs(params: PolicyParams, located: bool, known: int) -> list[float]:
    """Probabilities of the call kinds (in KINDS order) given what the agent can see."""
    p = params
    logits = [
        p.read_propensity - (2.5 if located else 0.0),
        p.edit_propensity + {UNKNOWN: 0.0, PASS: -3.0, FAIL: 1.0, CHANGED: -3.0}[known],
        p.test_propensity + {UNKNOWN: 0.0, PASS: -2.5, FAIL: -2.5, CHANGED: 1.0}[known],
        p.exploit_propensity + {UNKNOWN: 0.0, PASS: -3.0, FAIL: 1.0, CHANGED: -1.0}[known],
        p.submit_propensity + {UNKNOWN: -1.0, PASS: 3.5, FAIL: -1.5, CHANGED: 0.0}[known],
    ]
    return _softmax([x / p.temperature for x in logits])


def right_op_prob(params: PolicyParams, task: Task, located: bool) -> float:
    """P(the edit names the task's bug op | the agent edits)."""
    skill = task.skill * params.skill_scale + params.skill_shift + (params.read_bonus if located else 0.0)
    return _sigmoid(skill / params.temperature)


def call_distribution(params: PolicyParams, task: Task, state: State) -> list[tuple[str, float]]:
    """Every call the policy may write in `state`, with its probability (sums to 1).

    Calls are strings such as "read" or "edit swap_minmax"; wrong edit ops share the rest uniformly.
    """
    probs = kind_probs(params, state.located, state.known)
    q = right_op_prob(params, task, state.located)
    wrong = [op for op in OPS if op != task.bug]
    out: list[tuple[str, float]] = []
    for kind, pk in zip(KINDS, probs, strict=True):
        if kind == "edit":
            for op in OPS:
                out.append((f"edit {op}", pk * (q if op == task.bug else (1 - q) / len(wrong))))
        else:
            out.append((kind, pk))
    return out


class Step(NamedTuple):
    next_state: State
    effect: str
    done: bool
    outcome: float  # 1.0 when this call submitted a fixed bug, else 0.0


def transition(task: Task, state: State, call: str) -> Step:
    """The deterministic effect of `call` in `state` (observations are rendered by env.py)."""
    kind, _, op = call.partition(" ")
    if kind == "read":
        return Step(state._replace(located=True), "read", False, 0.0)
    if kind == "edit":
        # Any edit makes the last test result stale.
        if op == task.bug and not state.fixed:
            return Step(state._replace(fixed=True, known=CHANGED), "decisive_edit", False, 0.0)
        effect = "other" if op == task.bug else "wrong_edit"  # re-applying the fix changes nothing
        return Step(state._replace(known=CHANGED), effect, False, 0.0)
    if kind == "test":
        return Step(state._replace(known=PASS if (state.fixed or state.hacked) else FAIL), "test", False, 0.0)
    if kind == "hardcode_tests":
        return Step(state._replace(hacked=True, known=CHANGED), "exploit", False, 0.0)
    if kind == "submit":
        return Step(state, "submit", True, 1.0 if state.fixed else 0.0)
    raise ValueError(f"unknown call {call!r}")
