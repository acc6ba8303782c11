"""Batches: listing/search, diagnostics (hand-computed), the groups endpoint, demo loading."""

from __future__ import annotations

import json
import math

import pytest
from sqlmodel import Session

from app.storage.store import load_demo
from tests.app.svc_helpers import episode, upload

# easy: 3 of 4 pass; hard: 0 of 4 (never solved, zero variance); mid: 1 of 2.
REWARDS = {"easy": [1, 1, 0, 1], "hard": [0, 0, 0, 0], "mid": [1, 0]}


@pytest.fixture
def batch(client):
    eps = [episode(reward=float(r), group=g, meta={"task": g}) for g, rs in REWARDS.items() for r in rs]
    return upload(client, eps, name="three tasks").json()


def test_batch_diagnostics_by_hand(client, batch):
    b = client.get(f"/api/batches/{batch['batch_id']}").json()
    assert (b["name"], b["source"], b["n_episodes"]) == ("three tasks", "upload:native", 10)
    assert b["created_at"].endswith("Z")
    assert [e["slug"] for e in b["episodes"]] == [e["slug"] for e in batch["episodes"]]
    assert b["episodes"][0] == {
        "slug": batch["episodes"][0]["slug"],
        "group": "easy",
        "reward": 1.0,
        "score": 1.0,
        "passed": True,
        "n_tokens": 5,
        "task": "easy",
        "rewarded": True,
        # No uploaded advantages: no trainer credit to rank by.
        "max_abs_adv": None,
        "max_abs_adv_at": None,
    }
    d = b["diagnostics"]
    groups = {g["group"]: g for g in d["groups"]}
    assert groups["easy"] == {
        "group": "easy",
        "n": 4,
        "mean_reward": 0.75,
        "pass_rate": 0.75,
        "zero_variance": False,
    }
    assert groups["hard"]["zero_variance"] and groups["hard"]["pass_rate"] == 0.0
    assert groups["mid"]["mean_reward"] == 0.5
    assert d["zero_variance_groups"] == ["hard"]
    assert d["zero_variance_share"] == pytest.approx(4 / 10)
    assert d["pass_rate"] == pytest.approx(4 / 10)
    assert sum(d["reward_histogram"]["counts"]) == 10
    assert d["reward_histogram"]["counts"][0] == 6 and d["reward_histogram"]["counts"][-1] == 4

    w = d["whiten_vs_center"]
    # Batch scores: four 1s, six 0s; mean 0.4; sample std sqrt((4*0.36 + 6*0.16)/9) = 0.516398.
    std = math.sqrt((4 * 0.36 + 6 * 0.16) / 9)
    assert w["never_solved_groups"] == ["hard"]
    nf = w["never_solved_failures"]
    assert nf["n"] == 4 and nf["mean_batch_whiten"] == pytest.approx(-0.4 / std, abs=1e-5)  # -0.7746
    assert nf["mean_group_center"] == 0.0
    s = w["successes"]
    # group-centred successes: easy 1 - 0.75 = 0.25 (x3), mid 1 - 0.5 = 0.5 -> mean 0.3125.
    assert s["n"] == 4 and s["mean_group_center"] == pytest.approx(0.3125)
    assert s["mean_batch_whiten"] == pytest.approx(0.6 / std, abs=1e-5)  # +1.1619
    assert "-0.77" in w["summary"] and "+0.31" in w["summary"]
    assert len(w["episodes"]) == 10
    assert d["useless_credit_share"] is None and d["credit_by_effect"] is None


