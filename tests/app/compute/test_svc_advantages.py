"""GET /api/episodes/{slug}/advantages: numbers from hand-worked rows, verl 0.9.1 and hand arithmetic."""

from __future__ import annotations

import math

import pytest

from tests.app.svc_helpers import episode, upload


def adv(client, slug, **params):
    r = client.get(f"/api/episodes/{slug}/advantages", params=params)
    assert r.status_code == 200, r.text
    return r.json()


def policy_values(arr, kinds):
    return [a for a, k in zip(arr, kinds, strict=True) if k == "policy"]


@pytest.fixture
def group_of_eight(client):
    """One group of eight attempts with a single success (worked by hand)."""
    body = upload(client, [episode(reward=1.0 if i == 0 else 0.0, group="t") for i in range(8)]).json()
    return [e["slug"] for e in body["episodes"]]


@pytest.mark.parametrize(
    "baseline, success, failure",
    [
        # RLOO: 1 - 0/7 = +1; 0 - 1/7 = -0.142857.
        ("rloo", 1.0, -1 / 7),
        # group mean 1/8: 1 - 0.125 = +0.875; -0.125 (ratio 7/8).
        ("group_mean", 0.875, -0.125),
        # GRPO, sample std: sqrt((0.875^2 + 7 * 0.125^2) / 7) = sqrt(0.125) = 0.353553;
        # 0.875 / 0.353553 = 2.4749, -0.125 / 0.353553 = -0.35355.
        ("grpo", 0.875 / math.sqrt(0.125), -0.125 / math.sqrt(0.125)),
        # Dr. GRPO drops the division: the group-mean numbers.
        ("dr_grpo", 0.875, -0.125),
        # One group in the batch: batch whitening = GRPO's numbers.
        ("batch_whiten", 0.875 / math.sqrt(0.125), -0.125 / math.sqrt(0.125)),
        # No baseline: the score itself.
        ("none", 1.0, 0.0),
    ],
)
def test_outcome_baselines_of_a_group_of_eight_by_hand(client, group_of_eight, baseline, success, failure):
    for slug, want in ((group_of_eight[0], success), (group_of_eight[3], failure)):
        a = adv(client, slug, scheme="outcome", baseline=baseline)
        s = a["schemes"][0]
        assert s["name"] == "outcome" and s["kind"] == "outcome"
        vals = s["advantages"]
        assert vals[:2] == [None, None]  # prompt tokens carry no advantage
        assert vals[2:] == pytest.approx([want] * 3, abs=1e-5)
        assert a["params"]["baseline"] == baseline


def test_default_label_and_shape(client, group_of_eight):
    a = adv(client, group_of_eight[0], critic="zero")
    assert [s["name"] for s in a["schemes"]] == ["outcome", "token_gae", "turn_gae"]
    assert a["schemes"][0]["label"] == "outcome (RLOO)"
    assert a["n_tokens"] == 5 == len(a["tokens"]) == len(a["kinds"]) == len(a["rewards"]) == len(a["td"])
    assert a["turn_ids"] == [None, None, 0, 0, 0]
    assert a["rewards"] == [0, 0, 0, 0, 1.0]  # the outcome lives on the last policy token
    assert a["values"] is None and a["group"] == "t" and a["episode"]["reward"] == 1.0


def test_critic_zero_token_gae_by_hand(client, group_of_eight):
    # V = 0, gamma = 1, lam = 0.95, reward 1 on the last of 3 policy tokens:
    # A_2 = 1; A_1 = 0 + 0.95 * 1 = 0.95; A_0 = 0.95^2 = 0.9025.
    a = adv(client, group_of_eight[0], scheme="token_gae", critic="zero")
    assert a["schemes"][0]["advantages"][2:] == pytest.approx([0.9025, 0.95, 1.0])
    # gamma = 0.5: A_2 = 1; A_1 = 0.5 * 0.95 = 0.475; A_0 = 0.475^2 = 0.225625.
    a = adv(client, group_of_eight[0], scheme="token_gae", critic="zero", gamma=0.5)
    assert a["schemes"][0]["advantages"][2:] == pytest.approx([0.225625, 0.475, 1.0])


