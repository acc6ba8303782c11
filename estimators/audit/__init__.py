"""Audit a trainer's own advantages: which configuration computed them, and which tokens are wrong.

Given a padded batch (an :class:`EstimatorInput`), the token kinds and the advantages a trainer
actually used (``uploaded`` [B, T]), :func:`audit` answers two questions.

**Which configuration explains them** (``best_match``). Comparison is on policy tokens only. The
search space is the registry's estimators crossed with the conventions trainers differ on:

* outcome/group schemes (grpo, dr_grpo / group_mean, rloo, batch_whiten,
  group_center_batch_scale, opo, gpg, grpo_passk): std sample or population, eps 1e-8 / 1e-6 /
  1e-4, the singleton rule (verl's ``s/(1+eps)`` or ``s`` versus 0), the score summed over policy
  tokens or over the whole row, and whitening off or over the batch's tokens (verl's
  ``masked_whiten``: dr_grpo + whitening is REINFORCE++-baseline, grpo + whitening is verl's GDPO
  fallback). These give one number per episode, so each is scored on ``[B]`` vectors: with
  ``umin``/``umax`` the row's extreme uploaded values, the exact max |uploaded - ref| of a
  row-constant reference ``c`` is ``max(umax - c, c - umin)``. Hundreds of them cost
  milliseconds.
* token/turn schemes (token GAE, turn GAE, returns-to-go / REINFORCE++): gamma in
  :data:`GAMMAS`, lambda in :data:`LAMBDAS` (1.0, 0.99 and 0.95 included; lambda 0 is the TD
  error), whitening off or over the batch. These need the whole [B, T] recursion, so they are
  first **screened on a few rows** (:data:`SCREEN_ROWS`, chosen to include every row where a
  hypothesis below changes anything). Whitening over the batch is an affine map of the raw
  advantages, so a least-squares affine fit on the screened rows scores a raw configuration
  against both "whitened" and "not whitened" at once. Only the few best survivors are computed
  on the whole batch.
* whitening's arithmetic (``whiten_factor``, reported whenever ``whiten`` is ``batch``): the
  mean's count and the Bessel factor N/(N-1) in the data's float64 (``"float64"``, our
  :func:`estimators.stats.whiten`), or as verl's ``masked_whiten`` computes them from an integer
  or bool mask (``"float32"``: the count is an integer tensor, so ``count + 1e-8`` rounds to N and
  N/(N-1) is a float32 division, a relative gap of up to ~6e-8 on every whitened token). Both
  are correct computations, not bugs or conventions to flag; the one that fits closer wins.
  Uploads with no more than float32 precision cannot tell them apart (and a float32 trainer's
  factor is float32 either way), so only ``"float32"`` is searched for them.
* the known bugs, as hypotheses on the same search (each tried only where it changes something):
  the loss mask covering every response token, tool output included (GAE stepping through tool
  spans, verl PR #2337); the outcome reward sitting on the row's last token instead of its last
  policy token (verl PR #6392); the return reset at every mask-0 gap (REINFORCE++ treating a 0 in
  the mask as a terminal, verl issue #7278); truncated rows not bootstrapped from their final value.

A configuration **matches** when ``max_abs_diff <= MATCH_MAX_ABS`` (1e-4) and at least
``MATCH_SHARE`` (99 %) of policy tokens are within ``TOKEN_TOL`` (1e-5): float32 trainers are
not bit-exact, but a real difference (a wrong eps, a dropped reward) is far larger. Among the
matches, those within 1e-6 of the best are ranked by how few bug hypotheses and non-default
conventions they need (so a bug is only named when the correct computation does not fit).
Without a match ``best_match`` says so (``scheme`` None) and gives the ``closest`` fit.

**Which tokens are wrong** (``findings``). A finding names exact positions (the first
:data:`CAP` of them, with ``token_count`` the total). For a bug hypothesis they are the policy
tokens whose raw (pre-whitening) advantage changes when that hypothesis alone is switched back to
the correct computation (whitening would move every token of the batch and say nothing).

=====================================  ========  ===============================================
code                                   severity  tokens
=====================================  ========  ===============================================
credit_on_non_policy_tokens            error     prompt/tool tokens with |advantage| > 1e-5
                                       (warning  when they only hold verl's carried GAE values)
gae_through_tool_spans                 error     policy tokens changed by the mask covering tools
reward_on_non_policy_token             error     policy tokens changed by the moved reward;
                                                 or (data, ``evidence.source`` "rewards") the
                                                 prompt/tool tokens where the uploaded rewards
                                                 hold a nonzero reward: error when the best match
                                                 (closest fit) changes once they move onto the
                                                 policy token before them, warning otherwise
retokenization_drift                   warning   (data, ``drift``) sampled tokens a later prompt
                                                 re-renders as others; error when the upload's
                                                 log-probs there are below -10
mask_misaligned                        error     (data, ``misaligned``) tokens where the
                                                 trainer's own mask does not fit its ids
reward_dropped_before_tool_span        error     policy tokens changed by the reset at gaps
truncated_as_terminated                error     policy tokens changed by the missing bootstrap
zero_variance_group_nonzero_advantage  error     nonzero tokens of all-equal groups (no match)
std_eps_spike                          warning   |adv| >= 0.1 in groups with score std < 1e-4
convention_differs                     info      tokens the verl default (std, eps, singleton)
                                                 would change by more than 1e-5
advantage_not_constant_per_turn        error     tokens off their episode's (turn's) first value
                                                 (outcome / turn schemes; warning under a match)
mismatch_unexplained                   error     tokens off the closest fit that nothing above
                                                 claims (warning under a match)
=====================================  ========  ===============================================

The last two need ``logprobs`` and ``rollout_logprobs`` (:func:`audit`'s keywords); without them
there is no such finding. They read the uploaded advantages and claim nothing.

Uploaded advantages are compared as the trainer's loss sees them: the estimator's output times
the loss mask the trainer used. Everything runs in float64 on one intra-op thread. Token kinds use
the service's numbering (prompt 0, policy 1, tool 2; :data:`KIND_PAD` 255 past a row's end).

**Where things live** (one module per job; this package's ``__init__`` only runs them in order):

* :mod:`.constants` kind codes, search grids, tolerances;
* :mod:`.batch` the batch prepared once (masks, moved rewards, bootstrap values);
* :mod:`.whitening` masked whitening in both count arithmetics;
* :mod:`.candidates` a configuration and how it is scored, the match rule;
* :mod:`.hypotheses` the search space: **a new bug hypothesis goes here** (a row of
  ``HYPOTHESES``, its values in the enumeration, its arithmetic);
* :mod:`.search` screening, whole-batch evaluation and the pick;
* :mod:`.findings` the detectors: **a new finding goes here** (a detector in ``DETECTORS``);
* :mod:`.report` the answer (:class:`AuditResult`, ``best_match``, one finding's shape).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, cast

import torch
from torch import Tensor

from ..registry import EstimatorInput
from ..threads import one_thread
from .batch import prepare
from .constants import (
    CAP,
    EPSILONS,
    GAMMAS,
    ICEPOP_WINDOW,
    KIND_CODES,
    KIND_PAD,
    KIND_POLICY,
    KIND_PROMPT,
    KIND_TOOL,
    LAMBDAS,
    MATCH_MAX_ABS,
    MATCH_SHARE,
    TOKEN_TOL,
    WHITEN_FACTORS,
)
from .findings import Context, detect
from .hypotheses import ref_of, returns_reset_at_gaps
from .report import AuditResult, best_match, no_policy_tokens
from .search import search

__all__ = [
    "KIND_PAD",
    "KIND_PROMPT",
    "KIND_POLICY",
    "KIND_TOOL",
    "KIND_CODES",
    "GAMMAS",
    "LAMBDAS",
    "EPSILONS",
    "WHITEN_FACTORS",
    "TOKEN_TOL",
    "MATCH_MAX_ABS",
    "MATCH_SHARE",
    "CAP",
    "AuditResult",
    "audit",
    "audit_episodes",
    "returns_reset_at_gaps",
]


def audit(
    inp: EstimatorInput,
    uploaded_advantages: Tensor,
    kinds: Tensor,
    truncated: Tensor | None = None,
    *,
    logprobs: Tensor | None = None,
    rollout_logprobs: Tensor | None = None,
    icepop_window: str = ICEPOP_WINDOW,
    trainer: str | None = None,
    options: dict[str, dict[str, Any]] | None = None,
    drift: Tensor | None = None,
    drift_logprobs: Tensor | None = None,
    misaligned: Tensor | None = None,
) -> AuditResult:
    """Audit ``uploaded_advantages`` [B, T] (the trainer's own, as its loss sees them) against the
    registry's estimators and conventions on the padded batch ``inp``.

    ``kinds`` [B, T] integer codes: :data:`KIND_PROMPT` 0 / :data:`KIND_POLICY` 1 / :data:`KIND_TOOL` 2,
    :data:`KIND_PAD` 255 past a row's end (use an integer dtype that holds 255, e.g. uint8);
    ``inp.mask`` must be ``kinds == KIND_POLICY``. ``truncated`` [B] bool (optional) marks rows
    cut off before their end; ``inp.last_value`` [B] their bootstrap values (NaN: unknown).
    ``inp.gamma``/``inp.lam`` are ignored (they are searched). ``logprobs`` / ``rollout_logprobs``
    [B, T] (optional, both or neither): the training and rollout log-probs, for ``credit_clipped`` and
    ``credit_masked_by_rollout_correction`` (IcePop window ``icepop_window``, "lo_hi"). See the
    module docstring. ``trainer`` (a key of ``estimators.registry.TRAINERS``): the trainer the upload
    names, whose dialect is named first among equally good matches; ``options`` {dialect: {option:
    value}}: the options its configuration sets, tried beside the defaults. ``drift`` [B, T] bool (optional):
    the sampled tokens a later prompt re-renders as other tokens (token-in/token-out broken), with
    ``drift_logprobs`` [B, T] the upload's log-probs there (NaN: none), for
    ``retokenization_drift``; ``misaligned`` [B, T] bool: tokens where the trainer's own loss or tool
    mask does not fit its ids, for ``mask_misaligned``.
    """
    with one_thread():
        b = prepare(inp, uploaded_advantages, kinds, truncated)
        b = replace(b, drift=drift, drift_lp=drift_logprobs, misaligned=misaligned)
        if logprobs is not None and rollout_logprobs is not None:
            shape = tuple(b.u.shape)
            if tuple(logprobs.shape) != shape or tuple(rollout_logprobs.shape) != shape:
                raise ValueError(f"logprobs and rollout_logprobs must be [B, T] = {shape}")
            b = replace(b, lp=logprobs.double(), rlp=rollout_logprobs.double())
        if not bool(b.rows.any()):
            return no_policy_tokens()
        found = search(b, trainer, options)
        ref, raw = ref_of(b, found.closest)
        ctx = Context(
            b=b, search=found, ref=ref, raw=raw, claimed=torch.zeros_like(b.pol), icepop_window=icepop_window
        )
        findings = detect(ctx)
        return AuditResult(
            best_match=best_match(found), findings=findings, searched=found.searched, reference=ref
        )


def audit_episodes(
    kinds: Sequence[Sequence[str]],
    advantages: Sequence[Any],
    rewards: Sequence[Any],
    values: Sequence[Any] | None = None,
    groups: Sequence[Any] | None = None,
    turn_ids: Sequence[Any] | None = None,
    truncated: Sequence[bool] | None = None,
    bootstrap_value: Sequence[float | None] | None = None,
    logprobs: Sequence[Any] | None = None,
    rollout_logprobs: Sequence[Any] | None = None,
    trainer: str | None = None,
) -> AuditResult:
    """:func:`audit` on per-episode arrays (lists, numpy arrays or 1-D tensors of each episode's
    length): right-pads them into a batch. ``kinds`` holds "prompt" / "policy" / "tool" strings;
    ``rewards`` per-token (an outcome ``reward`` goes on the last policy token first);
    ``bootstrap_value`` None or NaN for terminated episodes; ``logprobs`` / ``rollout_logprobs``
    per-token (both or neither) for the loss findings."""
    B = len(kinds)
    T = max((len(k) for k in kinds), default=0)

    def pad_opt(xs: Sequence[Any] | None, dtype: torch.dtype = torch.float64) -> Tensor | None:
        return None if xs is None else pad(xs, dtype)

    def pad(xs: Sequence[Any], dtype: torch.dtype = torch.float64) -> Tensor:
        out = torch.zeros(B, T, dtype=dtype)
        for i, x in enumerate(xs):
            t = torch.as_tensor(x, dtype=dtype).reshape(-1)
            out[i, : t.numel()] = t
        return out

    kt = torch.full((B, T), KIND_PAD, dtype=torch.uint8)
    for i, ks in enumerate(kinds):
        kt[i, : len(ks)] = torch.tensor([KIND_CODES[k] for k in ks], dtype=torch.uint8)
    lv = None
    if bootstrap_value is not None:
        lv = torch.tensor([math.nan if x is None else float(x) for x in bootstrap_value], dtype=torch.float64)
    inp = EstimatorInput(
        rewards=pad(rewards),
        mask=kt == KIND_POLICY,
        values=pad_opt(values),
        # Any hashable labels (EstimatorInput.groups documents sequences; its annotation says Tensor).
        groups=None if groups is None else cast(Tensor, list(groups)),
        turn_ids=pad_opt(turn_ids, torch.long),
        last_value=lv,
    )
    tr = None if truncated is None else torch.tensor(list(truncated), dtype=torch.bool)
    return audit(
        inp,
        pad(advantages),
        kt,
        tr,
        logprobs=pad_opt(logprobs),
        rollout_logprobs=pad_opt(rollout_logprobs),
        trainer=trainer,
    )
