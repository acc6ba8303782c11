"""The service's audit: a batch's uploaded advantages through :func:`estimators.audit.audit`.

The computation, with no database: the API (``GET /api/batches/{id}/audit``, cached by
app/storage/audits.py), the episode page's ``audit_reference`` / ``audit_diff`` rows and the offline
``creditlens audit FILE`` all run it.

Episodes are indexed 0, 1, ... in upload order (the batch's rows): a finding's ``episodes`` and
``tokens`` ([episode, position]) use these indices; the service adds ``slugs`` (parallel to
``episodes``) and ``first`` (the first named token with its episode page URL, cursor on it).
Episodes without a group get a group of their own (:func:`app.core.domain.group_ids`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from app.core import domain, urls
from app.core.arrays import F64, EpisodeArrays
from app.core.errors import ApiError
from app.core.settings import Settings

# The formats whose files carry the trainer's advantages (named in the 409's message).
ADVANTAGE_FORMATS = ("native", "verl_pt", "nemo_rl", "safetensors", "slime_pt", "trl_completions", "atropos")


class Stats:
    """How many audits this process computed (a cache hit adds nothing; tests read it)."""

    computed = 0


def no_advantages(missing: int, total: int, first: int | None, where: str = "the batch") -> ApiError:
    """409: nothing to audit. ``first``: 1-based index of the first episode without advantages."""
    which = "none of its episodes has" if missing == total else f"{missing} of its {total} episodes have no"
    at = f" (the first is episode {first})" if first is not None and missing < total else ""
    return ApiError(
        409,
        "no_advantages",
        f"{where} cannot be audited: {which} uploaded advantages{at}. Upload the trainer's own advantages "
        "in the per-token field `advantages` (one number per token, as the loss saw them) of the native "
        "format, or in a file that carries them: " + ", ".join(ADVANTAGE_FORMATS[1:]) + ".",
        episode=first,
        field="advantages",
    )


def too_big(n_episodes: int, t_max: int, settings: Settings, where: str = "the batch") -> ApiError:
    """413: the audit's [B, T] work beyond the ``audit_max_cells`` budget."""
    cells = n_episodes * t_max
    return ApiError(
        413,
        "audit_too_large",
        f"auditing {where} needs {n_episodes} episodes x {t_max} tokens (its longest episode) = {cells:,} "
        f"cells; the limit is {settings.audit_max_cells:,} (setting CREDITLENS_AUDIT_MAX_CELLS). Upload fewer "
        "episodes per batch (split it) or shorter episodes.",
    )


# ---- the computation (no database) ------------------------------------------------------------


