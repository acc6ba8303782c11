"""The findings: each detector names the exact tokens one kind of problem touches.

**Adding a finding** happens here and only here: write a detector ``(ctx: Context) -> list[dict]``
that builds its findings with :func:`~.report.finding` (and adds the tokens it explains to
``ctx.claimed`` so that later detectors do not report them again), then put it in
:data:`DETECTORS` at the place its priority asks for. A finding that comes from a bug hypothesis
needs no detector of its own: its row in :data:`.hypotheses.HYPOTHESES` is enough
(:func:`bug_hypotheses` reports it).

Detectors run in :data:`DETECTORS` order: data findings that hold whatever the scheme, then the best
match's bug hypotheses and conventions, then group pathologies, turn constancy and, last, whatever
no detector claimed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .. import groups as G
from .. import token as TK
from ..losses import CLIPPING, TokenState, loss_weights_and_states
from ..registry import get
from .batch import Batch, is_token, on_policy_rewards, row_end_rewards
from .candidates import Cand, broadcast, num, public
from .constants import (
    CAP,
    ICEPOP_WINDOW,
    KIND_PROMPT,
    KIND_TOOL,
    LARGE_ADV_QUANTILE,
    RAW_TOL,
    SPIKE_ADV,
    SPIKE_STD,
    TOKEN_TOL,
    ZEROED_WARN_SHARE,
)
from .dialects import departures
from .dialects import run as run_dialect
from .hypotheses import CONVENTIONS, HYPOTHESES, Hypothesis, base_scheme, fixed_raw, outcome_candidates, raw
from .report import finding
from .search import Search


@dataclass
class Context:
    """What every detector may read: the batch, the search's outcome and the closest fit's
    advantages. ``claimed`` [B, T] bool: policy tokens an earlier finding already explains."""

    b: Batch
    search: Search
    ref: Tensor  # [B, T] the closest fit's advantages (0 off-policy)
    raw: Tensor  # [B, T] the same before whitening
    claimed: Tensor
    icepop_window: str = ICEPOP_WINDOW  # token-level IcePop's "lo_hi" for credit_masked_by_rollout_correction

    @property
    def pick(self) -> Cand | None:
        """The best match (None when nothing matches)."""
        return self.search.pick

    @property
    def closest(self) -> Cand:
        """The best match or, without one, the closest fit."""
        return self.search.closest


def changed(a: Tensor, c: Tensor, pol: Tensor) -> Tensor:
    """[B, T] policy tokens where the raw advantages ``a`` and ``c`` differ (relative RAW_TOL)."""
    return pol & ((a - c).abs() > RAW_TOL * (1 + c.abs()))


# ---- 1. data findings (whatever the scheme) ---------------------------------------------------


def _verl_carry(b: Batch, off: Tensor) -> bool:
    """True when every flagged off-policy value is what verl's unmasked GAE output holds there:
    the uploaded value of the next policy token to its right, or (after a row's last policy
    token) one batch-wide constant (-mean/std of the whitening)."""
    B, T = b.u.shape
    pos = torch.arange(T).expand(B, T)
    nxt = torch.where(b.pol, pos, T).flip(1).cummin(1).values.flip(1)
    has = nxt < T
    carry = b.u.gather(1, nxt.clamp(max=T - 1))
    ok_next = ((b.u - carry).abs() <= TOKEN_TOL) | ~has
    tail = off & ~has
    if bool(tail.any()):
        vals = b.u[tail]
        ok_tail = bool(((vals - vals[0]).abs() <= TOKEN_TOL).all())
    else:
        ok_tail = True
    return ok_tail and bool(ok_next[off].all()) and bool((off & has).any())


def credit_on_non_policy_tokens(ctx: Context) -> list[dict[str, Any]]:
    """Prompt or tool tokens with a nonzero uploaded advantage (a warning when they only hold the
    values verl's GAE leaves on masked positions)."""
    b = ctx.b
    off = ((b.kinds == KIND_PROMPT) | (b.kinds == KIND_TOOL)) & (b.u.abs() > TOKEN_TOL)
    if not bool(off.any()):
        return []
    n_tool = int((off & (b.kinds == KIND_TOOL)).sum())
    carried = _verl_carry(b, off)
    # The same pattern, said in the words of the best match's family: a token-level estimator
    # (verl's GAE) leaves it on masked positions; an outcome one (GRPO, RLOO, ...) puts it there
    # when its one number per episode is spread over every response token.
    carry = (
        "the values are what verl's GAE leaves on masked positions (the next policy token's advantage, "
        "or -mean/std after the last one)"
        if ctx.closest.kind != "outcome"
        else "the values are each episode's own advantage, spread over every response token (tool output "
        "included) instead of its policy tokens only"
    )
    text = (
        carry + ": harmless only if the loss masks these tokens"
        if carried
        else "the loss trains on tokens the policy did not choose"
    )
    return [
        finding(
            "credit_on_non_policy_tokens",
            "warning" if carried else "error",
            f"{int(off.sum())} prompt/tool tokens carry a nonzero advantage ({n_tool} of them tool output): "
            + text,
            off,
            {"max_abs": float(b.u[off].abs().max()), "tool_tokens": n_tool, "verl_carry_pattern": carried},
        )
    ]


# A log-prob below this at a re-rendered token: the trainer saw a token the model found improbable.
IMPROBABLE_LOGPROB = -10.0


def retokenization_drift(ctx: Context) -> list[dict[str, Any]]:
    """Sampled tokens that a later turn's prompt re-renders as other tokens (token-in/token-out
    broken: a trainer that reads the prompts trains on tokens the model never chose). A warning; an
    error when the upload's log-probs there are below ``IMPROBABLE_LOGPROB``."""
    b = ctx.b
    if b.drift is None or not bool(b.drift.any()):
        return []
    mask = b.drift & is_token(b.kinds)
    improbable = (
        mask & (b.drift_lp < IMPROBABLE_LOGPROB) if b.drift_lp is not None else torch.zeros_like(mask)
    )
    n_imp = int(improbable.sum())
    n_eps = int(mask.any(1).sum())
    msg = (
        f"{int(mask.sum())} sampled tokens in {n_eps} episodes are re-rendered as other tokens by a later "
        "turn's prompt (the loop decodes and re-encodes them): a trainer that reads the prompts trains "
        "on tokens the model never sampled"
    )
    if n_imp:
        msg += f"; {n_imp} of them have a log-prob below {IMPROBABLE_LOGPROB:g}"
    return [
        finding(
            "retokenization_drift",
            "error" if n_imp else "warning",
            msg,
            improbable if n_imp else mask,
            {"tokens": int(mask.sum()), "episodes": n_eps, "improbable_tokens": n_imp},
        )
    ]


def mask_misaligned(ctx: Context) -> list[dict[str, Any]]:
    """Tokens where the trainer's own loss or tool mask does not fit its ids (a mask longer or
    shorter than the ids, or one that makes template or tool tokens trainable)."""
    b = ctx.b
    if b.misaligned is None or not bool(b.misaligned.any()):
        return []
    mask = b.misaligned & is_token(b.kinds)
    n_eps = int(b.misaligned.any(1).sum())
    return [
        finding(
            "mask_misaligned",
            "error",
            f"the trainer's own mask does not fit its tokens in {n_eps} episodes ({int(mask.sum())} "
            "tokens): a mask longer or shorter than the ids, or template/tool tokens made trainable",
            mask,
            {"tokens": int(mask.sum()), "episodes": n_eps},
        )
    ]


def _raw_with_rewards(b: Batch, c: Cand, r: Tensor) -> Tensor | None:
    """The raw advantages of configuration ``c`` on ``b`` with the rewards ``r`` instead (None when
    the configuration does not exist there, e.g. a moved reward that no longer moves)."""
    bf = replace(b, r=r, r_end=row_end_rewards(r, b.pol, is_token(b.kinds)))
    if c.params.get("trainer") is not None:  # a trainer's dialect: run it again, as it ran
        return run_dialect(
            get(c.scheme), bf, float(c.params.get("gamma", 1.0)), float(c.params.get("lam", 1.0))
        )
    if c.kind == "outcome":
        cands = outcome_candidates(bf)
        # Once every reward is on a policy token the row's sum is the policy tokens' sum (one candidate).
        for p in (c.params, dict(c.params, score="policy")):
            same = [o for o in cands if o.scheme == c.scheme and o.params == p]
            if same:
                return broadcast(bf, same[0].vec)
        return None
    p = {k: v for k, v in c.params.items() if k not in ("whiten", "whiten_factor")}
    try:
        adv, _ = raw(bf, base_scheme(c.scheme), p)
    except ValueError:
        return None
    return adv


def reward_on_non_policy_token(ctx: Context) -> list[dict[str, Any]]:
    """The uploaded ``rewards`` hold a nonzero reward on a prompt/tool token (a data finding; the
    ``reward_at`` hypothesis of the same code is the trainer moving it). Error when the best match
    (closest fit) depends on where the reward sits: its raw advantages change on some policy token
    when each such reward moves to the policy token it belongs to (:func:`.batch.on_policy_rewards`);
    warning when nothing changes (a scheme that reads only the episode's total, such as an outcome
    baseline on the row's summed reward)."""
    b, c = ctx.b, ctx.closest
    off = is_token(b.kinds) & ~b.pol & (b.r != 0) & b.rows[:, None]
    if not bool(off.any()):
        return []
    fixed = _raw_with_rewards(b, c, on_policy_rewards(b))
    ch = b.pol.clone() if fixed is None else changed(ctx.raw, fixed, b.pol)
    depends = bool(ch.any())
    n, n_eps = int(off.sum()), int(off.any(1).sum())
    fit = "the best match" if ctx.pick is not None else "the closest fit"
    text = (
        f"{fit} ({c.scheme}) depends on where the reward sits: moving each onto the policy token it belongs "
        f"to changes the raw advantage of {int(ch.sum())} policy tokens"
        if depends
        else f"{fit} ({c.scheme}) does not depend on where the reward sits (it reads only the episode's total), "
        "but a scheme that does would credit tokens the policy did not choose"
    )
    return [
        finding(
            "reward_on_non_policy_token",
            "error" if depends else "warning",
            f"the uploaded rewards put {n} nonzero rewards on prompt/tool tokens in {n_eps} episodes; "
            + text,
            off,
            {
                "source": "rewards",
                "rewards": [num(float(x)) for x in b.r[off][:CAP].tolist()],
                "depends_on_placement": depends,
                "policy_tokens_changed": int(ch.sum()),
                "scheme": c.scheme,
                "params": dict(c.params),
            },
        )
    ]


# ---- 2. the best match's bug hypotheses and conventions ---------------------------------------


def _bug_finding(
    h: Hypothesis, pick: Cand, b: Batch, ch: Tensor, raw: Tensor, fixed: Tensor
) -> dict[str, Any]:
    ev: dict[str, Any] = {
        "hypothesis": {h.key: pick.params[h.key]},
        "max_raw_change": num(float((raw - fixed)[ch].abs().max())) if bool(ch.any()) else 0.0,
        **h.evidence(b),
    }
    return finding(
        h.code,
        "error",
        f"matches {pick.scheme} where {h.text}; {int(ch.sum())} policy tokens get a different raw advantage "
        "than the correct computation",
        ch,
        ev,
    )


def bug_hypotheses(ctx: Context) -> list[dict[str, Any]]:
    """One finding per hypothesis of :data:`HYPOTHESES` the best match needs: the policy tokens whose
    raw (pre-whitening) advantage changes when that hypothesis alone is switched back."""
    pick, b = ctx.pick, ctx.b
    if pick is None:
        return []
    out = []
    for h in HYPOTHESES:
        if pick.params.get(h.key) != h.bad or not h.observable(b):
            continue
        fixed = fixed_raw(b, pick, h.key, h.good, ctx.search.outcome)
        if fixed is None:
            continue
        ch = changed(ctx.raw, fixed, b.pol)
        out.append(_bug_finding(h, pick, b, ch, ctx.raw, fixed))
        ctx.claimed |= ch
    return out


def dialect_departures(ctx: Context) -> list[dict[str, Any]]:
    """When the best match is a trainer's dialect: the departures from our conventions its
    registration lists (``departs``) that this batch shows (:mod:`.departures`)."""
    out = []
    for d, message, where, evidence in departures(ctx.b, ctx.pick):
        ctx.claimed |= where & ctx.b.pol
        out.append(finding(d.code, d.severity, message, where, evidence))
    return out


def convention_differs(ctx: Context) -> list[dict[str, Any]]:
    """An outcome match computed with conventions other than verl's defaults (info, not a bug)."""
    pick, b = ctx.pick, ctx.b
    if pick is None or pick.kind != "outcome":
        return []
    devs = {k: pick.params[k] for k, d in CONVENTIONS.items() if k in pick.params and pick.params[k] != d}
    if not devs:
        return []
    p = dict(pick.params, **{k: CONVENTIONS[k] for k in devs})
    same = [o for o in ctx.search.outcome if o.scheme == pick.scheme and o.params == p]
    if not same:
        return []
    ch = b.pol & ((broadcast(b, same[0].vec) - ctx.ref).abs() > TOKEN_TOL)
    if not bool(ch.any()):
        return []
    return [
        finding(
            "convention_differs",
            "info",
            f"{pick.scheme} computed with "
            + ", ".join(f"{k}={v}" for k, v in devs.items())
            + " (verl's default: "
            + ", ".join(f"{k}={CONVENTIONS[k]}" for k in devs)
            + f"); {int(ch.sum())} policy tokens would differ by more than {TOKEN_TOL:g}",
            ch,
            {"found": devs, "default": {k: CONVENTIONS[k] for k in devs}},
        )
    ]


# ---- 3. group pathologies (group schemes only) ------------------------------------------------


def group_pathologies(ctx: Context) -> list[dict[str, Any]]:
    """Nonzero advantages in all-equal groups (without a match) and std-eps spikes."""
    b, c, pick = ctx.b, ctx.closest, ctx.pick
    if c.kind != "outcome":
        return []
    out = []
    s = (b.r * b.pol).sum(1) if c.params.get("score") != "row" else b.r.sum(1)
    if c.params.get("reward_at") == "row_end" and b.r_end is not None:
        s = (b.r_end * b.pol).sum(1)
    st = G.group_stats(s, b.groups)
    grouped = st.count >= 2
    big = b.pol & (b.u.abs() > TOKEN_TOL)
    zero = grouped & (st.m2 == 0)
    if pick is None:
        ch = big & zero[:, None] & ~ctx.claimed
        if bool(ch.any()):
            eps_ = sorted(set(ch.nonzero()[:, 0].tolist()))
            out.append(
                finding(
                    "zero_variance_group_nonzero_advantage",
                    "error",
                    f"{len(eps_)} episodes in groups whose scores are all equal carry nonzero advantages: "
                    "a group with no spread has nothing to compare",
                    ch,
                    {"groups": sorted(set(st.inverse[eps_].tolist())), "scores": s[eps_].tolist()},
                )
            )
            ctx.claimed |= ch
    sd = torch.nan_to_num(st.std("sample"))
    noisy = grouped & (sd > 0) & (sd < SPIKE_STD)
    ch = b.pol & noisy[:, None] & (b.u.abs() >= SPIKE_ADV)
    if bool(ch.any()):
        eps_ = sorted(set(ch.nonzero()[:, 0].tolist()))
        stds = sorted({float(x) for x in sd[eps_].tolist()})
        ev = {
            "group_std": stds,
            "max_abs": float(b.u[ch].abs().max()),
            "scheme": c.scheme,
            "params": dict(c.params),
        }
        out.append(
            finding(
                "std_eps_spike",
                "warning",
                f"{len(eps_)} episodes in groups whose scores differ by less than {SPIKE_STD:g} (std "
                f"{stds[0]:.3g}) get advantages up to {ev['max_abs']:.3g}: noise divided by a "
                "near-zero std (+eps) becomes a phantom signal",
                ch,
                ev,
            )
        )
    return out


# ---- 4. constant per episode / per turn -------------------------------------------------------


def _segment_first(b: Batch, kind: str) -> Tensor:
    """[B, T] the uploaded value at the first policy token of each token's episode (or turn)."""
    if kind == "outcome":
        return b.ep_first[:, None].expand_as(b.u)
    ti = TK.turn_spans(b.pol, b.turn_ids)
    B, T = ti.shape
    K = int(ti.max()) + 1 if ti.numel() else 0
    if K <= 0:
        return b.u
    key = torch.arange(B)[:, None] * K + ti.clamp(min=0)
    pos = torch.arange(T).expand(B, T)
    firsts = torch.full((B * K,), T, dtype=torch.long).scatter_reduce(
        0, key[b.pol], pos[b.pol], "amin", include_self=True
    )
    fpos = firsts[key].clamp(max=T - 1)
    return b.u.gather(1, fpos)


def advantage_not_constant_per_turn(ctx: Context) -> list[dict[str, Any]]:
    """Outcome / turn schemes give one advantage per episode (turn): tokens off their first value."""
    b, c = ctx.b, ctx.closest
    if c.kind not in ("outcome", "turn"):
        return []
    seg = _segment_first(b, c.kind)
    ch = b.pol & ((b.u - seg).abs() > TOKEN_TOL) & ~ctx.claimed
    if not bool(ch.any()):
        return []
    unit = "episode" if c.kind == "outcome" else "turn"
    ctx.claimed |= ch
    return [
        finding(
            "advantage_not_constant_per_turn",
            "error" if ctx.pick is None else "warning",
            f"{c.scheme} gives one advantage per {unit}, but {int(ch.sum())} policy tokens differ "
            f"from the first token of their {unit}",
            ch,
            {"unit": unit, "max_abs": float((b.u - seg)[ch].abs().max())},
        )
    ]


# ---- 5. whatever is left ----------------------------------------------------------------------


def mismatch_unexplained(ctx: Context) -> list[dict[str, Any]]:
    """Policy tokens off the best match (closest fit) that no detector above claimed."""
    b, c, pick = ctx.b, ctx.closest, ctx.pick
    diff = b.pol & ~((b.u - ctx.ref).abs() <= TOKEN_TOL) & ~ctx.claimed
    if not bool(diff.any()):
        return []
    off_by = (b.u - ctx.ref)[diff].abs()
    return [
        finding(
            "mismatch_unexplained",
            "error" if pick is None else "warning",
            f"{int(diff.sum())} policy tokens differ from {'the best match' if pick else 'the closest fit'} "
            f"({c.scheme}) by more than {TOKEN_TOL:g}, and no known bug explains them",
            diff,
            {"reference": public(c), "max_abs": num(float(torch.nan_to_num(off_by, nan=math.inf).max()))},
        )
    ]


# ---- 5. the loss: large advantages the gradient never sees --------------------------------------

# The TokenState bits whose zero weight counts as PPO clipping (the step metrics' reading).
_CLIP_BITS = int(CLIPPING)


def large_advantages(b: Batch) -> Tensor:
    """[B, T] bool: policy tokens with a "large" uploaded |A|: ``|A| > 0`` and ``|A| >=`` the
    :data:`.constants.LARGE_ADV_QUANTILE` (90th) percentile of |A| over the batch's policy tokens
    (linear interpolation between order statistics, numpy's and torch's default)."""
    a = b.u.abs()
    vals = a[b.pol]
    n = int(vals.numel())
    if n == 0:
        return torch.zeros_like(b.pol)
    pos = LARGE_ADV_QUANTILE * (n - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, n - 1)
    # The two order statistics by selection (O(n)), not a full sort of the batch's policy tokens.
    part = np.partition(vals.numpy(), [lo, hi])
    v_lo, v_hi = float(part[lo]), float(part[hi])
    q = v_lo + (pos - lo) * (v_hi - v_lo)
    return b.pol & (a > 0) & (a >= q)


def credit_zeroed_by_loss(ctx: Context) -> list[dict[str, Any]]:
    """Large-|A| policy tokens (:func:`large_advantages`) whose loss weight is 0, from the uploaded
    advantages and log-probs (only when both ``logprobs`` and ``rollout_logprobs`` are given; else
    nothing). ``credit_clipped``: verl's vanilla PPO with its defaults (clip 0.2, dual clip 3) in
    bypass mode, the ratio ``exp(logprobs - rollout_logprobs)`` (verl's own ratio is 1 on a step's
    first update), per token; zero weight with a clipping bit. ``credit_masked_by_rollout_correction``:
    token-level IcePop on ``exp(logprobs - rollout_logprobs)`` with the window ``ctx.icepop_window``
    (PPO ratio 1); zero weight with the IcePop bit. Severity info when the named tokens hold less than
    :data:`.constants.ZEROED_WARN_SHARE` (5 %) of the large-|A| mass, warning otherwise."""
    b = ctx.b
    if b.lp is None or b.rlp is None:
        return []
    large = large_advantages(b)
    if not bool(large.any()):
        return []
    a = torch.where(b.pol, b.u, 0.0)
    mass = float(a.abs()[large].sum())
    lp, rlp = torch.nan_to_num(b.lp), torch.nan_to_num(b.rlp)
    w_clip, st_clip = loss_weights_and_states(a, lp, rlp, b.pol, loss="vanilla", agg="token-sum")
    w_mask, st_mask = loss_weights_and_states(
        a, lp, lp, b.pol, loss="vanilla", agg="token-sum", rollout_log_prob=rlp,
        rollout_is="token", rollout_is_threshold=ctx.icepop_window,
    )  # fmt: skip
    clipped = large & (w_clip == 0) & ((st_clip.long() & _CLIP_BITS) != 0)
    masked = large & (w_mask == 0) & ((st_mask.long() & int(TokenState.ICEPOP_ZEROED)) != 0)
    n_large = int(large.sum())
    out = []
    for code, sel, why, extra in (
        (
            "credit_clipped",
            clipped,
            "PPO clipping (verl's vanilla loss and defaults, the training/rollout ratio as in bypass mode)",
            {"loss": "vanilla", "clip_ratio": 0.2, "clip_ratio_c": 3.0, "bypass": True},
        ),
        (
            "credit_masked_by_rollout_correction",
            masked,
            f"token-level IcePop masking (window {ctx.icepop_window} on the training/rollout ratio)",
            {"rollout_is": "token", "rollout_is_threshold": ctx.icepop_window},
        ),
    ):
        if not bool(sel.any()):
            continue
        share = float(a.abs()[sel].sum()) / mass if mass > 0 else 0.0
        n = int(sel.sum())
        out.append(
            finding(
                code,
                "info" if share < ZEROED_WARN_SHARE else "warning",
                f"{n} of the batch's {n_large} large-|A| policy tokens (|A| at or above its 90th percentile) "
                f"get no gradient from {why}: {100 * share:.3g} % of the large-|A| mass",
                sel,
                {
                    **extra,
                    "share_of_large_abs_advantage": share,
                    "large_tokens": n_large,
                    "large_threshold_quantile": LARGE_ADV_QUANTILE,
                    "abs_advantages": [num(float(x)) for x in a.abs()[sel][:CAP].tolist()],
                    "log_ratio": [num(float(x)) for x in (lp - rlp)[sel][:CAP].tolist()],
                },
            )
        )
    return out


Detector = Callable[[Context], list[dict[str, Any]]]

# The order is the priority: a token claimed by an earlier detector is not reported again later.
DETECTORS: tuple[Detector, ...] = (
    credit_on_non_policy_tokens,
    reward_on_non_policy_token,
    retokenization_drift,
    mask_misaligned,
    bug_hypotheses,
    dialect_departures,
    convention_differs,
    group_pathologies,
    advantage_not_constant_per_turn,
    mismatch_unexplained,
    credit_zeroed_by_loss,
)


def detect(ctx: Context) -> list[dict[str, Any]]:
    """Every detector's findings, in :data:`DETECTORS` order."""
    out: list[dict[str, Any]] = []
    for d in DETECTORS:
        out += d(ctx)
    return out
