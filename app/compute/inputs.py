"""What an episode gives the schemes: the inputs it has, and the 422 for a scheme that reads one it lacks.

Input names are the registry's (estimators/registry.py ``INPUTS``: values, logprobs, turn_values, ...)
plus ``advantages`` (the trainer's own, which the service schemes ``uploaded`` and ``audit_*`` read).
A scheme says what it reads (``EstimatorSpec.reads``, ``ServiceScheme.reads``); whether the service
can run it on an episode, what it loads for it and what the 422 says all follow from those names
and :data:`SOURCES`, never from the scheme's name.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import NamedTuple

from app.core import schemes as sc
from app.core.arrays import EpisodeArrays
from app.core.errors import ApiError

# Inputs the service always supplies: computed from the stored tokens (scores, lengths, turn ids,
# the anchor state before each turn) or with a meaning when absent (groups: a group of its own).
ALWAYS = frozenset({"rewards", "scores", "lengths", "groups", "turn_ids", "turn_states"})


class Source(NamedTuple):
    """Where an input comes from in an upload, for the 422 of a scheme that reads it."""

    what: str  # what the scheme needs ("critic values")
    where: str  # the upload field that carries it


SOURCES: dict[str, Source] = {
    "values": Source("critic values", "the per-token field `values`"),
    "logprobs": Source("log-probabilities of the chosen tokens", "the per-token field `logprobs`"),
    "turn_values": Source("a value of the state before each turn", "`meta.turn_values`"),
    "advantages": Source("advantages in the upload", "the per-token field `advantages`"),
    "last_value": Source("a bootstrap value", "`bootstrap_value` of a truncated episode"),
    "sum_pi_squared": Source("the vocabulary sum of pi^2", "not uploaded to the service"),
    "reward_baselines": Source("per-episode baseline rewards", "not uploaded to the service"),
}


def inputs_of(
    *,
    values: bool,
    logprobs: bool,
    turn_values: bool,
    advantages: bool,
    bootstrap: bool = False,
    critic: str = sc.DEFAULT_CRITIC,
) -> frozenset[str]:
    """The inputs of an episode with these uploaded fields, under ``critic`` (``zero`` supplies
    values: V = 0; a bootstrap value is used with the uploaded critic only)."""
    have = set(ALWAYS)
    if critic == sc.NO_CRITIC or (values and critic == "upload"):
        have.add("values")
    if bootstrap and critic == "upload":
        have.add("last_value")
    for name, present in (("logprobs", logprobs), ("turn_values", turn_values), ("advantages", advantages)):
        if present:
            have.add(name)
    return frozenset(have)


def episode_inputs(ep: EpisodeArrays, critic: str = sc.DEFAULT_CRITIC) -> frozenset[str]:
    """The inputs ``ep`` has under ``critic`` (see :func:`inputs_of`)."""
    return inputs_of(
        values=ep.values is not None,
        logprobs=ep.logprobs is not None,
        turn_values=ep.meta.get("turn_values") is not None,
        advantages=ep.advantages is not None,
        bootstrap=bool(ep.truncated and ep.bootstrap_value is not None),
        critic=critic,
    )


def missing(schemes: Iterable[str], have: Collection[str]) -> dict[str, list[str]]:
    """scheme -> the inputs it reads that are not in ``have`` (schemes missing nothing left out)."""
    out = {}
    for s in schemes:
        lack = [x for x in sc.reads_of(s) if x not in have]
        if lack:
            out[s] = lack
    return out


def check_reads(schemes: list[str], have: frozenset[str]) -> None:
    """ApiError 422 for the first scheme of ``schemes`` that reads an input the episode lacks: the
    field and message name the input. Critic values come last and suggest ``critic=zero``."""
    lacking = missing(schemes, have)
    for s, lack in lacking.items():
        other = [x for x in lack if x != "values"]
        if other:
            src = SOURCES[other[0]]
            raise ApiError(
                422,
                # The service's own schemes are not offered for such an episode at all.
                "unknown_scheme" if s in sc.SERVICE_SCHEMES else "scheme_not_applicable",
                f"scheme `{s}` needs {src.what} ({src.where}), which this episode does not have.",
                field="scheme",
            )
    needing = [s for s, lack in lacking.items() if "values" in lack]
    if needing:
        free = [s for s in (*sc.DEFAULT_SCHEMES, *sc.DEFAULT_FILL) if "values" not in sc.reads_of(s)]
        raise ApiError(
            422,
            "no_values",
            f"scheme(s) {', '.join(needing)} need critic values, but this episode was uploaded without "
            f"`values`; add critic=zero to use V = 0, or pick a critic-free scheme ({', '.join(free)}).",
            field="critic",
        )
