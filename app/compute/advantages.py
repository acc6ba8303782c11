"""Episode -> advantages JSON, through the estimator registry (estimators/registry.py).

Shapes: one episode is a row of T tokens; estimators see [1, T] tensors with the policy mask.
Outcome schemes need the episode's batch: the group baselines compare the scores ([B], the sum of
effective rewards on policy tokens) of the episodes of the same batch, grouped by ``group``.
No per-token Python work on the hot path: arrays are numpy/torch, JSON lists come from tolist().
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from app.compute import loss_view as lv
from app.core import domain
from app.core import schemes as sc
from app.core.arrays import EpisodeArrays, kind_names
from app.core.domain import POLICY
from app.core.errors import ApiError
from estimators import EstimatorInput, available
from estimators import compute as _compute
from estimators import groups as estimator_groups
from estimators.agent import anchor_state_ids

# Outcome estimators that read only inp.scores and inp.groups: computed exactly from the batch's
# [B] scores without decoding the other episodes' arrays.
SCORE_ONLY = {
    "group_mean",
    "grpo",
    "dr_grpo",
    "rloo",
    "batch_whiten",
    "group_center_batch_scale",
    "grpo_passk",
    "gpg",  # batch statistics of the scores: alpha = B / #{s != 0}
}
# Outcome estimators that also read each episode's number of policy tokens (a [B] column):
# opo's length-weighted group baseline, REINFORCE++'s global whitening over policy tokens.
FROM_SUMMARIES = SCORE_ONLY | {"opo", "reinforce_plus_plus_baseline"}


class WorkBudgetError(ApiError):
    """A request whose work exceeds the configured budget: 413 saying what to reduce."""

    def __init__(self, message: str) -> None:
        super().__init__(413, "work_budget", message)


def check_budget(cells: int, budget: int, what: str, reduce: str) -> None:
    """WorkBudgetError (413) when ``cells`` (the numbers the request would hold at once) exceeds
    ``budget``; the message says what the work was, the budget's setting and what to reduce."""
    if budget > 0 and cells > budget:
        raise WorkBudgetError(
            f"{what} needs {cells:,} numbers in memory at once; the budget is {budget:,} "
            f"(setting CREDITLENS_MAX_COMPUTE_CELLS). {reduce}"
        )


# Turn schemes that normalise within the episode's group (GiGPO's episode and step groups, the
# turn leave-one-out baseline): computed on the batch, with every turn's anchor state.
GROUP_TURN_SCHEMES = {"gigpo", "turn_loo"}
# Turn schemes that read Monte Carlo turn values (meta.turn_values, one per turn).
TURN_VALUE_SCHEMES = {"monte_carlo"}


@dataclass
class BatchContext:
    """The episode's batch, as the outcome schemes need it.

    groups: [B] group labels (None = its own group); scores: [B]; index: this episode's row;
    lengths: [B] policy tokens per episode (None: counted from the arrays when needed);
    n_tokens: [B] tokens per episode (for the work budget of the padded fallback);
    gids: [B] int64 group ids (None: derived from ``groups``); memo: scheme -> [B] advantages,
    shared by every request on the same batch (see :class:`BatchSummary`);
    load_all: returns every episode's EpisodeArrays (only for an outcome estimator that reads
    tokens, which no registry scheme does today); max_cells: the work budget (0 = none).
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
        if self._arrays is None:
            if self.load_all is None:
                raise ApiError(
                    422, "no_batch", "this scheme needs the episode's whole batch, which is not available."
                )
            self._arrays = self.load_all()
        return self._arrays

    def group_ids(self) -> np.ndarray:
        if self.gids is None:
            self.gids = domain.group_ids(self.groups)
        return self.gids

    def policy_lengths(self) -> np.ndarray:
        if self.lengths is None:
            self.lengths = np.array([int(a.policy.sum()) for a in self.arrays()], dtype=np.int64)
        return self.lengths

    def episode_outcome(self, name: str) -> float | None:
        """This episode's outcome advantage under registry scheme ``name`` from the [B] summaries
        (memoised per batch), or None when the scheme needs the other episodes' tokens."""
        if name not in FROM_SUMMARIES:
            return None
        memo = self.memo if self.memo is not None else {}
        if name not in memo:
            lengths = self.policy_lengths() if name not in SCORE_ONLY else None
            memo[name] = summary_advantages(name, self.scores, self.group_ids(), lengths)
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
            **kw,
        )

    def advantages(self, name: str) -> np.ndarray:
        """[B] outcome advantages of registry scheme ``name`` (in FROM_SUMMARIES), memoised."""
        if name not in self.memo:
            self.memo[name] = summary_advantages(name, self.scores, self.gids, self.lengths)
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
    name: str, scores: np.ndarray, gids: np.ndarray, lengths: np.ndarray | None = None
) -> np.ndarray:
    """[B] per-episode outcome advantages of registry scheme ``name`` (in FROM_SUMMARIES) from the
    [B] scores, group ids and policy-token counts; equal to the registry estimator on the padded
    [B, T_max] batch (tests/app/test_svc_memory.py) at O(B) memory."""
    s = torch.from_numpy(np.ascontiguousarray(scores, dtype=np.float64))
    g = torch.from_numpy(np.ascontiguousarray(gids, dtype=np.int64))
    if name in SCORE_ONLY:
        t = s[:, None]
        inp = EstimatorInput(rewards=t, mask=torch.ones_like(t), groups=g)
        return run_estimator(name, inp).advantages[:, 0].numpy()
    assert lengths is not None
    L = torch.from_numpy(np.ascontiguousarray(lengths, dtype=np.int64))
    if name == "opo":
        return estimator_groups.opo(s, g, L).double().numpy()
    if name == "reinforce_plus_plus_baseline":
        return _rfpp_baseline(s, g, L).numpy()
    raise KeyError(name)