def run_audit(
    arrays: Sequence[EpisodeArrays],
    turn_ids: bool = False,
    trainer: str | None = None,
    options: dict[str, dict[str, Any]] | None = None,
) -> tuple[dict[str, Any], list[np.ndarray]]:
    """(the audit's JSON answer, each episode's reference advantages [T_i] float64) of a batch.

    Every episode must have ``advantages``. Rewards are the effective ones (outcome reward on the
    last policy token); critic values are used only when every episode has them. ``turn_ids``: every
    episode uploaded its turn ids (else a turn is a maximal run of policy tokens, the engine's
    default). With ``logprobs`` and ``rollout_logprobs`` on every episode the audit also names the
    large-|A| tokens the loss zeroes (``credit_clipped``, ``credit_masked_by_rollout_correction``;
    bypass-mode ratio and IcePop window as the step metrics read them). ``trainer``: the trainer the upload names (its
    dialects are ranked first; estimators.audit.audit); ``options``: its dialects' options as its
    configuration sets them (app/core/trainers.py trainer_options), tried beside the defaults."""
    import torch

    from app.core.metrics import STEP_LOSS_ICEPOP
    from estimators.audit import KIND_PAD, KIND_POLICY, audit
    from estimators.registry import EstimatorInput

    B = len(arrays)
    lens = np.fromiter((len(a.kinds) for a in arrays), dtype=np.int64, count=B)
    T = int(lens.max()) if B else 0
    kinds = np.full((B, T), KIND_PAD, dtype=np.uint8)  # the service's codes (app.core.domain)
    rew = np.zeros((B, T))
    adv = np.zeros((B, T))
    has_values = all(a.values is not None for a in arrays)
    val = np.zeros((B, T)) if has_values else None
    tid = np.full((B, T), -1, dtype=np.int64) if turn_ids else None
    has_lp = B > 0 and all(a.logprobs is not None and a.rollout_logprobs is not None for a in arrays)
    lp = np.zeros((B, T)) if has_lp else None
    rlp = np.zeros((B, T)) if has_lp else None
    for b, a in enumerate(arrays):
        n = len(a.kinds)
        kinds[b, :n] = a.kinds
        rew[b, :n] = a.rewards
        adv[b, :n] = a.advantages
        if val is not None:
            val[b, :n] = a.values
        if tid is not None:
            tid[b, :n] = a.turn_ids
        if lp is not None and rlp is not None:
            lp[b, :n] = a.logprobs
            rlp[b, :n] = a.rollout_logprobs
    kt = torch.from_numpy(kinds)
    truncated = torch.tensor([bool(a.truncated) for a in arrays], dtype=torch.bool)
    boot = [
        a.bootstrap_value if a.truncated and a.bootstrap_value is not None else float("nan") for a in arrays
    ]
    any_boot = any(a.truncated and a.bootstrap_value is not None for a in arrays)
    inp = EstimatorInput(
        rewards=torch.from_numpy(rew),
        mask=kt == KIND_POLICY,
        values=None if val is None else torch.from_numpy(val),
        groups=torch.from_numpy(domain.group_ids([a.group for a in arrays])),
        turn_ids=None if tid is None else torch.from_numpy(tid),
        last_value=torch.tensor(boot, dtype=torch.float64) if any_boot else None,
    )
    drift, drift_lp, misaligned = token_findings_inputs(arrays, B, T)
    res = audit(
        inp,
        torch.from_numpy(adv),
        kt,
        truncated,
        logprobs=None if lp is None else torch.from_numpy(lp),
        rollout_logprobs=None if rlp is None else torch.from_numpy(rlp),
        icepop_window=STEP_LOSS_ICEPOP,
        drift=drift,
        drift_logprobs=drift_lp,
        misaligned=misaligned,
        trainer=trainer,
        options=options,
    )
    Stats.computed += 1
    ref = res.reference
    refs = [
        np.zeros(int(n)) if ref is None else ref[b, : int(n)].numpy().astype(F64, copy=True)
        for b, n in enumerate(lens)
    ]
    return res.as_dict(), refs


def token_meta(meta_json: str | None) -> dict[str, Any]:
    """The meta keys the token findings read (``drift``, ``mask_misaligned``), parsed only when the
    episode's meta JSON holds one."""
    if not meta_json or ('"drift"' not in meta_json and '"mask_misaligned"' not in meta_json):
        return {}
    from app.core.arrays import json_loads

    meta = json_loads(meta_json)
    return {k: meta[k] for k in ("drift", "mask_misaligned") if k in meta}


def _positions(value: Any) -> list[int]:
    return (
        [p for p in value if isinstance(p, int) and not isinstance(p, bool)]
        if isinstance(value, list)
        else []
    )


def token_findings_inputs(arrays: Sequence[EpisodeArrays], B: int, T: int) -> tuple[Any, Any, Any]:
    """(drift [B, T] bool, its log-probs [B, T] float64, misaligned [B, T] bool) as torch tensors
    from the episodes' ``meta.drift`` (each turn's ``at``: stored positions of sampled ids a later
    prompt re-renders as others) and ``meta.mask_misaligned`` (``at``); None where no episode has
    any. The log-probs are the lowest of the episode's ``logprobs`` and ``rollout_logprobs``."""
    import torch

    drift = np.zeros((B, T), dtype=bool)
    mis = np.zeros((B, T), dtype=bool)
    lp = np.full((B, T), np.nan)
    for b, a in enumerate(arrays):
        n = len(a.kinds)
        turns = a.meta.get("drift") if isinstance(a.meta, dict) else None
        for d in turns if isinstance(turns, list) else []:
            at = [p for p in _positions(d.get("at") if isinstance(d, dict) else None) if 0 <= p < n]
            drift[b, at] = True
        bad = a.meta.get("mask_misaligned") if isinstance(a.meta, dict) else None
        if isinstance(bad, dict):
            mis[b, [p for p in _positions(bad.get("at")) if 0 <= p < n]] = True
        rows = [x for x in (a.logprobs, a.rollout_logprobs) if x is not None and len(x) == n]
        if rows and drift[b].any():
            lp[b, :n] = np.fmin.reduce(rows) if len(rows) > 1 else rows[0]
    return (
        torch.from_numpy(drift) if drift.any() else None,
        torch.from_numpy(lp) if drift.any() else None,
        torch.from_numpy(mis) if mis.any() else None,
    )


