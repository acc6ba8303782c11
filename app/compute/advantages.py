"""Episode -> advantages JSON (GET /api/episodes/{slug}/advantages), through the estimator registry.

One row per scheme. The service's own schemes (``outcome``, ``oracle``, ``uploaded``, the audit's
``audit_reference`` / ``audit_diff``; app/core/schemes.py) each have a row builder in
:data:`SERVICE_ROWS`. A registry estimator runs where its ``reads`` say (estimators/registry.py):
an outcome estimator that reads only per-episode summaries on the batch's [B] columns
(app/compute/batch.py), another outcome estimator on the padded batch, one that reads ``groups`` on
the episode's group, any other on the episode's own [1, T] row. Nothing here branches on an
estimator's name. No per-token Python work on the hot path: arrays are numpy/torch, JSON lists come
from tolist().
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.compute import loss_view as lv
from app.compute.batch import BatchContext, rewarded_only
from app.compute.inputs import episode_inputs
from app.compute.params import parse_schemes, validate_params
from app.compute.refusals import check_budget, run_estimator
from app.compute.tensors import episode_row, padded_batch
from app.compute.turns import masked, oracle_advantages, turn_extras, turn_summaries
from app.core import schemes as sc
from app.core.arrays import EpisodeArrays, kind_names
from app.core.errors import ApiError
from estimators import EstimatorInput, EstimatorSpec, available


@dataclass
class Row:
    """One scheme's row: advantages [T] (0 off-policy), its label and kind; ``everywhere``: values
    served on every token (not nulled off-policy); ``extras``: per-token by-products."""

    advantages: np.ndarray
    label: str
    kind: str
    everywhere: np.ndarray | None = None
    extras: dict[str, Any] | None = None


@dataclass
class RowContext:
    """What a row builder may read: the episode, its batch, its [1, T] estimator row and the view."""

    ep: EpisodeArrays
    ctx: BatchContext
    single: EstimatorInput
    gamma: float
    lam: float
    baseline: str
    critic: str
    as_numpy: bool
    audit: Any = None  # the batch audit seen from this episode, when an audit row is asked for
    # {scheme: {option: value}}: the trainers' dialects' own options (app/core/schemes.py).
    options: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def policy(self) -> np.ndarray:
        return self.ep.policy


# ---- the service's own schemes ------------------------------------------------------------------


# Numbers held per token per scheme while one episode's advantages are answered: its [T] row, the
# masked copy and the JSON answer's floats. Measured on a 131,072-token episode: ~7 MB per scheme
# of peak memory, ~7 float64s per token (tests/adversarial/test_adv_memory.py).
ROW_NUMBERS = 7


def _outcome(q: RowContext) -> Row:
    if q.baseline == "none":
        a: float | None = float(q.ctx.scores[q.ctx.index])
    else:
        a = q.ctx.episode_outcome(q.baseline)
    if a is None:  # pragma: no cover - every outcome baseline (app/core/schemes.py) reads summaries only
        raise ValueError(f"baseline {q.baseline!r} reads more than per-episode summaries")
    return Row(np.where(q.policy, a, 0.0), sc.outcome_label(q.baseline), "outcome")


def _uploaded_advantages(q: RowContext) -> np.ndarray:
    """The trainer's advantages (a row that reads them is asked for only when they were uploaded:
    app/compute/inputs.py)."""
    if q.ep.advantages is None:  # pragma: no cover - refused before, by the scheme's inputs
        raise ValueError("the episode has no uploaded advantages")
    return q.ep.advantages


def _oracle(q: RowContext) -> Row:
    label, kind, _, _ = sc.SERVICE_SCHEMES["oracle"]
    return Row(oracle_advantages(q.ep, q.gamma), label, kind)


def _uploaded(q: RowContext) -> Row:
    label, kind, _, _ = sc.SERVICE_SCHEMES["uploaded"]
    # Served on every token: a nonzero trainer advantage on a prompt or tool token is a bug the
    # page outlines (the turn means still read policy tokens only).
    uploaded = _uploaded_advantages(q)
    everywhere = np.asarray(uploaded, dtype=np.float64)
    return Row(np.where(q.policy, uploaded, 0.0), label, kind, everywhere=everywhere)


def _audit_reference(q: RowContext) -> Row:  # the reference is 0 off-policy, as the uploaded row
    label, kind, _, _ = sc.SERVICE_SCHEMES["audit_reference"]
    return Row(q.audit.reference, label, kind)


def _audit_diff(q: RowContext) -> Row:
    label, kind, _, _ = sc.SERVICE_SCHEMES["audit_diff"]
    return Row(np.where(q.policy, _uploaded_advantages(q), 0.0) - q.audit.reference, label, kind)


SERVICE_ROWS: dict[str, Callable[[RowContext], Row]] = {
    "outcome": _outcome,
    "oracle": _oracle,
    "uploaded": _uploaded,
    "audit_reference": _audit_reference,
    "audit_diff": _audit_diff,
}
# Rows computed from the batch audit (fetched once per request when one of them is asked for).
NEEDS_AUDIT = frozenset(sc.AUDIT_SCHEMES)
# Rows computed from the other rows of the answer, after them (the loss weights of the advantages).
AFTER_ROWS = frozenset({"loss_weights"})


# ---- registry estimators, by what they read --------------------------------------------------


def registry_row(q: RowContext, spec: EstimatorSpec) -> Row:
    """Scheme ``spec`` on this episode, run where its ``reads`` say (see the module docstring)."""
    name, T = spec.name, len(q.ep.kinds)
    opts = q.options.get(name, {})
    extras = None
    if spec.kind == "outcome":
        # None unless it reads only per-episode summaries (memoised without options: none then).
        a = q.ctx.episode_outcome(name) if not opts else None
        if a is not None:
            adv = np.where(q.policy, a, 0.0)
        else:  # it reads other episodes' tokens: the padded batch, within the work budget
            q.ctx.check_batch_budget(
                name, "Pick a scheme that reads only scores (outcome, rloo, grpo, ...) or split the batch."
            )
            arrays, row = rewarded_only(q.ctx.arrays(), q.ctx.index)
            inp = padded_batch(arrays, spec, critic=q.critic, gamma=q.gamma, lam=q.lam)
            adv = run_estimator(name, inp, **opts).advantages[row, :T].numpy()
    elif "groups" in spec.reads:
        # It compares the episode with its group (and the group's turns): the group's rows give
        # the same numbers as the whole batch.
        # Members without a reward are left out (their score of 0 is not an outcome).
        members, row = rewarded_only(*q.ctx.group_arrays(name))
        inp = padded_batch(members, spec, critic=q.critic, gamma=q.gamma, lam=q.lam)
        res = run_estimator(name, inp, **opts)
        adv = res.advantages[row, :T].numpy()
        extras = turn_extras(res.extras, row, q.ep, q.as_numpy) or None
    else:
        adv = run_estimator(name, q.single, **opts).advantages[0].numpy()
    # An option away from the trainer's default is part of what the row shows.
    changed = [f"{k}={sc.option_text(v)}" for k, v in opts.items() if v != spec.params.get(k)]
    label = f"{spec.label} ({', '.join(changed)})" if changed else spec.label
    return Row(adv, label, spec.kind, extras=extras)


# ---- the payload -------------------------------------------------------------------------------


def _turn_id_list(turn_ids: np.ndarray, policy: np.ndarray) -> list[int | None]:
    """[T] ints with None off-policy."""
    o = turn_ids.astype(object)
    o[~policy] = None
    ids: list[int | None] = o.tolist()
    return ids


def episode_advantages(
    ep: EpisodeArrays,
    ctx: BatchContext | None,
    *,
    schemes: Sequence[str] | None = None,
    gamma: float = sc.DEFAULT_GAMMA,
    lam: float = sc.DEFAULT_LAM,
    baseline: str = sc.DEFAULT_BASELINE,
    critic: str = sc.DEFAULT_CRITIC,
    as_numpy: bool = False,
    loss: lv.LossParams | None = None,
    options: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The advantages payload of one episode (the JSON of GET /api/episodes/{slug}/advantages).

    ``schemes`` empty or None: the episode's default view (the default schemes whose inputs it
    has, :func:`app.core.schemes.default_schemes`). ``ctx`` None: the episode is its own batch (a
    group of one). ``as_numpy``: per-token arrays as float64 numpy arrays with NaN for null
    (serialise with app.http.api._json.dumps); default lists."""
    names = parse_schemes(schemes) or sc.default_schemes(episode_inputs(ep, critic))
    validate_params(ep, names, gamma, lam, baseline, critic)
    specs = available()
    T = len(ep.kinds)
    if ctx is not None:
        # Each scheme holds a few [T] arrays of this episode (token schemes run on its row alone)
        # and its answer's numbers: ROW_NUMBERS per token, as measured.
        check_budget(
            T * (ROW_NUMBERS * len(names) + 4),
            ctx.max_cells,
            f"{len(names)} scheme(s) on this {T:,}-token episode",
            "Ask for fewer schemes at once (scheme=...).",
        )
    policy = ep.policy
    if ctx is None:
        ctx = BatchContext(groups=[ep.group], scores=np.array([ep.score]), index=0, _arrays=[ep])
    single = episode_row(ep, gamma=gamma, lam=lam, critic=critic)
    q = RowContext(ep, ctx, single, gamma, lam, baseline, critic, as_numpy, options=dict(options or {}))
    if NEEDS_AUDIT.intersection(names):
        if ctx.audit is None:
            raise ApiError(
                422, "no_batch", "the audit rows need the episode's batch, which is not available."
            )
        q.audit = ctx.audit()
    # The TD error of the critic in use, for the tooltips (0 values without one).
    td = run_estimator("td", single).advantages[0].numpy() if "td" in specs else np.zeros(T)
    if not ep.rewarded:
        td = np.full(T, np.nan)

    out_schemes: list[dict[str, Any]] = []
    per_token: dict[str, np.ndarray] = {}
    for name in names:
        if name in AFTER_ROWS:  # filled in once the advantage rows it may read are computed
            out_schemes.append({"name": name})
            continue
        row = SERVICE_ROWS[name](q) if name in SERVICE_ROWS else registry_row(q, specs[name])
        adv = np.asarray(row.advantages, dtype=np.float64)
        if not ep.rewarded and row.everywhere is None and name not in NEEDS_AUDIT:
            # No reward was uploaded: any number here would credit a made-up outcome of 0.
            adv = np.full(T, np.nan)
            row.extras = None
        else:
            per_token[name] = adv
        shown = masked(adv, policy, as_numpy)
        if row.everywhere is not None:
            shown = row.everywhere.copy() if as_numpy else row.everywhere.tolist()
        entry: dict[str, Any] = {"name": name, "label": row.label, "kind": row.kind, "advantages": shown}
        if row.extras:
            entry["extras"] = row.extras
        out_schemes.append(entry)

    loss_out = None
    if "loss_weights" in names:
        loss_out = _loss_row(ep, ctx, loss or lv.LossParams(), per_token, out_schemes, as_numpy)
        per_token["loss_weights"] = loss_out.pop("_weights")
    use_values = ep.values if critic == "upload" else None
    turns = turn_summaries(ep, per_token, use_values)
    if loss_out is not None:
        lv.call_shares(per_token["loss_weights"], turns, ep.turn_ids, policy)
    audit = q.audit
    extra = {} if audit is None else {"audit": {"best_match": audit.best_match, "marks": audit.marks}}
    if loss_out is not None:
        extra["loss"] = loss_out
    return {
        **extra,
        "slug": ep.slug,
        "batch_id": ep.batch_id,
        "group": ep.group,
        "n_tokens": T,
        "params": {
            "gamma": gamma,
            "lam": lam,
            "baseline": baseline,
            "critic": critic,
            "schemes": names,
            **({"options": options} if options else {}),
        },
        "episode": {
            "reward": ep.reward,
            "truncated": ep.truncated,
            "task": ep.meta.get("task"),
            "meta": {k: v for k, v in ep.meta.items() if k != "uploaded_advantages"},
        },
        "tokens": ep.tokens,
        "kinds": kind_names(ep.kinds),
        "turn_ids": _turn_id_list(ep.turn_ids, policy),
        "rewards": ep.rewards if as_numpy else ep.rewards.tolist(),
        "values": None if use_values is None else masked(use_values, policy, as_numpy),
        "td": masked(td, policy, as_numpy),
        "schemes": out_schemes,
        "turns": turns,
        "has_advantages": ep.advantages is not None,
        "rewarded": ep.rewarded,
    }


