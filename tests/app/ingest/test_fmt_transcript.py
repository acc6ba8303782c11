"""The `transcript` format through the real POST /api/uploads, without naming a format: public files
of shapes no dedicated format reads (fixtures/formats/transcript/README.md says where each comes
from) open with their turns, tool spans and reward; the answer's ``warnings`` say what was noted;
a file that is not episodes is a 422 that says what it is, and nothing is stored."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

from tests.app.ingest.fmt_helpers import assert_no_credit_off_policy, pick, stored, text, upload
from tests.app.svc_helpers import row_counts

FIX = Path(__file__).resolve().parents[3] / "fixtures" / "formats" / "transcript"


def test_inspect_log_opens_with_its_score(client):
    batch, [ep] = stored(client, "log.json", (FIX / "inspect_log_read_sample.json").read_bytes())
    assert batch["source"] == "upload:transcript"
    assert ep["reward"] == 1.0 and ep["group"] == "1"
    assert ep["meta"]["outcome"] == "pass/fail"
    assert text(ep, "policy").startswith("Yes")
    assert_no_credit_off_policy(client, ep)


def test_inspect_eval_zip_opens(client):
    log = json.loads((FIX / "inspect_log_read_sample.json").read_text())
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("header.json", json.dumps({k: v for k, v in log.items() if k != "samples"}))
        for s in log["samples"]:
            zf.writestr(f"samples/{s['id']}_epoch_{s['epoch']}.json", json.dumps(s))
    batch, [ep] = stored(client, "run.eval", buf.getvalue())
    assert batch["source"] == "upload:transcript" and ep["reward"] == 1.0


def test_sharegpt_opens_with_tool_spans_and_warns_about_the_missing_reward(client):
    r = upload(client, "glaive.json", (FIX / "glaive_toolcall_en_demo.json").read_bytes())
    assert r.status_code == 201, r.text
    body = r.json()
    [warning] = body["warnings"]
    assert warning.startswith(
        "2 of 2 episodes have no reward (stored with reward null); looked at: reward, score"
    )
    ep = client.get(f"/api/episodes/{body['episodes'][1]['slug']}").json()
    assert ep["reward"] is None
    assert len(set(pick(ep, "policy", "turn_ids"))) == 6
    assert '{"area": 15}' in text(ep, "tool")


def test_bare_list_of_messages_opens(client):
    _, [ep] = stored(client, "local.traj.json", (FIX / "local.traj.json").read_bytes())
    assert len(set(pick(ep, "policy", "turn_ids"))) == 2
    assert "hello world" in text(ep, "tool")


def test_unknown_role_is_a_warning_not_a_422(client):
    rec = {
        "dialog": [
            {"role": "narrator", "content": "once"},
            {"role": "assistant", "content": "upon a time"},
        ],
        "reward": 1,
    }
    r = upload(client, "t.json", json.dumps(rec))
    assert r.status_code == 201, r.text
    assert r.json()["warnings"] == [
        "role `narrator` is not in the role table (1 message); kept as prompt (shown, given no credit)."
    ]


def test_metrics_log_is_a_422_that_says_what_it_is(client):
    lines = "".join(
        json.dumps({"step": s, "data": {"actor/entropy": 0.5, "critic/score/mean": 0.1}}) + "\n"
        for s in range(4)
    )
    r = upload(client, "metrics.jsonl", lines)
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["code"] == "not_episodes"
    assert err["message"].startswith(
        "This looks like a training metrics log (metric names as verl logs them): 4 lines of `step`"
    )
    assert row_counts(client) == (0, 0)


def test_empty_file_says_so(client):
    r = upload(client, "empty.jsonl", b"")
    assert r.status_code == 422 and r.json()["error"]["code"] == "empty_upload"


def test_messages_with_a_nameless_call_and_an_exit_role_open(client):
    # mini-swe-agent v2 ends with a role "exit" message; a tool call may lack function.name.
    rec = {
        "messages": [
            {"role": "system", "content": "solve it"},
            {"role": "user", "content": "fix the bug"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": "c1", "function": {"arguments": "{}"}}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
            {"role": "assistant", "content": "done"},
            {"role": "exit", "content": "diff --git a/x b/x"},
        ],
        "instance_id": "repo__x-1",
        "info": {"exit_status": "Submitted"},
    }
    batch, [ep] = stored(client, "run.traj.json", json.dumps(rec))
    assert batch["source"] == "upload:transcript"
    assert "<tool_call>  {}</tool_call>" in text(ep, "policy")
    assert text(ep, "tool") == "okdiff --git a/x b/x"
    assert ep["group"] == "repo__x-1" and ep["reward"] is None
