"""The URL is the state: EpisodeView parses any query string and writes the canonical one back."""

from __future__ import annotations

from app.core.urls import api_advantages as advantages_api_url
from app.core.urls import episode as episode_url
from app.core.views import EpisodeView


def test_round_trip_and_canonical_form():
    q = "scheme=td,token_gae&gamma=0.9&lam=0&baseline=grpo&critic=zero&open=7,2&tok=5&chart=1"
    v = EpisodeView.from_query(dict(p.split("=") for p in q.split("&")))
    assert v.schemes == ["td", "token_gae"] and (v.gamma, v.lam) == (0.9, 0.0)
    assert (v.baseline, v.critic, v.open, v.tok) == ("grpo", "zero", [2, 7], 5)
    # Canonical: open sorted, numbers in short form (static/episode.js writes the same string).
    assert v.query() == "scheme=td,token_gae&gamma=0.9&lam=0&baseline=grpo&critic=zero&open=2,7&tok=5&chart=1"
    assert EpisodeView.from_query(dict(p.split("=") for p in v.query().split("&"))) == v
    assert episode_url("a b", v).startswith("/e/a%20b?scheme=td,token_gae&")
    # The API URL carries the numbers' parameters only (not the cursor or expanded spans).
    assert (
        advantages_api_url("s", v)
        == "/api/episodes/s/advantages?scheme=td,token_gae&gamma=0.9&lam=0&baseline=grpo&critic=zero"
    )


def test_malformed_links_fall_back_to_defaults_never_fail():
    v = EpisodeView.from_query(
        {
            "gamma": "nan",
            "lam": "7",
            "baseline": "<script>",
            "critic": "x",
            "open": "1,a,-3",
            "tok": "-1",
            "scheme": "bogus,td",
        },
        known={"td", "outcome"},
    )
    assert (v.gamma, v.lam, v.baseline, v.critic) == (1.0, 1.0, "rloo", "upload")
    assert v.open == [1] and v.tok is None and v.schemes == ["td"]
    assert EpisodeView.from_query({}).schemes == ["outcome", "token_gae", "turn_gae"]
