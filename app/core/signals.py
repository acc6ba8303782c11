"""Per-token signal rows of the episode page: what the policy's own numbers say at each token,
beside the advantage rows. Each row is plain arithmetic on the uploaded arrays:

* ``logprob``: ``logprobs`` (the training policy's log-probability of the token);
* ``entropy``: ``entropy`` (the policy's entropy at the position);
* ``kl``: ``logprobs - ref_logprobs`` (the per-token k1 estimate of KL to the reference);
* ``ratio``: ``exp(logprobs - rollout_logprobs)`` (training vs rollout engine mismatch; 1 = none);
* ``token_scores``, ``token_weights``: per-token rows a format keeps in ``meta.token_signals``
  (a ``{name: [T numbers]}`` object; Atropos' ``token_scores`` and ``token_weights``). A signal
  whose ``needs`` name ``meta:<name>`` reads ``meta.token_signals[<name>]``.

Values are served on policy tokens only (null elsewhere): trainers fill the prompt with zeros and
never train on tool output, so a number there says nothing about the policy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypedDict

import numpy as np

from app.core.arrays import EpisodeArrays
from app.core.errors import ApiError


class Signal(NamedTuple):
    """One signal row, declared once: everything the service and the page need to know of it.

    label, description: for the legend and the "Rows shown" panel.
    scale:     "sequential" (0 … max, white to one hue), "diverging" (around 0) or "ratio"
               (diverging around 1 on a log scale).
    needs:     the EpisodeArrays fields it reads (``meta:<name>``: ``meta.token_signals[<name>]``).
    values:    the arithmetic: ``values(ep) -> [T]`` (only called when every field of ``needs`` is there).
    pos, neg:  the colours ([r, g, b]) its largest positive and negative magnitudes are drawn in
               (``neg`` None: one hue from white); the page reads them from :func:`catalog`.
    magnitude: what the colour is a function of: "value", "surprise" (−value: −logp) or "log" (log of
               the value: a ratio around 1).
    floor:     below this magnitude the row stays pale (float noise is not a signal).

    **Adding a signal** is one entry of :data:`SIGNAL_ROWS` (and, when it reads a new per-token
    array, that field in ``app.core.arrays.SIGNAL_FIELDS``)."""

    label: str
    scale: str
    needs: tuple[str, ...]
    description: str
    values: Callable[[EpisodeArrays], np.ndarray]
    pos: tuple[int, int, int]
    neg: tuple[int, int, int] | None = None
    magnitude: str = "value"
    floor: float = 1e-6


def _field(name: str) -> Callable[[EpisodeArrays], np.ndarray]:
    return lambda ep: np.array(_present(getattr(ep, name), name), dtype=np.float64)


def _meta(name: str) -> Callable[[EpisodeArrays], np.ndarray]:
    return lambda ep: np.array(_present_list(_meta_row(ep, name), name), dtype=np.float64)


# The signal rows a page can show (name -> how to compute and draw it); the raw per-token fields
# they read are app.core.arrays.SIGNAL_FIELDS.
SIGNAL_ROWS: dict[str, Signal] = {
    "logprob": Signal(
        "log-prob",
        "sequential",
        ("logprobs",),
        "The policy's log-probability of the token (darker = less likely).",
        _field("logprobs"),
        pos=(166, 54, 3),
        magnitude="surprise",
    ),
    "entropy": Signal(
        "entropy",
        "sequential",
        ("entropy",),
        "The policy's entropy at the position.",
        _field("entropy"),
        pos=(84, 39, 143),
    ),
    "kl": Signal(
        "KL (logp − ref)",
        "diverging",
        ("logprobs", "ref_logprobs"),
        "logprobs − ref_logprobs: the per-token k1 estimate of the KL to the reference policy.",
        lambda ep: _present(ep.logprobs, "kl") - _present(ep.ref_logprobs, "kl"),
        pos=(140, 81, 10),
        neg=(1, 102, 94),
    ),
    "ratio": Signal(
        "ratio train/rollout",
        "ratio",
        ("logprobs", "rollout_logprobs"),
        "exp(logprobs − rollout_logprobs): the training/rollout engine mismatch (1 = none).",
        lambda ep: np.exp(_present(ep.logprobs, "ratio") - _present(ep.rollout_logprobs, "ratio")),
        pos=(197, 27, 125),
        neg=(77, 146, 33),
        magnitude="log",
        floor=1e-3,
    ),
    "token_scores": Signal(
        "token score",
        "diverging",
        ("meta:token_scores",),
        "Per-token scores the environment gave (Atropos `token_scores`).",
        _meta("token_scores"),
        pos=(140, 81, 10),
        neg=(1, 102, 94),
    ),
    "token_weights": Signal(
        "token weight",
        "sequential",
        ("meta:token_weights",),
        "Per-token weights the environment gave (Atropos `token_weights`).",
        _meta("token_weights"),
        pos=(140, 81, 10),
    ),
}

META = "meta:"


def _meta_row(ep: EpisodeArrays, name: str) -> list[Any] | None:
    rows = ep.meta.get("token_signals") if isinstance(ep.meta, dict) else None
    row = rows.get(name) if isinstance(rows, dict) else None
    return row if isinstance(row, list) and len(row) == len(ep.kinds) else None


def _has(ep: EpisodeArrays, need: str) -> bool:
    if need.startswith(META):
        return _meta_row(ep, need[len(META) :]) is not None
    return getattr(ep, need) is not None


def available_signals(ep: EpisodeArrays) -> list[str]:
    """The signal names this episode has the arrays for, in catalog order."""
    return [n for n, s in SIGNAL_ROWS.items() if all(_has(ep, f) for f in s.needs)]


def parse_signals(raw: Sequence[str] | None) -> list[str]:
    """Repeated and/or comma-separated ``signal`` values -> de-duplicated names; ApiError 422
    naming the field for a name that is not a signal."""
    names: list[str] = []
    for item in raw or ():
        for s in item.split(","):
            s = s.strip()
            if not s or s in names:
                continue
            if s not in SIGNAL_ROWS:
                raise ApiError(
                    422,
                    "unknown_signal",
                    f"signal {s!r} is not known; choose from {', '.join(SIGNAL_ROWS)}.",
                    field="signal",
                )
            names.append(s)
    return names


def _present(a: np.ndarray | None, name: str) -> np.ndarray:
    """``a``, which :func:`available_signals` said the episode has (KeyError when it has not)."""
    if a is None:
        raise KeyError(name)
    return a


def _present_list(a: list[Any] | None, name: str) -> list[Any]:
    if a is None:
        raise KeyError(name)
    return a


def signal_values(ep: EpisodeArrays, name: str) -> np.ndarray:
    """[T] float64 of one signal, NaN off-policy (orjson writes null). The arrays must exist
    (:func:`available_signals`); KeyError for a name that is not a signal."""
    v = np.asarray(SIGNAL_ROWS[name].values(ep), dtype=np.float64).copy()
    v[~ep.policy] = np.nan
    return v


def signal_rows(ep: EpisodeArrays, names: Sequence[str], as_numpy: bool = False) -> list[dict[str, Any]]:
    """The rows of ``names`` this episode has data for (the others are left out; see
    :func:`available_signals`): [{name, label, scale, values}]. ``as_numpy``: values as float64
    arrays with NaN for null (serialise with app.http.api._json.dumps); default lists with None."""
    have = set(available_signals(ep))
    out = []
    for n in names:
        if n not in have:
            continue
        v = signal_values(ep, n)
        vals: Any = v
        if not as_numpy:
            o = v.astype(object)
            o[np.isnan(v)] = None
            vals = o.tolist()
        out.append({"name": n, "label": SIGNAL_ROWS[n].label, "scale": SIGNAL_ROWS[n].scale, "values": vals})
    return out


class SignalInfo(TypedDict):
    """One entry of :func:`catalog`."""

    name: str
    label: str
    scale: str
    needs: list[str]
    description: str
    pos: list[int]
    neg: list[int] | None
    magnitude: str
    floor: float


def catalog() -> list[SignalInfo]:
    """Every signal the service knows, with how the page draws it: [{name, label, scale, needs,
    description, pos, neg, magnitude, floor}] (the page state hands it to static/util.js)."""
    return [
        {
            "name": n,
            "label": s.label,
            "scale": s.scale,
            "needs": list(s.needs),
            "description": s.description,
            "pos": list(s.pos),
            "neg": None if s.neg is None else list(s.neg),
            "magnitude": s.magnitude,
            "floor": s.floor,
        }
        for n, s in SIGNAL_ROWS.items()
    ]