def _rfpp_baseline(s: torch.Tensor, g: torch.Tensor, L: torch.Tensor) -> torch.Tensor:
    """[B] REINFORCE++ with a group baseline from summaries: the centred score (singleton: the
    score) sits on each of the episode's L policy tokens, then verl's global masked whitening over
    all policy tokens of the batch. The token sums are L-weighted [B] sums, with verl's
    denominators (``mask.sum() + 1e-8`` and N/(N-1), in float64 as estimators/stats.py)."""
    st = estimator_groups.group_stats(s, g)
    c = torch.where(st.count == 1, s, st.centered)
    # The token count in the data's dtype, as estimators.stats._count() of a float64 batch.
    n = L.sum().to(torch.float64)
    if int(n.item()) < 2:  # fewer than 2 policy tokens: nothing to whiten against (as the estimator)
        return torch.zeros_like(s)
    Lf = L.to(torch.float64)
    mean = (c * Lf).sum() / (n + 1e-8)
    var = ((c - mean) ** 2 * Lf).sum() / (n + 1e-8)
    var = var * (n / (n - 1))
    return (c - mean) * torch.rsqrt(var + 1e-8)


def run_estimator(name: str, inp: EstimatorInput, **params: Any):
    """The registry call; an estimator's refusal of this input (ValueError/TypeError, e.g. "needs
    logprobs") becomes a 422 naming the scheme instead of a 500."""
    try:
        return _compute(name, inp, **params)
    except (ValueError, TypeError) as e:
        raise ApiError(
            422, "scheme_not_applicable", f"scheme {name!r} cannot run on this episode: {e}.", field="scheme"
        ) from None


def outcome_advantages(name: str, scores: np.ndarray, groups: Sequence[str | None]) -> np.ndarray:
    """[B] per-episode outcome advantages from [B] scores with a score-only registry estimator
    (rloo, grpo, dr_grpo, group_mean, batch_whiten, ...) or ``none`` (the score itself)."""
    scores = np.asarray(scores, dtype=np.float64)
    if name == "none":
        return scores.copy()
    t = torch.from_numpy(scores)[:, None]
    inp = EstimatorInput(
        rewards=t, mask=torch.ones_like(t), groups=torch.from_numpy(domain.group_ids(groups))
    )
    return run_estimator(name, inp).advantages[:, 0].numpy()


def parse_schemes(raw: Sequence[str] | None) -> list[str]:
    """Repeated and/or comma-separated ``scheme`` values -> a de-duplicated list (default three)."""
    names: list[str] = []
    for item in raw or ():
        for s in item.split(","):
            s = s.strip()
            if s and s not in names:
                names.append(s)
    return names or list(sc.DEFAULT_SCHEMES)


def known_schemes(ep: EpisodeArrays | None = None) -> list[str]:
    """Every scheme name the advantages API accepts (for ``ep``: oracle/uploaded only when present)."""
    names = ["outcome", *available()]
    if ep is not None and ep.meta.get("turn_values") is None:
        names = [n for n in names if n not in TURN_VALUE_SCHEMES]
    if ep is None or ep.meta.get("turn_values") is not None:
        names.append("oracle")
    if ep is None or ep.advantages is not None:
        names += ["uploaded", *sc.AUDIT_SCHEMES]
    return names


