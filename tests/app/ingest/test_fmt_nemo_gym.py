"""NeMo Gym rollouts uploaded to the real app without naming a format.

The public example is the first rollout of NVIDIA-NeMo/Gym
environments/tau2_synth/data/example_rollouts.jsonl (fixtures/formats/nemo_gym/), a multi-turn
customer-service episode with function calls, tool outputs and simulated-user messages. The
token-id rollouts are hand-written in the shape NeMo Gym's vLLM model server gives output items
(``prompt_token_ids``, ``generation_token_ids``, ``generation_log_probs``; see NeMo Gym's
docs on multi-turn rollouts), including the edge cases: empty id lists fall back to the text,
a prompt that re-renders the ids sampled before it (token-in/token-out) is stored as sampled with
the drift measured per turn."""

from __future__ import annotations

import json

import pytest

from tests.app.ingest.fmt_helpers import assert_no_credit_off_policy, pick, stored, text, upload
from tests.app.svc_helpers import FORMATS, row_counts

FIXTURE = FORMATS / "nemo_gym" / "tau2_synth_example_rollouts.jsonl"
BLACKJACK = FORMATS / "nemo_gym" / "blackjack_example_rollout.jsonl"


def test_public_tau2_rollout(client):
    row = json.loads(FIXTURE.read_text())
    batch, [ep] = stored(client, "rollouts.jsonl", FIXTURE.read_bytes())
    assert batch["source"] == "upload:nemo_gym"
    assert ep["reward"] == 1.0 and ep["group"] == "1"  # _ng_task_index
    assert ep["meta"]["_ng_rollout_index"] == 0 and ep["meta"]["agent"] == "tau2_synth"
    out = row["response"]["output"]
    # Every function_call_output is tool text, nothing else is.
    outputs = [i["output"] for i in out if i["type"] == "function_call_output"]
    assert text(ep, "tool") == "".join(outputs)
    # Every function call and assistant message is policy; the simulated user is not.
    pol = text(ep, "policy")
    for i in out:
        if i["type"] == "function_call":
            assert f"<tool_call> {i['name']} {i['arguments']}</tool_call>" in pol
        elif i.get("role") == "assistant":
            assert i["content"][0]["text"] in pol
        else:
            assert i.get("content", "") == "" or i["content"] not in pol
    users = [i["content"] for i in out if i.get("role") == "user"]
    assert all(u in text(ep, "prompt") for u in users)
    assert row["responses_create_params"]["input"][0]["content"] in text(ep, "prompt")
    # A turn is one model call: a run of policy items between tool outputs / user messages.
    # The file's own metric says 6 turns.
    assert len(set(pick(ep, "policy", "turn_ids"))) == row["response"]["metrics"]["num_turns"] == 6
    # The one item with (placeholder) ids does not turn the episode into two ⟨0⟩ tokens.
    assert ep["token_ids"] is None
    assert_no_credit_off_policy(client, ep)


def _rollout(task, idx, reward, output, **extra):
    return {
        "responses_create_params": {
            "input": [{"role": "user", "content": "What is 2+3? Use the calculator."}]
        },
        "response": {"output": output, "object": "response"},
        "reward": reward,
        "_ng_task_index": task,
        "_ng_rollout_index": idx,
        **extra,
    }


def _two_turns(gen2=(30, 31, 2)):
    return [
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "add them"}]},
        {
            "type": "function_call",
            "name": "add",
            "arguments": '{"a": 2, "b": 3}',
            "call_id": "c1",
            "prompt_token_ids": [1, 5, 6, 7],
            "generation_token_ids": [20, 21, 22],
            "generation_log_probs": [-0.1, -0.2, -0.3],
        },
        {"type": "function_call_output", "call_id": "c1", "output": "5"},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "It is 5."}],
            "prompt_token_ids": [1, 5, 6, 7, 20, 21, 22, 40, 41],
            "generation_token_ids": list(gen2),
            "generation_log_probs": [-0.5] * len(gen2),
        },
    ]


