"""The service decides from ``reads`` alone: what a scheme needs, what it loads, what the 422 says,
and which rows an episode's default view shows (no scheme name in the decision).

Test estimators are registered for real (``estimators.register``) with the reads under test and
removed afterwards; each records the shape of the input it was called with.
"""

from __future__ import annotations

import io

import pytest
import torch
from PIL import Image

from estimators import EstimatorInput, EstimatorOutput, register
from estimators.registry import unregister
from tests.app.svc_helpers import episode, make_client, upload

SEEN: dict[str, tuple[int, int]] = {}


def _plus_one(name: str, field: str | None = None):
    """An estimator that records its input's [B, T] and gives 1 (+ ``field``) on policy tokens."""

    def fn(inp: EstimatorInput) -> EstimatorOutput:
        SEEN[name] = tuple(inp.rewards.shape)
        m = inp.mask != 0
        extra = 0 if field is None else getattr(inp, field)
        return EstimatorOutput(advantages=torch.where(m, 1 + extra, 0).to(torch.float64))

    return fn


TEST_ESTIMATORS = {
    # name: (kind, reads, the field it adds)
    "test_reads_values": ("token", ("values",), "values"),
    "test_reads_logprobs": ("token", ("rewards", "logprobs"), "logprobs"),
    "test_outcome_of_scores": ("outcome", ("scores", "groups"), None),
    "test_outcome_of_tokens": ("outcome", ("rewards", "groups"), None),
    "test_token_of_group": ("token", ("rewards", "groups"), None),
    "test_token_of_row": ("token", ("rewards",), None),
}


@pytest.fixture(autouse=True)
def test_estimators():
    for name, (kind, reads, field) in TEST_ESTIMATORS.items():
        register(name, label=name, description="a test estimator", kind=kind, reads=reads)(
            _plus_one(name, field)
        )
    SEEN.clear()
    yield
    for name in TEST_ESTIMATORS:
        unregister(name)


def _adv(client, slug, **params):
    return client.get(f"/api/episodes/{slug}/advantages", params=params)


def _grpo_batch(client, **extra):
    """A GRPO user's upload: no critic values; group a has 3 episodes (3, 5 and 2 policy tokens
    after 2 prompt tokens), group b one."""
    eps = [
        episode(reward=1.0, group="a", n_policy=3, **extra),
        episode(reward=0.0, group="a", n_policy=5, **extra),
        episode(reward=0.5, group="a", n_policy=2, **extra),
        episode(reward=1.0, group="b", n_policy=4, **extra),
    ]
    return [e["slug"] for e in upload(client, eps).json()["episodes"]]


def test_a_scheme_reading_values_is_refused_without_them_naming_values(client):
    slug = _grpo_batch(client)[0]
    r = _adv(client, slug, scheme="test_reads_values")
    assert r.status_code == 422
    err = r.json()["error"]
    assert (err["code"], err["field"]) == ("no_values", "critic")
    assert "`values`" in err["message"] and "test_reads_values" in err["message"]
    assert "test_reads_values" not in SEEN  # refused before the call
    # critic=zero supplies V = 0: the estimator runs (1 + 0 on each policy token).
    a = _adv(client, slug, scheme="test_reads_values", critic="zero").json()
    assert a["schemes"][0]["advantages"] == [None, None, 1.0, 1.0, 1.0]


def test_a_scheme_reading_logprobs_is_refused_without_them_naming_logprobs(client):
    slug = _grpo_batch(client)[0]
    r = _adv(client, slug, scheme="test_reads_logprobs")
    assert r.status_code == 422
    err = r.json()["error"]
    assert (err["code"], err["field"]) == ("scheme_not_applicable", "scheme")
    assert "`logprobs`" in err["message"] and "test_reads_logprobs" in err["message"]
    # With logprobs uploaded the row is there (1 + logprob on policy tokens).
    body = upload(client, [episode(logprobs=[0.0, 0.0, -0.5, -0.25, -1.0])]).json()
    slug = body["episodes"][0]["slug"]
    a = _adv(client, slug, scheme="test_reads_logprobs").json()
    assert a["schemes"][0]["advantages"] == [None, None, 0.5, 0.75, 0.0]