def validate_params(
    ep: EpisodeArrays, schemes: list[str], gamma: float, lam: float, baseline: str, critic: str
) -> None:
    """ApiError 422 with a message naming the parameter for anything the API cannot honour."""
    for name, v in (("gamma", gamma), ("lam", lam)):
        if not (math.isfinite(v) and 0.0 <= v <= 1.0):
            raise ApiError(
                422, "bad_parameter", f"parameter `{name}` is {v}; it must be between 0 and 1.", field=name
            )
    if baseline not in sc.BASELINES:
        raise ApiError(
            422,
            "bad_parameter",
            f"parameter `baseline` is {baseline!r}; choose one of {', '.join(sc.BASELINES)}.",
            field="baseline",
        )
    if critic not in sc.CRITICS:
        raise ApiError(
            422,
            "bad_parameter",
            f"parameter `critic` is {critic!r}; choose {' or '.join(sc.CRITICS)}.",
            field="critic",
        )
    specs = available()
    for s in schemes:
        if s in TURN_VALUE_SCHEMES and ep.meta.get("turn_values") is None:
            raise ApiError(
                422,
                "scheme_not_applicable",
                f"scheme `{s}` needs `meta.turn_values` (a Monte Carlo value of the state before each turn), "
                "which this episode does not have.",
                field="scheme",
            )
        if s == "outcome" or s in specs or s == "loss_weights":
            continue
        if s == "oracle":
            if ep.meta.get("turn_values") is None:
                raise ApiError(
                    422,
                    "unknown_scheme",
                    "scheme `oracle` needs `meta.turn_values` (the true value at the start of each turn), "
                    "which this episode does not have.",
                    field="scheme",
                )
            continue
        if s == "uploaded" or s in sc.AUDIT_SCHEMES:
            if ep.advantages is None:
                raise ApiError(
                    422, "unknown_scheme", f"scheme `{s}` needs advantages in the upload.", field="scheme"
                )
            continue
        raise ApiError(
            422,
            "unknown_scheme",
            f"scheme {s!r} is not known; choose from {', '.join(known_schemes(ep))}.",
            field="scheme",
        )
    if critic == "upload" and ep.values is None:
        needing = [s for s in schemes if s in specs and specs[s].needs_values]
        if needing:
            raise ApiError(
                422,
                "no_values",
                f"scheme(s) {', '.join(needing)} need critic values, but this episode was uploaded without "
                "`values`; add critic=zero to use V = 0, or pick a critic-free scheme (outcome, returns).",
                field="critic",
            )


def _masked(arr: np.ndarray, policy: np.ndarray, as_numpy: bool = False) -> list | np.ndarray:
    """[T] -> list with None off-policy (the JSON null the front end greys out).

    ``as_numpy``: a float64 array with NaN off-policy instead; orjson writes NaN as null and
    serialises the array in C, which is what keeps the 32k-token API call fast."""
    out = np.array(arr, dtype=np.float64)
    out[~policy] = np.nan
    if as_numpy:
        return out
    o = out.astype(object)
    o[np.isnan(out)] = None  # off-policy, or no number at all (an episode without a reward)
    return o.tolist()


def _turn_id_list(turn_ids: np.ndarray, policy: np.ndarray) -> list:
    """[T] ints with None off-policy."""
    o = turn_ids.astype(object)
    o[~policy] = None
    return o.tolist()


def turn_starts(ep: EpisodeArrays) -> np.ndarray:
    """Position of each turn's first token, in the estimators' turn order (a turn starts at the
    first policy token and wherever a policy token's turn id differs from the previous one's)."""
    pol = np.flatnonzero(ep.policy)
    tid = ep.turn_ids[pol]
    new = np.ones(len(pol), dtype=bool)
    new[1:] = tid[1:] != tid[:-1]
    return pol[new]


