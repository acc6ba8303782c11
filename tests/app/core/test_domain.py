"""app/core/domain.py: each definition on hand-computed numbers, and the service using the same ones."""

from __future__ import annotations

import numpy as np
import pytest

from app.core import domain
from app.core.arrays import arrays_from_native
from app.core.schemas import EpisodeIn
from app.sim.diagnostics import sim_diagnostics
from tests.app.svc_helpers import episode, row_counts, upload

P, A, T = domain.PROMPT, domain.POLICY, domain.TOOL


def test_score_and_pass():
    kinds = np.array([P, A, A, T, A], dtype=np.uint8)
    # Per-token -0.1 on the three policy tokens, outcome 1.0 on the last one (index 4).
    eff = domain.effective_rewards(kinds, np.array([5.0, -0.1, -0.1, 7.0, -0.1]), 1.0)
    assert eff.tolist() == pytest.approx([5.0, -0.1, -0.1, 7.0, 0.9])
    assert domain.score(kinds, eff) == pytest.approx(0.7)  # prompt and tool rewards do not count
    assert domain.passed(1.0, -3.0) and not domain.passed(0.0, 5.0)  # the outcome decides
    assert domain.passed(None, 0.3) and not domain.passed(None, 0.0)  # else the score, > 0
    assert domain.passed(0.4, 0.4)  # > 0, not > 0.5


def test_an_ungrouped_episode_never_joins_a_group_named_like_its_index():
    labels = ["#3", None, "a", "#3", None, "a"]
    g = domain.groups(labels)
    assert [(domain.group_label(k), m) for k, m in g.items()] == [
        ("#3", [0, 3]),
        (None, [1]),
        ("a", [2, 5]),
        (None, [4]),
    ]
    assert domain.group_ids(labels).tolist() == [0, 1, 2, 0, 3, 2]
    # Episode 3 is ungrouped in this batch; the group "#3" still has only its two members.
    assert domain.groups(["#3", "x", "#3", None])[("#3")] == [0, 2]


def test_zero_variance():
    assert domain.zero_variance(np.array([1.0, 1.0, 1.0]))
    assert domain.zero_variance(np.array([0.3, 0.3 + 1e-13]))
    assert not domain.zero_variance(np.array([0.3, 0.3 + 1e-9]))
    assert not domain.zero_variance(np.array([1.0]))  # a group of one


def test_turn_spans_and_default_turn_ids():
    policy = np.array([0, 1, 1, 0, 0, 1, 0, 1, 1, 1], dtype=bool)
    assert domain.turn_spans(policy) == [(1, 3), (5, 6), (7, 10)]
    assert domain.default_turn_ids(policy).tolist() == [-1, 0, 0, -1, -1, 1, -1, 2, 2, 2]
    assert domain.turn_spans(domain.policy_mask(["prompt", "policy", "tool"])) == [(1, 2)]


def test_oracle_turn_advantages():
    policy = np.array([0, 1, 1, 0, 1], dtype=bool)
    tids = domain.default_turn_ids(policy)
    eff = np.array([0.0, 0.0, -0.1, 0.0, 1.0])
    # r = [-0.1, 1.0]; V = [0.5, 0.8]: A_0 = -0.1 + 0.8 - 0.5 = 0.2, A_1 = 1.0 + 0 - 0.8 = 0.2.
    a = domain.oracle_turn_advantages(tids, policy, eff, [0.5, 0.8])
    assert a.tolist() == pytest.approx([0.2, 0.2])
    # Truncated with bootstrap 0.3 and gamma 0.5: A_0 = -0.1 + 0.4 - 0.5, A_1 = 1 + 0.15 - 0.8.
    a = domain.oracle_turn_advantages(
        tids, policy, eff, [0.5, 0.8], truncated=True, bootstrap_value=0.3, gamma=0.5
    )
    assert a.tolist() == pytest.approx([-0.2, 0.35])
    assert domain.oracle_turn_advantages(tids, policy, eff, [0.5]) is None  # one value per turn