def test_token_ids_per_turn_and_groups(client):
    rows = [
        _rollout(7, 0, 1.0, _two_turns()),
        _rollout(7, 1, 0.0, _two_turns((33, 2))),
        _rollout(8, 0, 1.0, _two_turns(), truncated=True, terminated=False),
    ]
    batch, eps = stored(client, "rollouts.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    a, b, c = eps
    # NeMo-RL's assembly: first prompt, generation, the new prompt ids (the tool output the
    # environment appended), generation.
    assert a["token_ids"] == [1, 5, 6, 7, 20, 21, 22, 40, 41, 30, 31, 2]
    assert a["kinds"] == ["prompt"] * 4 + ["policy"] * 3 + ["tool"] * 2 + ["policy"] * 3
    assert a["tokens"][:2] == ["⟨1⟩", "⟨5⟩"]
    assert pick(a, "policy", "logprobs") == [-0.1, -0.2, -0.3, -0.5, -0.5, -0.5]
    assert pick(a, "policy", "turn_ids") == [0, 0, 0, 1, 1, 1]
    assert [e["group"] for e in eps] == ["7", "7", "8"]
    assert [e["reward"] for e in eps] == [1.0, 0.0, 1.0]
    assert c["truncated"] is True and c["meta"]["terminated"] is False
    # Signals: the generation log-probs are a `logprob` row on policy tokens.
    sig = client.get(f"/api/episodes/{a['slug']}/signals").json()
    assert sig["available_signals"] == ["logprob"]
    assert [v for v in sig["signals"][0]["values"] if v is not None] == [-0.1, -0.2, -0.3, -0.5, -0.5, -0.5]
    # GRPO over group 7 (rewards 1, 0): the tool ids carry no credit under any scheme.
    for ep in eps:
        assert_no_credit_off_policy(client, ep)


def test_empty_token_lists_fall_back_to_text(client):
    out = _two_turns()
    for item in out:
        if "generation_token_ids" in item:
            item["generation_token_ids"] = []
            item["prompt_token_ids"] = []
            item["generation_log_probs"] = []
    _, [ep] = stored(client, "r.jsonl", json.dumps(_rollout(1, 0, 1.0, out)))
    assert ep["token_ids"] is None
    assert text(ep, "tool") == "5"
    assert (
        text(ep, "policy")
        == '<think>add them</think><tool_call> add {"a": 2, "b": 3}</tool_call>It is 5.<|end|>'
    )
    assert "What is 2+3?" in text(ep, "prompt")


def test_string_input_and_no_reward(client):
    row = {
        "responses_create_params": {"input": "Say hi", "instructions": "Be brief."},
        "response": {"output": [{"type": "message", "role": "assistant", "content": "hi"}]},
    }
    _, [ep] = stored(client, "r.jsonl", json.dumps(row))
    assert ep["reward"] is None
    assert text(ep, "prompt") == "<|system|>\nBe brief.<|end|>\n<|user|>\nSay hi<|end|>\n<|assistant|>\n\n"
    assert text(ep, "policy") == "hi<|end|>"


def test_public_blackjack_rollout_token_in_token_out(client):
    # The last rollout of NVIDIA-NeMo/Gym resources_servers/blackjack_env/data/example_rollouts.jsonl
    # (fixtures/formats/nemo_gym/README.md): two model calls, the second prompt extends the first
    # prompt and its generation exactly.
    row = json.loads(BLACKJACK.read_text())
    first, second = row["response"]["output"]
    _, [ep] = stored(client, "blackjack.jsonl", BLACKJACK.read_bytes())
    assert ep["token_ids"] == second["prompt_token_ids"] + second["generation_token_ids"]
    n1, n2 = len(first["prompt_token_ids"]), len(second["prompt_token_ids"])
    g = len(first["generation_token_ids"])
    # No function call between the turns: the new part of the second prompt (the dealer's next
    # message, 100 - 44 - 8 = 48 ids) is prompt.
    assert ep["kinds"] == ["prompt"] * n1 + ["policy"] * g + ["prompt"] * (n2 - n1 - g) + ["policy"] * 8
    assert pick(ep, "policy", "logprobs") == first["generation_log_probs"] + second["generation_log_probs"]
    assert "drift" not in ep["meta"]


def _drifting_turns():
    """Three model calls. The second prompt re-renders the first call's ids [20, 21, 22] as
    [20, 99, 22] (a re-serialised argument) before the tool output [40, 41]; the third prompt
    extends the second prompt and its generation exactly."""
    out = _two_turns()
    out[3]["prompt_token_ids"] = [1, 5, 6, 7, 20, 99, 22, 40, 41]
    out.append({"type": "function_call_output", "call_id": "c2", "output": "ok"})
    out.append(
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Done."}],
            "prompt_token_ids": [1, 5, 6, 7, 20, 99, 22, 40, 41, 30, 31, 2, 50],
            "generation_token_ids": [60, 2],
            "generation_log_probs": [-0.7, -0.8],
        }
    )
    return out


