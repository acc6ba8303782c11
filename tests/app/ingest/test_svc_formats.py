"""Every upload format: its real example file in fixtures/formats/ is auto-detected, stored and
read back with arrays equal to what the file says."""

from __future__ import annotations

import json

import pytest
import torch

from app.core.tokenize import tokenize
from tests.app.svc_helpers import FORMATS


def up(client, name, **params):
    r = client.post("/api/uploads", files={"file": (name, (FORMATS / name).read_bytes())}, params=params)
    assert r.status_code == 201, r.text
    body = r.json()
    batch = client.get(f"/api/batches/{body['batch_id']}").json()
    eps = [client.get(f"/api/episodes/{e['slug']}").json() for e in body["episodes"]]
    return batch, eps


def lines(name):
    return [json.loads(s) for s in (FORMATS / name).read_text().splitlines() if s.strip()]


def pick(ep, kind, key="tokens"):
    return [x for x, k in zip(ep[key], ep["kinds"], strict=True) if k == kind]


def test_native(client):
    batch, eps = up(client, "native.jsonl")
    assert batch["source"] == "upload:native"
    for sent, got in zip(lines("native.jsonl"), eps, strict=True):
        for k in ("tokens", "kinds", "reward", "values", "turn_ids", "group", "truncated", "bootstrap_value"):
            assert got[k] == sent.get(k, {"truncated": False}.get(k)), k
        assert got["meta"]["calls"] == sent["meta"]["calls"]


def test_openai_chat(client):
    batch, eps = up(client, "openai_chat.jsonl")
    assert batch["source"] == "upload:openai_chat"
    for sent, got in zip(lines("openai_chat.jsonl"), eps, strict=True):
        msgs = sent["messages"]
        assert got["reward"] == sent["reward"] and got["group"] == "limit"
        # Tool results are exactly the tool tokens.
        assert "".join(pick(got, "tool")) == "".join(m["content"] for m in msgs if m["role"] == "tool")
        # Policy tokens: each assistant message's content + its tool calls + its end token.
        expected = ""
        for m in msgs:
            if m["role"] == "assistant":
                expected += m["content"] or ""
                for c in m.get("tool_calls") or []:
                    expected += (
                        "<tool_call> "
                        + c["function"]["name"]
                        + " "
                        + c["function"]["arguments"]
                        + "</tool_call>"
                    )
                expected += "<|end|>"
        assert "".join(pick(got, "policy")) == expected
        # One turn per assistant message.
        assert sorted(set(pick(got, "policy", "turn_ids"))) == [0, 1, 2]
        # System and user text are prompt tokens.
        assert "Fix limit()." in "".join(pick(got, "prompt"))


def test_verl_rollout(client):
    batch, eps = up(client, "verl_rollout.jsonl")
    assert batch["source"] == "upload:verl_rollout"
    for sent, got in zip(lines("verl_rollout.jsonl"), eps, strict=True):
        assert "".join(pick(got, "prompt")) == sent["input"]
        assert pick(got, "policy") == tokenize(sent["output"])
        assert got["reward"] == sent["score"] and got["meta"]["step"] == 3
    assert len({e["group"] for e in eps}) == 1  # the same prompt sampled 4 times is one group
    diag = batch["diagnostics"]
    assert diag["groups"][0]["n"] == 4 and diag["groups"][0]["pass_rate"] == 0.5


def test_rl_logging_board(client):
    batch, eps = up(client, "rl_logging_board.jsonl")
    assert batch["source"] == "upload:rl_logging_board"
    for sent, got in zip(lines("rl_logging_board.jsonl"), eps, strict=True):
        assert pick(got, "policy") == sent["response_tokens"]
        assert "".join(pick(got, "prompt")) == sent["prompt"]
        assert pick(got, "policy", "values") == sent["values"]
        assert pick(got, "policy", "logprobs") == sent["logprobs"]
        assert pick(got, "policy", "rewards") == sent["token_rewards"]
        assert got["reward"] is None and got["meta"]["reward"] == sent["reward"]


