"""The view state of each page, read from and written to the query string (the URL is the state).

One URL builder for templates and code alike: :func:`episode_url`, :func:`advantages_api_url`,
:func:`batch_url`, :func:`group_url`, :func:`talk_url`. static/episode.js mirrors
:func:`EpisodeView.query` when the user changes a control (history.replaceState).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from urllib.parse import quote, urlencode

from estimators import available

from ..compute import BASELINES

DEFAULT_SCHEMES = ("outcome", "token_gae", "turn_gae")
CRITICS = ("upload", "zero")

# Service-level schemes that are not registry entries.
SERVICE_SCHEMES = {
    "outcome": ("outcome", "outcome advantage under the chosen group baseline", "outcome"),
    "oracle": ("oracle (true values)", "turn-level advantage with the episode's true values", "turn"),
    "uploaded": (
        "uploaded advantages",
        "the advantages stored with the episode (meta.uploaded_advantages)",
        "token",
    ),
}


def scheme_catalog() -> list[dict]:
    """Every scheme a page may show: [{name, label, description, kind}], service schemes first."""
    out = [
        {"name": n, "label": lab, "description": d, "kind": k} for n, (lab, d, k) in SERVICE_SCHEMES.items()
    ]
    out += [
        {"name": s.name, "label": s.label, "description": s.description, "kind": s.kind}
        for s in available().values()
    ]
    return out


def scheme_names() -> set[str]:
    return {s["name"] for s in scheme_catalog()}


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


def fmt_num(x: float) -> str:
    # 0.95 -> "0.95", 1.0 -> "1": stable, short URLs that compare equal after a round trip.
    return f"{x:.6g}"


@dataclass
class EpisodeView:
    """The whole state of an episode page.

    schemes: rows shown, top to bottom. gamma, lam: discount and GAE lambda. baseline: group
    baseline of the `outcome` row. critic: "upload" (the episode's values) or "zero".
    open: start indices of tool spans shown expanded. tok: cursor token (or None).
    chart: the per-call Plotly chart is open.
    """

    schemes: list[str] = field(default_factory=lambda: list(DEFAULT_SCHEMES))
    gamma: float = 1.0
    lam: float = 0.95
    baseline: str = "rloo"
    critic: str = "upload"
    open: list[int] = field(default_factory=list)
    tok: int | None = None
    chart: bool = False

    @classmethod
    def from_query(cls, q: dict[str, str], known: set[str] | None = None) -> EpisodeView:
        """Parse a query string, silently replacing malformed values with defaults (a link
        never 500s); scheme names are filtered against ``known`` when given."""
        raw = q.get("scheme")
        if raw is None:
            schemes = list(DEFAULT_SCHEMES)
        else:
            schemes = []
            for s in raw.split(","):
                s = s.strip()
                if s and s not in schemes and (known is None or s in known):
                    schemes.append(s)
        tok_raw = q.get("tok", "")
        return cls(
            schemes=schemes,
            gamma=_float(q.get("gamma"), 1.0, 0.0, 1.0),
            lam=_float(q.get("lam"), 0.95, 0.0, 1.0),
            baseline=q.get("baseline") if q.get("baseline") in BASELINES else "rloo",
            critic=q.get("critic") if q.get("critic") in CRITICS else "upload",
            open=_int_list(q.get("open")),
            tok=int(tok_raw) if tok_raw.isdigit() else None,
            chart=q.get("chart") == "1",
        )

    def query(self) -> str:
        """The canonical query string (same key order as static/episode.js)."""
        extra = []
        if self.open:
            extra.append(("open", ",".join(map(str, self.open))))
        if self.tok is not None:
            extra.append(("tok", str(self.tok)))
        if self.chart:
            extra.append(("chart", "1"))
        return urlencode(self._api_pairs() + extra, safe=",")

    def api_query(self) -> str:
        """The query string of the advantages API for this view (no page-only keys)."""
        return urlencode(self._api_pairs(), safe=",")

    def _api_pairs(self) -> list[tuple[str, str]]:
        return [
            ("scheme", ",".join(self.schemes)),
            ("gamma", fmt_num(self.gamma)),
            ("lam", fmt_num(self.lam)),
            ("baseline", self.baseline),
            ("critic", self.critic),
        ]

    def to_dict(self) -> dict:
        return asdict(self)


def episode_url(slug: str, view: EpisodeView | None = None) -> str:
    base = f"/e/{quote(slug, safe='')}"
    return f"{base}?{view.query()}" if view else base


def advantages_api_url(slug: str, view: EpisodeView) -> str:
    return f"/api/episodes/{quote(slug, safe='')}/advantages?{view.api_query()}"


def batch_url(batch_id: int) -> str:
    return f"/b/{int(batch_id)}"


def group_url(batch_id: int, group: str) -> str:
    return f"/b/{int(batch_id)}/g/{quote(str(group), safe='')}"


def talk_url(step: int) -> str:
    return f"/talk/{int(step)}"
