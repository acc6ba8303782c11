"""A trainer's own options, end to end: a dialect's parameters are the trainer's config keys, taken
from a link (``?scheme=trl:grpo&scale_rewards=none``) or from the run's configuration, which also
sets gamma and lambda. The real app on a real database; the numbers by hand."""

from __future__ import annotations

import pytest

from tests.app.svc_helpers import upload

# A group of four attempts at one task, one pass: rewards 1, 0, 0, 0 (mean 0.25, unbiased std 0.5).
REWARDS = (1.0, 0.0, 0.0, 0.0)


def _episodes() -> list[dict]:
    return [
        {"tokens": ["Q", "a", "b"], "kinds": ["prompt", "policy", "policy"], "reward": r, "group": "t"}
        for r in REWARDS
    ]


def _first_policy(client, slug: str, query: str) -> tuple[float, str]:
    r = client.get(f"/api/episodes/{slug}/advantages?{query}")
    assert r.status_code == 200, r.text
    row = r.json()["schemes"][0]
    return row["advantages"][1], row["label"]


def test_an_option_in_the_link_is_the_trainers_own(client):
    slug = upload(client, _episodes(), trainer="trl").json()["episodes"][0]["slug"]
    # TRL's default scale_rewards="group": (1 - 0.25) / (0.5 + 1e-4), in float32.
    a, label = _first_policy(client, slug, "scheme=trl:grpo")
    assert a == pytest.approx(0.75 / 0.5001, rel=1e-6) and "scale_rewards" not in label
    # scale_rewards="none": the reward minus the group mean, and the row says so.
    a, label = _first_policy(client, slug, "scheme=trl:grpo&scale_rewards=none")
    assert a == pytest.approx(0.75) and label.endswith("(scale_rewards=none)")
    # verl's GRPO without the std: the same 0.75; a key no scheme shown takes changes nothing.
    a, _ = _first_policy(client, slug, "scheme=verl:grpo&norm_adv_by_std_in_grpo=false&scale_rewards=none")
    assert a == pytest.approx(0.75)


@pytest.mark.parametrize(
    ("query", "field", "says"),
    [
        ("scheme=verl:grpo&norm_adv_by_std_in_grpo=maybe", "norm_adv_by_std_in_grpo", "true or false"),
        ("scheme=openrlhf:group_norm&clip_range=5", "clip_range", "2 numbers"),
        ("scheme=areal:grpo&eps=tiny", "eps", "a number"),
    ],
)
def test_an_option_it_cannot_take_is_a_422_saying_what_it_takes(client, query, field, says):
    slug = upload(client, _episodes()).json()["episodes"][0]["slug"]
    r = client.get(f"/api/episodes/{slug}/advantages?{query}")
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["code"] == "bad_parameter" and err["field"] == field and says in err["message"]


def test_a_runs_config_sets_the_options_gamma_and_lambda(client):
    run = client.post(
        "/api/runs",
        json={
            "name": "trl-none",
            "trainer": "trl",
            "config": {"scale_rewards": "none", "gamma": 0.9, "lam": 0.8},
        },
    ).json()
    step = client.post(f"/api/runs/{run['ref']}/steps/0", json={"episodes": _episodes()}).json()
    slug = step["episodes"][0]["slug"]
    view = client.get(f"/e/{slug}?format=json").json()["view"]
    assert view["schemes"] == ["trl:grpo", "grpo"]
    assert view["options"] == {"scale_rewards": "none"} and (view["gamma"], view["lam"]) == (0.9, 0.8)
    # The API applies the config too, and a link's own value wins over it.
    a, label = _first_policy(client, slug, "scheme=trl:grpo")
    assert a == pytest.approx(0.75) and "scale_rewards=none" in label
    a, _ = _first_policy(client, slug, "scheme=trl:grpo&scale_rewards=group")
    assert a == pytest.approx(0.75 / 0.5001, rel=1e-6)
    body = client.get(f"/api/episodes/{slug}/advantages?scheme=trl:grpo").json()
    assert body["params"]["gamma"] == 0.9 and body["params"]["lam"] == 0.8
    assert body["params"]["options"] == {"trl:grpo": {"scale_rewards": "none"}}


