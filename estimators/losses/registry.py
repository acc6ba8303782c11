"""One registry of policy losses, one call shape, as the estimators have (estimators/registry.py).

A loss is a function ``fn(x: LossInput, **params) -> (weights [B, T], states [B, T] uint8)``
registered with :func:`register_loss` under its public name, with its parameters
(:class:`LossParam`: name, default, choices, how a URL's text reads) and the trainer and version
whose code it reproduces. A trainer's loss is named ``"<trainer>:<its own name>"`` (``trl:dapo``,
``openrlhf:ppo``, ``skyrl:regular``); verl's are also registered under their plain names
(``vanilla``) with ``verl:<name>`` aliases. :func:`loss_weights` and its two siblings run any of
them; the service and the pages read :func:`available_losses` for the names, parameters and
defaults.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from ..registry import TRAINERS
from .core import BatchShape, LossInput, parse_threshold

__all__ = [
    "DEFAULT_LOSS",
    "LossParam",
    "LossSpec",
    "available_losses",
    "get_loss",
    "loss_token_states",
    "loss_weights",
    "loss_weights_and_states",
    "register_loss",
]

# The loss a call, a link or a page without ``loss`` gets: verl's PPO (the service's default).
DEFAULT_LOSS = "vanilla"

LossFn = Callable[..., tuple[Tensor, Tensor]]

# How a parameter's value is read from text (a URL) and written back.
KINDS = ("choice", "float", "optional_float", "int", "threshold", "threshold_pair")


@dataclass(frozen=True)
class LossParam:
    """One parameter of a loss.

    name: the keyword (the trainer's own config key, or its last part). default: its value when not
    given (the trainer's default). kind: how text reads (:data:`KINDS`): ``choice`` (one of
    ``choices``), ``float``, ``optional_float`` (``none`` for None), ``int``, ``threshold`` (a
    number or ``lo_hi``, :func:`parse_threshold`), ``threshold_pair`` (``hi`` or ``lo_hi``: a
    (lo, hi) pair, lo 0 when only hi is given; ``none`` when the default is None). help: one line for the pages and docs. control: offered as a control on the pages.
    """

    name: str
    default: Any
    kind: str
    help: str
    choices: tuple[str, ...] = ()
    control: bool = False

    def check(self, value: Any) -> Any:
        """``value`` as the loss takes it, or ValueError/TypeError naming the parameter."""
        if self.kind == "choice":
            v = "none" if value is None and "none" in self.choices else value
            if v not in self.choices:
                raise ValueError(f"unknown {self.name} {value!r}; one of {', '.join(self.choices)}")
            return v
        if self.kind == "threshold":
            parse_threshold(value)
            return value
        if self.kind == "threshold_pair":
            return None if value is None and self.default is None else _pair(self.name, value)
        if self.kind == "optional_float" and value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"{self.name} must be a number, not {value!r}")
        if self.kind == "int":
            if int(value) != value:
                raise ValueError(f"{self.name} must be a whole number, got {value!r}")
            return int(value)
        return float(value)

    def parse(self, text: str) -> Any:
        """The value of a URL's text (ValueError saying what is allowed)."""
        s = text.strip()
        if self.kind == "choice":
            return self.check(s)
        if self.kind == "threshold_pair" and self.default is None and s.lower() in ("", "none", "null"):
            return None
        if self.kind == "threshold":  # a number as a number (TIS), a window as its "lo_hi" text
            upper, lower = parse_threshold(s)
            return s if lower is not None else upper
        if self.kind == "threshold_pair":
            return self.check(s)
        if self.kind == "optional_float" and s.lower() in ("", "none", "null"):
            return None
        try:
            x = float(s)
        except ValueError:
            x = math.nan
        if not math.isfinite(x):
            raise ValueError(f"{self.name} {text!r}: a finite number")
        return self.check(int(x) if self.kind == "int" and x == int(x) else x)

    def text(self, value: Any) -> str:
        """``value`` written as a URL carries it (``2.0`` -> ``"2"``, None -> ``"none"``)."""
        if value is None:
            return "none"
        if isinstance(value, tuple):
            return "_".join(f"{float(v):.6g}" for v in value)
        if isinstance(value, float | int) and not isinstance(value, bool):
            return f"{float(value):.6g}"
        return str(value)


def _pair(name: str, value: Any) -> tuple[float, float]:
    """(lo, hi) from ``hi``, ``"hi"``, ``"lo_hi"`` or a 2-sequence (lo 0 when only hi is given)."""
    if isinstance(value, str):
        parts = value.strip().split("_")
        try:
            nums = [float(p) for p in parts]
        except ValueError:
            nums = []
    elif isinstance(value, int | float) and not isinstance(value, bool):
        nums = [float(value)]
    elif isinstance(value, tuple | list):
        nums = [float(v) for v in value]
    else:
        nums = []
    if len(nums) == 1:
        nums = [0.0, nums[0]]
    if len(nums) != 2 or not all(math.isfinite(v) for v in nums) or not 0 <= nums[0] <= nums[1]:
        raise ValueError(f"{name} {value!r}: hi or lo_hi with 0 <= lo <= hi")
    return nums[0], nums[1]


@dataclass(frozen=True)
class LossSpec:
    """A registered loss.

    name: its public name (``loss=`` in URLs). fn: ``fn(x: LossInput, **params) -> (w, states)``
    with every parameter given. label, description: for legends, tooltips and docs. params: its
    :class:`LossParam` by name, in order. trainer, version: whose code it reproduces (a key of
    ``estimators.registry.TRAINERS``) and which version it is checked against. needs_rollout:
    True when the loss with these parameter values needs ``rollout_log_prob`` (a rollout
    correction; the call refuses it without them); given rollout log-probs reach every loss.
    alias_of: for an alias (``verl:vanilla``), the name it stands for.
    """

    name: str
    fn: LossFn
    label: str
    description: str
    params: dict[str, LossParam]
    trainer: str
    version: str
    needs_rollout: Callable[[dict[str, Any]], bool] = field(default=lambda _p: False)
    alias_of: str | None = None

    def defaults(self) -> dict[str, Any]:
        """{parameter: default}."""
        return {n: p.default for n, p in self.params.items()}

    def resolve(self, given: dict[str, Any]) -> dict[str, Any]:
        """Every parameter's value: ``given`` checked, the defaults for the rest. TypeError naming
        a parameter the loss does not take (and the ones it does)."""
        unknown = sorted(set(given) - set(self.params))
        if unknown:
            raise TypeError(
                f"loss {self.name!r} takes no parameter(s) {unknown}; it takes {', '.join(self.params) or 'none'}"
            )
        out = self.defaults()
        for k, v in given.items():
            out[k] = self.params[k].check(v)
        return out


_LOSSES: dict[str, LossSpec] = {}


def register_loss(
    name: str,
    *,
    label: str,
    description: str,
    params: tuple[LossParam, ...],
    trainer: str,
    version: str,
    needs_rollout: Callable[[dict[str, Any]], bool] | None = None,
    aliases: tuple[str, ...] = (),
) -> Callable[[LossFn], LossFn]:
    """Decorator: add ``fn`` under ``name``. A trainer's loss is named ``"<trainer>:<its name>"``;
    verl's plain names (``vanilla``) are the one exception, each with a ``verl:`` alias in
    ``aliases``."""
    if trainer not in TRAINERS:
        raise ValueError(f"unknown trainer {trainer!r}; known: {', '.join(TRAINERS)}")
    if ":" in name and not name.startswith(f"{trainer}:"):
        raise ValueError(f"a {trainer} loss is named '{trainer}:<name>', not {name!r}")
    if ":" not in name and trainer != "verl":
        raise ValueError(f"{name!r}: only verl's losses have plain names")
    for p in params:
        if p.kind not in KINDS:
            raise ValueError(f"parameter {p.name!r}: kind must be one of {KINDS}")
        p.check(p.default)

    def deco(fn: LossFn) -> LossFn:
        spec = LossSpec(
            name=name,
            fn=fn,
            label=label,
            description=description,
            params={p.name: p for p in params},
            trainer=trainer,
            version=version,
            needs_rollout=needs_rollout or (lambda _p: False),
        )
        for n in (name, *aliases):
            if n in _LOSSES:
                raise ValueError(f"loss {n!r} is already registered")
            if n != name and not n.startswith(f"{trainer}:"):
                raise ValueError(f"alias {n!r} of {name!r} must be named '{trainer}:<name>'")
        _LOSSES[name] = spec
        for n in aliases:
            _LOSSES[n] = replace(spec, name=n, alias_of=name)
        return fn

    return deco


def available_losses(aliases: bool = True) -> dict[str, LossSpec]:
    """Every registered loss by name, trainer by trainer in ``TRAINERS`` order (verl's first), each
    trainer's in registration order (without the aliases when ``aliases`` is False)."""
    order = list(TRAINERS)
    specs = sorted(_LOSSES.values(), key=lambda s: order.index(s.trainer))  # stable: keeps registration order
    return {s.name: s for s in specs if aliases or s.alias_of is None}


def get_loss(name: str) -> LossSpec:
    """The spec of ``name``; ValueError listing the known names if unknown."""
    try:
        return _LOSSES[name]
    except KeyError:
        raise ValueError(f"unknown loss {name!r}; one of {', '.join(available_losses())}") from None


def _dtype(*xs: Tensor) -> torch.dtype:
    floats = [x.dtype for x in xs if x.is_floating_point()]
    dtype = floats[0] if floats else torch.get_default_dtype()
    for dt in floats[1:]:
        dtype = torch.promote_types(dtype, dt)
    return dtype


def _run(
    advantages: Tensor,
    log_prob: Tensor,
    old_log_prob: Tensor,
    mask: Tensor,
    rollout_log_prob: Tensor | None,
    loss: str,
    batch: BatchShape | None,
    params: dict[str, Any],
    want_states: bool,
) -> tuple[Tensor, Tensor]:
    spec = get_loss(loss)
    values = spec.resolve(params)
    shape = advantages.shape
    if advantages.ndim != 2:
        raise ValueError(f"advantages must be [B, T], got shape {tuple(shape)}")
    reads_rollout = spec.needs_rollout(values)
    named = {"log_prob": log_prob, "old_log_prob": old_log_prob, "mask": mask}
    if rollout_log_prob is not None:
        named["rollout_log_prob"] = rollout_log_prob
    for name, x in named.items():
        if x.shape != shape:
            raise ValueError(f"{name} has shape {tuple(x.shape)}, advantages {tuple(shape)}")
    if reads_rollout and rollout_log_prob is None:
        what = ", ".join(f"{k}={v!r}" for k, v in values.items() if spec.params[k].control) or loss
        raise ValueError(f"loss {loss!r} with {what} needs rollout_log_prob")
    dtype = _dtype(advantages, log_prob, old_log_prob)
    with torch.no_grad():
        a, lp, olp = (x.detach().to(dtype) for x in (advantages, log_prob, old_log_prob))
        # Given rollout log-probs are passed on (a loss may read them when there: SkyRL's dppo).
        rlp = rollout_log_prob.detach().to(dtype) if rollout_log_prob is not None else None
        m = mask.detach()
        if batch is not None and batch.rows is not None and batch.rows.shape != shape[:1]:
            raise ValueError(f"batch.rows has shape {tuple(batch.rows.shape)}, the rows {shape[0]}")
        inp = LossInput(a, lp, olp, m, rlp, dtype, batch, want_states)
        return spec.fn(inp, **values)


def loss_weights(
    advantages: Tensor,
    log_prob: Tensor,
    old_log_prob: Tensor,
    mask: Tensor,
    *,
    loss: str = DEFAULT_LOSS,
    rollout_log_prob: Tensor | None = None,
    batch: BatchShape | None = None,
    **params: Any,
) -> Tensor:
    """[B, T] ``w = -dL/d log_prob`` per token under the registered loss ``loss`` with its
    ``params`` (:func:`available_losses` lists them with their defaults), 0 off-mask, in the
    inputs' floating dtype. ``batch``: the batch the aggregation is taken over when these rows are
    part of one (default: these rows). Unknown loss: ValueError; a parameter the loss does not
    take: TypeError; both list what is known."""
    w, _ = _run(advantages, log_prob, old_log_prob, mask, rollout_log_prob, loss, batch, params, False)
    return w


def loss_weights_and_states(
    advantages: Tensor,
    log_prob: Tensor,
    old_log_prob: Tensor,
    mask: Tensor,
    *,
    loss: str = DEFAULT_LOSS,
    rollout_log_prob: Tensor | None = None,
    batch: BatchShape | None = None,
    **params: Any,
) -> tuple[Tensor, Tensor]:
    """(:func:`loss_weights`, :func:`loss_token_states`) in one computation."""
    return _run(advantages, log_prob, old_log_prob, mask, rollout_log_prob, loss, batch, params, True)


def loss_token_states(
    advantages: Tensor,
    log_prob: Tensor,
    old_log_prob: Tensor,
    mask: Tensor,
    *,
    loss: str = DEFAULT_LOSS,
    rollout_log_prob: Tensor | None = None,
    batch: BatchShape | None = None,
    **params: Any,
) -> Tensor:
    """[B, T] uint8 :class:`~estimators.losses.core.TokenState` flags of each token under the
    same arguments as :func:`loss_weights` (clipped, dual-clipped, truncated, zeroed, selected,
    clamped); 0 off-mask. ``state & ZEROING`` nonzero means the weight is 0 (except for the
    CISPO-style losses, whose clipping truncates)."""
    _, state = _run(advantages, log_prob, old_log_prob, mask, rollout_log_prob, loss, batch, params, True)
    return state
