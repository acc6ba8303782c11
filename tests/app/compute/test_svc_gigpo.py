"""GiGPO, turn leave-one-out and Monte Carlo rows of the advantages API on real uploads.

The sampled BugFix demo batch has repeated states (the same tool output after the same edit, the
same prompt for every attempt at a task), so GiGPO's step groups are non-trivial there. The
service's numbers must equal estimators.compute called directly on the batch, built here from the
uploaded file by hand (prompt/tool text before each turn as its anchor state).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from estimators import EstimatorInput, compute
from estimators.agent import anchor_state_ids
from tests.app.svc_helpers import episode, upload

DEMO = Path(__file__).resolve().parents[3] / "fixtures" / "demo" / "bugfix.jsonl"


def _direct_batch(episodes: list[dict]) -> tuple[EstimatorInput, list[list[int]]]:
    """The demo batch as the estimators see it, built without the service: [B, T] rewards (outcome
    on the last policy token), mask, default turn ids (maximal policy runs), anchor states."""
    B, T = len(episodes), max(len(e["tokens"]) for e in episodes)
    rew, mask = np.zeros((B, T)), np.zeros((B, T))
    tids = np.full((B, T), -1, dtype=np.int64)
    anchors, starts_all, labels = [], [], {}
    for b, e in enumerate(episodes):
        pol = [k == "policy" for k in e["kinds"]]
        idx = [i for i, p in enumerate(pol) if p]
        rew[b, idx[-1]] = e["reward"]
        turn, starts, obs = -1, [], []
        for i, p in enumerate(pol):
            if p:
                mask[b, i] = 1
                if i == 0 or not pol[i - 1]:
                    turn += 1
                    starts.append(i)
                    j = i
                    while j > 0 and not pol[j - 1]:
                        j -= 1
                    obs.append("".join(e["tokens"][j:i]) if j < i else None)
                tids[b, i] = turn
        anchors.append(obs)
        starts_all.append(starts)
        labels.setdefault(e["group"], len(labels))
    groups = torch.tensor([labels[e["group"]] for e in episodes])
    inp = EstimatorInput(
        rewards=torch.from_numpy(rew),
        mask=torch.from_numpy(mask),
        groups=groups,
        turn_ids=torch.from_numpy(tids),
        turn_states=anchor_state_ids(anchors),
    )
    return inp, starts_all


@pytest.fixture
def demo(client):
    episodes = [json.loads(line) for line in DEMO.read_text().splitlines() if line.strip()]
    r = client.post("/api/uploads", files={"file": ("bugfix.jsonl", DEMO.read_bytes())})
    assert r.status_code == 201, r.text
    return episodes, [e["slug"] for e in r.json()["episodes"]]


def _row(client, slug, scheme, **params):
    r = client.get(f"/api/episodes/{slug}/advantages", params={"scheme": scheme, **params})
    assert r.status_code == 200, r.text
    body = r.json()
    return body, body["schemes"][0]


def test_gigpo_on_the_demo_batch_equals_the_estimator_and_has_real_step_groups(client, demo):
    episodes, slugs = demo
    inp, _ = _direct_batch(episodes)
    want = compute("gigpo", inp)
    sizes = want.extras["step_group_size"]
    # Repeated states: many turns share their step group with other turns of their group.
    assert int((sizes > 1).sum()) > len(episodes)
    checked_big = 0
    for b in range(0, len(episodes), 7):
        body, row = _row(client, slugs[b], "gigpo")
        T = body["n_tokens"]
        pol = np.array([k == "policy" for k in body["kinds"]])
        got = np.array([np.nan if x is None else x for x in row["advantages"]])
        np.testing.assert_allclose(got[pol], want.advantages[b, :T].numpy()[pol], rtol=0, atol=1e-12)
        assert all(x is None for x in np.array(row["advantages"], dtype=object)[~pol])
        # The tooltip's step-group size: the estimator's size of each token's turn.
        tok_size = np.array([np.nan if x is None else x for x in row["extras"]["step_group_size"]])
        turn_of = inp.turn_ids[b, :T].numpy()
        np.testing.assert_array_equal(tok_size[pol], sizes[b, turn_of[pol]].numpy().astype(float))
        checked_big += int((tok_size[pol] > 1).any())
        ep_adv = np.array([x for x in row["extras"]["episode_advantages"] if x is not None])
        assert ep_adv == pytest.approx(float(want.extras["episode_advantages"][b]), abs=1e-12)
    assert checked_big > 0


def test_turn_loo_and_monte_carlo_on_the_demo_batch(client, demo):
    episodes, slugs = demo
    inp, _ = _direct_batch(episodes)
    loo = compute("turn_loo", inp).advantages
    for b in (0, 5, 41):
        body, row = _row(client, slugs[b], "turn_loo")
        pol = np.array([k == "policy" for k in body["kinds"]])
        got = np.array([np.nan if x is None else x for x in row["advantages"]])
        np.testing.assert_allclose(got[pol], loo[b, : body["n_tokens"]].numpy()[pol], rtol=0, atol=1e-12)
        # Monte Carlo with meta.turn_values (one episode on its own; gamma from the page).
        e = episodes[b]
        T = len(e["tokens"])
        single = EstimatorInput(
            rewards=inp.rewards[b : b + 1, :T],
            mask=inp.mask[b : b + 1, :T],
            turn_ids=inp.turn_ids[b : b + 1, :T],
            turn_values=torch.tensor([e["meta"]["turn_values"]], dtype=torch.float64),
            gamma=0.9,
            last_value=None
            if not e.get("truncated") or e.get("bootstrap_value") is None
            else torch.tensor([e["bootstrap_value"]], dtype=torch.float64),
        )
        mc = compute("monte_carlo", single).advantages[0].numpy()
        body, row = _row(client, slugs[b], "monte_carlo", gamma=0.9)
        got = np.array([np.nan if x is None else x for x in row["advantages"]])
        np.testing.assert_allclose(got[pol], mc[pol], rtol=0, atol=1e-12)


def two_turns(reward: float, states: list) -> dict:
    """Two turns (policy, tool, policy) with the native ``turn_states`` of each."""
    return {
        "tokens": ["p", "a", "o", "b"],
        "kinds": ["prompt", "policy", "tool", "policy"],
        "reward": reward,
        "group": "g",
        "turn_states": states,
    }


def test_native_turn_states_group_the_turns_the_upload_says(client):
    # Two attempts, two turns each; states given: both first turns "A", second turns "B" vs "C".
    body = upload(client, [two_turns(1.0, ["A", "B"]), two_turns(0.0, ["A", "C"])]).json()
    slug = body["episodes"][0]["slug"]
    stored = client.get(f"/api/episodes/{slug}").json()
    assert stored["meta"]["turn_states"] == ["A", "B"]  # kept in meta: no column, no migration
    _, row = _row(client, slug, "gigpo")
    assert row["extras"]["step_group_size"] == [None, 2, None, 1]
    # Without turn_states the observations differ only in nothing: the same prompt and tool text,
    # so the second turns share a step group.
    body = upload(client, [episode(reward=1.0, n_policy=1), episode(reward=0.0, n_policy=1)]).json()
    _, row = _row(client, body["episodes"][0]["slug"], "gigpo")
    assert row["extras"]["step_group_size"] == [None, None, 2]


@pytest.mark.parametrize(
    "states, field",
    [(["A"], "turn_states"), (["A", 3], "turn_states")],
)
def test_bad_turn_states_are_a_422_naming_the_field(client, states, field):
    ep = {
        "tokens": ["p", "a", "o", "b"],
        "kinds": ["prompt", "policy", "tool", "policy"],
        "reward": 1.0,
        "turn_states": states,
    }
    r = upload(client, [ep])
    assert r.status_code == 422, r.text
    assert r.json()["error"]["field"] == field
    meta_ep = {k: v for k, v in ep.items() if k != "turn_states"} | {"meta": {"turn_states": ["A"]}}
    r = upload(client, [meta_ep])
    assert r.status_code == 422 and r.json()["error"]["field"] == "meta.turn_states"


def test_monte_carlo_without_turn_values_is_a_422_naming_meta_turn_values(client):
    body = upload(client, [episode()]).json()
    r = client.get(
        f"/api/episodes/{body['episodes'][0]['slug']}/advantages", params={"scheme": "monte_carlo"}
    )
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["field"] == "scheme" and "meta.turn_values" in err["message"]


def test_offline_compute_reads_native_turn_states_like_the_server(client):
    from app.cli import compute_file

    eps = [two_turns(1.0, ["A", "B"]), two_turns(0.0, ["A", "B"]), two_turns(0.5, ["A", "C"])]
    offline = compute_file(
        "".join(json.dumps(e) + "\n" for e in eps).encode(),
        fmt=None,
        schemes=["gigpo"],
        gamma=1.0,
        lam=0.95,
        baseline="rloo",
        critic="zero",
    )
    body = upload(client, eps).json()
    for i, slug in enumerate(e["slug"] for e in body["episodes"]):
        _, row = _row(client, slug, "gigpo")
        assert offline[i]["schemes"][0]["advantages"] == pytest.approx(row["advantages"], abs=1e-12)
        assert offline[i]["schemes"][0]["extras"]["step_group_size"] == row["extras"]["step_group_size"]
    assert [r["schemes"][0]["extras"]["step_group_size"][3] for r in offline] == [2, 2, 1]
