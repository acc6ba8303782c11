"""The search space: every configuration the audit tries, and the known bugs as hypotheses on it.

**Adding a hypothesis** (a bug a trainer may have) happens here and only here:

1. a row in :data:`HYPOTHESES`: the parameter that carries it, its buggy and correct values, the
   finding code it reports, a sentence for the message and, if the batch must show something for it
   to be observable, a predicate (and any evidence for the finding);
2. its values in the enumeration (:func:`token_configs` for the token/turn family,
   :func:`outcome_candidates` for outcome/group schemes), tried only where it changes something;
3. its arithmetic in :func:`raw` (token family) or in the score of :func:`outcome_candidates`.

Its finding then follows by itself: the findings step switches the hypothesis back to ``good`` on the
best match and names the policy tokens whose raw advantage changes (``findings.bug_hypotheses``).
Conventions trainers choose freely (not bugs) are :data:`CONVENTIONS`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import Tensor

from .. import groups as G
from .. import token as TK
from .._scan import compress
from .batch import Batch
from .candidates import Cand, broadcast, share
from .constants import CAP, EPSILONS, GAMMAS, LAMBDAS
from .whitening import whiten_rows, whiten_tokens


def _always(_b: Batch) -> bool:
    return True


def _no_evidence(_b: Batch) -> dict[str, Any]:
    return {}


def _reward_tokens(b: Batch) -> dict[str, Any]:
    if b.r_end is None:
        return {}
    moved = (b.r_end != b.r) & (b.r_end != 0)
    return {"reward_tokens": moved.nonzero()[:CAP].tolist()}


def _truncated_episodes(b: Batch) -> dict[str, Any]:
    if b.lv is None:
        return {}
    return {"truncated_episodes": (torch.nan_to_num(b.lv) != 0).nonzero().squeeze(1).tolist()}


@dataclass(frozen=True)
class Hypothesis:
    """A known bug, carried by one configuration parameter."""

    key: str  # the parameter of a configuration that carries it
    bad: Any  # its value when the bug is present
    good: Any  # its value in the correct computation
    code: str  # the finding code reported when the best match needs ``bad``
    text: str  # what the bug does, for the finding's message ("matches X where ...")
    observable: Callable[[Batch], bool] = field(default=_always)  # can this batch show it at all?
    evidence: Callable[[Batch], dict[str, Any]] = field(default=_no_evidence)  # extra finding evidence


HYPOTHESES: tuple[Hypothesis, ...] = (
    Hypothesis(
        "mask",
        "response",
        "policy",
        "gae_through_tool_spans",
        "the loss mask covers tool/template tokens, so the recursion steps through tool spans "
        "and bootstraps from the critic's values on tool output",
    ),
    Hypothesis(
        "mask",
        "response_recursion",
        "policy",
        "gae_through_tool_spans",
        "the GAE recursion steps over every response token, tool spans included (bootstrapping from the "
        "critic's values on tool output), while whitening and the loss use the policy mask (verl before PR #2337)",
    ),
    Hypothesis(
        "reward_at",
        "row_end",
        "last_policy",
        "reward_on_non_policy_token",
        "the outcome reward sits on the row's last token (not a policy token) instead of the last policy token",
        evidence=_reward_tokens,
    ),
    Hypothesis(
        "reset_at_gaps",
        True,
        False,
        "reward_dropped_before_tool_span",
        "the return restarts at every masked gap, so tokens before a tool span never see the outcome reward",
    ),
    Hypothesis(
        "bootstrap",
        False,
        True,
        "truncated_as_terminated",
        "truncated episodes are treated as terminated (no bootstrap from the value of the state "
        "where they were cut off)",
        observable=lambda b: b.has_boot,
        evidence=_truncated_episodes,
    ),
)

# Conventions per scheme that a trainer may choose freely; a match with another value is
# reported as info (``convention_differs``), not as a bug. verl 0.9.1's values.
CONVENTIONS: dict[str, Any] = {"std": "sample", "eps": 1e-6, "singleton": "verl"}


def deviations(params: dict[str, Any]) -> int:
    """How many bug hypotheses and non-default conventions a configuration needs (ties go to fewer)."""
    n = sum(1 for h in HYPOTHESES if params.get(h.key) == h.bad)
    n += sum(1 for k, d in CONVENTIONS.items() if k in params and params[k] != d)
    n += params.get("score") == "row"
    return n


# ---- outcome / group family -------------------------------------------------------------------


def _singleton_zero(a: Tensor, st: G.GroupStats) -> Tensor:
    return torch.where(st.count == 1, torch.zeros_like(a), a)


def outcome_candidates(b: Batch) -> list[Cand]:
    """Every outcome/group configuration as a [B] vector of per-episode advantages."""
    scores = {"policy": (b.r * b.pol).sum(1)}
    row = b.r.sum(1)
    if not torch.equal(row, scores["policy"]):
        scores["row"] = row
    if b.r_end is not None:
        scores["policy@row_end"] = (b.r_end * b.pol).sum(1)
    g = b.groups
    out: list[Cand] = []
    for skey, s in scores.items():
        score, _, rat = skey.partition("@")
        base = {"score": score, "reward_at": rat or "last_policy"}
        st = G.group_stats(s, g)
        all_pairs = bool((st.gcount >= 2).all())
        eps_one = {e: float(torch.tensor(1.0, dtype=torch.float32) + e) for e in EPSILONS}
        single = st.count == 1

        def add(scheme: str, ep: Tensor, _base: dict[str, Any] = base, **params: Any) -> None:
            out.append(Cand(scheme, {**params, **_base}, "outcome", ep=ep))
            name = {"dr_grpo": "reinforce_plus_plus_baseline", "grpo": "gdpo"}.get(scheme, scheme)
            for fac in b.factors:
                ww = dict(params, whiten="batch", whiten_factor=fac)
                out.append(Cand(name, {**ww, **_base}, "outcome", ep=whiten_rows(ep, b.n_pol, fac)))

        centered_verl = torch.where(single, s, st.centered)
        for std in ("sample", "population"):
            sd = st.std(std)
            for eps in EPSILONS:
                a = centered_verl / torch.where(single, torch.full_like(s, eps_one[eps]), sd + eps)
                add("grpo", a, std=std, eps=eps, singleton="verl")
                add("grpo", _singleton_zero(a, st), std=std, eps=eps, singleton="zero")
                bw = G.batch_whiten(s, None, std=std, eps=eps).double()
                add("batch_whiten", bw, std=std, eps=eps)
                for scale_of in ("scores", "centered"):
                    gc = G.group_center_batch_scale(s, g, scale_of=scale_of, std=std, eps=eps).double()
                    add("group_center_batch_scale", gc, scale_of=scale_of, std=std, eps=eps)
                if all_pairs and std == "sample":
                    add("grpo_passk", G.grpo_passk(s, g, norm=True, eps=eps).double(), norm=True, eps=eps)
        add("dr_grpo", centered_verl, singleton="verl")
        add("group_mean", st.centered, singleton="zero")
        add("rloo", G.rloo(s, g, singleton="score").double(), singleton="verl")
        add("rloo", G.rloo(s, g, singleton="zero").double(), singleton="zero")
        add("opo", G.opo(s, g, b.n_pol).double())
        add("gpg", G.gpg(s, g).double())
        if all_pairs:
            add("grpo_passk", G.grpo_passk(s, g, norm=False).double(), norm=False)
    return out


# ---- token / turn family ----------------------------------------------------------------------


def returns_reset_at_gaps(rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """[B, T] returns-to-go that restart at every mask-0 gap: each maximal run of policy tokens
    only sees its own rewards (REINFORCE++ treating a 0 in the mask as a terminal). 0 off-mask."""
    m = mask != 0
    B, T = m.shape
    g = TK.returns_to_go(rewards, m, gamma)
    lay = compress(m)
    buf = lay.scatter(g)
    ordn = lay.idx  # 1-based ordinal of each policy token
    start = m & ~torch.nn.functional.pad(m[:, :-1], (1, 0), value=False)
    tid = torch.cumsum(start.long(), 1)
    K = int(tid.max()) + 1 if tid.numel() else 1
    key = torch.arange(B)[:, None] * K + tid
    end = torch.zeros(B * K, dtype=torch.long).scatter_reduce(0, key[m], ordn[m], "amax", include_self=True)
    e = torch.where(m, end[key], 0)
    nxt = buf.gather(1, torch.where(m, e + 1, 0))
    if gamma == 1.0:
        return torch.where(m, g - nxt, 0.0)
    k = (e - ordn + 1).to(g.dtype)
    return torch.where(m, g - (gamma**k) * nxt, 0.0)


def raw(b: Batch, scheme: str, p: dict[str, Any]) -> tuple[Tensor, Tensor]:
    """(raw advantages [B, T], the mask the trainer used [B, T]) of a token/turn configuration."""
    # "response": the loss mask covers tool tokens; "response_recursion" (verl before PR #2337):
    # only the recursion steps through them, whitening and the loss use the policy mask.
    mask = b.resp if p["mask"] in ("response", "response_recursion") else b.pol
    r = b.r_end if p["reward_at"] == "row_end" else b.r
    if r is None:  # configurations only move the reward where prepare() found one to move
        raise ValueError("reward_at='row_end' on a batch with no reward to move")
    lv = b.lv if p.get("bootstrap") else None
    gamma = p["gamma"]
    if scheme in ("token_gae", "turn_gae") and b.v is None:
        raise ValueError(f"{scheme} needs values")
    if scheme == "token_gae":
        a, _ = TK.gae(r, cast(Tensor, b.v), mask, gamma, p["lam"], lv)
    elif scheme == "turn_gae":
        tids = b.turn_ids if p["mask"] == "policy" else None
        a, _ = TK.turn_gae(r, cast(Tensor, b.v), mask, gamma, p["lam"], tids, lv)
    elif p.get("reset_at_gaps"):
        a = returns_reset_at_gaps(r, mask, gamma)
    else:
        a = TK.returns_to_go(r, mask, gamma)
    return a, (b.pol if p["mask"] == "response_recursion" else mask)


def token_configs(b: Batch) -> list[tuple[str, dict[str, Any]]]:
    """Every raw token/turn configuration (scheme, params) worth trying on this batch; whitening is
    not part of it (the screen scores each raw configuration with and without it)."""
    masks = ["policy"] + (["response"] if b.has_gaps else [])
    rats = ["last_policy"] + (["row_end"] if b.r_end is not None else [])
    boots = [True, False] if b.has_boot else [False]
    out: list[tuple[str, dict[str, Any]]] = []
    if b.has_gaps and b.v is not None:
        masks.append("response_recursion")  # GAE only (verl PR #2337)
    for mk in masks:
        for rat in rats:
            flags = {"mask": mk, "reward_at": rat}
            if mk == "response_recursion":
                for scheme in ("token_gae", "turn_gae"):
                    for gamma in GAMMAS:
                        for lam in LAMBDAS:
                            for boot in boots:
                                out.append((scheme, {"gamma": gamma, "lam": lam, **flags, "bootstrap": boot}))
                continue
            if b.v is not None:
                for scheme in ("token_gae", "turn_gae"):
                    for gamma in GAMMAS:
                        for lam in LAMBDAS:
                            for boot in boots:
                                out.append((scheme, {"gamma": gamma, "lam": lam, **flags, "bootstrap": boot}))
            resets = [False, True] if (b.has_gaps and mk == "policy") else [False]
            for gamma in GAMMAS:
                for reset in resets:
                    out.append(("returns", {"gamma": gamma, **flags, "reset_at_gaps": reset}))
    return out


def full_token(
    b: Batch,
    scheme: str,
    p: dict[str, Any],
    whitening: Sequence[str] = ("none", "batch"),
    factors: Sequence[str] | None = None,
) -> list[Cand]:
    """The whole-batch candidates of one raw configuration: one per whitening (``"batch"`` once
    per whitening factor, ``factors`` or the batch's)."""
    adv, mask = raw(b, scheme, p)
    out = []
    kind = "turn" if scheme == "turn_gae" else "token"
    for wh in whitening:
        if wh == "batch":
            name = {"token_gae": "verl_gae", "returns": "reinforce_plus_plus"}.get(scheme, scheme)
            refs = [
                (whiten_tokens(adv, mask, f), {"whiten": wh, "whiten_factor": f})
                for f in (factors or b.factors)
            ]
        else:
            name, refs = scheme, [(adv, {"whiten": wh})]
        for ref, wp in refs:
            ref = torch.where(b.pol, ref, 0.0)
            mx, sh, inl = share(b, ref)
            out.append(Cand(name, {**p, **wp}, kind, max_abs=mx, share=sh, inlier=inl, ref=ref, raw=adv))
    return out


def base_scheme(name: str) -> str:
    """The raw token scheme behind a whitened name (``verl_gae`` is whitened ``token_gae``)."""
    return {"verl_gae": "token_gae", "reinforce_plus_plus": "returns"}.get(name, name)


def ref_of(b: Batch, c: Cand) -> tuple[Tensor, Tensor]:
    """(reference [B, T], raw [B, T]) of a candidate on the whole batch."""
    if c.kind == "outcome":
        ref = broadcast(b, c.vec)
        return ref, ref
    if c.ref is None:
        p = {k: v for k, v in c.params.items() if k not in ("whiten", "whiten_factor")}
        fac = c.params.get("whiten_factor")
        (got,) = full_token(
            b, base_scheme(c.scheme), p, (c.params["whiten"],), None if fac is None else (fac,)
        )
        c.ref, c.raw = got.ref, got.raw
    return cast(Tensor, c.ref), cast(Tensor, c.raw)


def fixed_raw(b: Batch, c: Cand, key: str, good: Any, outcome: list[Cand]) -> Tensor | None:
    """The raw advantages of ``c`` with hypothesis ``key`` switched back to ``good`` (None when
    the outcome family holds no such variant)."""
    p = dict(c.params, **{key: good})
    if c.kind == "outcome":
        same = [o for o in outcome if o.scheme == c.scheme and o.params == p]
        return broadcast(b, same[0].vec) if same else None
    p.pop("whiten", None)
    p.pop("whiten_factor", None)
    adv, _ = raw(b, base_scheme(c.scheme), p)
    return adv
