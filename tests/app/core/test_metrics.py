"""One definition of each metric (app/core/metrics.py): the batch diagnostics, a run step's stored
metrics and the simulator's diagnostics give the same numbers on one hand-built batch (computed by
hand below), an empty batch has no pass rate in any of them, and every metric a run step stores
has its name, label and format in the catalogue the run page reads from its page state."""

from __future__ import annotations

import json
import re

import pytest

from app.compute.diagnostics import batch_diagnostics
from app.compute.step_metrics import StepMetrics
from app.core import metrics
from app.core.schemas import EpisodeIn
from app.sim.diagnostics import sim_diagnostics
from tests.app.svc_helpers import episode, jsonl

# prompt | read (2 policy tokens) | obs | decisive edit (3) | obs | submit (1)
KINDS = ["prompt", "policy", "policy", "tool", "policy", "policy", "policy", "tool", "policy"]
CALLS = [
    {"turn": 0, "effect": "read"},
    {"turn": 1, "effect": "decisive_edit"},
    {"turn": 2, "effect": "submit"},
]


def hand_batch() -> list[dict]:
    """Seven episodes. Group a: a pass and a fail with calls; b: two fails (zero variance, all
    fail); c: two passes (zero variance, all pass); one ungrouped episode that passes on its
    per-token rewards alone (no outcome ``reward``)."""
    win = {"tokens": list("PrrOeeeOs"), "kinds": KINDS, "reward": 1.0, "group": "a", "meta": {"calls": CALLS}}
    return [
        win,
        dict(win, reward=0.0),
        episode(0.0, "b"),
        episode(0.0, "b"),
        episode(1.0, "c"),
        episode(1.0, "c"),
        {"tokens": ["p", "x", "y"], "kinds": ["prompt", "policy", "policy"], "rewards": [0.0, 0.0, 1.0]},
    ]


# Pass: the win, both c's and the ungrouped episode (score 1 > 0) -> 4 of 7. Zero variance: b and
# c, 4 of 7 episodes, 2 all-pass, 2 all-fail. RLOO in a: +1 for the win on its 2 + 3 + 1 policy
# tokens; read (2 of 6) is useless -> 1/3.
WANT = {
    "pass_rate": 4 / 7,
    "zero_variance_share": 4 / 7,
    "zero_variance_all_pass_share": 2 / 7,
    "zero_variance_all_fail_share": 2 / 7,
    "useless_credit_share": 1 / 3,
}


def test_batch_step_and_simulator_agree_by_hand(client):
    eps = hand_batch()
    run = client.post("/api/runs", json={"name": "m"}).json()
    r = client.post(f"/api/runs/{run['id']}/steps/0", content=jsonl(eps))
    assert r.status_code == 201, r.text
    step = client.get(f"/api/runs/{run['id']}").json()["steps"][0]["metrics"]
    diag = client.get(f"/api/batches/{r.json()['batch_id']}").json()["diagnostics"]
    sim = sim_diagnostics([EpisodeIn(**e) for e in eps])
    for name, want in WANT.items():
        assert step[name] == pytest.approx(want), name
        assert diag[name] == pytest.approx(want), name
        assert sim[name] == pytest.approx(want), name
    # credit_by_effect has one shape: the batch's and the simulator's are equal (the batch has no
    # oracle turn values here, nor does the simulator).
    assert (
        sorted(diag["credit_by_effect"])
        == sorted(sim["credit_by_effect"])
        == ["decisive_edit", "read", "submit"]
    )
    for effect, want in sim["credit_by_effect"].items():
        assert diag["credit_by_effect"][effect] == pytest.approx(want), effect
    assert diag["credit_by_effect"]["read"] == {
        "calls": 2,
        "tokens": 4,
        "credit": 2.0,  # the win's 2 read tokens times its RLOO +1; the fail's get none
        "call_credit": 1.0,
        "share": pytest.approx(2 / 6),
        "call_share": pytest.approx(1 / 3),
        "mean_outcome_advantage": 0.0,  # (+1 - 1) / 2
        "mean_oracle_advantage": None,
    }
    # The group and talk pages count passes from the API's `passed`, never restating the rule.
    ungrouped = client.get(f"/api/batches/{r.json()['batch_id']}").json()["episodes"][-1]
    assert ungrouped["group"] is None and ungrouped["passed"] is True


def test_an_empty_batch_has_no_pass_rate_anywhere():
    assert batch_diagnostics([])["pass_rate"] is None
    assert batch_diagnostics([])["zero_variance_share"] is None
    m = StepMetrics().result()
    assert m["pass_rate"] is None and m["zero_variance_share"] is None and m["n_episodes"] == 0
    assert metrics.pass_rate([]) is None


def test_every_step_metric_is_in_the_catalogue_and_on_the_run_page(client):
    """StepMetrics stores exactly the catalogue's step metrics; the audit adds ``audit_errors``;
    the run page's state lists every metric once, with its label and format."""
    assert set(StepMetrics().result()) == {*metrics.STEP_METRICS, "n_episodes"}
    assert metrics.AUDIT_ERRORS == "audit_errors" and metrics.METRICS["audit_errors"].source == "audit"
    run = client.post("/api/runs", json={"name": "m"}).json()
    html = client.get(f"/r/{run['id']}").text
    state = json.loads(re.search(r'id="initial-state">(.*?)</script>', html, re.S).group(1))
    served = [m["name"] for f in state["figures"] for m in f["metrics"]]
    assert sorted(served) == sorted(metrics.METRICS) and len(served) == len(set(served))
    fig = {f["id"]: f for f in state["figures"]}
    assert fig["zero-variance"]["percent"] and not fig["outcome"]["percent"]
    assert {"name": "audit_errors", "label": "error findings", "format": "count"} in fig["audit"]["metrics"]
    assert state["labels"]["pass_rate"] == "pass rate"


def test_old_stored_step_metrics_still_render(client):
    """Stored metric JSON keeps its names: a step stored before this catalogue (its JSON written
    directly, as an older server did) is served as stored."""
    from sqlalchemy import text

    run = client.post("/api/runs", json={"name": "old"}).json()
    r = client.post(f"/api/runs/{run['id']}/steps/0", content=jsonl([episode(1.0, "a"), episode(0.0, "a")]))
    old = {
        "n_episodes": 2,
        "pass_rate": 0.5,
        "mean_score": 0.5,
        "zero_variance_share": 0.0,
        "audit_errors": 1,
    }
    with client.app.state.engine.begin() as conn:
        conn.execute(
            text("UPDATE batch SET metrics_json = :m WHERE id = :i"),
            {"m": json.dumps(old), "i": r.json()["batch_id"]},
        )
    series = client.get(f"/api/runs/{run['id']}/metrics").json()
    assert series["pass_rate"] == [[0, 0.5]] and series["audit_errors"] == [[0, 1]]
