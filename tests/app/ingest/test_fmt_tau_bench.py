"""tau-bench results uploaded to the real app without naming a format.

Public examples (fixtures/formats/tau_bench/, see its README): the first record of
sierra-research/tau-bench historical_trajectories/gpt-4o-airline.json (trimmed) and the whole of
results_test_company_model/tool-calling-deepseek-v3-0.0_range_0-1_user-gpt-4o-human_0612073827.json
(a failed run with an empty ``traj``). Hand-written cases follow tau-bench's record shape
(``task_id``, ``trial``, ``reward``, ``info``, ``traj``)."""

from __future__ import annotations

import json

from tests.app.ingest.fmt_helpers import assert_no_credit_off_policy, pick, stored, text, upload
from tests.app.svc_helpers import FORMATS, row_counts

DIR = FORMATS / "tau_bench"


def test_public_airline_record(client):
    [rec] = json.loads((DIR / "gpt-4o-airline_task0.json").read_text())
    batch, [ep] = stored(client, "gpt-4o-airline.json", (DIR / "gpt-4o-airline_task0.json").read_bytes())
    assert batch["source"] == "upload:tau_bench"
    assert ep["reward"] == 0.0 and ep["group"] == "0"
    assert ep["meta"]["r_actions"] == 0.0 and ep["meta"]["user_id"] == "mia_li_3668"
    traj = rec["traj"]
    # Tool results are tool tokens, and only they.
    assert text(ep, "tool") == "".join(m["content"] for m in traj if m["role"] == "tool")
    pol = text(ep, "policy")
    for m in traj:
        if m["role"] == "assistant":
            assert (m["content"] or "") in pol
            for c in m.get("tool_calls") or []:
                assert f"<tool_call> {c['function']['name']} {c['function']['arguments']}</tool_call>" in pol
        elif m["role"] in ("user", "system"):
            assert m["content"] in text(ep, "prompt")
    # One turn per assistant message.
    assert len(set(pick(ep, "policy", "turn_ids"))) == sum(m["role"] == "assistant" for m in traj) == 5
    assert_no_credit_off_policy(client, ep)


def test_public_failed_run_is_refused_naming_it(client):
    r = upload(client, "results.json", (DIR / "failed_run.json").read_bytes())
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["code"] == "empty_episode" and err["field"] == "traj" and err["episode"] == 1
    assert "EOF when reading a line" in err["message"]
    assert row_counts(client) == (0, 0)


def _rec(task_id, trial, reward, answer="done"):
    return {
        "task_id": task_id,
        "trial": trial,
        "reward": reward,
        "info": {},
        "traj": [
            {"role": "user", "content": "cancel my order"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "cancel", "arguments": {"id": 7}}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "name": "cancel", "content": "cancelled"},
            {"role": "assistant", "content": answer},
        ],
    }


def test_trials_of_a_task_form_a_group_and_object_arguments(client):
    recs = [_rec(3, 0, 1.0), _rec(3, 1, 0.0, "sorry"), _rec(4, 0, 1.0)]
    batch, eps = stored(client, "r.json", json.dumps(recs))
    assert [e["group"] for e in eps] == ["3", "3", "4"]
    assert [e["meta"]["trial"] for e in eps] == [0, 1, 0]
    # Arguments given as an object are shown as JSON.
    assert '<tool_call> cancel {"id": 7}</tool_call>' in text(eps[0], "policy")
    # GRPO-style outcome within the task's group: +/- for the two trials, 0 for the singleton.
    adv = client.get(
        f"/api/episodes/{eps[0]['slug']}/advantages", params={"scheme": "outcome", "baseline": "rloo"}
    )
    assert adv.json()["schemes"][0]["advantages"][-2] == 1.0  # 1 - mean of the others (0)


def test_bad_message_names_line_episode_and_field(client):
    bad = _rec(1, 0, 1.0)
    bad["traj"][1]["tool_calls"][0] = "not json"
    r = upload(client, "r.jsonl", json.dumps(_rec(1, 0, 1.0)) + "\n" + json.dumps(bad) + "\n")
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["line"] == 2 and err["episode"] == 2 and err["field"] == "traj[1].tool_calls[0]"
    assert row_counts(client) == (0, 0)
