"""Chat messages in other containers (``conversation``, ``trajectory``, ``history`` of role
messages) and the shared message rule on edge cases, hand-written from the OpenAI chat message
schema (role, content as text or parts, tool_calls as objects or JSON strings, tool_call_id) and
the keys agent frameworks use (``is_demo``, ``message_type``, roles ``ipython``/``agent``)."""

from __future__ import annotations

import json

from tests.app.ingest.fmt_helpers import assert_no_credit_off_policy, pick, stored, text, upload
from tests.app.svc_helpers import row_counts


def _conv(answer: str, **extra) -> dict:
    return {
        "conversation": [
            {"role": "system", "content": [{"type": "text", "text": "You can run Python."}]},
            {"role": "user", "content": "What is 6*7?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    json.dumps(
                        {
                            "id": "c",
                            "type": "function",
                            "function": {"name": "python", "arguments": "print(6*7)"},
                        }
                    )
                ],
            },
            {"role": "ipython", "content": "42"},
            {"role": "assistant", "content": answer},
        ],
        **extra,
    }


def test_conversation_key_json_array_groups_and_null_reward(client):
    doc = [
        _conv("42", task_id="mul", reward=1.0),
        _conv("41", task_id="mul", reward=0.0),
        _conv("?", task_id="mul"),
    ]
    batch, eps = stored(client, "convs.json", json.dumps(doc))
    assert batch["source"] == "upload:chat_trajectory"
    assert [e["group"] for e in eps] == ["mul"] * 3
    assert [e["reward"] for e in eps] == [1.0, 0.0, None]
    assert [e["rewarded"] for e in batch["episodes"]] == [True, True, False]
    ep = eps[0]
    assert text(ep, "tool") == "42"  # role ipython is tool output
    assert "<tool_call> python print(6*7)</tool_call>" in text(ep, "policy")  # a JSON-string tool call
    assert "You can run Python." in text(ep, "prompt")  # content as parts
    assert len(set(pick(ep, "policy", "turn_ids"))) == 2
    assert_no_credit_off_policy(client, ep)
    none = client.get(f"/api/episodes/{eps[2]['slug']}/advantages", params={"scheme": "outcome"}).json()
    assert none["rewarded"] is False and all(a is None for a in none["schemes"][0]["advantages"])


def test_demonstrations_and_first_observation_are_prompt(client):
    row = {
        "trajectory": [
            {"role": "user", "content": "Example: ls", "is_demo": True},
            {"role": "assistant", "content": "ls", "is_demo": True},
            {"role": "user", "content": "the task: fix the bug", "message_type": "observation"},
            {"role": "agent", "content": "cat main.py"},
            {"role": "user", "content": "print(1", "message_type": "observation"},
            {"role": "agent", "content": "done"},
        ],
        "score": 1,
    }
    _, [ep] = stored(client, "t.jsonl", json.dumps(row) + "\n")
    assert ep["reward"] == 1.0
    assert text(ep, "tool") == "print(1"
    pol = text(ep, "policy")
    assert "cat main.py" in pol and "done" in pol and "ls<|end|>" not in pol
    assert "Example: ls" in text(ep, "prompt") and "the task: fix the bug" in text(ep, "prompt")


def test_tool_spans_inside_assistant_text_of_openai_chat(client):
    row = {
        "messages": [
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": "<tool_call>w</tool_call>\nuser\n<tool_response>\nsun\n</tool_response>\nassistant\nSunny.",
            },
        ],
        "reward": 1.0,
    }
    batch, [ep] = stored(client, "m.jsonl", json.dumps(row) + "\n")
    assert batch["source"] == "upload:openai_chat"
    assert text(ep, "tool") == "<tool_response>\nsun\n</tool_response>"
    assert len(set(pick(ep, "policy", "turn_ids"))) == 2
    assert_no_credit_off_policy(client, ep)


def test_no_policy_message_and_bad_message_are_422(client):
    r = upload(client, "c.jsonl", json.dumps({"history": [{"role": "user", "content": "hi"}]}) + "\n")
    assert r.status_code == 422 and r.json()["error"]["code"] == "no_policy_tokens"
    bad = {"conversation": [{"role": "user", "content": "hi"}, "oops"]}
    r = upload(client, "c.jsonl", json.dumps(_conv("x")) + "\n" + json.dumps(bad) + "\n")
    err = r.json()["error"]
    assert r.status_code == 422 and (err["line"], err["episode"], err["field"]) == (2, 2, "conversation[1]")
    assert row_counts(client) == (0, 0)


def _first(payload: dict, row: int = 0):
    """The row's value on the first policy token (None: null everywhere)."""
    return next((a for a in payload["schemes"][row]["advantages"] if a is not None), None)


def test_an_episode_without_reward_is_left_out_of_its_groups_baseline(client):
    # Group "mul": rewards 1, 0 and none. RLOO over the two rewarded ones: 1 - 0 = +1 and
    # 0 - 1 = -1 (counting the unrewarded one as 0 would give 1 - (0 + 0)/2 = 0.5 and -0.5).
    doc = [
        _conv("42", task_id="mul", reward=1.0),
        _conv("41", task_id="mul", reward=0.0),
        _conv("?", task_id="mul"),
    ]
    _, eps = stored(client, "convs.json", json.dumps(doc))
    got = []
    for ep in eps:
        r = client.get(
            f"/api/episodes/{ep['slug']}/advantages", params={"scheme": "outcome", "baseline": "rloo"}
        )
        got.append(_first(r.json()))
    assert got == [1.0, -1.0, None]


def test_grpo_group_of_four_with_one_null_reward_uses_the_three_rewarded(client):
    # Rewards 1, 0, 1 and none. By hand over the three rewarded: mean 2/3, unbiased std
    # sqrt(((1/3)^2 + (2/3)^2 + (1/3)^2) / 2) = sqrt(1/3); GRPO (score - mean) / (std + 1e-6):
    # +(1/3)/sqrt(1/3) = +0.57735, -(2/3)/sqrt(1/3) = -1.15470. Counting the null one as 0 would
    # give mean 1/2, std sqrt(1/3) and +-0.86603.
    doc = [
        _conv("42", task_id="mul", reward=1.0),
        _conv("41", task_id="mul", reward=0.0),
        _conv("42", task_id="mul", reward=1.0),
        _conv("?", task_id="mul"),
    ]
    batch, eps = stored(client, "convs.json", json.dumps(doc))
    assert [e["rewarded"] for e in batch["episodes"]] == [True, True, True, False]
    assert batch["episodes"][3]["reward"] is None
    std = (1 / 3) ** 0.5 + 1e-6
    want = [(1 / 3) / std, -(2 / 3) / std, (1 / 3) / std]
    for params in ({"scheme": "outcome", "baseline": "grpo"}, {"scheme": "grpo"}):
        got = []
        for ep in eps:
            body = client.get(f"/api/episodes/{ep['slug']}/advantages", params=params).json()
            got.append((_first(body), body["rewarded"]))
        assert [g[1] for g in got] == [True, True, True, False]
        assert got[3][0] is None  # no advantage for the episode without a reward
        assert [round(g[0], 5) for g in got[:3]] == [round(w, 5) for w in want] == [0.57735, -1.1547, 0.57735]
