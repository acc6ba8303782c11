"""The search: score every configuration of :mod:`.hypotheses` against the upload and pick the match.

Outcome/group candidates are scored exactly on [B] vectors. Unless they already explain a
row-constant upload, the token/turn configurations are **screened** on a few rows
(:data:`~.constants.SCREEN_ROWS`, chosen to include every row where a hypothesis changes
anything), scored both raw and up to an affine map (whitening over the batch is one), and only the
best :data:`~.constants.SURVIVORS` are computed on the whole batch. Among the matches, those within
:data:`~.constants.TIE` of the best are ranked by how few hypotheses and non-default conventions
they need; without a match, the closest fit is the one most tokens agree with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from .batch import Batch, subset
from .candidates import Cand, broadcast, matches, one_factor, score_outcome, share
from .constants import MATCH_MAX_ABS, SCREEN_ROWS, SURVIVORS, TIE, TOKEN_TOL
from .dialects import candidates as dialect_candidates
from .dialects import rank
from .hypotheses import deviations, full_token, outcome_candidates, raw, token_configs


@dataclass
class Search:
    """What the search found on one batch."""

    outcome: list[Cand]  # every outcome variant (bug and convention findings look counterparts up here)
    pool: list[Cand]  # the candidates still in the running (outcome survivors + whole-batch token ones)
    searched: int  # configurations scored
    pick: Cand | None  # the best match, None when nothing matches
    closest: Cand  # the best match, or the closest fit
    also: list[Cand] = field(default_factory=list)  # trainers' dialects that match as well as the pick


def screen_rows(b: Batch) -> Tensor:
    """Up to SCREEN_ROWS rows where every hypothesis shows: rows with tool gaps, moved rewards and
    bootstrap values first, then evenly spread rows."""
    B = b.pol.shape[0]
    picks: list[int] = []
    feats = [(b.resp & ~b.pol).any(1)]
    if b.r_end is not None:
        feats.append((b.r_end != b.r).any(1))
    if b.lv is not None:
        feats.append(torch.nan_to_num(b.lv) != 0)
    per = max(1, SCREEN_ROWS // (2 * len(feats)))
    for f in feats:
        picks += [i for i in f.nonzero().squeeze(1).tolist() if i not in picks][:per]
    rest = [i for i in torch.linspace(0, B - 1, min(B, SCREEN_ROWS)).long().tolist() if i not in picks]
    picks += rest[: max(0, SCREEN_ROWS - len(picks))]
    picks = [i for i in sorted(set(picks)) if bool(b.rows[i])]
    return torch.tensor(picks, dtype=torch.long)


def screen(b: Batch, configs: list[tuple[str, dict[str, Any]]]) -> list[tuple[float, float, int]]:
    """Score every raw configuration on the screening rows: (residual without whitening, residual
    of the best affine map a x + c, config index). Whitening over the batch is such an affine map,
    so a config that is right up to whitening has a near-zero affine residual."""
    rows = screen_rows(b)
    if rows.numel() == 0:
        return [(math.inf, math.inf, k) for k in range(len(configs))]
    sub = subset(b, rows)
    pidx = sub.pol.reshape(-1).nonzero().squeeze(1)
    y = sub.u.reshape(-1)[pidx]
    yc = y - y.mean()
    out = []
    for k, (scheme, p) in enumerate(configs):
        x = raw(sub, scheme, p)[0].reshape(-1)[pidx]
        direct = float((y - x).abs().max()) if y.numel() else 0.0
        xc = x - x.mean()
        vx = float(xc.dot(xc))
        a = float(xc.dot(yc)) / vx if vx > 0 else 0.0
        fit = float((yc - a * xc).abs().max()) if y.numel() else 0.0
        out.append((direct, fit, k))
    return out


def _pick(pool: list[Cand], trainer: str | None) -> tuple[Cand | None, list[Cand]]:
    """(the best match or None, the trainers' dialects that match as well): among the matches within
    TIE of the best, the fewest deviations (the named trainer's dialect first)."""
    found = [c for c in pool if matches(c)]
    if not found:
        return None, []
    top = min(c.max_abs for c in found)
    near = [c for c in found if c.max_abs <= top + TIE]
    pick = min(near, key=lambda c: (deviations(c.params) + rank(c, trainer), c.max_abs))
    return pick, [c for c in near if c is not pick and c.params.get("trainer") is not None]


def _closest(pool: list[Cand], trainer: str | None) -> Cand:
    """The candidate most tokens agree with, then the smallest worst diff (float32 trainers' ties
    within TIE are equal), then the fewest deviations (the named trainer's dialect first)."""

    def agree(c: Cand) -> float:
        return c.share if c.share is not None else c.fit

    top = max(agree(c) for c in pool)
    best = [c for c in pool if agree(c) >= top - 1e-12]
    low = min(c.max_abs for c in best)
    near = [c for c in best if c.max_abs <= low + TIE]
    return min(near, key=lambda c: (deviations(c.params) + rank(c, trainer), c.max_abs))


def search(b: Batch, trainer: str | None = None, options: dict[str, dict[str, Any]] | None = None) -> Search:
    """Score the search space on ``b`` (a batch with at least one policy token) and pick. The
    trainers' dialects are in it (:mod:`.dialects`); ``trainer`` (a key of
    ``estimators.registry.TRAINERS``, the one the upload names) ranks that trainer's first among
    equally good matches; ``options`` ({dialect: {option: value}}, its configuration's) are tried
    beside each dialect's defaults."""
    outcome = outcome_candidates(b)
    for c in outcome:
        c.max_abs, c.fit, c.inlier = score_outcome(b, c)
    searched = len(outcome)
    # The closest outcome fits: most tokens in rows that agree whole, then the smallest worst diff.
    ranked = sorted(one_factor(outcome), key=lambda c: (-c.fit, c.max_abs, deviations(c.params)))
    pool: list[Cand] = ranked[: SURVIVORS * 2]
    for c in pool:
        if c.max_abs <= MATCH_MAX_ABS:  # only a possible match needs its share now
            c.share = share(b, broadcast(b, c.vec))[1]

    row_const = bool((torch.where(b.rows, b.umax - b.umin, 0.0) <= TOKEN_TOL).all())
    outcome_fits = any(matches(c) for c in pool)
    if not (row_const and outcome_fits):
        configs = token_configs(b)
        # each raw configuration is scored unwhitened and whitened (once per whitening factor)
        searched += (1 + len(b.factors)) * len(configs)
        scored = screen(b, configs)
        best_res = min((min(d, f) for d, f, _ in scored), default=math.inf)
        cut = max(10 * best_res, best_res + TIE)
        keep = sorted((min(d, f), k) for d, f, k in scored if min(d, f) <= cut)[:SURVIVORS]
        if best_res > MATCH_MAX_ABS:
            keep = keep[:1]  # nothing can match: the closest fit is enough
        for _, k in keep:
            d, f, _ = scored[k]
            scheme, p = configs[k]
            whs = tuple(w for w, r in (("none", d), ("batch", f)) if r <= cut) or ("batch",)
            pool += one_factor(full_token(b, scheme, p, whs))

    pick, also = _pick(pool, trainer)
    # The trainers' dialects: the named trainer's always; every trainer's when no reference
    # configuration explains the upload as it is (no match, or one that needs a bug or a
    # non-default convention). A clean reference match keeps its cost.
    if trainer is not None or pick is None or deviations(pick.params) > 0:
        dialects, n = dialect_candidates(b, screen_rows(b), trainer, options)
        pool += dialects
        searched += n
        pick, also = _pick(pool, trainer)
    # Without a match, the closest fit is the one most tokens agree with (then the smallest worst
    # diff): one wild token should not hand "closest" to a scheme that agrees with nothing.
    closest = pick or _closest(pool, trainer)
    if closest.share is None:
        closest.share = share(b, broadcast(b, closest.vec))[1]
    return Search(outcome=outcome, pool=pool, searched=searched, pick=pick, closest=closest, also=also)