def anchor_observations(ep: EpisodeArrays) -> list[str | None]:
    """One anchor state per turn: ``meta.turn_states`` (the native field ``turn_states``) when
    uploaded, else the text of the observation right before the turn (the tool output before it;
    the prompt for the first turn); None (an unknown state) when nothing precedes the turn.
    ApiError 422 when the uploaded list does not have one entry per turn."""
    starts = turn_starts(ep)
    given = ep.meta.get("turn_states")
    if given is not None:
        if len(given) != len(starts):
            raise ApiError(
                422,
                "bad_turn_states",
                f"`meta.turn_states` has {len(given)} entries but the episode has {len(starts)} turns.",
                field="meta.turn_states",
            )
        return list(given)
    pol = np.flatnonzero(ep.policy)
    # The policy token before each turn start (-1: none): the observation is what lies between.
    prev = np.concatenate(([-1], pol))[np.searchsorted(pol, starts)]
    return [
        "".join(ep.tokens[p + 1 : s]) if s - p > 1 else None
        for p, s in zip(prev.tolist(), starts.tolist(), strict=True)
    ]


def _turn_extras(extras: dict[str, Any], row: int, ep: EpisodeArrays, as_numpy: bool) -> dict[str, Any]:
    """A batch turn scheme's per-turn ([B, K]) and per-episode ([B]) extras of row ``row`` on
    this episode's policy tokens (null elsewhere); ``turn_advantages`` (the row itself) left out."""
    policy = ep.policy
    k_of = np.cumsum(np.isin(np.arange(len(policy)), turn_starts(ep))) - 1  # turn index per token
    out: dict[str, Any] = {}
    for key, v in extras.items():
        if key == "turn_advantages" or not isinstance(v, torch.Tensor):
            continue
        x = v[row].to(torch.float64).numpy()
        if x.ndim == 0:
            tok = np.full(len(policy), float(x))
        elif x.ndim == 1 and len(x):
            tok = x[np.clip(k_of, 0, len(x) - 1)]
        else:
            continue
        out[key] = _masked(tok, policy, as_numpy)
    return out


def _padded_batch(arrays: list[EpisodeArrays], values: bool, turns: bool = False) -> EstimatorInput:
    """[B, T_max] right-padded estimator input of a whole batch (padding: mask 0). ``turns``: also
    ``turn_ids`` and ``turn_states`` (:func:`anchor_observations`, ids shared across the batch)."""
    B, T = len(arrays), max(len(a.kinds) for a in arrays)
    rew = np.zeros((B, T))
    mask = np.zeros((B, T))
    val = np.zeros((B, T)) if values else None
    lp = np.zeros((B, T))
    has_lp = all(a.logprobs is not None for a in arrays)
    for b, a in enumerate(arrays):
        n = len(a.kinds)
        rew[b, :n] = a.rewards
        mask[b, :n] = a.kinds == POLICY
        if val is not None and a.values is not None:
            val[b, :n] = a.values
        if has_lp:
            lp[b, :n] = a.logprobs
    groups = torch.from_numpy(domain.group_ids([a.group for a in arrays]))
    turn_kw: dict[str, Any] = {}
    if turns:
        tids = np.full((B, T), -1, dtype=np.int64)
        for b, a in enumerate(arrays):
            tids[b, : len(a.kinds)] = a.turn_ids
        turn_kw = {
            "turn_ids": torch.from_numpy(tids),
            "turn_states": anchor_state_ids([anchor_observations(a) for a in arrays]),
        }
    return EstimatorInput(
        rewards=torch.from_numpy(rew),
        mask=torch.from_numpy(mask),
        values=None if val is None else torch.from_numpy(val),
        groups=groups,
        logprobs=torch.from_numpy(lp) if has_lp else None,
        **turn_kw,
    )