def test_nemo_rl(client):
    batch, eps = up(client, "nemo_rl.jsonl")
    assert batch["source"] == "upload:nemo_rl"
    for sent, got in zip(lines("nemo_rl.jsonl"), eps, strict=True):
        n = sent["input_lengths"]
        assert got["tokens"] == [f"⟨{i}⟩" for i in sent["token_ids"][:n]]
        mask = sent["token_loss_mask"][:n]
        assert [k == "policy" for k in got["kinds"]] == [bool(m) for m in mask]
        # zeros before the first policy token are prompt, zeros after it are the tool observation
        assert got["kinds"][:12] == ["prompt"] * 12 and got["kinds"][15:19] == ["tool"] * 4
        # the training policy's log-probs, beside the generation engine's (their ratio is shown)
        assert got["logprobs"] == sent["prev_logprobs"][:n]
        assert got["rollout_logprobs"] == sent["generation_logprobs"][:n]
        assert got["token_ids"] == sent["token_ids"][:n]
        assert got["reward"] == sent["rewards"]
        assert got["advantages"] == sent["advantages"][:n]
    adv = client.get(
        f"/api/episodes/{batch['episodes'][0]['slug']}/advantages", params={"scheme": "uploaded"}
    ).json()
    # the uploaded row has every token, as stored: 0.5 on the 6 policy tokens, 0 elsewhere
    row = adv["schemes"][0]["advantages"]
    assert [a for a, k in zip(row, adv["kinds"], strict=True) if k == "policy"] == [0.5] * 6
    assert row == eps[0]["advantages"] and all(
        a == 0 for a, k in zip(row, adv["kinds"], strict=True) if k != "policy"
    )


def test_verl_torch_save(client):
    batch, eps = up(client, "verl_batch.pt")
    assert batch["source"] == "upload:verl_pt"
    d = torch.load(FORMATS / "verl_batch.pt", weights_only=True)
    P = d["prompts"].shape[1]
    for b, got in enumerate(eps):
        keep_p = d["attention_mask"][b, :P].bool()
        keep_r = d["attention_mask"][b, P:].bool()
        ids = d["prompts"][b][keep_p].tolist() + d["responses"][b][keep_r].tolist()
        assert got["tokens"] == [f"⟨{i}⟩" for i in ids]
        m = d["response_mask"][b][keep_r].tolist()
        assert got["kinds"] == ["prompt"] * int(keep_p.sum()) + ["policy" if x else "tool" for x in m]
        npr = int(keep_p.sum())
        assert got["rewards"][npr:] == d["token_level_rewards"][b][keep_r].double().tolist()
        assert got["values"][npr:] == d["values"][b][keep_r].double().tolist()
        assert got["logprobs"][npr:] == d["old_log_probs"][b][keep_r].double().tolist()
        assert got["group"] == d["uid"][b]


def test_verl_pickled_objects_are_refused(client, tmp_path):
    import numpy as np

    path = tmp_path / "evil.pt"
    # A numpy object array needs arbitrary unpickling: weights_only=True must refuse it.
    torch.save({"prompts": torch.zeros(1, 2), "uid": np.array(["a"], dtype=object)}, path)
    r = client.post("/api/uploads", files={"file": ("evil.pt", path.read_bytes())})
    assert r.status_code == 422 and r.json()["error"]["code"] == "bad_verl_batch"


@pytest.mark.parametrize("name, fmt", [("native.jsonl", "native"), ("verl_rollout.jsonl", "verl_rollout")])
def test_format_override(client, name, fmt):
    batch, _ = up(client, name, format=fmt)
    assert batch["source"] == f"upload:{fmt}"


def test_format_override_that_does_not_fit_names_the_field(client):
    r = client.post(
        "/api/uploads",
        files={"file": ("x", (FORMATS / "native.jsonl").read_bytes())},
        params={"format": "nemo_rl"},
    )
    assert r.status_code == 422
    assert r.json()["error"]["field"] == "token_ids" and r.json()["error"]["line"] == 1
