"""SWE-agent trajectories (.traj) uploaded to the real app without naming a format.

The files in fixtures/formats/swe_agent/ are built by hand in the shape SWE-agent writes
(SWE-agent/SWE-agent sweagent/types.py: HistoryItem, TrajectoryStep, AgentInfo; see the README).
SWE-agent writes no reward: the episodes are stored with ``reward: null`` and no advantages."""

from __future__ import annotations

import json

from tests.app.ingest.fmt_helpers import all_schemes, pick, stored, text
from tests.app.svc_helpers import FORMATS

DIR = FORMATS / "swe_agent"


def _content(m):
    c = m["content"]
    return c if isinstance(c, str) else "".join(p["text"] for p in c)


def test_function_calling_traj(client):
    doc = json.loads((DIR / "function_calling.traj").read_text())
    batch, [ep] = stored(client, "x.traj", (DIR / "function_calling.traj").read_bytes())
    assert batch["source"] == "upload:swe_agent"
    h = doc["history"]
    # Observations after the first action are tool tokens; the problem statement (the first
    # observation, before any action) and the demonstration are prompt.
    assert text(ep, "tool") == "".join(_content(m) for m in h[4:] if m["message_type"] == "observation")
    assert _content(h[2]) in text(ep, "prompt") and h[1]["content"] in text(ep, "prompt")
    pol = text(ep, "policy")
    for m in h:
        if m["role"] == "assistant":
            assert m["content"] in pol
            fn = m["tool_calls"][0]["function"]
            assert f"<tool_call> {fn['name']} {fn['arguments']}</tool_call>" in pol
    assert len(set(pick(ep, "policy", "turn_ids"))) == 3
    assert ep["meta"]["exit_status"] == "submitted" and ep["truncated"] is False
    assert ep["group"] == "swe_main"


def test_no_reward_is_null_and_no_advantage_is_shown(client):
    batch, [ep] = stored(client, "x.traj", (DIR / "thought_action_exit_cost.traj").read_bytes())
    assert ep["reward"] is None
    assert batch["episodes"][0]["reward"] is None and batch["episodes"][0]["rewarded"] is False
    # An exit on the cost limit: truncated.
    assert ep["truncated"] is True and ep["meta"]["exit_status"] == "submitted (exit_cost)"
    # The thought-action parser's observations are user messages with message_type observation.
    h = json.loads((DIR / "thought_action_exit_cost.traj").read_text())["history"]
    assert text(ep, "tool") == h[3]["content"] + h[5]["content"]
    for name in all_schemes(client):
        if name in ("uploaded", "audit_reference", "audit_diff", "oracle", "monte_carlo"):
            continue
        r = client.get(f"/api/episodes/{ep['slug']}/advantages", params={"scheme": name, "critic": "zero"})
        if r.status_code == 422:  # a scheme this episode cannot run (e.g. grpo_passk on a group of one)
            assert r.json()["error"]["code"] == "scheme_not_applicable", (name, r.text)
            continue
        body = r.json()
        assert body["rewarded"] is False and body["episode"]["reward"] is None
        assert all(a is None for a in body["schemes"][0]["advantages"]), name
        assert all(t is None for t in body["td"])
    page = client.get(f"/e/{ep['slug']}")
    assert 'id="no-reward"' in page.text


def test_a_record_with_a_reward_keeps_it(client):
    doc = json.loads((DIR / "function_calling.traj").read_text())
    doc["reward"] = 1.0
    _, [ep] = stored(client, "x.traj", json.dumps(doc))
    assert ep["reward"] == 1.0
    r = client.get(f"/api/episodes/{ep['slug']}/advantages", params={"scheme": "outcome"}).json()
    assert r["rewarded"] is True and any(a is not None for a in r["schemes"][0]["advantages"])
