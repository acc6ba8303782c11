"""One registry, one call shape.

Every estimator takes an :class:`EstimatorInput` and returns an :class:`EstimatorOutput`, so callers
(the service, the CLI, the benchmarks, the lambda lab) never branch on an estimator's name.

Add an estimator by decorating a function ``fn(inp: EstimatorInput, **params) -> EstimatorOutput``
with :func:`register`; it then shows up in :func:`available` and in the service's ``scheme=`` list.
The call declares what the estimator reads (``reads``, ``may_read``: names from :data:`INPUTS`), and
callers decide from that what to load, what to check and what to say when an input is missing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor


@dataclass
class EstimatorInput:
    """Everything an estimator may read. Shapes: B rows (episodes), T token positions.

    rewards:   [B, T] per-token rewards; only policy positions are meaningful (a reward lives on
               the policy token that earned it).
    mask:      [B, T] policy-token mask (1 where the policy chose the token; 0 for prompt, template,
               tool output and padding). Any dtype; treated as ``mask != 0``.
    values:    [B, T] critic values, meaningful at policy positions only (None = no critic).
    groups:    [B] group labels (attempts at the same task share a label; any integer/float
               tensor or a sequence of hashables such as strings; groups need not be
               contiguous); None = the whole batch is ONE group.
    turn_ids:  [B, T] integer turn index per token (None = a turn is a maximal run of policy tokens).
    last_value:[B] bootstrap value for truncated rows (NaN or None = terminated, V = 0 after the end).
    gamma, lam: discount and GAE lambda, applied once per step (policy token, or turn).
    logprobs:  [B, T] log-probabilities of the chosen tokens (optional; OTB uses them).
    sum_pi_squared: [B, T] sum over the vocabulary of pi^2 (optional; OTB).
    reward_baselines: [B] per-row baseline scores (optional; ReMax's greedy reward).
    turn_states: [B, K] long anchor-state id of each turn (turn k = the row's k-th turn, see
               ``token.turn_spans``); -1 where the row has no k-th turn (or its state is unknown).
               Turns of the same group with the same id form GiGPO's step groups. Ids are global
               (the caller hashes the observation before each turn to an id).
    turn_values: [B, K] Monte Carlo value of the state before each turn (the mean return of
               continuations sampled from that prefix); NaN where the row has no k-th turn.
    lengths:   [B] policy tokens per row, for rows that stand for whole episodes (a caller that
               holds only per-episode summaries passes [B, 1] rows: rewards = the scores, mask = 1,
               and each episode's number of policy tokens here); None: counted from ``mask``.
    """

    rewards: Tensor
    mask: Tensor
    values: Tensor | None = None
    groups: Tensor | None = None
    turn_ids: Tensor | None = None
    last_value: Tensor | None = None
    gamma: float = 1.0
    lam: float = 0.95
    logprobs: Tensor | None = None
    sum_pi_squared: Tensor | None = None
    reward_baselines: Tensor | None = None
    turn_states: Tensor | None = None
    turn_values: Tensor | None = None
    lengths: Tensor | None = None

    @property
    def policy_lengths(self) -> Tensor:
        """[B] policy tokens per row: ``lengths`` when given, else counted from ``mask``."""
        if self.lengths is not None:
            return self.lengths
        return (self.mask != 0).sum(-1)

    def has(self, name: str) -> bool:
        """True when input ``name`` (a key of :data:`INPUTS`) is there to read: the ones with a
        default (rewards, scores, lengths, groups, turn_ids) always are; the others when not None."""
        if name not in INPUTS:
            raise KeyError(f"unknown input {name!r}; known: {', '.join(INPUTS)}")
        if name in _ALWAYS:
            return True
        return getattr(self, name) is not None

    @property
    def scores(self) -> Tensor:
        """[B] per-episode score: the sum of rewards over policy positions (verl sums the whole
        row without the mask; outcome estimators take ``score="unmasked"`` for that)."""
        return (self.rewards * (self.mask != 0).to(self.rewards.dtype)).sum(-1)


@dataclass
class EstimatorOutput:
    """advantages: [B, T], 0 off-mask. value_targets: [B, T] (returns / lambda-returns), or None."""

    advantages: Tensor
    value_targets: Tensor | None = None
    extras: dict[str, Any] = field(default_factory=dict)


EstimatorFn = Callable[..., EstimatorOutput]

# What an estimator may read (``EstimatorSpec.reads`` / ``may_read``): EstimatorInput fields and
# per-row summaries of them. The mask is always read and not listed.
INPUTS: dict[str, str] = {
    "rewards": "per-token rewards [B, T] (the token layout of each row)",
    "scores": "one score per episode [B] (rewards summed over policy tokens)",
    "lengths": "policy tokens per episode [B]",
    "groups": "group labels [B] (None: the batch is one group)",
    "turn_ids": "turn index per token [B, T] (None: a turn is a maximal run of policy tokens)",
    "values": "critic values [B, T]",
    "last_value": "bootstrap values of truncated rows [B]",
    "logprobs": "log-probabilities of the chosen tokens [B, T]",
    "sum_pi_squared": "sum over the vocabulary of pi^2 [B, T]",
    "reward_baselines": "per-row baseline rewards [B]",
    "turn_states": "anchor-state id of each turn [B, K]",
    "turn_values": "Monte Carlo value of the state before each turn [B, K]",
}
# Inputs that are always there to read (derived from rewards and mask, or with a default).
_ALWAYS = frozenset({"rewards", "scores", "lengths", "groups", "turn_ids"})
# Inputs that a per-episode summary row carries: an outcome estimator that reads nothing else can be
# computed from [B] columns ([B, 1] rows of scores with ``lengths``), without the token layout.
SUMMARY_INPUTS = frozenset({"scores", "groups", "lengths"})


@dataclass(frozen=True)
class EstimatorSpec:
    """A registered estimator.

    name:        the public name (used in URLs: ``scheme=name``).
    fn:          ``fn(inp, **params) -> EstimatorOutput``.
    label:       short human label for legends.
    description: one or two sentences for tooltips and docs.
    kind:        "outcome" (one number per episode, broadcast), "token" or "turn".
    reads:       the inputs it reads (keys of :data:`INPUTS`); each must be there
                 (:meth:`EstimatorInput.has`), :func:`compute` refuses the call otherwise.
    may_read:    inputs it reads when they are given and does without otherwise.
    params:      the keyword parameters it accepts, with defaults (documented choices).
    verl_name:   the name in verl 0.9.1's registry this corresponds to, if any.
    trainer:     for a trainer's dialect (``"<trainer>:<name>"``): the key of :data:`TRAINERS` whose
                 code it reproduces, quirks included; None for the reference estimators.
    version:     the trainer's version whose code the dialect reproduces (and is checked against).
    reference:   for a dialect, the reference estimator computing the same quantity under our
                 conventions (``token_gae`` for a trainer's GAE); the audit names the tokens where
                 they differ.
    departs:     for a dialect, the audit's codes of the known departures from our conventions its
                 quirks produce (``estimators.audit.departures.DEPARTURES``): when an upload's best
                 match is this dialect, the audit reports each one it can see on the batch.
    """

    name: str
    fn: EstimatorFn
    label: str
    description: str
    kind: str
    reads: tuple[str, ...] = ("rewards",)
    may_read: tuple[str, ...] = ()
    params: dict[str, Any] = field(default_factory=dict)
    verl_name: str | None = None
    trainer: str | None = None
    version: str | None = None
    reference: str | None = None
    departs: tuple[str, ...] = ()

    @property
    def needs_values(self) -> bool:
        """True when the estimator reads critic values."""
        return "values" in self.reads

    @property
    def from_summaries(self) -> bool:
        """True for an outcome estimator that reads only per-episode summaries (:data:`SUMMARY_INPUTS`)."""
        return self.kind == "outcome" and set(self.reads) <= SUMMARY_INPUTS

    def missing(self, inp: EstimatorInput) -> list[str]:
        """The inputs of ``reads`` that ``inp`` does not have, in ``reads`` order."""
        return [x for x in self.reads if not inp.has(x)]


_REGISTRY: dict[str, EstimatorSpec] = {}

# The trainers whose credit the dialects reproduce: key -> (display name, the version checked).
TRAINERS: dict[str, tuple[str, str]] = {
    "verl": ("verl", "0.9.1"),
    "trl": ("TRL", "1.16.0"),
    "openrlhf": ("OpenRLHF", "0.11.2"),
    "skyrl": ("SkyRL", "0.3.0"),
    "areal": ("AReaL", "1.0.4"),
    "nemo_rl": ("NeMo-RL", "0.7.0"),
    "prime_rl": ("prime-rl", "0.8.1.dev"),
    "slime": ("slime", "0.3.1"),
}


def register(
    name: str,
    *,
    label: str,
    description: str,
    kind: str,
    reads: tuple[str, ...] = ("rewards",),
    may_read: tuple[str, ...] = (),
    params: dict[str, Any] | None = None,
    verl_name: str | None = None,
    trainer: str | None = None,
    version: str | None = None,
    reference: str | None = None,
    departs: tuple[str, ...] = (),
) -> Callable[[EstimatorFn], EstimatorFn]:
    """Decorator: add ``fn`` to the registry under ``name``. ``reads``/``may_read``: see
    :class:`EstimatorSpec` (names from :data:`INPUTS`). A trainer's dialect is registered as
    ``"<trainer>:<the trainer's own name>"`` with ``trainer`` (a key of :data:`TRAINERS`) and the
    ``version`` of the code it reproduces."""

    if trainer is not None:
        if trainer not in TRAINERS:
            raise ValueError(f"unknown trainer {trainer!r}; known: {', '.join(TRAINERS)}")
        if not name.startswith(f"{trainer}:"):
            raise ValueError(f"a {trainer} dialect is named '{trainer}:<name>', not {name!r}")
        if not version:
            raise ValueError(f"dialect {name!r} must say which {trainer} version it reproduces")
    elif ":" in name:
        raise ValueError(f"{name!r}: only a trainer's dialect (trainer=...) has a ':' in its name")
    elif reference is not None or departs:
        raise ValueError(f"{name!r}: reference= and departs= describe a trainer's dialect (trainer=...)")
    if kind not in ("outcome", "token", "turn"):
        raise ValueError(f"kind must be outcome, token or turn, not {kind!r}")
    unknown = [x for x in (*reads, *may_read) if x not in INPUTS]
    if unknown:
        raise ValueError(f"estimator {name!r} reads unknown input(s) {unknown}; known: {', '.join(INPUTS)}")

    def deco(fn: EstimatorFn) -> EstimatorFn:
        if name in _REGISTRY:
            raise ValueError(f"estimator {name!r} is already registered")
        _REGISTRY[name] = EstimatorSpec(
            name=name,
            fn=fn,
            label=label,
            description=description,
            kind=kind,
            reads=tuple(reads),
            may_read=tuple(may_read),
            params=dict(params or {}),
            verl_name=verl_name,
            trainer=trainer,
            version=version,
            reference=reference,
            departs=tuple(departs),
        )
        return fn

    return deco


def unregister(name: str) -> None:
    """Remove ``name`` from the registry (a test's or a plugin's own estimator); KeyError if unknown."""
    del _REGISTRY[name]


def available() -> dict[str, EstimatorSpec]:
    """All registered estimators by name, in registration order."""
    return dict(_REGISTRY)


def get(name: str) -> EstimatorSpec:
    """The spec for ``name``; KeyError with the list of names if unknown."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown estimator {name!r}; known: {', '.join(_REGISTRY)}") from None


def compute(name: str, inp: EstimatorInput, **params: Any) -> EstimatorOutput:
    """Run estimator ``name`` on ``inp``. Unknown params raise TypeError naming them."""
    spec = get(name)
    unknown = set(params) - set(spec.params)
    if unknown:
        raise TypeError(
            f"estimator {name!r} takes no parameter(s) {sorted(unknown)}; it takes {sorted(spec.params)}"
        )
    missing = spec.missing(inp)
    if missing:
        raise ValueError(
            f"estimator {name!r} reads {', '.join(missing)} ({'; '.join(INPUTS[x] for x in missing)}), "
            "which this input does not have"
        )
    with torch.no_grad():
        return spec.fn(inp, **params)