def _loss_row(
    ep: EpisodeArrays,
    ctx: BatchContext,
    params: lv.LossParams,
    per_token: dict[str, np.ndarray],
    out_schemes: list[dict[str, Any]],
    as_numpy: bool,
) -> dict[str, Any]:
    """Fill the `loss_weights` row in ``out_schemes`` and return the payload's `loss` object
    (params, where the advantages came from, flags, marks; ``_weights`` for the caller)."""
    policy = ep.policy
    source: str | None
    if ep.advantages is not None:
        source, adv = "uploaded", np.asarray(ep.advantages, dtype=np.float64)
    else:
        source = next((n for n in per_token if n != "loss_weights"), None)
        if source is None:
            raise ApiError(
                422,
                "scheme_not_applicable",
                "the `loss_weights` row needs advantages: upload them, or show an advantage row with it.",
                field="scheme",
            )
        adv = per_token[source]
    lengths = ctx.lengths if ctx.lengths is not None else None
    if lengths is None and (ctx._arrays is not None or ctx.load_all is not None):
        lengths = ctx.policy_lengths()
    horizon = int(ctx.n_tokens.max(initial=0)) if ctx.n_tokens is not None else len(policy)
    w, states = lv.episode_loss_weights(
        adv, policy, ep.logprobs, ep.rollout_logprobs, params, lengths, horizon=horizon or None,
        index=ctx.index, groups=ctx.group_ids() if lengths is not None else None,
    )  # fmt: skip
    for entry in out_schemes:
        if entry["name"] == "loss_weights":
            label, kind, _, _ = sc.SERVICE_SCHEMES["loss_weights"]
            entry.update(label=label, kind=kind, advantages=masked(w, policy, as_numpy))
    st = np.where(policy, states, 0)
    zero = np.flatnonzero(policy & (adv != 0) & (w == 0))
    return {
        **params.as_dict(),
        "advantages_from": source,
        "ratio_from": "logprobs" if ep.logprobs is not None else "none (ratio 1)",
        "states": st.astype(np.int64).tolist(),
        "marks": lv.marks(st),
        "n_zeroed": int(len(zero)),
        "abs_advantage_zeroed_share": float(np.abs(adv[zero]).sum() / max(np.abs(adv[policy]).sum(), 1e-300)),
        "_weights": w,
    }
