"""Query-parameter specs for the lab figures: parse, validate and canonicalise.

Every figure's whole state is its query string. :func:`parse` turns the raw query into a canonical
dict (defaults filled, numbers normalised) whose sorted JSON is the cache key; a bad value raises
:class:`~app.core.errors.ApiError` (422) naming the parameter, in the service's one error shape.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from app.core.errors import ApiError

# A figure's canonical parameters (:func:`parse`) and its result: plain JSON values.
Params = dict[str, Any]
Result = dict[str, Any]


def param_error(field: str | None, message: str, code: str = "invalid_param") -> ApiError:
    """A rejected query parameter: a 422 in the service's one error shape, ``field`` naming it."""
    return ApiError(422, code, message, field=field)


# The old name of the lab's parameter error, still caught by callers (tests/lab).
LabParamError = ApiError


def as_fraction(x: float) -> Fraction:
    """The decimal the user typed as an exact Fraction (0.3 -> 3/10, not the binary float)."""
    return Fraction(repr(float(x)))


@dataclass(frozen=True)
class Param:
    """One query parameter. kind: int | float | floats (comma-separated list) | choice | ints |
    names (a comma-separated list of distinct ``choices``)."""

    name: str
    kind: str
    default: Any
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] = ()
    max_items: int = 64
    help: str = ""

    def parse(self, raw: str) -> Any:
        raw = raw.strip()
        if self.kind == "choice":
            if raw not in self.choices:
                raise param_error(
                    self.name, f"{self.name} must be one of {', '.join(self.choices)}, not {raw!r}"
                )
            return raw
        if self.kind == "names":
            parts = [p.strip() for p in raw.split(",") if p.strip()]
            if not parts:
                raise param_error(self.name, f"{self.name} needs at least one of {', '.join(self.choices)}")
            if len(parts) > self.max_items:
                raise param_error(
                    self.name, f"{self.name} takes at most {self.max_items} names, got {len(parts)}"
                )
            bad = [p for p in parts if p not in self.choices]
            if bad:
                raise param_error(
                    self.name, f"{self.name}: {bad[0]!r} is not one of {', '.join(self.choices)}"
                )
            if len(set(parts)) != len(parts):
                raise param_error(self.name, f"{self.name} names an entry twice")
            return parts
        if self.kind in ("floats", "ints"):
            parts = [p for p in raw.split(",") if p.strip()]
            if not parts:
                raise param_error(self.name, f"{self.name} needs at least one number")
            if len(parts) > self.max_items:
                raise param_error(
                    self.name, f"{self.name} takes at most {self.max_items} values, got {len(parts)}"
                )
            one = Param(self.name, self.kind[:-1], None, self.lo, self.hi)
            return [one.parse(p) for p in parts]
        if self.kind == "int":
            try:
                value: Any = int(raw)
            except ValueError:
                raise param_error(
                    self.name, f"{self.name} must be an integer{self._range()}, not {raw!r}"
                ) from None
        else:
            try:
                value = float(raw)
            except ValueError:
                raise param_error(
                    self.name, f"{self.name} must be a number{self._range()}, not {raw!r}"
                ) from None
            if not math.isfinite(value):
                raise param_error(self.name, f"{self.name} must be finite{self._range()}, not {raw!r}")
            value = value + 0.0  # -0.0 -> 0.0 so equal values share a cache key
        if (self.lo is not None and value < self.lo) or (self.hi is not None and value > self.hi):
            raise param_error(
                self.name, f"{self.name} must lie in [{_fmt(self.lo)}, {_fmt(self.hi)}], not {raw}"
            )
        return value

    def _range(self) -> str:
        """ " in [lo, hi]" when the parameter has caps (every 422 states them)."""
        if self.lo is None and self.hi is None:
            return ""
        return f" in [{_fmt(self.lo)}, {'inf' if self.hi is None else _fmt(self.hi)}]"


def _fmt(x: float | None) -> str:
    return "-inf" if x is None else (str(int(x)) if float(x).is_integer() else str(x))


# Keys that select a representation, not a result; they never reach the cache key.
RESERVED = {"format"}


def parse(specs: Mapping[str, Param], query: Mapping[str, str] | list[tuple[str, str]]) -> Params:
    """Canonical parameters from a raw query: unknown names and repeated names are errors."""
    items = list(query.items()) if isinstance(query, Mapping) else list(query)
    seen: dict[str, str] = {}
    for key, raw in items:
        if key in RESERVED:
            continue
        if key not in specs:
            raise param_error(
                key, f"unknown parameter {key!r}; this figure takes {', '.join(specs)}", code="unknown_param"
            )
        if key in seen:
            raise param_error(key, f"parameter {key!r} given more than once", code="repeated_param")
        seen[key] = raw
    out = {}
    for name, spec in specs.items():
        out[name] = spec.parse(seen[name]) if name in seen and seen[name].strip() != "" else spec.default
    return out


def canonical_json(params: Mapping[str, Any]) -> str:
    """Sorted, compact JSON: equal parameters give the same string (the cache key)."""
    return json.dumps(params, sort_keys=True, separators=(",", ":"))
