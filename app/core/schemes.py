"""The advantage schemes the service offers, their labels, and the one set of defaults.

Every scheme is either an estimator of the registry (estimators/registry.py: name, label, kind,
description come from its ``register`` call) or one of the service schemes of :data:`SERVICE_SCHEMES` (outcome, oracle,
uploaded, audit_reference, audit_diff, loss_weights), which need the episode's batch or data stored
with it. Each says what it ``reads`` (the registry's input
names, estimators/registry.py ``INPUTS``, plus ``advantages``, the trainer's own), and the service
decides from that alone what to load, what to check and which schemes an episode's default view
shows (:func:`default_schemes`). Python imports these names; the pages hand :func:`client_config`
to their scripts in the initial state, so static/*.js holds no copy.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, NamedTuple

# The view a link without parameters shows (API, pages, CLI) on an episode that has every input
# these read; one without them (no critic values, as GRPO uploads) shows the first
# len(DEFAULT_SCHEMES) of DEFAULT_SCHEMES + DEFAULT_FILL whose inputs it has (outcome, returns).
DEFAULT_SCHEMES = ("outcome", "token_gae", "turn_gae")
DEFAULT_FILL = ("returns",)
DEFAULT_GAMMA = 1.0
DEFAULT_LAM = 0.95
DEFAULT_BASELINE = "rloo"
DEFAULT_CRITIC = "upload"

# Baselines of the `outcome` scheme (registry estimators that read only the [B] scores), with
# their labels; "none" is the score itself.
BASELINES = {
    "rloo": "RLOO",
    "grpo": "GRPO",
    "dr_grpo": "Dr. GRPO",
    "group_mean": "group mean",
    "batch_whiten": "batch whitening",
    "none": "no baseline",
}
# The baselines a group page compares side by side (all but "none").
GROUP_BASELINES = tuple(b for b in BASELINES if b != "none")

# Where the critic values come from; NO_CRITIC (V = 0) is the page's fallback for an episode
# uploaded without values.
CRITICS = {"upload": "uploaded values", "zero": "zero (no critic)"}
NO_CRITIC = "zero"


class ServiceScheme(NamedTuple):
    """A scheme of the service that is not a registry entry."""

    label: str
    kind: str
    description: str
    reads: tuple[str, ...]


SERVICE_SCHEMES = {
    "outcome": ServiceScheme(
        "outcome (group baseline chosen by `baseline`)",
        "outcome",
        "One number per episode from its group's scores, on every policy token.",
        ("scores", "groups"),
    ),
    "oracle": ServiceScheme(
        "oracle (true turn values)",
        "turn",
        "A_k = r_k + gamma V_{k+1} - V_k with meta.turn_values; only for episodes that have them.",
        ("rewards", "turn_values"),
    ),
    "uploaded": ServiceScheme(
        "uploaded advantages",
        "token",
        "The trainer's own advantages uploaded with the episode (the per-token `advantages` field; NeMo-RL, verl, TRL and slime dumps fill it).",
        ("advantages",),
    ),
    # The audit of the batch's uploaded advantages (GET /api/batches/{id}/audit); need `advantages`.
    "audit_reference": ServiceScheme(
        "audit reference (best match)",
        "token",
        "The configuration that best explains the batch's uploaded advantages (the audit's best match, or its "
        "closest fit when nothing matches), on this episode.",
        ("advantages",),
    ),
    "audit_diff": ServiceScheme(
        "uploaded − reference",
        "diff",
        "The uploaded advantages minus the audit's reference: where the trainer differs from the best match "
        "(own diverging scale).",
        ("advantages",),
    ),
    "loss_weights": ServiceScheme(
        "loss weights (−∂L/∂log π)",
        "loss",
        "Each token's share of the policy gradient under the loss, aggregation and rollout correction "
        "chosen with loss=, agg=, rollout_is= (verl 0.9.1's; app/compute/loss_view.py), on its own scale; "
        "clipped or zeroed tokens are marked.",
        (),  # the uploaded advantages, else the first advantage row shown with it (422 when neither)
    ),
}
# Service schemes computed by the batch audit (app/compute/audit.py).
AUDIT_SCHEMES = ("audit_reference", "audit_diff")


def outcome_label(baseline: str) -> str:
    """The row label of the `outcome` scheme under ``baseline``: "outcome (RLOO)"."""
    return f"outcome ({BASELINES[baseline]})"


def reads_of(name: str) -> tuple[str, ...]:
    """The inputs scheme ``name`` reads (a service scheme's, or its registry estimator's ``reads``);
    KeyError for an unknown name."""
    if name in SERVICE_SCHEMES:
        return SERVICE_SCHEMES[name].reads
    from estimators import get  # torch: not needed for the constants above (the CLI's start)

    return get(name).reads


def reference_of(name: str) -> str | None:
    """The reference estimator a trainer's dialect is compared with (its ``reference``), or None."""
    from estimators import available

    spec = available().get(name)
    return None if spec is None else spec.reference


def default_schemes(have: Collection[str]) -> list[str]:
    """The default view's schemes for an episode that has the inputs ``have``: the first
    len(DEFAULT_SCHEMES) of DEFAULT_SCHEMES + DEFAULT_FILL whose reads it has."""
    ok = [s for s in (*DEFAULT_SCHEMES, *DEFAULT_FILL) if set(reads_of(s)) <= set(have)]
    return ok[: len(DEFAULT_SCHEMES)]