def oracle_advantages(ep: EpisodeArrays, gamma: float) -> np.ndarray:
    """[T] the oracle turn advantage (:func:`app.core.domain.oracle_turn_advantages`) with the true
    values ``meta.turn_values``, broadcast on each turn's policy tokens."""
    V = ep.meta["turn_values"]
    policy = ep.policy
    A = domain.oracle_turn_advantages(
        ep.turn_ids,
        policy,
        ep.rewards,
        V,
        truncated=ep.truncated,
        bootstrap_value=ep.bootstrap_value,
        gamma=gamma,
    )
    if A is None:
        K = int(ep.turn_ids[policy].max()) + 1
        raise ApiError(
            422,
            "bad_turn_values",
            f"`meta.turn_values` has {len(V)} entries but the episode has {K} turns.",
            field="meta.turn_values",
        )
    out = np.zeros(len(policy))
    out[policy] = A[ep.turn_ids[policy]]
    return out


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
) -> dict[str, Any]:
    """The advantages payload of one episode (the JSON of GET /api/episodes/{slug}/advantages).

    ``ctx`` None: the episode is its own batch (a group of one). ``as_numpy``: per-token arrays
    as float64 numpy arrays with NaN for null (serialise with app.http.api._json.dumps); default lists."""
    names = parse_schemes(schemes)
    validate_params(ep, names, gamma, lam, baseline, critic)
    specs = available()
    T = len(ep.kinds)
    if ctx is not None:
        # Each scheme holds a few [T] arrays of this episode (token schemes run on its row alone).
        check_budget(
            T * (len(names) + 4),
            ctx.max_cells,
            f"{len(names)} scheme(s) on this {T:,}-token episode",
            "Ask for fewer schemes at once (scheme=...).",
        )
    policy = ep.policy
    if ctx is None:
        ctx = BatchContext(groups=[ep.group], scores=np.array([ep.score]), index=0, _arrays=[ep])
    use_values = ep.values if critic == "upload" else None
    values = use_values if use_values is not None else np.zeros(T)
    last_value = None
    if ep.truncated and ep.bootstrap_value is not None and critic == "upload":
        last_value = torch.tensor([ep.bootstrap_value], dtype=torch.float64)
    mask_t = torch.from_numpy(policy.astype(np.float64))[None]
    single = EstimatorInput(
        rewards=torch.from_numpy(np.ascontiguousarray(ep.rewards, dtype=np.float64))[None],
        mask=mask_t,
        values=torch.from_numpy(np.ascontiguousarray(values, dtype=np.float64))[None],
        groups=torch.zeros(1, dtype=torch.long),
        turn_ids=torch.from_numpy(ep.turn_ids.astype(np.int64))[None],
        last_value=last_value,
        gamma=gamma,
        lam=lam,
        logprobs=None if ep.logprobs is None else torch.from_numpy(np.ascontiguousarray(ep.logprobs))[None],
        turn_values=None
        if ep.meta.get("turn_values") is None
        else torch.tensor([ep.meta["turn_values"]], dtype=torch.float64),
    )
    td = run_estimator("td", single).advantages[0].numpy() if "td" in specs else np.zeros(T)
    if not ep.rewarded:
        td = np.full(T, np.nan)

    out_schemes = []
    per_token: dict[str, np.ndarray] = {}
    audit = None
    if any(n in sc.AUDIT_SCHEMES for n in names):
        if ctx.audit is None:
            raise ApiError(
                422, "no_batch", "the audit rows need the episode's batch, which is not available."
            )
        audit = ctx.audit()
    for name in names:
        extras = None
        everywhere = None
        if name == "loss_weights":  # after the advantage rows it may read
            out_schemes.append({"name": name})
            continue
        if name == "outcome":
            a = ctx.scores[ctx.index] if baseline == "none" else ctx.episode_outcome(baseline)
            adv = np.where(policy, a, 0.0)
            label, kind = sc.outcome_label(baseline), "outcome"
        elif name == "oracle":
            adv = oracle_advantages(ep, gamma)
            label, kind, _ = sc.SERVICE_SCHEMES["oracle"]
        elif name == "uploaded":
            adv = np.where(policy, ep.advantages, 0.0)
            label, kind, _ = sc.SERVICE_SCHEMES["uploaded"]
            # Served on every token: a nonzero trainer advantage on a prompt or tool token is a
            # bug the page outlines (the turn means below still read policy tokens only).
            everywhere = np.asarray(ep.advantages, dtype=np.float64)
        elif name in sc.AUDIT_SCHEMES:  # the reference is 0 off-policy, as the uploaded row
            adv = (
                audit.reference
                if name == "audit_reference"
                else np.where(policy, ep.advantages, 0.0) - audit.reference
            )
            label, kind, _ = sc.SERVICE_SCHEMES[name]
        else:
            spec = specs[name]
            label, kind = spec.label, spec.kind
            a = ctx.episode_outcome(name) if spec.kind == "outcome" else None
            if a is not None:
                adv = np.where(policy, a, 0.0)
            elif spec.kind == "outcome":
                # An outcome estimator that reads other episodes' tokens: the padded batch,
                # within the work budget.
                ctx.check_batch_budget(
                    name,
                    "Pick a scheme that reads only scores (outcome, rloo, grpo, ...) or split the batch.",
                )
                arrays = ctx.arrays()
                batch_inp = _padded_batch(arrays, values=critic == "upload")
                batch_inp.gamma, batch_inp.lam = gamma, lam
                adv = run_estimator(name, batch_inp).advantages[ctx.index, :T].numpy()
            elif name in GROUP_TURN_SCHEMES:
                # They normalise within the episode's group (and its step groups): the group's
                # rows give the same numbers as the whole batch.
                members, row = ctx.group_arrays(name)
                batch_inp = _padded_batch(members, values=False, turns=True)
                batch_inp.gamma, batch_inp.lam = gamma, lam
                res = run_estimator(name, batch_inp)
                adv = res.advantages[row, :T].numpy()
                extras = _turn_extras(res.extras, row, ep, as_numpy) or None
            else:
                adv = run_estimator(name, single).advantages[0].numpy()
        adv = np.asarray(adv, dtype=np.float64)
        if not ep.rewarded and everywhere is None and name not in sc.AUDIT_SCHEMES:
            # No reward was uploaded: any number here would credit a made-up outcome of 0.
            adv = np.full(T, np.nan)
            extras = None
        else:
            per_token[name] = adv
        shown = _masked(adv, policy, as_numpy)
        if everywhere is not None:
            shown = everywhere.copy() if as_numpy else everywhere.tolist()
        entry = {"name": name, "label": label, "kind": kind, "advantages": shown}
        if extras:
            entry["extras"] = extras
        out_schemes.append(entry)

    loss_out = None
    if "loss_weights" in names:
        loss_out = _loss_row(ep, ctx, loss or lv.LossParams(), per_token, out_schemes, as_numpy)
        per_token["loss_weights"] = loss_out.pop("_weights")
    turns = turn_summaries(ep, per_token, use_values)
    if loss_out is not None:
        lv.call_shares(per_token["loss_weights"], turns, ep.turn_ids, policy)
    extra = {} if audit is None else {"audit": {"best_match": audit.best_match, "marks": audit.marks}}
    if loss_out is not None:
        extra["loss"] = loss_out
    return {
        **extra,
        "slug": ep.slug,
        "batch_id": ep.batch_id,
        "group": ep.group,
        "n_tokens": T,
        "params": {"gamma": gamma, "lam": lam, "baseline": baseline, "critic": critic, "schemes": names},
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
        "values": None if use_values is None else _masked(use_values, policy, as_numpy),
        "td": _masked(td, policy, as_numpy),
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
        adv, policy, ep.logprobs, ep.rollout_logprobs, params, lengths, horizon=horizon or None
    )
    for entry in out_schemes:
        if entry["name"] == "loss_weights":
            label, kind, _ = sc.SERVICE_SCHEMES["loss_weights"]
            entry.update(label=label, kind=kind, advantages=_masked(w, policy, as_numpy))
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


