"""verifiers / prime-rl evaluation results uploaded to the real app without naming a format.

Public examples (fixtures/formats/verifiers/): the first rollout of PrimeIntellect-ai/verifiers
environments/math_python/outputs/evals/math-python--gpt-5-mini/0953dadd/results.jsonl (a
multi-turn Python-tool episode whose ``tool_calls`` are JSON strings) and the first two lines of
environments/gsm8k/outputs/evals/gsm8k--gpt-4.1-mini/d497acc3/results.jsonl (failed generations:
empty completions). Groups, tool calls as objects and bad records are written inline from the
same columns."""

from __future__ import annotations

import json

from tests.app.ingest.fmt_helpers import assert_no_credit_off_policy, pick, stored, text, upload
from tests.app.svc_helpers import FORMATS, row_counts

DIR = FORMATS / "verifiers"


def test_math_python_tool_calls_as_json_strings(client):
    row = json.loads((DIR / "math_python_results.jsonl").read_text())
    batch, [ep] = stored(client, "results.jsonl", (DIR / "math_python_results.jsonl").read_bytes())
    assert batch["source"] == "upload:verifiers"
    assert ep["reward"] == 1.0 and ep["group"] == "0"  # example_id
    assert ep["meta"]["answer"] == "388" and ep["meta"]["correct_answer_rlm"] == 1.0
    assert ep["meta"]["total_tool_calls"] == 4.0
    tools = [m["content"] for m in row["completion"] if m["role"] == "tool"]
    assert text(ep, "tool") == "".join(tools)
    pol = text(ep, "policy")
    calls = [
        json.loads(c) for m in row["completion"] if m["role"] == "assistant" for c in m["tool_calls"] or []
    ]
    assert len(calls) == row["total_tool_calls"] == 4
    for c in calls:
        assert f"<tool_call> {c['function']['name']} {c['function']['arguments']}</tool_call>" in pol
    assert row["completion"][-1]["content"] in pol
    # One turn per assistant message (the file's `turns` column counts 5).
    assert len(set(pick(ep, "policy", "turn_ids"))) == row["turns"] == 5
    # The environment echoed the question as a user message in the completion: prompt, not policy.
    assert row["completion"][0]["content"] not in pol
    assert_no_credit_off_policy(client, ep)


def test_gsm8k_empty_completions(client):
    rows = [json.loads(line) for line in (DIR / "gsm8k_results.jsonl").read_text().splitlines()]
    _, eps = stored(client, "results.jsonl", (DIR / "gsm8k_results.jsonl").read_bytes())
    assert [e["group"] for e in eps] == ["0", "1"]  # the older `id` column
    for row, ep in zip(rows, eps, strict=True):
        assert pick(ep, "policy") == ["<|end|>"]  # a failed generation: only its stop token
        assert row["prompt"][1]["content"] in text(ep, "prompt")
        assert ep["reward"] == 0.0 and ep["meta"]["format_reward_func"] == 0.0
        assert ep["meta"]["answer"] == row["answer"]


def _rollout(example, reward, calls, **extra):
    return {
        "example_id": example,
        "prompt": [{"role": "user", "content": "weather in Paris?"}],
        "completion": [
            {"role": "assistant", "content": "", "tool_calls": calls},
            {"role": "tool", "content": "18C sunny", "tool_call_id": "c1"},
            {"role": "assistant", "content": "18C and sunny."},
        ],
        "task": "weather",
        "reward": reward,
        "info": {"city": "Paris"},
        "answer": "18C",
        **extra,
    }