def test_useless_credit_share():
    policy = np.array([0, 1, 1, 0, 1, 1, 1, 0, 1], dtype=bool)
    tokens = domain.call_tokens(domain.default_turn_ids(policy), policy, 3)
    assert tokens.tolist() == [2, 3, 1]
    assert domain.call_tokens(domain.default_turn_ids(policy), policy, 2) is None  # calls mismatch
    credit = domain.positive_credit(True, 0.5, tokens)
    assert credit.tolist() == [1.0, 1.5, 0.5]
    assert domain.positive_credit(False, 0.5, tokens).tolist() == [0, 0, 0]
    assert domain.positive_credit(True, -0.5, tokens).tolist() == [0, 0, 0]
    by = {"read": 1.0, "decisive_edit": 1.5, "submit": 0.5}
    assert domain.useless_credit_share(by) == pytest.approx(1.0 / 3.0)
    assert domain.useless_credit_share({"read": 0.0}) is None


def _annotated(reward: float, group: str | None, effects: list[str]) -> dict:
    tokens, kinds, calls = ["task"], ["prompt"], []
    for k, effect in enumerate(effects):
        tokens += [f"c{k}"] * (k + 1) + ["obs"]
        kinds += ["policy"] * (k + 1) + ["tool"]
        calls.append({"turn": k, "effect": effect})
    return {"tokens": tokens, "kinds": kinds, "reward": reward, "group": group, "meta": {"calls": calls}}


def test_the_batch_page_and_the_sampler_report_the_same_useless_credit_share(client):
    """One definition: a reward of 0.3 is a pass for both (> 0), and an episode whose meta.calls
    do not match its turns is left out by both."""
    eps = [
        _annotated(0.3, "#1", ["read", "decisive_edit", "submit"]),  # 1, 2, 3 policy tokens
        _annotated(0.0, "#1", ["read", "submit"]),
        _annotated(1.0, None, ["read", "submit"]),  # a group of one: RLOO gives it its score, 1
        dict(_annotated(1.0, "#1", ["read"]), meta={"calls": [{"effect": "read"}] * 2}),  # mismatch
    ]
    # Group "#1" scores [0.3, 0.0, 1.0]: RLOO of the first = 0.3 - 0.5 < 0 (no credit); the fourth
    # (1.0 - 0.15 = 0.85) is left out. The third: credit 1 x (1, 2) tokens: useless 1 / 3.
    want = 1 / 3
    assert sim_diagnostics([EpisodeIn(**e) for e in eps])["useless_credit_share"] == pytest.approx(want)
    bid = upload(client, eps).json()["batch_id"]
    assert client.get(f"/api/batches/{bid}").json()["diagnostics"]["useless_credit_share"] == pytest.approx(
        want
    )
    # Without the fourth, "#1" = [0.3, 0.0]: RLOO +0.3 on the first (a pass: 0.3 > 0), credit
    # 0.3 x (1, 2, 3) = 1.8 of which 0.3 useless; with the third's 1 of 3: 1.3 / 4.8.
    eps = eps[:3]
    want = 1.3 / 4.8
    assert sim_diagnostics([EpisodeIn(**e) for e in eps])["useless_credit_share"] == pytest.approx(want)
    bid = upload(client, eps).json()["batch_id"]
    d = client.get(f"/api/batches/{bid}").json()["diagnostics"]
    assert d["useless_credit_share"] == pytest.approx(want)
    # The ungrouped episode is its own group, not a member of "#1" (or of a group "#2").
    groups = {g["group"]: g["n"] for g in d["groups"]}
    assert groups == {"#1": 2, None: 1}


def test_a_group_named_like_an_index_is_not_merged_with_ungrouped_episodes(client):
    # Episode index 3 (0-based) is ungrouped; a real group is labelled "#3". Scores 1, 1 in "#3"
    # make it zero-variance; the ungrouped 0-scored episode must not join it.
    eps = [episode(reward=1.0, group="#3"), episode(reward=1.0, group="#3"), episode(reward=0.0, group=None)]
    eps.insert(3, episode(reward=0.0, group=None))
    bid = upload(client, eps).json()["batch_id"]
    d = client.get(f"/api/batches/{bid}").json()["diagnostics"]
    assert d["zero_variance_groups"] == ["#3"] and d["zero_variance_share"] == pytest.approx(2 / 4)
    sim = sim_diagnostics([EpisodeIn(**e) for e in eps])
    assert sim["zero_variance_groups"] == [{"group": "#3", "n": 2, "all": "pass"}]
    assert sim["n_groups"] == 3


