"""The loss views take any registered loss (`loss=<trainer>:<loss>`) with its own parameters by
name, through the real app on a real SQLite file with a real upload: GET
/api/batches/{id}/loss and the episode's `loss_weights` row against the trainers' own loss code
by autograd on the uploaded batch (OpenRLHF's PolicyLoss, SkyRL's ppo_utils with prompt_mean
over the upload's groups), GET /api/losses, and the 422s that list what is known."""

from __future__ import annotations

import pytest
import torch

import estimators as E
from tests.app.svc_helpers import upload
from tests.estimators.loss_refs import autograd_weights, openrlhf_loss, skyrl_ppo_utils

F64 = torch.float64
# Three episodes in two groups: prompt, calls with tool spans between them; logprobs and
# rollout_logprobs that make PPO clip and the rollout correction bite.
EPISODES = [
    {
        "kinds": ["prompt", "policy", "policy", "tool", "tool", "policy", "policy", "policy"],
        "advantages": [0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0],
        "logprobs": [0.0, -0.5, -1.0, 0.0, 0.0, -0.2, -0.7, -1.5],
        "rollout_logprobs": [0.0, -1.0, -1.0, 0.0, 0.0, -0.1, -0.3, -1.5],
        "group": "g1",
    },
    {
        "kinds": ["prompt", "policy", "policy", "tool", "policy"],
        "advantages": [0.0, -1.0, -1.0, 0.0, -1.0],
        "logprobs": [0.0, -0.4, -0.9, 0.0, -0.6],
        "rollout_logprobs": [0.0, -0.1, -1.8, 0.0, -0.6],
        "group": "g1",
    },
    {
        "kinds": ["prompt", "prompt", "policy", "policy", "policy"],
        "advantages": [0.0, 0.0, 0.5, -0.25, 0.75],
        "logprobs": [0.0, 0.0, -0.3, -0.2, -2.0],
        "rollout_logprobs": [0.0, 0.0, -0.35, -0.9, -1.2],
        "group": "g2",
    },
]


@pytest.fixture
def batch(client):
    eps = [{**e, "tokens": [f"t{i}" for i in range(len(e["kinds"]))], "reward": 1.0} for e in EPISODES]
    r = upload(client, eps)
    assert r.status_code == 201, r.text
    return r.json()


def padded() -> tuple[torch.Tensor, ...]:
    """(advantages, logprobs, rollout_logprobs, policy mask) of the upload, right-padded."""
    T = max(len(e["kinds"]) for e in EPISODES)

    def pad(key: str) -> torch.Tensor:
        return torch.tensor([e[key] + [0.0] * (T - len(e[key])) for e in EPISODES], dtype=F64)

    mask = torch.tensor(
        [[k == "policy" for k in e["kinds"]] + [False] * (T - len(e["kinds"])) for e in EPISODES]
    )
    return pad("advantages"), pad("logprobs"), pad("rollout_logprobs"), mask.to(F64)


def batch_sums(client, batch_id, **params) -> list[float]:
    r = client.get(f"/api/batches/{batch_id}/loss", params=params)
    assert r.status_code == 200, r.text
    return [e["weight_sum"] for e in r.json()["episodes"]]


def row(client, slug, **params) -> list[float | None]:
    r = client.get(f"/api/episodes/{slug}/advantages", params={"scheme": "uploaded,loss_weights", **params})
    assert r.status_code == 200, r.text
    return next(s for s in r.json()["schemes"] if s["name"] == "loss_weights")["advantages"]