def test_groups_and_tool_calls_as_objects(client):
    obj = [{"id": "c1", "type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}]
    as_str = [json.dumps(obj[0])]
    rows = [_rollout(3, 1.0, obj), _rollout(3, 0.0, as_str), _rollout(4, 1.0, obj)]
    _, eps = stored(client, "results.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    assert [e["group"] for e in eps] == ["3", "3", "4"]
    # Objects and JSON strings render the same.
    assert text(eps[0], "policy") == text(eps[1], "policy")
    assert '<tool_call> weather {"city": "Paris"}</tool_call>' in text(eps[0], "policy")
    assert text(eps[0], "tool") == "18C sunny"
    assert eps[0]["meta"]["info"] == {"city": "Paris"} and eps[0]["meta"]["task"] == "weather"
    assert pick(eps[0], "policy", "turn_ids")[0] == 0 and pick(eps[0], "policy", "turn_ids")[-1] == 1
    # GRPO within example 3 (rewards 1 and 0): the tool result carries no credit.
    for ep in eps:
        assert_no_credit_off_policy(client, ep)


def test_string_prompt_and_completion(client):
    row = {"prompt": "2+2?", "completion": "4", "reward": 1.0, "answer": "4"}
    _, [ep] = stored(client, "r.jsonl", json.dumps(row))
    assert text(ep, "policy") == "4<|end|>" and "2+2?" in text(ep, "prompt")


def test_bad_records_name_line_episode_field(client):
    good = json.dumps(_rollout(1, 1.0, []))
    cases = [
        (_rollout(1, 1.0, ["{not json"]), "completion[0].tool_calls[0]"),
        (_rollout(1, 1.0, [{"function": {"arguments": "{}"}}]), "completion[0].tool_calls[0]"),
        ({**_rollout(1, 1.0, []), "completion": [{"content": "x"}]}, "completion[0].role"),
        ({**_rollout(1, 1.0, []), "reward": "yes"}, "reward"),
    ]
    for bad, field in cases:
        r = upload(client, "r.jsonl", good + "\n" + json.dumps(bad) + "\n")
        assert r.status_code == 422, r.text
        err = r.json()["error"]
        assert (err["field"], err["line"], err["episode"]) == (field, 2, 2), err
    assert row_counts(client) == (0, 0)


def test_tool_responses_inside_assistant_text_are_tool_tokens(client):
    """A completion whose assistant text carries the whole multi-turn exchange (a stripped
    template): the shared text rule (app/ingest/_chat.py) makes the tool response tool tokens."""
    content = (
        '<tool_call>{"name": "f"}</tool_call>\nuser\n<tool_response>42</tool_response>\nassistant\nIt is 42.'
    )
    row = {
        "example_id": 0,
        "prompt": "q?",
        "completion": [{"role": "assistant", "content": content}],
        "reward": 1.0,
    }
    _, [ep] = stored(client, "r.jsonl", json.dumps(row))
    assert text(ep, "tool") == "<tool_response>42</tool_response>"
    assert "It is 42." in text(ep, "policy") and "42</tool_response>" not in text(ep, "policy")
    assert len(set(pick(ep, "policy", "turn_ids"))) == 2
    assert_no_credit_off_policy(client, ep)


def test_a_saved_trajectory_is_stored_as_sampled_with_its_drift(client):
    # Hand-built from verifiers' TrajectoryStep (verifiers/types.py, 0.1.8 and later; saved with
    # `vf-eval --state-columns trajectory`): two model calls with their token ids. The second
    # call's prompt re-renders the first completion's [10, 11, 12] as [10, 13, 12] (prime-rl's
    # "exact prefix" broken), then the tool's answer [20, 21].
    row = json.loads((DIR / "math_python_results.jsonl").read_text())
    first = row["prompt"]
    call = [{"role": "assistant", "content": "", "tool_calls": row["completion"][0].get("tool_calls")}]
    tool = [{"role": "tool", "content": "388", "tool_call_id": "c1"}]

    def step(prompt, completion, prompt_ids, completion_ids, logprobs):
        tokens = {
            "prompt_ids": prompt_ids,
            "prompt_mask": [0] * len(prompt_ids),
            "completion_ids": completion_ids,
            "completion_mask": [1] * len(completion_ids),
            "completion_logprobs": logprobs,
            "overlong_prompt": False,
            "is_truncated": False,
        }
        return {
            "prompt": prompt,
            "completion": completion,
            "tokens": tokens,
            "reward": None,
            "advantage": None,
        }

    row["trajectory"] = [
        step(first, call, [1, 2, 3], [10, 11, 12], [-0.1, -0.2, -0.3]),
        step(
            first + call + tool,
            [{"role": "assistant", "content": "388"}],
            [1, 2, 3, 10, 13, 12, 20, 21],
            [30, 2],
            [-0.4, -0.5],
        ),
    ]
    _, [ep] = stored(client, "results.jsonl", json.dumps(row) + "\n")
    # As sampled: the first completion's ids stay, the tool's answer is the new part (tool).
    assert ep["token_ids"] == [1, 2, 3, 10, 11, 12, 20, 21, 30, 2]
    assert ep["kinds"] == ["prompt"] * 3 + ["policy"] * 3 + ["tool"] * 2 + ["policy"] * 2
    assert pick(ep, "policy", "turn_ids") == [0, 0, 0, 1, 1]
    assert pick(ep, "policy", "logprobs") == [-0.1, -0.2, -0.3, -0.4, -0.5]
    # By hand: first difference at row position 4 (11 -> 13); the sampled tail [11, 12] keeps 12.
    assert ep["meta"]["drift"] == [
        {
            "turn": 1,
            "position": 4,
            "sampled": 2,
            "rerendered_ids": [13, 12],
            "differing": 1,
            "first": [11, 13],
            "at": [4],
        }
    ]
    assert ep["reward"] == 1.0 and ep["group"] == "0"