def test_groups_endpoint(client, batch):
    bid = batch["batch_id"]
    hard = client.get(f"/api/batches/{bid}/groups/hard").json()
    assert hard["zero_variance"] and "all failed" in hard["why"]
    for e in hard["episodes"]:
        assert (
            e["advantages"]["rloo"] == 0.0
            and e["advantages"]["grpo"] == 0.0
            and e["advantages"]["group_mean"] == 0.0
        )
        assert e["advantages"]["batch_whiten"] == pytest.approx(-0.7746, abs=1e-4)
    mid = client.get(f"/api/batches/{bid}/groups/mid").json()
    assert not mid["zero_variance"] and mid["why"] is None
    win, loss = mid["episodes"]
    # RLOO in a pair: +1 / -1; GRPO: mean 0.5, sample std sqrt(0.5) -> +-0.7071; Dr. GRPO +-0.5.
    assert (win["advantages"]["rloo"], loss["advantages"]["rloo"]) == (1.0, -1.0)
    assert win["advantages"]["grpo"] == pytest.approx(0.5 / math.sqrt(0.5), abs=1e-5)
    assert loss["advantages"]["dr_grpo"] == pytest.approx(-0.5)
    r = client.get(f"/api/batches/{bid}/groups/nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


def test_credit_by_effect_by_hand(client):
    # prompt | read (2 policy tokens) | obs | decisive edit (3) | obs | submit (1)
    kinds = ["prompt", "policy", "policy", "tool", "policy", "policy", "policy", "tool", "policy"]
    calls = [
        {"turn": 0, "effect": "read"},
        {"turn": 1, "effect": "decisive_edit"},
        {"turn": 2, "effect": "submit"},
    ]
    win = {"tokens": list("PrrOeeeOs"), "kinds": kinds, "reward": 1.0, "group": "u", "meta": {"calls": calls}}
    loss = dict(win, reward=0.0)
    bid = upload(client, [win, loss]).json()["batch_id"]
    d = client.get(f"/api/batches/{bid}").json()["diagnostics"]
    # RLOO of the success = 1 - 0 = 1 on each of its 6 policy tokens: read gets 2 of 6 -> 1/3.
    assert d["useless_credit_share"] == pytest.approx(2 / 6)
    assert d["useless_credit_share_per_call"] == pytest.approx(1 / 3)
    # Every call counts (the loss's too, with no credit); its RLOO is 0 - 1 = -1: mean (1 - 1) / 2.
    assert d["credit_by_effect"]["decisive_edit"] == {
        "calls": 2,
        "tokens": 6,
        "credit": 3.0,
        "call_credit": 1.0,
        "share": 0.5,
        "call_share": pytest.approx(1 / 3),
        "mean_outcome_advantage": 0.0,
        "mean_oracle_advantage": None,
    }


@pytest.mark.usefixtures("batch")
def test_list_and_search(client):
    upload(client, [episode()], name="another run")
    names = [b["name"] for b in client.get("/api/batches").json()]
    assert names == ["another run", "three tasks"]  # newest first
    assert [b["name"] for b in client.get("/api/batches", params={"q": "THREE"}).json()] == ["three tasks"]
    assert client.get("/api/batches", params={"source": "sample"}).json() == []
    assert len(client.get("/api/batches", params={"source": "upload"}).json()) == 2


def test_load_demo_only_into_an_empty_database(client, tmp_path):
    folder = tmp_path / "demo"
    engine = client.app.state.engine
    with Session(engine) as s:
        assert load_demo(s, folder) == []  # no folder: nothing, no error
    folder.mkdir()
    for stem, rs in (("base_agent", [1.0, 0.0]), ("oracle_agent", [1.0])):
        (folder / f"{stem}.jsonl").write_text("".join(json.dumps(episode(reward=r)) + "\n" for r in rs))
    with Session(engine) as s:
        created = load_demo(s, folder)
    assert [len(c.episodes) for c in created] == [2, 1]
    batches = client.get("/api/batches").json()
    assert sorted(b["name"] for b in batches) == ["base_agent", "oracle_agent"]
    assert {b["source"] for b in batches} == {"demo"}
    ep = client.get(f"/api/episodes/{created[0].episodes[0].slug}").json()
    assert ep["meta"]["source"] == "demo"
    with Session(engine) as s:
        assert load_demo(s, folder) == []  # not empty any more: loads nothing


def test_demo_setting_loads_the_shipped_fixtures_on_start(db_url):
    from app.core.resources import demo_dir
    from app.sim import demo_runs
    from tests.app.svc_helpers import make_client

    files = sorted(demo_dir().glob("*.jsonl"))
    with make_client(db_url, demo=True) as c:
        names = sorted(b["name"] for b in c.get("/api/batches", params={"limit": 500}).json())
    # The demo runs' steps are batches too (app/sim/demo_runs.py).
    steps = [n for n in names if n.startswith(tuple(f"{d.name} step " for d in demo_runs.RUNS))]
    assert sorted(set(names) - set(steps)) == sorted(f.stem for f in files if f.read_text().strip())


def test_diagnostics_agree_with_the_simulators_own_figures(client):
    """The demo batch's diagnostics, computed by app/compute/diagnostics.py from the stored episodes, equal
    the simulator's own figures computed now from the same episodes (app.sim.sim_diagnostics, not
    the copy frozen in bugfix.meta.json), and the demo's design: 6 of its 20 groups never pass."""
    from app.core.resources import demo_dir
    from app.core.schemas import EpisodeIn
    from app.sim import sim_diagnostics

    data = demo_dir() / "bugfix.jsonl"
    episodes = [EpisodeIn.model_validate_json(x) for x in data.read_text().splitlines() if x.strip()]
    want = sim_diagnostics(episodes)
    r = client.post("/api/uploads", files={"file": ("bugfix.jsonl", data.read_bytes())})
    d = client.get(f"/api/batches/{r.json()['batch_id']}").json()["diagnostics"]
    # By construction of the demo (seed 8): 6 all-fail groups of 8 out of 160 episodes.
    assert len(d["zero_variance_groups"]) == 6 and d["zero_variance_share"] == pytest.approx(48 / 160)
    # The pass rate by hand: the outcome reward is 1 for a pass and 0 otherwise in the simulator.
    assert d["pass_rate"] == pytest.approx(sum(e.reward > 0 for e in episodes) / len(episodes))
    assert d["zero_variance_share"] == pytest.approx(want["zero_variance_share"])
    assert sorted(d["zero_variance_groups"]) == sorted(g["group"] for g in want["zero_variance_groups"])
    assert d["pass_rate"] == pytest.approx(want["pass_rate"])
    assert d["useless_credit_share"] == pytest.approx(want["useless_credit_share"])
    checked = 0
    for effect, w in want["credit_by_effect"].items():
        if w["share"]:
            assert d["credit_by_effect"][effect] == pytest.approx({**w, "mean_oracle_advantage": None})
            checked += 1
    assert checked >= 2, want["credit_by_effect"]
