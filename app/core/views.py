"""The view state of the episode page, read from and written to the query string (the URL is the
state). static/episode.js writes the same canonical query when the user changes a control
(history.replaceState); app/core/urls.py turns a view into the page's and the API's URLs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlencode

from app.core import losses as ls
from app.core import schemes as sc
from app.core.signals import SIGNAL_ROWS


def _float(raw: str | None, default: float, lo: float, hi: float) -> float:
    try:
        x = float(raw) if raw is not None else default
    except ValueError:
        return default
    if not math.isfinite(x):
        return default
    return min(hi, max(lo, x))


def _int_list(raw: str | None) -> list[int]:
    out: list[int] = []
    for part in (raw or "").split(","):
        part = part.strip()
        if part.isdigit():
            out.append(int(part))
    return sorted(set(out))


def _choice(raw: str | None, allowed: Collection[str], default: str) -> str:
    return raw if raw is not None and raw in allowed else default


def fmt_num(x: float) -> str:
    # 0.95 -> "0.95", 1.0 -> "1": stable, short URLs that compare equal after a round trip.
    return f"{x:.6g}"


# The rows an episode opens with when it carries the trainer's own advantages: what the user brought,
# then the audit's reference and where the two differ (a finding's link opens the same rows).
UPLOADED_ROWS = ("uploaded", "audit_reference", "audit_diff")


def default_rows(have: Collection[str], trainer_rows: Sequence[str] = ()) -> list[str]:
    """The rows of a link without ``scheme=`` for an episode with the inputs ``have``: the
    trainer's advantages and the audit's reference when uploaded, else sc.default_schemes.
    ``trainer_rows``: the named trainer's dialect and its reference (app/core/trainers.py), shown
    right under the upload (those whose inputs the episode has), before the audit's difference;
    without uploaded advantages, the dialect and its reference are the rows."""
    mine = [r for r in trainer_rows if set(sc.reads_of(r)) <= set(have)]
    if "advantages" not in have:
        return mine if len(mine) == len(trainer_rows) and mine else sc.default_schemes(have)
    if mine:
        return ["uploaded", *mine, "audit_diff"]
    return list(UPLOADED_ROWS)


# The query's keys in canonical order: (key, attribute, kind, gate). Python writes the query from
# this list and the pages' scripts from the same list (the page state carries it: static/util.js
# viewPairs), so the two cannot drift. kind: "list" (comma-joined), "num" (fmt_num), "str", "int",
# "flag" ("1", absent when false), "params" (a dict written as its own keys, in order). gate:
# "always"; "page" (a page-only key, absent from the API's query, and absent when unset); "set"
# (absent when unset: empty, false, None); "row:NAME" (only while that row is shown, so older
# links stay canonical).
QUERY_KEYS: tuple[tuple[str, str, str, str], ...] = (
    ("scheme", "schemes", "list", "always"),
    ("gamma", "gamma", "num", "always"),
    ("lam", "lam", "num", "always"),
    ("baseline", "baseline", "str", "always"),
    ("critic", "critic", "str", "always"),
    ("options", "options", "params", "set"),
    ("signal", "signals", "list", "set"),
    ("loss", "loss", "str", "row:loss_weights"),
    ("agg", "agg", "str", "row:loss_weights"),
    ("rollout_is", "rollout_is", "str", "row:loss_weights"),
    ("rollout_is_threshold", "rollout_is_threshold", "str", "row:loss_weights"),
    ("loss_params", "loss_params", "params", "row:loss_weights"),
    ("bypass", "bypass", "flag", "row:loss_weights"),
    ("open", "open", "list", "page"),
    ("tok", "tok", "int", "page"),
    ("chart", "chart", "flag", "page"),
)


@dataclass
class EpisodeView:
    """The whole state of an episode page.

    schemes: rows shown, top to bottom. gamma, lam: discount and GAE lambda. baseline: group
    baseline of the `outcome` row. critic: "upload" (the episode's values) or "zero".
    open: start indices of tool spans shown expanded. tok: cursor token (or None).
    chart: the per-call Plotly chart is open. signals: per-token signal rows shown under the
    advantage rows (app/core/signals.py: logprob, entropy, kl, ratio), top to bottom.
    """

    schemes: list[str] = field(default_factory=lambda: list(sc.DEFAULT_SCHEMES))
    gamma: float = sc.DEFAULT_GAMMA
    lam: float = sc.DEFAULT_LAM
    baseline: str = sc.DEFAULT_BASELINE
    critic: str = sc.DEFAULT_CRITIC
    open: list[int] = field(default_factory=list)
    tok: int | None = None
    chart: bool = False
    signals: list[str] = field(default_factory=list)
    # The options of the trainers' dialects shown (their own config keys: scale_rewards,
    # norm_adv_by_std_in_grpo, ...) as the URL writes them; app/core/schemes.py parse_options.
    options: dict[str, str] = field(default_factory=dict)
    # The `loss_weights` row's loss x aggregation x correction (app/compute/loss_view.py); in the
    # query only when that row is shown, so older links stay canonical.
    # The defaults are the default loss's (app/core/losses.py, from the loss registry). agg,
    # rollout_is, rollout_is_threshold: verl's controls, None for a loss that does not take them;
    # loss_params: the chosen loss's other controls (another trainer's: importance_sampling_level,
    # loss_agg_mode, loss_reduction, ...) as the URL writes them.
    loss: str = ls.DEFAULT_LOSS
    agg: str | None = field(default_factory=lambda: ls.default_text("agg"))
    rollout_is: str | None = field(default_factory=lambda: ls.default_text("rollout_is"))
    rollout_is_threshold: str | None = field(default_factory=lambda: ls.default_text("rollout_is_threshold"))
    loss_params: dict[str, str] = field(default_factory=dict)
    bypass: bool = False

    @classmethod
    def from_query(
        cls,
        q: dict[str, str],
        known: set[str] | None = None,
        inputs: Callable[[str], Collection[str]] | None = None,
        trainer_rows: Sequence[str] = (),
    ) -> EpisodeView:
        """Parse a query string, silently replacing malformed values with defaults (a link
        never 500s); scheme names are filtered against ``known`` when given.

        ``inputs``: critic -> the inputs the episode has (app/compute/inputs.py). With it, a
        query without ``scheme`` gets the episode's default schemes (those whose reads it has:
        no critic-reading row for an episode without values), and a query without ``critic`` whose
        schemes read values the episode lacks gets ``critic=zero`` (V = 0)."""
        view = cls._parse(q, known)
        if inputs is not None:
            if q.get("scheme") is None:
                view.schemes = default_rows(inputs(view.critic), trainer_rows)
                view.options = {k: q[k] for k in sc.option_names(view.schemes) if k in q}
            elif q.get("critic") is None and view.needs_critic_fallback(inputs):
                view.critic = sc.NO_CRITIC
        return view

    def needs_critic_fallback(self, inputs: Callable[[str], Collection[str]]) -> bool:
        """True when a scheme shown reads critic values that the episode lacks under this critic
        but gets under ``critic=zero``."""
        if "values" in inputs(self.critic) or "values" not in inputs(sc.NO_CRITIC):
            return False
        known = set(sc.names())
        return any(s in known and "values" in sc.reads_of(s) for s in self.schemes)

    @classmethod
    def _parse(cls, q: dict[str, str], known: set[str] | None) -> EpisodeView:
        raw = q.get("scheme")
        if raw is None:
            schemes = list(sc.DEFAULT_SCHEMES)
        else:
            schemes = []
            for s in raw.split(","):
                s = s.strip()
                if s and s not in schemes and (known is None or s in known):
                    schemes.append(s)
        tok_raw = q.get("tok", "")
        signals: list[str] = []
        # `signals=` is read too (a natural spelling); `signal=` is written, like `scheme=`.
        for name in (q.get("signal") or q.get("signals") or "").split(","):
            name = name.strip()
            if name in SIGNAL_ROWS and name not in signals:
                signals.append(name)
        loss = ls.canonical(_choice(q.get("loss"), ls.loss_names(), ls.DEFAULT_LOSS))
        verl, own = ls.view_params(loss, q)
        return cls(
            schemes=schemes,
            gamma=_float(q.get("gamma"), sc.DEFAULT_GAMMA, 0.0, 1.0),
            lam=_float(q.get("lam"), sc.DEFAULT_LAM, 0.0, 1.0),
            baseline=_choice(q.get("baseline"), sc.BASELINES, sc.DEFAULT_BASELINE),
            critic=_choice(q.get("critic"), sc.CRITICS, sc.DEFAULT_CRITIC),
            open=_int_list(q.get("open")),
            tok=int(tok_raw) if tok_raw.isdigit() else None,
            chart=q.get("chart") == "1",
            signals=signals,
            options={k: q[k] for k in sc.option_names(schemes) if k in q},
            loss=loss,
            agg=verl["agg"],
            rollout_is=verl["rollout_is"],
            rollout_is_threshold=verl["rollout_is_threshold"],
            loss_params=own,
            bypass=q.get("bypass") == "1",
        )

    def query(self) -> str:
        """The canonical query string: :data:`QUERY_KEYS` in order (static/util.js viewPairs
        writes the same from the same list)."""
        return urlencode(self.pairs(api=False), safe=",:")

    def api_query(self) -> str:
        """The query string of the advantages API for this view (no page-only keys)."""
        return urlencode(self.pairs(api=True), safe=",:")

    def pairs(self, api: bool) -> list[tuple[str, str]]:
        """[(key, value)] of the query, as :data:`QUERY_KEYS` says; ``api``: without page-only keys."""
        out: list[tuple[str, str]] = []
        for key, attr, kind, gate in QUERY_KEYS:
            x = getattr(self, attr)
            unset = x is None or x is False or (isinstance(x, list | dict) and not x)
            if (gate == "page" and api) or (gate != "always" and unset):
                continue
            if gate.startswith("row:") and gate[4:] not in self.schemes:
                continue
            if kind == "list":
                out.append((key, ",".join(map(str, x))))
            elif kind == "num":
                out.append((key, fmt_num(x)))
            elif kind == "flag":
                out.append((key, "1"))
            elif kind == "params":
                out.extend((k, str(v)) for k, v in x.items())
            else:
                out.append((key, str(x)))
        return out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