def catalog() -> list[dict[str, Any]]:
    """Every scheme, service schemes first: [{name, label, kind, needs_values, reads, description, params}]."""
    from estimators import available  # torch: not needed for the constants above (the CLI's start)

    out: list[dict[str, Any]] = [
        {
            "name": n,
            "label": s.label,
            "kind": s.kind,
            "needs_values": "values" in s.reads,
            "reads": list(s.reads),
            "description": s.description,
            "params": {},
        }
        for n, s in SERVICE_SCHEMES.items()
    ]
    out += [
        {
            "name": s.name,
            "label": s.label,
            "kind": s.kind,
            "needs_values": s.needs_values,
            "reads": list(s.reads),
            "description": s.description,
            "params": s.params,
        }
        for s in available().values()
    ]
    return out


def names() -> list[str]:
    """Every scheme name, in catalog order."""
    from estimators import available

    return [*SERVICE_SCHEMES, *available()]


def defaults() -> dict[str, Any]:
    """The default view parameters as one dict (schemes as a list)."""
    return {
        "schemes": list(DEFAULT_SCHEMES),
        "gamma": DEFAULT_GAMMA,
        "lam": DEFAULT_LAM,
        "baseline": DEFAULT_BASELINE,
        "critic": DEFAULT_CRITIC,
    }


def client_config() -> dict[str, Any]:
    """What the pages' scripts know about schemes: the catalog, the baselines and critics with
    labels (in order), the group page's baselines, the critic-free fallback and the defaults."""
    return {
        "schemes": catalog(),
        "baselines": [{"name": n, "label": label} for n, label in BASELINES.items()],
        "group_baselines": list(GROUP_BASELINES),
        "critics": [{"name": n, "label": label} for n, label in CRITICS.items()],
        "no_critic": NO_CRITIC,
        "defaults": defaults(),
    }


# ---- a trainer's options -----------------------------------------------------------------------
# A dialect's parameters are the trainer's own config keys (TRL `scale_rewards`, verl
# `norm_adv_by_std_in_grpo`, ...). In a link or an API query they are keys of their own
# (`?scheme=trl:grpo&scale_rewards=none`), applied to every scheme shown that takes them; a
# batch whose trainer config sets them opens with them (app/core/trainers.py config_query).

_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off"})


def options_of(name: str) -> dict[str, Any]:
    """The options (parameters with their defaults) of trainer dialect ``name``; {} for any other
    scheme (a service scheme, a reference estimator, an unknown name)."""
    from estimators import available

    spec = available().get(name)
    return dict(spec.params) if spec is not None and spec.trainer is not None else {}


def option_names(schemes: Collection[str]) -> list[str]:
    """The option keys the dialects among ``schemes`` take, in their order (each once)."""
    out: list[str] = []
    for s in schemes:
        out += [p for p in options_of(s) if p not in out]
    return out


def option_text(value: Any) -> str:
    """An option's value as a link writes it (``true``, ``none``, ``-10,10``, ``group``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    if isinstance(value, list | tuple):
        return ",".join(option_text(v) for v in value)
    return str(value)


def parse_option(name: str, param: str, raw: Any) -> Any:
    """``raw`` (text from a link, or a config's value) as dialect ``name``'s option ``param``, typed
    like its default; ApiError 422 ``bad_parameter`` saying what it takes."""
    from app.core.errors import ApiError

    default = options_of(name)[param]
    text = option_text(raw).strip()

    def bad(takes: str) -> ApiError:
        return ApiError(
            422,
            "bad_parameter",
            f"option `{param}` of {name} is {text[:60]!r}; it takes {takes} (default {option_text(default)}).",
            field=param,
        )

    if isinstance(default, bool):
        if text.lower() in _TRUE | _FALSE:
            return text.lower() in _TRUE
        raise bad("true or false")
    if isinstance(default, tuple):
        parts = [p for p in text.strip("()[] ").replace(" ", "").split(",") if p]
        try:
            nums = tuple(float(p) for p in parts)
        except ValueError:
            raise bad(f"{len(default)} numbers, comma-separated") from None
        if len(nums) != len(default):
            raise bad(f"{len(default)} numbers, comma-separated")
        return nums
    if isinstance(default, int | float) or default is None:
        if default is None and text.lower() in ("none", "null", ""):
            return None
        try:
            value = float(text)
        except ValueError:
            if default is None:  # an option whose default is None may also name a level ("group")
                return text
            raise bad("a number") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise bad("a finite number")
        return int(value) if isinstance(default, int) and value.is_integer() else value
    if isinstance(default, str) and isinstance(raw, bool):
        return raw  # TRL's scale_rewards=True/False: the dialect reads a bool as the trainer does
    return text


def parse_options(schemes: Collection[str], given: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{scheme: {option: typed value}} for the dialects among ``schemes`` and the options in
    ``given`` (query keys, or a config's values) that each takes; 422 for a value it cannot take."""
    out: dict[str, dict[str, Any]] = {}
    for s in schemes:
        mine = {p: parse_option(s, p, given[p]) for p in options_of(s) if p in given}
        if mine:
            out[s] = mine
    return out
