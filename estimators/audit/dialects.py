"""Trainers' dialects in the audit's search, and the departures they carry.

Every estimator registered with ``trainer=`` (``"openrlhf:gae"``, ``"verl:grpo"`` ...) is a
candidate by itself: nothing here lists them. Each runs with the trainer's defaults over the
gamma/lambda grid it reads (:data:`~.constants.GAMMAS` x :data:`~.constants.LAMBDAS` with a critic,
:data:`~.constants.GAMMAS` for a return, once for an outcome estimator). Those that do not read
group labels are screened on a few rows first, as the token family is (up to an affine map: a
dialect that whitens over the batch whitens the screened rows differently); the survivors, and the
dialects that read groups (group statistics need every row), are computed on the whole batch.

When the best match is a dialect, :func:`departures` reports the departures its registration lists
(:mod:`.departures`) that this batch shows.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from ..registry import EstimatorInput, EstimatorSpec, available, get
from .batch import Batch, subset
from .candidates import Cand, score_outcome, share
from .constants import GAMMAS, LAMBDAS, MATCH_MAX_ABS, SURVIVORS, TIE
from .departures import DEPARTURES, Departure, Seen

# A dialect of a trainer the upload does not name ranks behind every reference configuration that
# fits as well (those keep the names they have always had; the dialects that also match are listed
# beside the pick); the named trainer's dialect ranks first.
OTHER_TRAINER = 10


def _inp(b: Batch, gamma: float, lam: float) -> EstimatorInput:
    return EstimatorInput(
        rewards=b.r,
        mask=b.pol,
        values=b.v,
        groups=b.groups,
        turn_ids=b.turn_ids,
        last_value=b.lv,
        gamma=gamma,
        lam=lam,
        logprobs=b.lp,
    )


def grid(spec: EstimatorSpec) -> list[tuple[float, float]]:
    """The (gamma, lambda) pairs worth trying for ``spec``."""
    if spec.kind == "outcome":
        return [(1.0, 1.0)]
    if "values" in spec.reads:
        return [(g, lam) for g in GAMMAS for lam in LAMBDAS]
    return [(g, 1.0) for g in GAMMAS]


Options = dict[str, Any]  # a dialect's options away from its defaults ({} for the defaults)


def run(
    spec: EstimatorSpec, b: Batch, gamma: float, lam: float, options: Options | None = None
) -> Tensor | None:
    """The dialect's advantages [B, T] on ``b`` (0 off policy), None when it cannot run there."""
    inp = _inp(b, gamma, lam)
    if spec.missing(inp):
        return None
    try:
        with torch.no_grad():
            out = spec.fn(inp, **{**spec.params, **(options or {})}).advantages
    except (ValueError, RuntimeError):  # e.g. equal groups assumed by a reshape that does not fit
        return None
    return torch.where(b.pol, out.double(), 0.0)


def params_of(
    spec: EstimatorSpec, gamma: float, lam: float, options: Options | None = None
) -> dict[str, Any]:
    """The candidate's public parameters: trainer, version, the gamma/lambda it ran with, and the
    trainer's options it ran with where they are not its defaults (``options``)."""
    p: dict[str, Any] = {"trainer": spec.trainer, "version": spec.version}
    if spec.kind != "outcome":
        p["gamma"] = gamma
        if "values" in spec.reads:
            p["lam"] = lam
    if options:
        p["options"] = dict(options)
    return p


def _cand(b: Batch, spec: EstimatorSpec, gamma: float, lam: float, ref: Tensor, options: Options) -> Cand:
    mx, sh, inl = share(b, ref)
    kind = spec.kind
    c = Cand(
        spec.name,
        params_of(spec, gamma, lam, options),
        kind,
        max_abs=mx,
        share=sh,
        inlier=inl,
        ref=ref,
        raw=ref,
    )
    if kind == "outcome":  # one number per episode: the value at each row's first policy token
        T = b.pol.shape[1]
        first = torch.where(b.pol, torch.arange(T), T).amin(1).clamp(max=max(T - 1, 0))
        c.ep = ref.gather(1, first[:, None]).squeeze(1) if T else ref.new_zeros(ref.shape[0])
        # scored as the outcome family is (whole rows), so the closest fit compares like with like
        c.max_abs, c.fit, c.inlier = score_outcome(b, c)
        c.share = sh if c.max_abs <= MATCH_MAX_ABS else None
    return c


