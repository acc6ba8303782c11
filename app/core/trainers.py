"""The trainer an upload or a run names, and what its configuration says about its credit.

A user says once which trainer computed their advantages (``POST /api/uploads?trainer=``, the
upload form, ``POST /api/runs`` ``trainer``, ``creditlens.run(name, trainer=...)``; the client's
adapters say it themselves). The name is a key of ``estimators.registry.TRAINERS``; the run's or
upload's configuration (verl's Hydra config, TRL's ``GRPOConfig``, OpenRLHF's arguments, any JSON
object) then says which of that trainer's estimators ran, and with which gamma and lambda:
:func:`dialect_of` finds the estimator's key wherever the configuration nests it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any

from app.core.errors import ApiError

# The keys (last part of a dotted config key) that name the advantage estimator, by trainer.
ESTIMATOR_KEYS = ("adv_estimator", "advantage_estimator", "estimator")
# What each trainer runs when its configuration names no estimator (its config's default).
DEFAULT_ESTIMATOR = {
    "verl": "gae",
    "trl": "grpo",
    "openrlhf": "gae",
    "skyrl": "grpo",
    "nemo_rl": "grpo",
    "prime_rl": "grpo",
    "slime": "grpo",
}
# The keys that name the policy loss, and each trainer's default loss (its config's default).
LOSS_KEYS = ("loss_type", "policy_loss_type", "loss_mode", "policy_loss")
DEFAULT_LOSS = {"verl": "vanilla", "trl": "dapo", "openrlhf": "ppo", "skyrl": "regular"}
GAMMA_KEYS = ("gamma",)
LAM_KEYS = ("lam", "lambd", "lmbda", "gae_lambda", "lambda_")


def known() -> dict[str, tuple[str, str]]:
    """Every trainer: key -> (display name, the version its dialects reproduce)."""
    from estimators.registry import TRAINERS

    return dict(TRAINERS)


def check_trainer(name: str | None, field: str = "trainer") -> str | None:
    """``name`` if it is a known trainer (None or "" stays None); 422 ``unknown_trainer`` listing
    the known ones otherwise."""
    if name is None or not name.strip():
        return None
    key = name.strip().lower().replace("-", "_")
    if key in known():
        return key
    listed = ", ".join(f"{k} ({n} {v})" for k, (n, v) in known().items())
    raise ApiError(
        422, "unknown_trainer", f"trainer {name!r} is not known; choose one of: {listed}.", field=field
    )


# Keys only one trainer's configuration has, in the shape it saves them: verl's Hydra config
# (``actor_rollout_ref``), SkyRL's (``trainer.algorithm`` beside ``generator``), TRL's
# ``GRPOConfig`` (``num_generations`` and ``scale_rewards``), OpenRLHF's arguments
# (``advantage_estimator`` with ``n_samples_per_prompt``).
_SIGNATURES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("verl", ("actor_rollout_ref",)),
    ("skyrl", ("trainer.algorithm", "generator")),
    ("trl", ("num_generations", "scale_rewards")),
    ("openrlhf", ("advantage_estimator", "n_samples_per_prompt")),
)


def trainer_of_config(config: Mapping[str, Any]) -> str | None:
    """The trainer whose configuration this is, when its shape says so unambiguously: a string
    ``trainer`` key, else the keys only that trainer's configuration has; None otherwise."""
    named = config.get("trainer")
    if isinstance(named, str):
        return named
    found = []
    for trainer, keys in _SIGNATURES:
        if all(_has(config, k) for k in keys):
            found.append(trainer)
    return found[0] if len(found) == 1 else None


def _has(config: Mapping[str, Any], dotted: str) -> bool:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def configured(
    base: Mapping[str, Any], config: Mapping[str, Any], config_text: str | None, trainer: str | None
) -> dict[str, Any]:
    """A run's configuration: ``base`` (what it had), then the configuration file ``config_text``
    (app/core/configs.py), then ``config``'s settings on top, with ``trainer`` under its key (named,
    else the configuration's own, else its shape's: :func:`trainer_of_config`; 422 if unknown)."""
    from app.core.configs import merged, parse_config

    out = dict(base)
    if config_text:
        out = merged(out, parse_config(config_text, "config_text"))
    out = merged(out, dict(config))
    named = check_trainer(trainer or trainer_of_config(out), "trainer")
    if named:
        out["trainer"] = named
    return out