def test_a_re_rendered_tool_call_is_stored_as_sampled_and_measured(client):
    r = upload(client, "r.jsonl", json.dumps(_rollout(1, 0, 1.0, _drifting_turns())))
    assert r.status_code == 201, r.text
    assert any("token-in/token-out" in w for w in r.json()["warnings"])
    ep = client.get(f"/api/episodes/{r.json()['episodes'][0]['slug']}").json()
    # Stored as sampled: the first call's own ids [20, 21, 22], then only what the second prompt
    # adds after its re-render of them ([40, 41], tool: a function call came between), etc.
    assert ep["token_ids"] == [1, 5, 6, 7, 20, 21, 22, 40, 41, 30, 31, 2, 50, 60, 2]
    assert (
        ep["kinds"]
        == ["prompt"] * 4 + ["policy"] * 3 + ["tool"] * 2 + ["policy"] * 3 + ["tool"] + ["policy"] * 2
    )
    # The second prompt agrees up to position 5; the sampled tail [21, 22] is re-rendered as
    # [99, 22]: 22 matches, 21 has no counterpart (1 differing, at stored position 5). The third
    # prompt extends the second: the re-render is counted once.
    assert ep["meta"]["drift"] == [
        {
            "turn": 1,
            "position": 5,
            "sampled": 2,
            "rerendered_ids": [99, 22],
            "differing": 1,
            "first": [21, 99],
            "at": [5],
        }
    ]
    assert pick(ep, "policy", "logprobs") == [-0.1, -0.2, -0.3, -0.5, -0.5, -0.5, -0.7, -0.8]


def test_a_prompt_that_drops_the_sampled_call(client):
    # The second prompt keeps only the first prompt: the call's 3 ids are not re-rendered at all
    # ([20, 21, 22] against [40, 41]: nothing matches, so the re-render is taken one for one, 3 ids
    # of the prompt, where only 2 remain: [40, 41]); nothing of it is new.
    out = _two_turns()
    out[3]["prompt_token_ids"] = [1, 5, 6, 7, 40, 41]
    _, [ep] = stored(client, "r.jsonl", json.dumps(_rollout(1, 0, 1.0, out)))
    [d] = ep["meta"]["drift"]
    assert d["position"] == 4 and d["differing"] == 3 and d["rerendered_ids"] == [40, 41]
    assert d["at"] == [4, 5, 6] and d["first"] == [20, 40]
    assert ep["token_ids"] == [1, 5, 6, 7, 20, 21, 22, 30, 31, 2]


@pytest.mark.parametrize(
    "bad, field",
    [
        ({"response": {"output": "x"}}, "response.output"),
        ({"response": {"output": [{"type": "function_call", "arguments": "{}"}]}}, "response.output[0].name"),
        ({"reward": "high"}, "reward"),
    ],
)
def test_bad_records_name_the_field(client, bad, field):
    row = _rollout(1, 0, 1.0, _two_turns())
    row.update(bad)
    good = json.dumps(_rollout(1, 1, 0.0, _two_turns()))
    r = upload(client, "r.jsonl", good + "\n" + json.dumps(row) + "\n")
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["field"] == field and err["line"] == 2 and err["episode"] == 2
    assert row_counts(client) == (0, 0)


def _word_tokenizer() -> bytes:
    """A WordLevel tokenizer.json whose piece for id i is "w<i>" (ids 0..99)."""
    return json.dumps(
        {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": [],
            "normalizer": None,
            "pre_tokenizer": None,
            "post_processor": None,
            "decoder": None,
            "model": {"type": "WordLevel", "vocab": {f"w{i}": i for i in range(100)}, "unk_token": "w0"},
        }
    ).encode()


def test_the_re_render_as_tokenizer_pieces(client):
    files = {
        "file": ("r.jsonl", json.dumps(_rollout(1, 0, 1.0, _drifting_turns()))),
        "tokenizer": ("tokenizer.json", _word_tokenizer()),
    }
    r = client.post("/api/uploads", files=files)
    assert r.status_code == 201, r.text
    ep = client.get(f"/api/episodes/{r.json()['episodes'][0]['slug']}").json()
    [d] = ep["meta"]["drift"]
    assert d["rerendered_ids"] == [99, 22] and d["rerendered_tokens"] == ["w99", "w22"]
    assert ep["tokens"][5] == "w21"  # the sampled id the prompt re-rendered as 99


@pytest.mark.parametrize("ids", [[20, True, 22], [20, 21.0, 22], [20, None, 22], [[20, 21, 22]]])
def test_ids_that_are_not_integers_are_refused(client, ids):
    out = _two_turns()
    out[1]["generation_token_ids"] = ids
    r = upload(client, "r.jsonl", json.dumps(_rollout(1, 0, 1.0, out)))
    assert r.status_code == 422 and r.json()["error"]["field"] == "response.output[1].generation_token_ids"