def test_no_values_with_a_critic_scheme_is_a_4xx_that_suggests_critic_zero(client, group_of_eight):
    r = client.get(
        f"/api/episodes/{group_of_eight[0]}/advantages", params={"scheme": "outcome,token_gae,turn_gae"}
    )
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["code"] == "no_values" and err["field"] == "critic" and "critic=zero" in err["message"]
    assert "`values`" in err["message"] and "token_gae, turn_gae" in err["message"]
    # critic-free schemes need no values
    assert (
        adv(client, group_of_eight[0], scheme="outcome,returns")["schemes"][1]["advantages"][2:] == [1.0] * 3
    )


@pytest.mark.parametrize(
    "params, field, code",
    [
        ({"scheme": "bogus"}, "scheme", "unknown_scheme"),
        ({"scheme": "oracle"}, "scheme", "unknown_scheme"),
        ({"gamma": 1.5}, "gamma", "bad_parameter"),
        ({"gamma": -0.1}, "gamma", "bad_parameter"),
        ({"lam": 2}, "lam", "bad_parameter"),
        ({"lam": "nan"}, "lam", "bad_parameter"),
        ({"baseline": "median"}, "baseline", "bad_parameter"),
        ({"critic": "learned"}, "critic", "bad_parameter"),
        ({"gamma": "abc"}, "gamma", "invalid_request"),
    ],
)
def test_invalid_parameters_get_4xx(client, group_of_eight, params, field, code):
    params = {"critic": "zero", **params}
    r = client.get(f"/api/episodes/{group_of_eight[0]}/advantages", params=params)
    assert r.status_code == 422
    err = r.json()["error"]
    assert (err["field"], err["code"]) == (field, code)


def test_schemes_repeated_and_comma_separated(client, group_of_eight):
    r = client.get(
        f"/api/episodes/{group_of_eight[0]}/advantages?scheme=outcome,returns&scheme=grpo&scheme=returns&critic=zero"
    )
    assert [s["name"] for s in r.json()["schemes"]] == ["outcome", "returns", "grpo"]


def test_values_td_turns_and_oracle_by_hand(client):
    # prompt, [turn 0: 2 policy], tool, [turn 1: 2 policy]; reward 1 at the end.
    ep = {
        "tokens": ["P", "a", "b", "T", "c", "d"],
        "kinds": ["prompt", "policy", "policy", "tool", "policy", "policy"],
        "reward": 1.0,
        "values": [9.0, 0.5, 0.6, 9.0, 0.8, 0.9],  # 9.0 at non-policy positions must be ignored
        "group": "g",
        "meta": {
            "turn_values": [0.5, 0.8],
            "calls": [{"turn": 0, "effect": "read"}, {"turn": 1, "effect": "submit"}],
        },
    }
    slug = upload(client, [ep]).json()["episodes"][0]["slug"]
    a = adv(client, slug, scheme="token_gae,turn_gae,oracle", lam=1.0)
    # TD errors (gamma 1), skipping the tool token: 0.6-0.5 = 0.1; 0.8-0.6 = 0.2; 0.9-0.8 = 0.1; 1-0.9 = 0.1.
    assert policy_values(a["td"], a["kinds"]) == pytest.approx([0.1, 0.2, 0.1, 0.1])
    assert a["td"][0] is None and a["td"][3] is None
    assert a["values"] == [None, 0.5, 0.6, None, 0.8, 0.9]
    # lam = 1: token GAE = return - V = 1 - V.
    gae = a["schemes"][0]["advantages"]
    assert policy_values(gae, a["kinds"]) == pytest.approx([0.5, 0.4, 0.2, 0.1])
    # Oracle: A_0 = 0 + 0.8 - 0.5 = 0.3 on turn 0; A_1 = 1 + 0 - 0.8 = 0.2 on turn 1.
    oracle = a["schemes"][2]["advantages"]
    assert oracle == pytest.approx([None, 0.3, 0.3, None, 0.2, 0.2])
    t0, t1 = a["turns"]
    # Word tokens with no spacing of their own ("a", "b") read joined with spaces.
    assert (t0["turn"], t0["start"], t0["end"], t0["text"], t0["effect"]) == (0, 1, 3, "a b", "read")
    assert (t1["turn"], t1["start"], t1["end"], t1["text"], t1["effect"]) == (1, 4, 6, "c d", "submit")
    assert (t0["reward"], t1["reward"], t0["value"], t1["value"]) == (0.0, 1.0, 0.5, 0.8)
    assert t0["means"]["token_gae"] == pytest.approx(0.45) and t1["means"]["token_gae"] == pytest.approx(0.15)
    assert t0["means"]["oracle"] == pytest.approx(0.3)


