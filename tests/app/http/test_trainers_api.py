"""GET /api/trainers (and the page's JSON twin): every trainer's dialects on the canonical
episodes, computed live by the real app on a real SQLite file, with numbers worked by hand."""

from __future__ import annotations

import math

import pytest

from estimators import available
from estimators.registry import TRAINERS
from tests.app.svc_helpers import make_client


@pytest.fixture(scope="module")
def body(tmp_path_factory):
    with make_client(tmp_path_factory.mktemp("trainers")) as client:
        r = client.get("/api/trainers")
        assert r.status_code == 200
        twin = client.get("/trainers?format=json")
        assert twin.status_code == 200 and twin.json()["api"] == "/api/trainers"
        page = client.get("/trainers")
        assert page.status_code == 200 and "Your trainer's credit, exactly" in page.text
        return r.json()


def _cell(body, name, case):
    for t in body["trainers"]:
        for e in t["estimators"]:
            if e["name"] == name:
                return e["cases"][case]
    raise KeyError(name)


def test_every_trainer_and_every_dialect_is_listed(body):
    assert [t["key"] for t in body["trainers"]] == list(TRAINERS)
    assert [(t["name"], t["version"]) for t in body["trainers"]] == list(TRAINERS.values())
    listed = {e["name"] for t in body["trainers"] for e in t["estimators"]}
    assert listed == {n for n, s in available().items() if s.trainer is not None}
    assert [c["key"] for c in body["cases"]] == [
        "tool_spans",
        "reward_on_tool",
        "singleton",
        "all_equal",
        "truncated",
        "rejected",
    ]
    assert body["gamma"] == 1.0 and body["lam"] == 0.95


def test_verl_rloo_twins_disagree_on_a_group_of_one(body):
    # The shown episode is alone in its group with score 0.7: verl 0.9.1's rloo gives it its score,
    # rloo_vectorized gives it 0 (policy tokens are positions 2-5 of "qqpppp").
    loop = _cell(body, "verl:rloo", "singleton")["advantages"]
    vec = _cell(body, "verl:rloo_vectorized", "singleton")["advantages"]
    assert loop[2:] == pytest.approx([0.7] * 4, abs=1e-6) and loop[:2] == [0.0, 0.0]
    assert vec == [0.0] * 6


def test_verl_grpo_lets_a_rejected_row_move_the_baseline(body):
    # Scores of the group as verl's GRPO sums the rows (rejected row included): 1, 0, 5.
    # mean 2, sample std sqrt((1 + 4 + 9) / 2) = sqrt(7); row 0: (1 - 2) / (sqrt(7) + 1e-6) = -0.37796.
    adv = _cell(body, "verl:grpo", "rejected")["advantages"]
    assert adv[2] == pytest.approx(-1 / (math.sqrt(7) + 1e-6), abs=1e-6)
    assert all(a == pytest.approx(adv[2], abs=1e-6) for a in adv[2:])


def test_all_equal_groups_get_no_credit_from_group_baselines(body):
    for name in ("verl:grpo", "trl:grpo", "skyrl:grpo", "prime_rl:grpo", "verl:rloo"):
        assert _cell(body, name, "all_equal")["advantages"] == [0.0] * 6, name


def test_gae_that_steps_through_tool_spans_departs_before_the_span(body):
    # "qqppptttpp": OpenRLHF's and SkyRL's GAE step through the three tool tokens, so the three
    # policy tokens before the span (positions 2-4) depart from the reference, the two after do not.
    for name in ("openrlhf:gae", "skyrl:gae"):
        cell = _cell(body, name, "tool_spans")
        assert cell["departs"] == [2, 3, 4], name
    # verl's GAE skips the span (PR #2337): no departure there.
    assert _cell(body, "verl:gae", "tool_spans")["departs"] == []
    codes = {e["name"]: e["departs_codes"] for t in body["trainers"] for e in t["estimators"]}
    assert codes["openrlhf:gae"] == ["gae_through_tool_spans"]
