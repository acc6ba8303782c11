"""Atropos ScoredDataGroup JSONL uploaded to the real app without naming a format.

fixtures/formats/atropos/groups.jsonl is written by make_atropos.py the way
atroposlib/envs/base.py writes groups (jsonlines, one ScoredDataGroup per line); group 1 has the
shape of NousResearch/atropos environments/cybersec_env_outputs/objreward.jsonl (masks of -100
then the label ids, messages as decoded text), group 2 a two-turn tool episode with per-token
token_scores/token_weights. Edge cases from the ScoredDataGroup TypedDict are written inline."""

from __future__ import annotations

import json

import pytest

from tests.app.ingest.fmt_helpers import assert_no_credit_off_policy, pick, stored, text, upload
from tests.app.svc_helpers import FORMATS, row_counts

DIR = FORMATS / "atropos"
GROUPS = [json.loads(line) for line in (DIR / "groups.jsonl").read_text().splitlines()]


def post_with_tokenizer(client, data):
    files = {
        "file": ("groups.jsonl", data),
        "tokenizer": ("tokenizer.json", (DIR / "tokenizer.json").read_bytes()),
    }
    r = client.post("/api/uploads", files=files)
    assert r.status_code == 201, r.text
    return [client.get(f"/api/episodes/{e['slug']}").json() for e in r.json()["episodes"]]


def test_groups_kinds_rewards(client):
    batch, eps = stored(client, "groups.jsonl", (DIR / "groups.jsonl").read_bytes())
    assert batch["source"] == "upload:atropos"
    g1, g2 = GROUPS
    assert len(eps) == len(g1["tokens"]) + len(g2["tokens"]) == 5
    # One group per line, one episode per sequence, the score as the reward.
    assert [e["group"] for e in eps] == ["line-1"] * 3 + ["line-2"] * 2
    assert [e["reward"] for e in eps] == g1["scores"] + g2["scores"]
    for ep, toks, masks in zip(eps, g1["tokens"] + g2["tokens"], g1["masks"] + g2["masks"], strict=True):
        assert ep["token_ids"] == toks
        assert ep["tokens"][0] == f"⟨{toks[0]}⟩"  # no tokenizer sent: ids
        trained = [m != -100 for m in masks]
        assert [k == "policy" for k in ep["kinds"]] == trained
        first = trained.index(True)
        assert set(ep["kinds"][:first]) == {"prompt"}
        # -100 after the first trained token is the tool observation.
        assert all(k == "tool" for k, t in zip(ep["kinds"][first:], trained[first:], strict=True) if not t)
    assert eps[0]["meta"]["messages"] == g1["messages"][0]
    assert "tool" not in eps[0]["kinds"] and "tool" in eps[3]["kinds"]
    for ep in eps:
        assert_no_credit_off_policy(client, ep)


def test_tokenizer_pieces_and_signal_rows(client):
    eps = post_with_tokenizer(client, (DIR / "groups.jsonl").read_bytes())
    first = eps[0]
    assert first["tokens"][:4] == ["<|begin_of_text|>", "<|start_header_id|>", "system", "<|end_header_id|>"]
    assert text(first, "policy").startswith("<think>\nProcess creation")
    tool = eps[3]
    assert text(tool, "tool").startswith("<|start_header_id|>ipython<|end_header_id|>\n\n<tool_response>391")
    g2 = GROUPS[1]
    sig = client.get(f"/api/episodes/{tool['slug']}/signals").json()
    # inference_logprobs -> logprob; with ref_logprobs, kl; and the two per-token rows.
    assert sig["available_signals"] == ["logprob", "kl", "token_scores", "token_weights"]
    rows = {r["name"]: r["values"] for r in sig["signals"]}
    pol = [k == "policy" for k in tool["kinds"]]
    assert [v for v, p in zip(rows["token_scores"], pol, strict=True) if p] == [
        s for s, p in zip(g2["token_scores"][0], pol, strict=True) if p
    ]
    assert all(v is None for v, p in zip(rows["token_weights"], pol, strict=True) if not p)
    assert [v for v in rows["kl"] if v is not None] == [
        pytest.approx(a - b)
        for a, b, p in zip(g2["inference_logprobs"][0], g2["ref_logprobs"][0], pol, strict=True)
        if p
    ]
    # The second sequence's ref_logprobs is null: no kl row, the others stay.
    sig2 = client.get(f"/api/episodes/{eps[4]['slug']}/signals").json()
    assert sig2["available_signals"] == ["logprob", "token_scores", "token_weights"]
    # The rows are on the episode page's signal checkboxes too.
    page = client.get(f"/e/{tool['slug']}")
    assert page.status_code == 200 and 'value="token_scores"' in page.text


def test_trainer_advantages_and_empty_lists(client):
    group = {
        "tokens": [[1, 2, 3, 4], [1, 2, 5]],
        "masks": [[-100, -100, 3, 4], [-100, -100, 1]],
        "scores": [1.0, 0.0],
        "advantages": [[0.0, 0.0, 0.5, 0.5], [0.0, 0.0, -0.5]],
        "ref_logprobs": [],  # collect_trajectories leaves [] when no item had them
        "messages": [],
    }
    _, eps = stored(client, "g.jsonl", json.dumps(group) + "\n" + json.dumps(group) + "\n")
    assert [e["group"] for e in eps] == ["line-1", "line-1", "line-2", "line-2"]
    assert eps[0]["advantages"] == [0.0, 0.0, 0.5, 0.5] and eps[0]["ref_logprobs"] is None
    adv = client.get(f"/api/episodes/{eps[1]['slug']}/advantages", params={"scheme": "uploaded"}).json()
    assert adv["has_advantages"] and pick(
        {"kinds": eps[1]["kinds"], "a": adv["schemes"][0]["advantages"]}, "policy", "a"
    ) == [-0.5]


def test_bad_groups_name_line_episode_field(client):
    good = {"tokens": [[1, 2]], "masks": [[-100, 2]], "scores": [1.0]}
    cases = [
        (
            {"tokens": [[1, 2], [1, 2, 3]], "masks": [[-100, 2], [-100, 2]], "scores": [1.0, 0.0]},
            "masks[1]",
            3,
        ),
        ({"tokens": [[1, 2]], "masks": [[-100, 2]], "scores": [1.0, 2.0]}, "scores", 2),
        ({"tokens": [[1, "x"]], "masks": [[-100, 2]], "scores": [1.0]}, "tokens[0]", 2),
        (
            {"tokens": [[1, 2]], "masks": [[-100, 2]], "scores": [1.0], "token_scores": [[0.1]]},
            "token_scores[0]",
            2,
        ),
    ]
    for bad, field, episode in cases:
        r = upload(client, "g.jsonl", json.dumps(good) + "\n" + json.dumps(bad) + "\n")
        assert r.status_code == 422, r.text
        err = r.json()["error"]
        assert (err["field"], err["line"], err["episode"]) == (field, 2, episode), err
    assert row_counts(client) == (0, 0)