def decorate(
    body: dict[str, Any], slugs: Sequence[str] | None, kinds: Sequence[np.ndarray] | None = None
) -> dict[str, Any]:
    """Add ``slugs`` (parallel to ``episodes``) and ``first`` ({episode, position, slug, url}) to each
    finding, and ``n_errors``; ``slugs`` None (offline): positions only. ``kinds`` (each episode's
    codes): a first token inside a tool span opens that span in the link."""
    for f in body["findings"]:
        if slugs is not None:
            f["slugs"] = [slugs[i] for i in f["episodes"]]
        first = None
        if f["tokens"]:
            e, p = f["tokens"][0]
            first = {"episode": e, "position": p}
            if slugs is not None:
                first["slug"] = slugs[e]
                first["url"] = episode_link(slugs[e], p, None if kinds is None else kinds[e])
        f["first"] = first
    body["n_errors"] = sum(1 for f in body["findings"] if f["severity"] == "error")
    return body


AUDIT_VIEW_SCHEMES = ["uploaded", "audit_reference", "audit_diff"]


def episode_link(slug: str, position: int, kinds: np.ndarray | None = None) -> str:
    """The episode page showing the uploaded, reference and difference rows, the cursor on
    ``position`` (and, when it is a tool token, its tool span expanded), in the canonical form."""
    from app.core.views import EpisodeView

    open_spans = []
    if kinds is not None and kinds[position] == domain.TOOL:
        start = position
        while start > 0 and kinds[start - 1] == domain.TOOL:
            start -= 1
        open_spans = [start]
    return urls.episode(
        slug, EpisodeView(schemes=list(AUDIT_VIEW_SCHEMES), open=open_spans, tok=int(position))
    )


def marks_of(body: dict[str, Any], index: int) -> list[dict[str, Any]]:
    """Per finding naming tokens of episode ``index``: {code, severity, message, positions}."""
    out = []
    for f in body["findings"]:
        pos = [p for e, p in f["tokens"] if e == index]
        if pos:
            out.append(
                {"code": f["code"], "severity": f["severity"], "message": f["message"], "positions": pos}
            )
    return out


# ---- offline ----------------------------------------------------------------------------------------


def audit_file(data: bytes, *, fmt: str | None = None, filename: str | None = None) -> dict[str, Any]:
    """Offline: the audit of an upload file (one batch), with the server's validation and messages.
    ApiError for unreadable or invalid input, 409 without advantages, as the API."""
    from app.compute.episode_fields import row_arrays
    from app.core.validate import prepare_episode
    from app.ingest import iter_upload

    _, pairs = iter_upload(data, fmt=fmt)
    arrays = []
    all_tids = True
    for i, (line, ep) in enumerate(pairs):
        row = prepare_episode(ep, episode=i + 1, line=line)  # the upload's validation: same 4xx messages
        # The prepared row, as the server's step audit reads it: native and array episodes alike.
        arrays.append(row_arrays(row))
        arrays[-1].meta = token_meta(row["meta_json"])
        all_tids &= row["turn_ids"] is not None
    if not arrays:
        raise ApiError(422, "empty_upload", "the upload holds no episodes.")
    lacking = [i for i, a in enumerate(arrays) if a.advantages is None]
    if lacking:
        raise no_advantages(len(lacking), len(arrays), lacking[0] + 1, filename or "the file")
    body, _ = run_audit(arrays, turn_ids=all_tids)
    return decorate(body, None)