def test_where_a_scheme_runs_follows_its_reads(client):
    slugs = _grpo_batch(client)
    r = _adv(
        client,
        slugs[0],
        scheme="test_outcome_of_scores,test_outcome_of_tokens,test_token_of_group,test_token_of_row",
    )
    assert r.status_code == 200, r.text
    assert SEEN == {
        "test_outcome_of_scores": (4, 1),  # [B, 1] rows of scores: the batch's summaries only
        "test_outcome_of_tokens": (4, 7),  # the padded batch (T_max = 2 + 5)
        "test_token_of_group": (3, 7),  # the episode's group a, padded
        "test_token_of_row": (1, 5),  # the episode's own row
    }


def test_the_default_view_of_an_episode_without_values_is_critic_free(client):
    slug = _grpo_batch(client)[0]
    r = _adv(client, slug)
    assert r.status_code == 200, r.text
    body = r.json()
    assert [s["name"] for s in body["schemes"]] == body["params"]["schemes"] == ["outcome", "returns"]
    assert body["params"]["critic"] == "upload" and body["values"] is None
    # returns-to-go, gamma 1: the reward 1 on the last policy token reaches every policy token.
    assert body["schemes"][1]["advantages"] == [None, None, 1.0, 1.0, 1.0]
    # An episode with critic values keeps the usual three rows.
    with_values = upload(client, [episode(values=[0.0, 0.0, 0.1, 0.2, 0.3])]).json()["episodes"][0]["slug"]
    assert _adv(client, with_values).json()["params"]["schemes"] == ["outcome", "token_gae", "turn_gae"]


def test_the_episode_page_builds_the_critic_free_view_for_its_first_request(client):
    slug = _grpo_batch(client)[0]
    twin = client.get(f"/e/{slug}", params={"format": "json"})
    assert twin.status_code == 200, twin.text
    body = twin.json()
    assert body["view"]["schemes"] == ["outcome", "returns"] and body["view"]["critic"] == "upload"
    assert "scheme=outcome,returns&" in body["api"]
    assert [s["name"] for s in body["data"]["schemes"]] == ["outcome", "returns"]
    html = client.get(f"/e/{slug}").text
    assert "scheme=outcome,returns&amp;" in html or "scheme=outcome,returns&" in html
    # A link asking for critic rows without saying which critic: shown with V = 0, no 422.
    twin = client.get(f"/e/{slug}", params={"scheme": "outcome,token_gae", "format": "json"}).json()
    assert twin["view"]["critic"] == "zero" and [s["name"] for s in twin["data"]["schemes"]] == [
        "outcome",
        "token_gae",
    ]
    # ... but an explicit critic=upload is honoured (the API's 422 passes through).
    r = client.get(f"/e/{slug}", params={"scheme": "token_gae", "critic": "upload", "format": "json"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "no_values"


def test_the_preview_of_an_episode_without_values_renders(client):
    slug = _grpo_batch(client)[0]
    r = client.get(f"/e/{slug}/preview.png")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "image/png"
    img = Image.open(io.BytesIO(r.content))
    assert img.size == (1200, 630)


def test_the_preview_says_does_not_exist_only_for_a_missing_episode(tmp_path):
    # A work budget of 10 numbers: the default view of a 5-token episode needs 5 x (2 + 4) = 30.
    with make_client(tmp_path, max_compute_cells=10) as c:
        slug = upload(c, [episode()]).json()["episodes"][0]["slug"]
        r = c.get(f"/e/{slug}/preview.png")
        assert r.status_code == 413
        err = r.json()["error"]
        assert "does not exist" not in err["message"] and err["code"] == "work_budget"
        assert f"no preview of episode {slug!r}" in err["message"]
        r = c.get("/e/no-such-episode/preview.png")
        assert r.status_code == 404 and "does not exist" in r.json()["error"]["message"]
