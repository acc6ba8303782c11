"""Every trainer's dialect on a handful of canonical episodes, beside the reference.

Each :class:`Case` is a small batch built to show one thing trainers handle differently: tool spans
between policy turns, a reward placed on a tool token, a group of one, a group whose rewards are all
equal, a truncated row, a rejected row (its loss mask all 0) in a group. Row 0 is the episode shown.
:func:`table` runs every registered dialect (``register(..., trainer=...)``) and its reference
estimator on each case and marks the policy tokens where they differ, so the page ``/trainers``
(and ``GET /api/trainers``) shows, computed live, where each trainer departs from the conventions:
rewards on the policy token that earned them, time advancing only on policy tokens, recursions that
carry their state across tool spans.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .registry import TRAINERS, EstimatorInput, EstimatorSpec, available, get

# One letter per token in a case's layout: prompt, policy, tool.
_KIND = {"q": "prompt", "p": "policy", "t": "tool"}
GAMMA, LAM = 1.0, 0.95


@dataclass(frozen=True)
class Case:
    """A canonical batch: ``layouts`` one string per row ("qqpppttpp": prompt, policy, tool),
    ``rewards`` per row {position: reward}, ``values`` one value per token (the same on every row),
    ``groups`` the rows' group labels, ``truncated`` {row: bootstrap value}."""

    key: str
    title: str
    text: str
    layouts: tuple[str, ...]
    rewards: tuple[dict[int, float], ...]
    groups: tuple[str, ...]
    values: tuple[float, ...]
    truncated: tuple[tuple[int, float], ...] = ()

    def inp(self) -> EstimatorInput:
        """The case as an EstimatorInput (float64, right-padded; gamma 1, lambda 0.95)."""
        B, T = len(self.layouts), max(len(x) for x in self.layouts)
        mask = torch.zeros(B, T, dtype=torch.bool)
        rewards = torch.zeros(B, T, dtype=torch.float64)
        values = torch.zeros(B, T, dtype=torch.float64)
        for i, lay in enumerate(self.layouts):
            mask[i, : len(lay)] = torch.tensor([c == "p" for c in lay])
            values[i, : len(lay)] = torch.tensor(self.values[: len(lay)], dtype=torch.float64)
            for pos, r in self.rewards[i].items():
                rewards[i, pos] = r
        last = None
        if self.truncated:
            last = torch.full((B,), math.nan, dtype=torch.float64)
            for row, v in self.truncated:
                last[row] = v
        groups = torch.tensor([sorted(set(self.groups)).index(g) for g in self.groups])
        return EstimatorInput(
            rewards=rewards, mask=mask, values=values, groups=groups, last_value=last, gamma=GAMMA, lam=LAM
        )

    def public(self) -> dict[str, Any]:
        """The case as the API shows it (row 0's kinds and rewards; the batch around it)."""
        lay = self.layouts[0]
        return {
            "key": self.key,
            "title": self.title,
            "text": self.text,
            "kinds": [_KIND[c] for c in lay],
            "rewards": [self.rewards[0].get(i, 0.0) for i in range(len(lay))],
            "values": list(self.values[: len(lay)]),
            "rows": len(self.layouts),
            "groups": list(self.groups),
            "row_rewards": [sum(r.values()) for r in self.rewards],
            "truncated": dict(self.truncated),
        }


