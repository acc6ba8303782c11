"""The episode's batch as the outcome schemes see it: [B] per-episode summaries (scores, group
ids, policy-token counts) read once per batch, the arrays only on demand, and the outcome advantages
computed from the summaries alone when a scheme reads nothing else (its ``reads``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from app.compute.refusals import check_budget, run_estimator
from app.core import domain
from app.core.arrays import EpisodeArrays
from app.core.errors import ApiError
from estimators import EstimatorInput, get


@dataclass
class BatchContext:
    """The episode's batch, as the outcome schemes need it.

    groups: [B] group labels (None = its own group); scores: [B]; index: this episode's row;
    lengths: [B] policy tokens per episode (None: counted from the arrays when needed);
    n_tokens: [B] tokens per episode (for the work budget of the padded fallback);
    gids: [B] int64 group ids (None: derived from ``groups``); memo: scheme -> [B] advantages,
    shared by every request on the same batch (see :class:`BatchSummary`);
    load_all: returns every episode's EpisodeArrays (only for an outcome estimator that reads the
    token layout, which no registry scheme does today); max_cells: the work budget (0 = none).
    """

    groups: list[str | None]
    scores: np.ndarray
    index: int
    load_all: Callable[[], list[EpisodeArrays]] | None = None
    # Loads the EpisodeArrays of the episodes at the given rows (for schemes that need only the
    # episode's group); None: fall back to ``load_all``.
    load_rows: Callable[[list[int]], list[EpisodeArrays]] | None = None
    _arrays: list[EpisodeArrays] | None = field(default=None, repr=False)
    # The batch audit seen from this episode (app.compute.audit.EpisodeAuditView), for the audit rows.
    audit: Callable[[], Any] | None = None
    lengths: np.ndarray | None = None
    n_tokens: np.ndarray | None = None
    gids: np.ndarray | None = None
    memo: dict[str, np.ndarray] | None = None
    max_cells: int = 0
    # [B] bool: the episode was uploaded with a reward (app.core.domain.rewarded); None: all were.
    # The others are left out of every baseline: their score of 0 is not an outcome.
    rewarded: np.ndarray | None = None

    def check_batch_budget(self, name: str, reduce: str) -> None:
        """413 (WorkBudgetError) when scheme ``name`` on the whole padded batch would hold more
        numbers than the work budget (about six [B, T_max] arrays at once)."""
        if self.n_tokens is not None:
            cells = len(self.n_tokens) * int(self.n_tokens.max(initial=0)) * 6
            check_budget(
                cells, self.max_cells, f"scheme {name!r} on this {len(self.n_tokens)}-episode batch", reduce
            )

    def group_arrays(self, name: str) -> tuple[list[EpisodeArrays], int]:
        """The EpisodeArrays of this episode's group (the rows a group-normalised turn scheme
        reads) and this episode's row among them, within the work budget."""
        gids = self.group_ids()
        rows = [int(i) for i in np.flatnonzero(gids == gids[self.index])]
        if self.n_tokens is not None:
            # The padded [G, T_max] inputs these schemes read (rewards, mask, turn ids) and output.
            cells = len(rows) * int(self.n_tokens[rows].max(initial=0)) * 4
            check_budget(
                cells,
                self.max_cells,
                f"scheme {name!r} on this episode's group of {len(rows)}",
                "Upload smaller groups, or pick a token or turn scheme.",
            )
        if self.load_rows is None:
            everything = self.arrays()
            return [everything[i] for i in rows], rows.index(self.index)
        return self.load_rows(rows), rows.index(self.index)

    def arrays(self) -> list[EpisodeArrays]:
        """Every episode's EpisodeArrays, loaded once (422 when the batch is not available)."""
        if self._arrays is None:
            if self.load_all is None:
                raise ApiError(
                    422, "no_batch", "this scheme needs the episode's whole batch, which is not available."
                )
            self._arrays = self.load_all()
        return self._arrays

    def group_ids(self) -> np.ndarray:
        """[B] int64 group ids (an episode without a group is a group of its own)."""
        if self.gids is None:
            self.gids = domain.group_ids(self.groups)
        return self.gids

    def policy_lengths(self) -> np.ndarray:
        """[B] policy tokens per episode (counted from the arrays when not given)."""
        if self.lengths is None:
            self.lengths = np.array([int(a.policy.sum()) for a in self.arrays()], dtype=np.int64)
        return self.lengths

    def episode_outcome(self, name: str) -> float | None:
        """This episode's outcome advantage under registry scheme ``name`` from the [B] summaries
        (memoised per batch), or None when the scheme reads more than summaries (its ``reads``)."""
        spec = get(name)
        if not spec.from_summaries:
            return None
        memo = self.memo if self.memo is not None else {}
        if name not in memo:
            lengths = self.policy_lengths() if "lengths" in spec.reads else None
            memo[name] = summary_advantages(name, self.scores, self.group_ids(), lengths, self.rewarded)
            self.memo = memo
        return float(memo[name][self.index])