def test_oracle_truncated_bootstraps(client):
    ep = episode(reward=0.0, n_prompt=1, n_policy=2, turn_ids=[-1, 0, 1], truncated=True, bootstrap_value=0.4)
    ep["meta"] = {"turn_values": [0.5, 0.8]}
    slug = upload(client, [ep]).json()["episodes"][0]["slug"]
    a = adv(client, slug, scheme="oracle")
    # A_0 = 0 + 0.8 - 0.5 = 0.3; A_1 = 0 + 0.4 (bootstrap) - 0.8 = -0.4.
    assert a["schemes"][0]["advantages"] == pytest.approx([None, 0.3, -0.4])


@pytest.mark.verl
def test_token_gae_matches_verl(client):
    """Through the API, token_gae equals verl 0.9.1's compute_gae_advantage_return before its whitening
    (returns - values) and verl_gae equals its whitened advantages."""
    import torch
    from verl.trainer.ppo.core_algos import compute_gae_advantage_return

    R = 7
    values = [0.1, 0.3, -0.2, 0.5, 0.25, 0.7, 0.4]
    rewards = [0.0, -0.05, 0.0, 0.0, -0.05, 0.0, 0.0]
    ep = {
        "tokens": ["p0", "p1"] + [f"r{i}" for i in range(R)],
        "kinds": ["prompt"] * 2 + ["policy"] * R,
        "rewards": [0.0, 0.0] + rewards,
        "reward": 1.0,
        "values": [0.0, 0.0] + values,
    }
    slug = upload(client, [ep]).json()["episodes"][0]["slug"]
    a = adv(client, slug, scheme="token_gae,verl_gae", gamma=0.9, lam=0.8)
    tlr = torch.tensor([rewards], dtype=torch.float64)
    tlr[0, -1] += 1.0
    v = torch.tensor([values], dtype=torch.float64)
    whitened, returns = compute_gae_advantage_return(tlr, v, torch.ones(1, R), gamma=0.9, lam=0.8)
    assert a["schemes"][0]["advantages"][2:] == pytest.approx((returns - v)[0].tolist(), abs=1e-9)
    assert a["schemes"][1]["advantages"][2:] == pytest.approx(whitened[0].tolist(), abs=1e-6)


def test_registry_outcome_estimator_on_the_whole_batch(client):
    # opo reads response lengths, so it runs on the padded batch; a zero-variance group gives 0.
    body = upload(client, [episode(reward=1.0, group="a"), episode(reward=1.0, group="a", n_policy=5)]).json()
    a = adv(client, body["episodes"][1]["slug"], scheme="opo")
    assert policy_values(a["schemes"][0]["advantages"], a["kinds"]) == pytest.approx([0.0] * 5)


def test_schemes_listing(client):
    body = client.get("/api/schemes").json()
    names = [s["name"] for s in body["schemes"]]
    assert body["default"] == ["outcome", "token_gae", "turn_gae"]
    for n in ("outcome", "oracle", "returns", "td", "token_gae", "turn_gae", "rloo", "grpo", "verl_gae"):
        assert n in names


def test_every_registry_scheme_answers_200_or_a_clear_4xx(db_url):
    """No scheme may crash the API: an estimator that cannot run on an episode (e.g. the optimal
    token baseline without logprobs) is a 422 naming the scheme."""
    from estimators import available
    from tests.app.svc_helpers import FORMATS, make_client

    c = make_client(db_url)
    c.raise_server_exceptions = False
    with c:
        for name in ("native.jsonl", "verl_batch.pt"):
            r = c.post("/api/uploads", files={"file": (name, (FORMATS / name).read_bytes())})
            slug = r.json()["episodes"][0]["slug"]
            for scheme in available():
                r = c.get(f"/api/episodes/{slug}/advantages", params={"scheme": scheme})
                assert r.status_code in (200, 422), (name, scheme, r.text)
                if r.status_code == 422:
                    assert r.json()["error"]["field"] == "scheme" and scheme in r.json()["error"]["message"]
                else:
                    assert len(r.json()["schemes"][0]["advantages"]) == r.json()["n_tokens"]