def flat(config: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every leaf of a nested configuration."""
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            yield from flat(v, key + ".")
        else:
            yield key, v


def _find(config: Mapping[str, Any], names: tuple[str, ...]) -> Any:
    """The value of the first leaf whose last key part is one of ``names`` (shallowest first)."""
    leaves = sorted(flat(config), key=lambda kv: kv[0].count("."))
    for key, v in leaves:
        if key.rsplit(".", 1)[-1].lower() in names:
            return v
    return None


def _named(
    config: Mapping[str, Any] | None,
    keys: tuple[str, ...],
    default: str,
    full_name: Callable[[str], str],
    registered: Collection[str],
) -> str | None:
    """The first of (the value of the config's first key in ``keys``, ``default``) whose
    ``full_name`` is registered; None when neither is."""
    named = _find(config or {}, keys)
    for n in ([str(named)] if isinstance(named, str) and named else []) + [default]:
        if n and full_name(n) in registered:
            return full_name(n)
    return None


def dialect_of(trainer: str | None, config: Mapping[str, Any] | None = None) -> str | None:
    """The registered dialect (``"<trainer>:<name>"``) the configuration says ran: its estimator
    key, else the trainer's default; None when that is not registered (or no trainer)."""
    if trainer is None:
        return None
    from estimators.registry import available

    default = DEFAULT_ESTIMATOR.get(trainer, "")
    return _named(config, ESTIMATOR_KEYS, default, lambda n: f"{trainer}:{n}", available())


def loss_of(trainer: str | None, config: Mapping[str, Any] | None = None) -> str | None:
    """The registered loss (``"<trainer>:<loss>"``, or verl's own names) the configuration says the
    trainer trained with: its loss key (TRL ``loss_type``, OpenRLHF/SkyRL ``policy_loss_type``,
    verl ``policy_loss.loss_mode``), else the trainer's default; None when not registered."""
    if trainer is None:
        return None
    from estimators.losses import available_losses

    def full(n: str) -> str:
        return n if trainer == "verl" else f"{trainer}:{n}"  # verl's losses keep their own names

    return _named(config, LOSS_KEYS, DEFAULT_LOSS.get(trainer, ""), full, available_losses())


def discount_of(config: Mapping[str, Any] | None) -> tuple[float | None, float | None]:
    """(gamma, lambda) as the configuration sets them (None where it does not)."""
    out: list[float | None] = []
    for names in (GAMMA_KEYS, LAM_KEYS):
        v = _find(config or {}, names)
        out.append(float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None)
    return out[0], out[1]


def config_query(trainer: str | None, config: Mapping[str, Any] | None) -> dict[str, str]:
    """The view a batch of ``trainer`` with ``config`` opens with, as query keys: the config's
    gamma and lambda, and every option of the trainer's dialects its config sets (by the option's
    name, the last part of the trainer's config key), as a link writes them. {} without either."""
    if trainer is None or not config:
        return {}
    from app.core.schemes import option_text, options_of

    out: dict[str, str] = {}
    gamma, lam = discount_of(config)
    if gamma is not None and 0.0 <= gamma <= 1.0:
        out["gamma"] = f"{gamma:g}"
    if lam is not None and 0.0 <= lam <= 1.0:
        out["lam"] = f"{lam:g}"
    from estimators.registry import available

    for name, spec in available().items():
        if spec.trainer != trainer:
            continue
        for param in options_of(name):
            v = _find(config, (param.lower(),))
            if v is not None and param not in out:
                out[param] = option_text(v)
    return out


def summary(trainer: str, config: Mapping[str, Any] | None, loss: str | None) -> dict[str, Any] | None:
    """What a batch of ``trainer`` trained with, for its page: the trainer's name and version, the
    dialect its config names with the options and gamma/lambda the config sets, and the loss."""
    if trainer not in known():
        return None
    name, version = known()[trainer]
    query = config_query(trainer, config)
    dialect = dialect_of(trainer, config)
    from app.core.schemes import options_of

    options = {k: v for k, v in query.items() if dialect is not None and k in options_of(dialect)}
    return {
        "trainer": trainer,
        "name": name,
        "version": version,
        "dialect": dialect,
        "options": options,
        "gamma": query.get("gamma"),
        "lam": query.get("lam"),
        "loss": loss,
        "from_config": any(k != "trainer" for k in (config or {})),
    }


def trainer_options(meta: Mapping[str, Any]) -> tuple[str | None, dict[str, dict[str, Any]]]:
    """(the trainer a batch's meta names, {dialect: {option: value}} of that trainer's dialects as
    its kept configuration sets them) -- what the audit tries beside the dialects' defaults. An
    option its configuration sets to a value the dialect cannot take is left out (the pages'
    links say so; the audit keeps going)."""
    from app.core.errors import ApiError
    from app.core.schemes import parse_option

    trainer = meta.get("trainer")
    if not isinstance(trainer, str):
        return None, {}
    config = meta.get("trainer_config")
    given = config_query(trainer, config if isinstance(config, dict) else None)
    from estimators.registry import available

    out: dict[str, dict[str, Any]] = {}
    for name, spec in available().items():
        if spec.trainer != trainer:
            continue
        mine = {}
        for param in spec.params:
            if param in given:
                try:
                    mine[param] = parse_option(name, param, given[param])
                except ApiError:
                    continue
        if mine:
            out[name] = mine
    return trainer, out
