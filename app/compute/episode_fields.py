"""What a run step computes of each of its episodes at ingest, before retention drops any: the
search fields of ``GET /api/runs/{id}/episodes`` and whether the episode is flagged.

Pure: a prepared episode row (app/core/rows.py: numpy arrays, not packed yet) in, numbers out.
Definitions ("policy tokens" are the tokens of kind policy; A the trainer's uploaded advantages):

* ``n_tool_tokens``: tokens of kind tool.
* ``max_abs_adv``: max |A| on policy tokens (None without advantages).
* ``nonpolicy_abs_adv_share``: the share of the episode's total |A| that sits on prompt and tool
  tokens (0 when the total is 0; None without advantages). Above 0 the episode is flagged: only
  generated tokens carry a gradient.
* ``max_ratio``: max over policy tokens of exp(logprob - rollout_logprob), the importance ratio
  between the trainer and the rollout engine (None without both; capped at e^700, so it stays a
  finite number); only tokens where both log-probs are finite count (app/compute/mismatch.py).
* ``mean_entropy``: mean entropy on policy tokens (None without entropy).
* ``n_findings`` / ``finding_codes``: the audit's findings that name the episode (their number and
  their codes, space-separated). An error finding flags the episodes it names when they are at
  most half of the step's: one about (nearly) every episode, e.g. advantages that no known scheme
  explains, says nothing about which ones to keep.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, TypedDict

import numpy as np

from app.compute import mismatch
from app.core import domain
from app.core.arrays import F64, EpisodeArrays, arrays_of
from app.core.rows import FLOAT_COLUMNS, EpisodeRow, FloatField

MAX_LOG_RATIO = 700.0  # exp(700) ~ 1e304: still a finite float64


class SearchColumns(TypedDict):
    """The ``episode_search`` columns (app/storage/models.py) an episode's fields are stored in."""

    n_tool_tokens: int
    max_abs_adv: float | None
    nonpolicy_abs_adv_share: float | None
    max_ratio: float | None
    mean_entropy: float | None
    n_findings: int
    finding_codes: str


@dataclass
class EpisodeFields:
    """One episode's search fields (see the module docstring)."""

    n_tool_tokens: int
    max_abs_adv: float | None
    nonpolicy_abs_adv_share: float | None
    max_ratio: float | None
    mean_entropy: float | None
    n_findings: int = 0
    finding_codes: str = ""
    n_errors: int = 0

    @property
    def flagged(self) -> bool:
        """An error finding names it, or credit sits on its prompt or tool tokens."""
        return self.n_errors > 0 or bool(self.nonpolicy_abs_adv_share)

    def columns(self) -> SearchColumns:
        """The ``episode_search`` columns (app/storage/models.py) these fields are stored in."""
        return {
            "n_tool_tokens": self.n_tool_tokens,
            "max_abs_adv": self.max_abs_adv,
            "nonpolicy_abs_adv_share": self.nonpolicy_abs_adv_share,
            "max_ratio": self.max_ratio,
            "mean_entropy": self.mean_entropy,
            "n_findings": self.n_findings,
            "finding_codes": self.finding_codes,
        }


def _float(row: EpisodeRow, name: FloatField) -> np.ndarray | None:
    arr = row.get(name)  # ``get``: a hand-made row may leave out the fields it does not have
    return None if arr is None else arr.astype(F64, copy=False)


def episode_fields(row: EpisodeRow) -> EpisodeFields:
    """The fields of one prepared episode row (findings are added by :func:`add_findings`)."""
    kinds = row["kinds"]
    policy = kinds == domain.POLICY
    adv = _float(row, "advantages")
    max_abs = share = None
    if adv is not None:
        a = np.abs(adv)
        total = float(a.sum())
        max_abs = float(a[policy].max()) if policy.any() else 0.0
        share = float(a[~policy].sum()) / total if total > 0 else 0.0
    logp, roll, ent = _float(row, "logprobs"), _float(row, "rollout_logprobs"), _float(row, "entropy")
    ratio = None
    if logp is not None and roll is not None:
        d = mismatch.log_ratio(policy, logp, roll)
        ratio = float(np.exp(min(float(d.max()), MAX_LOG_RATIO))) if len(d) else None
    return EpisodeFields(
        n_tool_tokens=int((kinds == domain.TOOL).sum()),
        max_abs_adv=max_abs,
        nonpolicy_abs_adv_share=share,
        max_ratio=ratio,
        mean_entropy=float(ent[policy].mean()) if ent is not None and policy.any() else None,
    )


def add_findings(fields: list[EpisodeFields], findings: Sequence[Mapping[str, Any]]) -> None:
    """Count each audit finding (``{"code", "severity", "episodes": [index, ...]}``) on the
    episodes it names (see the module docstring for which ones it flags)."""
    codes: list[list[str]] = [[] for _ in fields]
    for f in findings:
        named = set(f.get("episodes") or ())
        flags = f.get("severity") == "error" and 2 * len(named) <= len(fields)
        for i in named:
            if 0 <= i < len(fields):
                fields[i].n_findings += 1
                fields[i].n_errors += flags
                if f["code"] not in codes[i]:
                    codes[i].append(f["code"])
    for episode, c in zip(fields, codes, strict=True):
        episode.finding_codes = " ".join(c)


def row_arrays(row: EpisodeRow) -> EpisodeArrays:
    """A prepared row as :class:`EpisodeArrays` for the audit (no token strings)."""
    floats: dict[str, np.ndarray | None] = {name: _float(row, name) for name in FLOAT_COLUMNS}
    tids = row["turn_ids"]
    src = SimpleNamespace(
        reward=row.get("reward"),
        group=row.get("group"),
        truncated=row.get("truncated", False),
        bootstrap_value=row.get("bootstrap_value"),
    )
    return arrays_of(src, row["kinds"], floats, tids, [], {}, None)