# ---- the trainer's own advantages ----------------------------------------------------------------


def test_uploaded_advantages_are_stored_round_tripped_and_offered(client):
    adv = [9.0, 9.0, 0.5, -0.25, 1.0]  # on every token; the scheme shows them all (9.0: a bug to see)
    body = upload(client, [episode(advantages=adv)]).json()
    slug = body["episodes"][0]["slug"]
    assert client.get(f"/api/episodes/{slug}").json()["advantages"] == adv
    r = client.get(f"/api/episodes/{slug}/advantages", params={"scheme": "uploaded"}).json()
    assert r["schemes"][0]["advantages"] == adv
    assert r["has_advantages"] is True


def test_meta_uploaded_advantages_is_read_the_same_way(client):
    adv = [0.0, 0.0, 0.1, 0.2, 0.3]
    slug = upload(client, [episode(meta={"uploaded_advantages": adv})]).json()["episodes"][0]["slug"]
    got = client.get(f"/api/episodes/{slug}").json()
    assert got["meta"]["uploaded_advantages"] == adv and got["advantages"] is None  # as uploaded
    r = client.get(f"/api/episodes/{slug}/advantages", params={"scheme": "uploaded"}).json()
    assert r["schemes"][0]["advantages"] == adv
    assert (
        arrays_from_native(EpisodeIn(**episode(meta={"uploaded_advantages": adv}))).advantages.tolist() == adv
    )


@pytest.mark.parametrize(
    "bad, code",
    [([0.0] * 4, "length_mismatch"), ([0.0, 0.0, 1e400, 0.0, 0.0], "not_finite")],
)
def test_bad_advantages_name_line_episode_and_field(client, bad, code):
    r = upload(client, [episode(), episode(advantages=bad)])
    err = r.json()["error"]
    assert (r.status_code, err["code"], err["line"], err["episode"], err["field"]) == (
        422,
        code,
        2,
        2,
        "advantages",
    )
    assert err["message"].startswith("line 2, episode 2: field `advantages`")
    assert row_counts(client) == (0, 0)


def test_html_pages_answer_404_with_the_html_page(client):
    r = client.get("/lab/no-such-figure", headers={"accept": "text/html"})
    assert r.status_code == 404 and r.headers["content-type"].startswith("text/html")
    assert "Not found" in r.text
    r = client.get("/lab/no-such-figure", headers={"accept": "application/json"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    # Unknown paths are not pages: the one JSON error shape.
    r = client.get("/no/such/path", headers={"accept": "text/html"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    err = client.get("/talk/999", params={"format": "json"}).json()["error"]
    assert (err["code"], err["field"], err["line"]) == ("not_found", "step", None)
    assert err["message"].startswith("talk mode has steps 1 to ")


def test_verl_batches_bring_their_advantages(client):
    import io

    import torch

    buf = io.BytesIO()
    torch.save(
        {
            "prompts": torch.tensor([[5, 6]]),
            "responses": torch.tensor([[7, 8, 9]]),
            "response_mask": torch.tensor([[1, 0, 1]]),
            "token_level_rewards": torch.tensor([[0.0, 0.0, 1.0]]),
            "advantages": torch.tensor([[0.25, 0.0, -0.5]]),
        },
        buf,
    )
    r = client.post("/api/uploads", files={"file": ("b.pt", buf.getvalue())}, params={"format": "verl_pt"})
    slug = r.json()["episodes"][0]["slug"]
    # Prompt tokens get 0; the tool token (mask 0) keeps its stored number but is no policy token.
    assert client.get(f"/api/episodes/{slug}").json()["advantages"] == [0.0, 0.0, 0.25, 0.0, -0.5]
    a = client.get(f"/api/episodes/{slug}/advantages", params={"scheme": "uploaded"}).json()
    assert a["schemes"][0]["advantages"] == [0.0, 0.0, 0.25, 0.0, -0.5]
