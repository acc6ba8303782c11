"""OpenHands event streams uploaded to the real app without naming a format.

Public example: All-Hands-AI/OpenHands tests/runtime/trajs/basic.json (trimmed, see
fixtures/formats/openhands/README.md): a saved trajectory, a bare JSON array of events, which is
one episode. The evaluation-output records (``history`` of events, ``instance_id``) and the
several-actions-per-model-call case are hand-written from OpenHands' event shape."""

from __future__ import annotations

import json

from tests.app.ingest.fmt_helpers import assert_no_credit_off_policy, pick, stored, text
from tests.app.svc_helpers import FORMATS

FIXTURE = FORMATS / "openhands" / "basic.json"


def test_public_saved_trajectory_is_one_episode(client):
    events = json.loads(FIXTURE.read_text())
    batch, eps = stored(client, "basic.json", FIXTURE.read_bytes())
    assert batch["source"] == "upload:openhands" and len(eps) == 1
    [ep] = eps
    # The observation is tool text, and only it.
    assert text(ep, "tool") == events[2]["content"]
    pol = text(ep, "policy")
    for ev in (events[1], events[3]):
        msg = ev["tool_call_metadata"]["model_response"]["choices"][0]["message"]
        assert msg["content"] in pol
        fn = msg["tool_calls"][0]["function"]
        assert f"<tool_call> {fn['name']} {fn['arguments']}</tool_call>" in pol
    assert events[0]["args"]["content"] in text(ep, "prompt")
    assert len(set(pick(ep, "policy", "turn_ids"))) == 2  # two model calls
    assert ep["reward"] is None


def _ev(i, source, **kw):
    return {"id": i, "source": source, **kw}


def test_records_with_history_reward_and_one_call_several_actions(client):
    resp = {
        "id": "r1",
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "content": "two commands",
                    "tool_calls": [
                        {
                            "id": "a",
                            "type": "function",
                            "function": {"name": "run", "arguments": '{"command": "ls"}'},
                        },
                        {
                            "id": "b",
                            "type": "function",
                            "function": {"name": "run", "arguments": '{"command": "pwd"}'},
                        },
                    ],
                }
            }
        ],
    }
    meta = {"function_name": "run", "tool_call_id": "a", "model_response": resp, "total_calls_in_response": 2}
    history = [
        _ev(0, "user", action="message", args={"content": "where am I?"}, message="where am I?"),
        _ev(
            1,
            "agent",
            action="run",
            args={"command": "ls", "thought": "two commands"},
            tool_call_metadata=meta,
        ),
        _ev(
            2,
            "agent",
            action="run",
            args={"command": "pwd", "thought": ""},
            tool_call_metadata=dict(meta, tool_call_id="b"),
        ),
        _ev(3, "agent", observation="run", content="a.txt", cause=1),
        _ev(4, "environment", observation="run", content="/workspace", cause=2),
        _ev(5, "agent", action="finish", args={"thought": "in /workspace"}, message="in /workspace"),
    ]
    recs = [
        {"instance_id": "django-1", "history": history, "reward": 1.0},
        {"instance_id": "django-1", "history": history[:4] + history[5:], "reward": 0.0},
    ]
    _, eps = stored(client, "output.jsonl", "".join(json.dumps(r) + "\n" for r in recs))
    ep = eps[0]
    assert [e["group"] for e in eps] == ["django-1", "django-1"]
    assert text(ep, "tool") == "a.txt/workspace"
    pol = text(ep, "policy")
    # One model call, two actions: its message and both tool calls, once.
    assert pol.count("two commands") == 1 and pol.count("<tool_call>") == 2
    assert "in /workspace" in pol
    assert len(set(pick(ep, "policy", "turn_ids"))) == 2
    assert_no_credit_off_policy(client, ep)