def test_a_bool_in_a_config_file_means_what_the_trainer_reads_it_as():
    # TRL's GRPOConfig takes scale_rewards=True as "group" and False as "none".
    import torch

    from app.core.schemes import parse_option
    from estimators import EstimatorInput, compute

    v = parse_option("trl:grpo", "scale_rewards", False)
    inp = EstimatorInput(
        rewards=torch.tensor([[1.0], [0.0], [0.0], [0.0]]),
        mask=torch.ones(4, 1, dtype=torch.bool),
        groups=torch.zeros(4, dtype=torch.long),
    )
    assert compute("trl:grpo", inp, scale_rewards=v).advantages[0, 0].item() == pytest.approx(0.75)
    assert compute("trl:grpo", inp, scale_rewards="false").advantages[0, 0].item() == pytest.approx(0.75)
    assert parse_option("openrlhf:gae", "clip_range", "(-5, 5)") == (-5.0, 5.0)
    assert parse_option("nemo_rl:gae", "gae_lambda_value", "none") is None
    assert parse_option("nemo_rl:gae", "gae_lambda_value", "0.9") == 0.9


def test_the_batch_page_says_what_the_trainer_trained_with(client):
    run = client.post(
        "/api/runs",
        json={"name": "v", "trainer": "verl", "config": {"algorithm": {"adv_estimator": "grpo", "lam": 1.0}}},
    ).json()
    step = client.post(f"/api/runs/{run['ref']}/steps/0", json={"episodes": _episodes()}).json()
    page = client.get(f"/b/{step['batch_id']}").text
    assert 'id="b-trainer"' in page and "verl 0.9.1" in page
    assert "<code>verl:grpo</code>" in page and "λ = 1" in page and "loss <code>vanilla</code>" in page
    assert "from its configuration" in page
    plain = client.get(f"/b/{upload(client, _episodes()).json()['batch_id']}").text
    assert 'id="b-trainer"' not in plain


def test_the_audit_names_the_option_the_trainers_config_set(client):
    """TRL with scale_rewards="none" trained on r - mean: the audit of a step of that run names
    TRL's GRPO with that option (its default, the group std, does not match these numbers)."""
    eps = [dict(e, advantages=[0.0, r - 0.25, r - 0.25]) for e, r in zip(_episodes(), REWARDS, strict=True)]
    run = client.post(
        "/api/runs", json={"name": "trl-audit", "trainer": "trl", "config": {"scale_rewards": "none"}}
    ).json()
    step = client.post(f"/api/runs/{run['ref']}/steps/0", json={"episodes": eps}).json()
    bm = client.get(f"/api/batches/{step['batch_id']}/audit").json()["best_match"]
    assert bm["scheme"] == "trl:grpo", bm
    assert bm["params"] == {"trainer": "trl", "version": "1.16.0", "options": {"scale_rewards": "none"}}
    # The same advantages uploaded without the config: TRL's default cannot explain them.
    plain = upload(client, eps, trainer="trl").json()
    bm = client.get(f"/api/batches/{plain['batch_id']}/audit").json()["best_match"]
    assert bm["scheme"] != "trl:grpo" and "options" not in bm.get("params", {})


def test_the_run_page_says_what_the_trainer_trained_with(client):
    run = client.post("/api/runs", json={"name": "o", "trainer": "openrlhf"}).json()
    page = client.get(f"/r/{run['ref']}").text
    assert (
        "OpenRLHF 0.11.2" in page
        and "<code>openrlhf:gae</code>" in page
        and "loss <code>openrlhf:ppo</code>" in page
    )
    assert "its defaults: no configuration was sent" in page
    assert (
        'id="b-trainer"'
        not in client.get(f"/r/{client.post('/api/runs', json={'name': 'x'}).json()['ref']}").text
    )