def test_openrlhf_ppo_with_its_correction_equals_openrlhf(client, batch):
    """bypass: old_log_prob = rollout_logprobs (the ratio clips); then the token IcePop correction
    with old = logprobs, against OpenRLHF's own PolicyLoss on the padded upload."""
    adv, lp, roll, mask = padded()
    cases = [
        ({"bypass": "true", "loss_agg_mode": "seq-mean-token-mean"}, roll, "off", "token-mean"),
        ({"is_correction_level": "token", "is_correction_threshold": "0.6_1.5"}, lp, "token", "token-mean"),
    ]
    for params, old, level, _ in cases:
        agg = params.get("loss_agg_mode", "token-mean")
        fn = openrlhf_loss().PolicyLoss(
            token_level_loss=agg == "token-mean",
            is_correction_level=level,
            is_correction_threshold=[0.6, 1.5],
        )
        theirs = autograd_weights(
            lambda x, fn=fn, old=old: fn(x, old, adv, action_mask=mask, rollout_log_probs=roll)[0], lp
        )
        got = batch_sums(client, batch["batch_id"], loss="openrlhf:ppo", **params)
        assert got == pytest.approx(theirs.sum(-1).tolist(), abs=1e-12)
        assert theirs.abs().max() > 0
    # One episode's row is the batch's row for it, token by token.
    w = row(client, batch["episodes"][1]["slug"], loss="openrlhf:ppo", is_correction_level="token",
            is_correction_threshold="0.6_1.5")  # fmt: skip
    fn = openrlhf_loss().PolicyLoss(is_correction_level="token", is_correction_threshold=[0.6, 1.5])
    theirs = autograd_weights(lambda x: fn(x, lp, adv, action_mask=mask, rollout_log_probs=roll)[0], lp)
    for i, v in enumerate(w):
        if v is not None:
            assert v == pytest.approx(theirs[1, i].item(), abs=1e-12)


def test_skyrl_prompt_mean_over_the_upload_groups_equals_skyrl(client, batch):
    """prompt_mean: 1 / (P N_p) with the upload's groups (g1: episodes 0 and 1, g2: episode 2),
    the advantages reduced by SkyRL's own function, its regular loss by autograd; bypass."""
    adv, lp, roll, mask = padded()
    pu = skyrl_ppo_utils()
    from types import SimpleNamespace

    reduced = pu.apply_loss_reduction_to_advantages_minibatch(
        adv, mask, "prompt_mean", 1, adv.shape[1], [(0, 2), (2, 3)]
    )
    cfg = SimpleNamespace(
        policy_loss_type="regular", eps_clip_low=0.2, eps_clip_high=0.2, loss_reduction="prompt_mean",
        off_policy_correction=SimpleNamespace(
            tis_ratio_type=None, sequence_mask_metric=None, outlier_token_is_threshold_low=None,
            outlier_token_is_threshold_high=None, token_mask_is_threshold_low=None,
            token_mask_is_threshold_high=None,
        ),
    )  # fmt: skip
    theirs = autograd_weights(lambda x: pu.ppo_policy_loss(x, roll, reduced, cfg, loss_mask=mask)[0], lp)
    got = batch_sums(
        client, batch["batch_id"], loss="skyrl:regular", loss_reduction="prompt_mean", bypass="true"
    )
    # float32 ratio in SkyRL (safe_exp_delta): 1e-6 relative
    assert got == pytest.approx(theirs.sum(-1).tolist(), rel=1e-6, abs=1e-9)


def test_trl_and_verl_aliases(client, batch):
    """trl:grpo at the sequence level on the whole upload, and verl:vanilla = vanilla."""
    adv, lp, roll, mask = padded()
    ours = E.loss_weights(adv, lp, roll, mask, loss="trl:grpo", importance_sampling_level="sequence")
    got = batch_sums(
        client, batch["batch_id"], loss="trl:grpo", importance_sampling_level="sequence", bypass="true"
    )
    assert got == pytest.approx(ours.sum(-1).tolist(), abs=1e-12)
    assert got[0] != pytest.approx(0.0)
    a = batch_sums(client, batch["batch_id"], loss="verl:vanilla", agg="seq-mean-token-sum", bypass="true")
    assert a == batch_sums(client, batch["batch_id"], loss="vanilla", agg="seq-mean-token-sum", bypass="true")
    r = client.get(f"/api/batches/{batch['batch_id']}/loss", params={"loss": "trl:dapo"}).json()
    assert (r["loss"], r["importance_sampling_level"], r["trainer"], r["version"]) == (
        "trl:dapo",
        "token",
        "trl",
        "1.16.0",
    )