def turn_summaries(
    ep: EpisodeArrays, per_token: dict[str, np.ndarray], values: np.ndarray | None
) -> list[dict]:
    """One entry per turn: token span, text, reward, V at its first token, effect, mean advantage per scheme."""
    policy = ep.policy
    tid = ep.turn_ids
    idx = np.flatnonzero(policy)
    if not len(idx):
        return []
    t = tid[idx]
    K = int(t.max()) + 1
    counts = np.bincount(t, minlength=K)
    rewards = np.bincount(t, weights=ep.rewards[idx], minlength=K)
    # Policy positions grouped by turn (stable sort keeps token order): O(T log T), not O(K T).
    order = idx[np.argsort(t, kind="stable")]
    bounds = np.concatenate(([0], np.cumsum(counts))).tolist()
    means = {
        name: (np.bincount(t, weights=adv[idx], minlength=K) / np.maximum(counts, 1)).tolist()
        for name, adv in per_token.items()
    }
    calls = ep.meta.get("calls") if isinstance(ep.meta.get("calls"), list) else None
    tokens = ep.tokens
    counts_l, rewards_l = counts.tolist(), rewards.tolist()
    out = []
    for k in range(K):
        n = counts_l[k]
        if n == 0:
            continue
        b0, b1 = bounds[k], bounds[k + 1]
        s, e = int(order[b0]), int(order[b1 - 1]) + 1
        if e - s == n:  # the usual case: a contiguous run of policy tokens
            text = "".join(tokens[s : min(e, s + 400)])
        else:
            text = "".join(tokens[i] for i in order[b0 : min(b1, b0 + 400)].tolist())
        effect = None
        if calls is not None and k < len(calls) and isinstance(calls[k], dict):
            effect = calls[k].get("effect")
        out.append(
            {
                "turn": k,
                "start": s,
                "end": e,
                "text": text,
                "reward": rewards_l[k],
                "value": None if values is None else float(values[s]),
                "effect": effect,
                "means": {name: m[k] for name, m in means.items()},
            }
        )
    return out