_V = (0.0, 0.0, 0.3, 0.4, 0.5, 0.9, 0.9, 0.9, 0.6, 0.7, 0.8, 0.8)
CASES: tuple[Case, ...] = (
    Case(
        "tool_spans",
        "Tool spans",
        "Three tool tokens between two policy turns; the critic reads 0.9 on them. Time should advance "
        "only on policy tokens and the recursion carry its state across the span.",
        ("qqppptttpp", "qqppptttpp"),
        ({9: 1.0}, {9: 0.0}),
        ("a", "a"),
        _V,
    ),
    Case(
        "reward_on_tool",
        "A reward on a tool token",
        "A tool-call reward of 0.5 sits on the tool output (position 5), the outcome 1 on the last policy "
        "token. A reward belongs to the policy token that earned it: is the 0.5 counted or dropped?",
        ("qqppptttpp", "qqppptttpp"),
        ({5: 0.5, 9: 1.0}, {9: 0.0}),
        ("a", "a"),
        _V,
    ),
    Case(
        "singleton",
        "A group of one",
        "The shown episode is alone in its group (score 0.7); two others form a group (1 and 0).",
        ("qqpppp", "qqpppp", "qqpppp"),
        ({5: 0.7}, {5: 1.0}, {5: 0.0}),
        ("s", "g", "g"),
        _V,
    ),
    Case(
        "all_equal",
        "An all-equal group",
        "Every attempt scores 1: nothing in the group says which was better, so the credit should be 0.",
        ("qqpppp",) * 4,
        ({5: 1.0},) * 4,
        ("g",) * 4,
        _V,
    ),
    Case(
        "truncated",
        "A truncated row",
        "The shown episode was cut off (bootstrap value 0.8 where it stopped), its sibling terminated.",
        ("qqpppppp", "qqpppppp"),
        ({}, {7: 1.0}),
        ("a", "a"),
        _V,
        truncated=((0, 0.8),),
    ),
    Case(
        "rejected",
        "A rejected row",
        "The third attempt was rejected (its loss mask all 0) with a reward of 5; it should not move the "
        "baseline of the two accepted ones (scores 1 and 0).",
        ("qqpppp", "qqpppp", "qqtttt"),
        ({5: 1.0}, {5: 0.0}, {5: 5.0}),
        ("g", "g", "g"),
        _V,
    ),
)


def _row(x: Tensor, n: int) -> list[float | None]:
    return [None if not math.isfinite(v) else round(float(v), 6) for v in x[0, :n].tolist()]


def cell(spec: EstimatorSpec, case: Case) -> dict[str, Any]:
    """One dialect on one case: row 0's advantages, its reference's, the policy positions where they
    differ (``departs``), or the error the dialect raises on this batch."""
    inp = case.inp()
    n = len(case.layouts[0])
    pol = inp.mask[0, :n]
    try:
        with torch.no_grad():
            res = spec.fn(inp, **spec.params)
    except (ValueError, RuntimeError, IndexError) as exc:
        return {"advantages": None, "reference": None, "departs": [], "error": str(exc)}
    out = torch.where(inp.mask, res.advantages.double(), 0.0)
    # A critic dialect is compared before its whitening: its returns minus the values.
    raw = out
    if "values" in spec.reads and res.value_targets is not None and inp.values is not None:
        raw = torch.where(inp.mask, res.value_targets.double() - inp.values, 0.0)
    ref = None
    departs: list[int] = []
    if spec.reference is not None:
        r = get(spec.reference)
        if not r.missing(inp):
            with torch.no_grad():
                ref = torch.where(inp.mask, r.fn(inp, **r.params).advantages.double(), 0.0)
            # 1e-4: float32 trainers and whitening epsilons differ by less; a departure by far more.
            diff = ((raw - ref).abs() > 1e-4 * (1 + ref.abs()))[0, :n] & pol
            departs = diff.nonzero().squeeze(1).tolist()
    return {
        "advantages": _row(out, n),
        "reference": None if ref is None else _row(ref, n),
        "departs": departs,
        "error": None,
    }


def table() -> dict[str, Any]:
    """Every trainer, its dialects and what each computes on every case (``GET /api/trainers``)."""
    specs = [s for s in available().values() if s.trainer is not None]
    trainers = []
    for key, (label, version) in TRAINERS.items():
        mine = [s for s in specs if s.trainer == key]
        trainers.append(
            {
                "key": key,
                "name": label,
                "version": version,
                "estimators": [
                    {
                        "name": s.name,
                        "label": s.label,
                        "description": s.description,
                        "kind": s.kind,
                        "reads": list(s.reads),
                        "params": dict(s.params),
                        "reference": s.reference,
                        "departs_codes": list(s.departs),
                        "cases": {c.key: cell(s, c) for c in CASES},
                    }
                    for s in mine
                ],
            }
        )
    return {"gamma": GAMMA, "lam": LAM, "cases": [c.public() for c in CASES], "trainers": trainers}
