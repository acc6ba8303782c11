"""The advantages API's view parameters: the scheme list as given, the schemes an episode can show,
and the 422 for anything the API cannot honour (a bad number, an unknown name, an input the episode
lacks; the last decided from the schemes' ``reads``, app/compute/inputs.py)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from app.compute.inputs import check_reads, episode_inputs, missing
from app.core import schemes as sc
from app.core.arrays import EpisodeArrays
from app.core.errors import ApiError
from estimators import available


def parse_schemes(raw: Sequence[str] | None) -> list[str]:
    """Repeated and/or comma-separated ``scheme`` values -> a de-duplicated list ([] when none:
    the caller shows the episode's default view, :func:`app.core.schemes.default_schemes`)."""
    names: list[str] = []
    for item in raw or ():
        for s in item.split(","):
            s = s.strip()
            if s and s not in names:
                names.append(s)
    return names


def known_schemes(ep: EpisodeArrays | None = None) -> list[str]:
    """Every scheme name the advantages API accepts (for ``ep``: those whose inputs it has, critic
    values aside, which ``critic=zero`` supplies)."""
    names = ["outcome", *available(), *(s for s in sc.SERVICE_SCHEMES if s != "outcome")]
    if ep is None:
        return names
    lacking = missing(names, episode_inputs(ep, sc.NO_CRITIC))
    return [n for n in names if n not in lacking]


def validate_params(
    ep: EpisodeArrays, schemes: list[str], gamma: float, lam: float, baseline: str, critic: str
) -> None:
    """ApiError 422 with a message naming the parameter for anything the API cannot honour."""
    for name, v in (("gamma", gamma), ("lam", lam)):
        if not (math.isfinite(v) and 0.0 <= v <= 1.0):
            raise ApiError(
                422, "bad_parameter", f"parameter `{name}` is {v}; it must be between 0 and 1.", field=name
            )
    if baseline not in sc.BASELINES:
        raise ApiError(
            422,
            "bad_parameter",
            f"parameter `baseline` is {baseline!r}; choose one of {', '.join(sc.BASELINES)}.",
            field="baseline",
        )
    if critic not in sc.CRITICS:
        raise ApiError(
            422,
            "bad_parameter",
            f"parameter `critic` is {critic!r}; choose {' or '.join(sc.CRITICS)}.",
            field="critic",
        )
    specs = available()
    for s in schemes:
        if s not in specs and s not in sc.SERVICE_SCHEMES:
            raise ApiError(
                422,
                "unknown_scheme",
                f"scheme {s!r} is not known; choose from {', '.join(known_schemes(ep))}.",
                field="scheme",
            )
    check_reads(schemes, episode_inputs(ep, critic))