@pytest.mark.parametrize(
    "params,field,says",
    [
        ({"loss": "ppo"}, "loss", "trl:dapo"),  # unknown: the known names are listed
        ({"loss": "trl:dapo", "agg": "token-mean"}, "agg", "importance_sampling_level"),  # not its parameter
        ({"loss": "skyrl:regular", "loss_reduction": "mean"}, "loss_reduction", "prompt_mean"),
        ({"loss": "openrlhf:ppo", "is_correction_threshold": "5_1"}, "is_correction_threshold", "lo <= hi"),
        ({"loss": "skyrl:rollout_is"}, "loss", "rollout_logprobs"),  # the upload below has none
    ],
)
def test_bad_parameters_are_422_saying_what_is_known(client, params, field, says):
    ep = {"tokens": ["a", "b"], "kinds": ["policy", "policy"], "reward": 1.0, "advantages": [1.0, -1.0]}
    body = upload(client, [ep]).json()
    for url in (
        f"/api/batches/{body['batch_id']}/loss",
        f"/api/episodes/{body['episodes'][0]['slug']}/advantages",
    ):
        r = client.get(url, params={"scheme": "uploaded,loss_weights", **params})
        assert r.status_code == 422, r.text
        err = r.json()["error"]
        assert err["field"] == field and says in err["message"]


def test_list_of_losses(client):
    body = client.get("/api/losses").json()
    assert body["default"] == "vanilla"
    assert [t["key"] for t in body["trainers"]] == ["verl", "trl", "openrlhf", "skyrl"]
    dapo = body["losses"]["trl:dapo"]
    assert (dapo["trainer"], dapo["version"]) == ("trl", "1.16.0")
    assert {p["name"]: p["default"] for p in dapo["params"]} == {
        "importance_sampling_level": "token", "epsilon": "0.2", "epsilon_high": "none", "delta": "none",
    }  # fmt: skip
    assert body["losses"]["verl:gspo"]["alias_of"] == "gspo"
    assert "loss_reduction" in body["param_names"] and "agg" in body["param_names"]


def test_episode_page_view_reads_every_loss_and_its_own_controls():
    """The episode page's view: a `verl:` alias shows the loss under its plain name; another
    trainer's loss drops verl's controls (agg, rollout_is, rollout_is_threshold) and carries its
    own (a malformed value reads as the default); the query the page asks the API for is the same."""
    from app.core.views import EpisodeView

    view = EpisodeView.from_query(
        {"scheme": "uploaded,loss_weights", "loss": "verl:gspo", "agg": "token-sum"}
    )
    assert (view.loss, view.agg, view.loss_params) == ("gspo", "token-sum", {})
    view = EpisodeView.from_query(
        {
            "scheme": "uploaded,loss_weights",
            "loss": "trl:dapo",
            "agg": "token-sum",
            "importance_sampling_level": "x",
        }
    )
    assert (view.loss, view.agg, view.rollout_is, view.rollout_is_threshold) == ("trl:dapo", None, None, None)
    assert view.loss_params == {"importance_sampling_level": "token"}
    assert view.api_query().endswith("&loss=trl:dapo&importance_sampling_level=token")
    view = EpisodeView.from_query(
        {"scheme": "loss_weights", "loss": "skyrl:regular", "loss_reduction": "sequence_mean", "bypass": "1"}
    )
    assert (
        "loss=skyrl:regular&loss_reduction=sequence_mean&tis_ratio_type=none&sequence_mask_metric=none&bypass=1"
        in (view.query())
    )


def test_episode_row_through_the_page_query(client, batch):
    """The page's own query for a trainer's loss is one the API answers: its row equals the batch
    view's weights for that episode."""
    from app.core.views import EpisodeView

    slug = batch["episodes"][0]["slug"]
    view = EpisodeView.from_query(
        {
            "scheme": "uploaded,loss_weights",
            "loss": "trl:luspo",
            "importance_sampling_level": "sequence",
            "bypass": "1",
        }
    )
    r = client.get(f"/api/episodes/{slug}/advantages?{view.api_query()}")
    assert r.status_code == 200, r.text
    w = next(s for s in r.json()["schemes"] if s["name"] == "loss_weights")["advantages"]
    got = sum(v for v in w if v is not None)
    sums = batch_sums(
        client, batch["batch_id"], loss="trl:luspo", importance_sampling_level="sequence", bypass="true"
    )
    assert got == pytest.approx(sums[0], abs=1e-12) and got != 0