@dataclass
class BatchSummary:
    """What every outcome answer on one batch reuses: [B] columns read once, group ids, and the
    [B] advantages of each scheme asked for so far. Immutable apart from ``memo``."""

    slugs: dict[str, int]
    groups: list[str | None]
    scores: np.ndarray
    lengths: np.ndarray
    n_tokens: np.ndarray
    gids: np.ndarray
    memo: dict[str, np.ndarray] = field(default_factory=dict)
    rewarded: np.ndarray | None = None  # [B] bool (see BatchContext.rewarded)

    def context(self, slug: str, **kw: Any) -> BatchContext | None:
        """The BatchContext of episode ``slug`` (None if it is not in this batch)."""
        i = self.slugs.get(slug)
        if i is None:
            return None
        return BatchContext(
            groups=self.groups,
            scores=self.scores,
            index=i,
            lengths=self.lengths,
            n_tokens=self.n_tokens,
            gids=self.gids,
            memo=self.memo,
            rewarded=self.rewarded,
            **kw,
        )

    def advantages(self, name: str) -> np.ndarray:
        """[B] outcome advantages of registry scheme ``name`` (one that reads only summaries), memoised."""
        if name not in self.memo:
            self.memo[name] = summary_advantages(name, self.scores, self.gids, self.lengths, self.rewarded)
        return self.memo[name]

    def members(self, group: str) -> list[int]:
        """Row indices of the episodes labelled ``group``, in upload order."""
        return [i for i, g in enumerate(self.groups) if g == group]

    @property
    def nbytes(self) -> int:
        """Rough bytes held (slugs and labels count ~100 bytes each)."""
        arrays = self.scores.nbytes + self.lengths.nbytes + self.n_tokens.nbytes + self.gids.nbytes
        return arrays + 200 * len(self.groups) + sum(a.nbytes for a in self.memo.values())


def summary_advantages(
    name: str,
    scores: np.ndarray,
    gids: np.ndarray,
    lengths: np.ndarray | None = None,
    rewarded: np.ndarray | None = None,
) -> np.ndarray:
    """[B] per-episode outcome advantages of registry scheme ``name`` (an outcome estimator that
    reads only summaries: scores, groups and, if it reads them, ``lengths`` policy tokens per
    episode) from [B] columns: the registry call on [B, 1] rows of scores. Equal to the estimator
    on the padded [B, T_max] batch (tests/app/compute/test_svc_memory.py) at O(B) memory. ``rewarded`` [B]
    bool: only those episodes enter the statistics (the others get 0; their rows are shown null)."""
    spec = get(name)
    if not spec.from_summaries:
        raise KeyError(f"scheme {name!r} reads {', '.join(spec.reads)}: more than per-episode summaries")
    if rewarded is not None and not bool(np.all(rewarded)):
        keep = np.flatnonzero(rewarded)
        out = np.zeros(len(scores), dtype=np.float64)
        if len(keep):
            sub_g = np.unique(np.asarray(gids)[keep], return_inverse=True)[1]
            sub_l = None if lengths is None else np.asarray(lengths)[keep]
            out[keep] = summary_advantages(name, np.asarray(scores)[keep], sub_g, sub_l)
        return out
    s = torch.from_numpy(np.ascontiguousarray(scores, dtype=np.float64))[:, None]
    L = None
    if "lengths" in spec.reads:
        if lengths is None:
            raise ValueError(f"scheme {name!r} reads the episodes' policy-token counts (lengths)")
        L = torch.from_numpy(np.ascontiguousarray(lengths, dtype=np.int64))
    g = torch.from_numpy(np.ascontiguousarray(gids, dtype=np.int64))
    inp = EstimatorInput(rewards=s, mask=torch.ones_like(s), groups=g, lengths=L)
    return run_estimator(name, inp).advantages[:, 0].numpy()


def rewarded_only(arrays: list[EpisodeArrays], row: int) -> tuple[list[EpisodeArrays], int]:
    """The members with a reward (BatchContext.rewarded) and ``row``'s index among them; all of
    them when ``row`` itself has none (its advantages are not shown)."""
    if not arrays[row].rewarded or all(a.rewarded for a in arrays):
        return arrays, row
    keep = [i for i, a in enumerate(arrays) if a.rewarded]
    return [arrays[i] for i in keep], keep.index(row)


def outcome_advantages(name: str, scores: np.ndarray, groups: Sequence[str | None]) -> np.ndarray:
    """[B] per-episode outcome advantages from [B] scores with a score-only registry estimator
    (rloo, grpo, dr_grpo, group_mean, batch_whiten, ...) or ``none`` (the score itself)."""
    scores = np.asarray(scores, dtype=np.float64)
    if name == "none":
        return scores.copy()
    return summary_advantages(name, scores, domain.group_ids(groups))
