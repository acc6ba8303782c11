"""The policy losses the service offers (``estimators.losses``' registry: names, parameters,
defaults, trainers) as the pages and the view state read them. Python imports these; the pages
hand :func:`client_config` to their scripts in the initial state (as app/core/schemes.py does
for the estimators), so static/*.js and the templates hold no copy of a name or a default.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from estimators.losses import DEFAULT_LOSS, LossParam, LossSpec, available_losses, get_loss, parse_threshold
from estimators.registry import TRAINERS

__all__ = [
    "DEFAULT_LOSS",
    "EPISODE_CONTROLS",
    "canonical",
    "catalog",
    "choices",
    "client_config",
    "default_text",
    "episode_losses",
    "loss_names",
    "page_choices",
    "threshold_or_default",
    "view_params",
]

# The episode page's loss controls are verl's parameters (the `loss_weights` row's query keys,
# app/core/views.py QUERY_KEYS); it offers the losses that take all of them.
EPISODE_CONTROLS = ("agg", "rollout_is", "rollout_is_threshold")


def _spec() -> LossSpec:
    return get_loss(DEFAULT_LOSS)


def default_text(param: str) -> str:
    """The default loss's parameter ``param`` as a URL writes it (``agg`` -> ``"token-mean"``)."""
    p = _spec().params[param]
    return p.text(p.default)


def episode_losses(aliases: bool = True) -> tuple[str, ...]:
    """The losses the episode page's controls fit: those taking every one of
    :data:`EPISODE_CONTROLS` (verl's, with their ``verl:`` aliases unless ``aliases`` is False)."""
    specs = available_losses(aliases=aliases)
    return tuple(n for n, s in specs.items() if all(c in s.params for c in EPISODE_CONTROLS))


def canonical(name: str) -> str:
    """The registered name an alias stands for (``verl:gspo`` -> ``gspo``); other names as given."""
    return get_loss(name).alias_of or name


def loss_names() -> tuple[str, ...]:
    """Every registered loss's name (aliases too)."""
    return tuple(available_losses())


def _link_text(p: LossParam, raw: str | None) -> str:
    """A link's text of parameter ``p`` when it reads, else its default's text (a link never fails)."""
    if raw is None:
        return p.text(p.default)
    if p.kind == "threshold":
        return threshold_or_default(raw)
    try:
        p.parse(raw)
    except (TypeError, ValueError):
        return p.text(p.default)
    return raw.strip()


def view_params(loss: str, q: Mapping[str, str]) -> tuple[dict[str, str | None], dict[str, str]]:
    """The episode page's parameters of ``loss`` from a link's query ``q``: ({each of
    :data:`EPISODE_CONTROLS`: its text, None when the loss does not take it}, {the loss's other
    controls: their text}); a malformed value reads as the default."""
    spec = get_loss(loss)
    verl = {c: _link_text(spec.params[c], q.get(c)) if c in spec.params else None for c in EPISODE_CONTROLS}
    own = {
        n: _link_text(p, q.get(n)) for n, p in spec.params.items() if p.control and n not in EPISODE_CONTROLS
    }
    return verl, own


def choices(param: str) -> tuple[str, ...]:
    """The default loss's choices of ``param`` (``agg``, ``rollout_is``)."""
    return _spec().params[param].choices


def threshold_or_default(raw: str | None) -> str:
    """A link's ``rollout_is_threshold`` text when it reads (a positive number, TIS; ``lo_hi``,
    IcePop), else the default's text: a link never fails."""
    s = (raw or "").strip()
    try:
        upper, _ = parse_threshold(s)
    except (TypeError, ValueError):
        return default_text("rollout_is_threshold")
    return s if upper != float("inf") else default_text("rollout_is_threshold")


def page_choices() -> dict[str, tuple[str, ...]]:
    """The episode page's loss controls: its losses, the aggregations and rollout corrections."""
    return {
        "losses": episode_losses(aliases=False),
        "aggs": choices("agg"),
        "rollout_is": choices("rollout_is"),
    }


def _param(spec: LossSpec, name: str) -> dict[str, Any]:
    p = spec.params[name]
    return {
        "name": p.name,
        "default": p.text(p.default),
        "kind": p.kind,
        "choices": list(p.choices) or None,
        "help": p.help,
        "control": p.control,
    }


def catalog(controls_only: bool = False) -> dict[str, Any]:
    """Every registered loss: the default, the trainers in order (display name, version, their
    losses without the aliases), each loss (aliases too) with its label, description, trainer,
    version and parameters (defaults as URL text; ``controls_only``: just the ones the pages offer
    as controls), and every parameter name some loss takes (the query keys a loss view reads)."""
    specs = available_losses()
    trainers = []
    for key, (name, version) in TRAINERS.items():
        own = [n for n, s in specs.items() if s.trainer == key and s.alias_of is None]
        if own:
            trainers.append({"key": key, "name": name, "version": version, "losses": own})
    return {
        "default": DEFAULT_LOSS,
        "trainers": trainers,
        "losses": {
            n: {
                "label": s.label,
                "description": s.description,
                "trainer": s.trainer,
                "version": s.version,
                "alias_of": s.alias_of,
                "params": [_param(s, p) for p, d in s.params.items() if d.control or not controls_only],
            }
            for n, s in specs.items()
        },
        "param_names": list(dict.fromkeys(p for s in specs.values() for p in s.params)),
    }


def client_config() -> dict[str, Any]:
    """What the pages' scripts know about losses: :func:`catalog` with the controls only (GET
    /api/losses lists every parameter)."""
    return catalog(controls_only=True)