def _screen(b: Batch, rows: Tensor, spec: EstimatorSpec, gamma: float, lam: float, options: Options) -> float:
    """min(direct, affine) residual of a dialect on the screening rows (inf when it cannot run)."""
    sub = subset(b, rows)
    out = run(spec, sub, gamma, lam, options)
    if out is None:
        return math.inf
    pidx = sub.pol.reshape(-1).nonzero().squeeze(1)
    y, x = sub.u.reshape(-1)[pidx], out.reshape(-1)[pidx]
    if y.numel() == 0:
        return 0.0
    direct = float((y - x).abs().max())
    yc, xc = y - y.mean(), x - x.mean()
    vx = float(xc.dot(xc))
    a = float(xc.dot(yc)) / vx if vx > 0 else 0.0
    return min(direct, float((yc - a * xc).abs().max()))


def variants(spec: EstimatorSpec, options: dict[str, Options] | None) -> list[Options]:
    """The option sets to try for ``spec``: its defaults, and the options the upload's trainer
    configuration sets for it (``options[spec.name]``) where they differ from the defaults."""
    given = {k: v for k, v in (options or {}).get(spec.name, {}).items() if spec.params.get(k) != v}
    return [{}, given] if given else [{}]


def candidates(
    b: Batch, rows: Tensor, trainer: str | None = None, options: dict[str, Options] | None = None
) -> tuple[list[Cand], int]:
    """(the dialects' whole-batch candidates worth keeping, configurations scored): ``trainer``'s
    dialects, or every trainer's when None; each with its defaults and with ``options[name]``
    (the trainer's configuration says so) when given."""
    specs = [s for s in available().values() if s.trainer is not None and trainer in (None, s.trainer)]
    out: list[Cand] = []
    searched = 0
    screened: list[tuple[float, EstimatorSpec, float, float, Options]] = []
    for spec in specs:
        for opts in variants(spec, options):
            for gamma, lam in grid(spec):
                searched += 1
                if "groups" in spec.reads or spec.kind == "outcome" or rows.numel() == 0:
                    ref = run(spec, b, gamma, lam, opts)
                    if ref is not None:
                        out.append(_cand(b, spec, gamma, lam, ref, opts))
                else:
                    screened.append((_screen(b, rows, spec, gamma, lam, opts), spec, gamma, lam, opts))
    if screened:
        best = min(x[0] for x in screened)
        cut = max(10 * best, best + TIE)
        keep = sorted((x for x in screened if x[0] <= cut), key=lambda x: x[0])[:SURVIVORS]
        for _, spec, gamma, lam, opts in keep:
            ref = run(spec, b, gamma, lam, opts)
            if ref is not None:
                out.append(_cand(b, spec, gamma, lam, ref, opts))
    return out, searched


def rank(c: Cand, trainer: str | None) -> int:
    """What a candidate adds to its deviations when matches are ranked: -1 for a dialect of the
    trainer the upload names (named first), :data:`OTHER_TRAINER` for another trainer's, 0 for a
    reference configuration."""
    t = c.params.get("trainer")
    if t is None:
        return 0
    return -1 if t == trainer else OTHER_TRAINER


def departures(b: Batch, pick: Cand | None) -> list[tuple[Departure, str, Tensor, dict[str, Any]]]:
    """The departures the best match's dialect lists that this batch shows: (the departure, the
    finding's message, the [B, T] tokens it touches, its evidence), one each."""
    if pick is None or pick.params.get("trainer") is None or pick.ref is None:
        return []
    spec = get(pick.scheme)
    inp = _inp(b, float(pick.params.get("gamma", 1.0)), float(pick.params.get("lam", 1.0)))
    ref = None
    with torch.no_grad():
        res = spec.fn(inp, **{**spec.params, **pick.params.get("options", {})})
        if spec.reference is not None and not get(spec.reference).missing(inp):
            rspec = get(spec.reference)
            ref = torch.where(b.pol, rspec.fn(inp, **rspec.params).advantages.double(), 0.0)
    # Compared before any whitening: a critic dialect's raw advantages are its returns minus the values.
    mine = res.advantages.double()
    if "values" in spec.reads and res.value_targets is not None and b.v is not None:
        mine = res.value_targets.double() - b.v
    seen = Seen(b=b, dialect=torch.where(b.pol, mine, 0.0), reference=ref)
    who = f"{spec.label} ({spec.trainer} {spec.version})"
    out = []
    for code in spec.departs:
        d = DEPARTURES[code]
        where = d.where(seen)
        if bool(where.any()):
            evidence = {
                "scheme": spec.name,
                "trainer": spec.trainer,
                "version": spec.version,
                "reference": spec.reference,
            }
            out.append((d, f"the best match is {who}: {d.text}", where, evidence))
    return out
