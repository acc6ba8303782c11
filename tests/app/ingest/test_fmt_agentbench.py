"""AgentBench runs uploaded to the real app without naming a format.

Public example: the first line of THUDM/AgentBench
outputs/Jan17v1/gpt-4o-mini/medagentbench-std/runs.jsonl (trimmed, see
fixtures/formats/agentbench/README.md); its ``output.result`` is a string, so no reward. The
numeric-result and limit cases are hand-written in the same record shape."""

from __future__ import annotations

import json

from tests.app.ingest.fmt_helpers import assert_no_credit_off_policy, pick, stored, text
from tests.app.svc_helpers import FORMATS

FIXTURE = FORMATS / "agentbench" / "runs.jsonl"


def test_public_medagentbench_run(client):
    row = json.loads(FIXTURE.read_text())
    batch, [ep] = stored(client, "runs.jsonl", FIXTURE.read_bytes())
    assert batch["source"] == "upload:agentbench"
    h = row["output"]["history"]
    assert text(ep, "policy").count("<|end|>") == 2
    for m in h:
        part = text(ep, "policy") if m["role"] == "agent" else text(ep, "prompt")
        assert m["content"] in part
    assert text(ep, "tool") == ""  # AgentBench sends the environment's replies as user messages
    assert len(set(pick(ep, "policy", "turn_ids"))) == 2
    assert ep["reward"] is None and ep["meta"]["result"] == "[-1]" and ep["meta"]["status"] == "completed"
    assert ep["group"] == "96"
    assert batch["episodes"][0]["rewarded"] is False


def test_numeric_result_is_the_reward_and_limits_truncate(client):
    row = json.loads(FIXTURE.read_text())
    a = json.loads(json.dumps(row))
    a["output"]["result"] = 1
    b = json.loads(json.dumps(row))
    b["output"]["result"] = {"score": 0.0}
    b["output"]["status"] = "task limit reached"
    _, [ea, eb] = stored(client, "runs.jsonl", json.dumps(a) + "\n" + json.dumps(b) + "\n")
    assert ea["reward"] == 1.0 and eb["reward"] == 0.0
    assert ea["truncated"] is False and eb["truncated"] is True
    assert_no_credit_off_policy(client, ea)
