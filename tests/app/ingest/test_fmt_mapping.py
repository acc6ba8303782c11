"""When nothing fits: the 422 shows the record's tree and proposes a mapping; ``mapping=`` reads the
records through it. Hand-written records of shapes no format knows (keys renamed, nested
rewards), through the real POST /api/uploads."""

from __future__ import annotations

import json

from tests.app.ingest.fmt_helpers import assert_no_credit_off_policy, pick, stored, text, upload
from tests.app.svc_helpers import row_counts


def _rows():
    return [
        {
            "dialog": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "weather in Paris?"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": ['{"function": {"name": "weather", "arguments": "{}"}}'],
                },
                {"role": "tool", "content": "20C"},
                {"role": "assistant", "content": "20C."},
            ],
            "eval": {"passed": 1.0},
            "prompt_uid": "p1",
            "model": "m",
        },
        {
            "dialog": [
                {"role": "user", "content": "weather in Paris?"},
                {"role": "assistant", "content": "no idea"},
            ],
            "eval": {"passed": 0.0},
            "prompt_uid": "p1",
            "model": "m",
        },
    ]


def _jsonl(rows):
    return "".join(json.dumps(r) + "\n" for r in rows)


def _odd_rows():
    """Records no reader knows: the speaker and the text under keys of their own."""
    return [
        {
            "utterances": [
                {"speaker_name": "me", "utterance": "what is the weather in Paris today?"},
                {"speaker_name": "bot", "utterance": "it is twenty degrees and sunny."},
                {"speaker_name": "me", "utterance": "thanks"},
            ],
            "eval": {"passed": 1.0},
            "prompt_uid": "p1",
        }
    ]


def test_unknown_format_shows_the_tree_and_proposes_a_mapping(client):
    r = upload(client, "odd.jsonl", _jsonl(_odd_rows()))
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["code"] == "unknown_format" and err["line"] == 1
    msg = err["message"]
    for seen in (
        "utterances: list of 3 objects",
        "utterances[].speaker_name: text",
        "eval.passed: number",
        "prompt_uid: text",
    ):
        assert seen in msg
    proposed = {
        "messages": "utterances",
        "role": "speaker_name",
        "content": "utterance",
        "reward": "eval.passed",
    }
    assert f"Proposed mapping={json.dumps(proposed)}" in msg
    assert row_counts(client) == (0, 0)
    # The proposal, sent back as it is (the upload page's one click), reads the file.
    r = upload(client, "odd.jsonl", _jsonl(_odd_rows()), mapping=json.dumps(proposed))
    assert r.status_code == 201, r.text
    assert r.json()["warnings"] == [
        "role `me` is not in the role table (2 messages); kept as prompt (shown, given no credit)."
    ]
    ep = client.get(f"/api/episodes/{r.json()['episodes'][0]['slug']}").json()
    assert text(ep, "policy").startswith("it is twenty degrees") and ep["reward"] == 1.0


def test_mapping_paths_into_lists_of_steps(client):
    rows = [
        {
            "goal": "reach the door",
            "steps": [{"act": "go north", "obs": "a wall"}, {"act": "go east", "obs": "the door"}],
            "r": {"value": "C"},
        }
    ]
    m = {"prompt": "goal", "response": "steps[].act", "observation": "steps[].obs", "reward": "r"}
    _, [ep] = stored(client, "steps.jsonl", _jsonl(rows), mapping=json.dumps(m))
    assert text(ep, "tool") == "a wallthe door"
    assert len(set(pick(ep, "policy", "turn_ids"))) == 2
    assert ep["reward"] == 1.0  # Inspect's "C" read as the structural reader reads it
    assert "reach the door" in text(ep, "prompt")


def test_mapping_query_reads_the_records(client):
    m = {"messages": "dialog", "reward": "eval.passed", "group": "prompt_uid"}
    batch, eps = stored(client, "odd.jsonl", _jsonl(_rows()), mapping=json.dumps(m))
    assert batch["source"] == "upload:mapped" and batch["meta"]["mapping"] == m
    assert [(e["reward"], e["group"]) for e in eps] == [(1.0, "p1"), (0.0, "p1")]
    ep = eps[0]
    assert text(ep, "tool") == "20C"
    assert "<tool_call> weather {}</tool_call>" in text(ep, "policy")  # a tool call given as a JSON string
    assert len(set(pick(ep, "policy", "turn_ids"))) == 2
    assert ep["meta"]["model"] == "m" and "prompt_uid" not in ep["meta"]
    assert_no_credit_off_policy(client, ep)


def test_mapping_form_field_and_text_fields(client):
    rows = [
        {
            "q": "Say hi",
            "a": "hi <tool_call>x</tool_call>\nuser\n<tool_response>ok</tool_response>\nassistant\nbye",
            "r": 1,
        }
    ]
    r = client.post(
        "/api/uploads",
        files={"file": ("t.jsonl", _jsonl(rows))},
        data={"mapping": json.dumps({"prompt": "q", "response": "a", "reward": "r"})},
    )
    assert r.status_code == 201, r.text
    ep = client.get(f"/api/episodes/{r.json()['episodes'][0]['slug']}").json()
    assert text(ep, "tool") == "<tool_response>ok</tool_response>"
    assert "Say hi" in text(ep, "prompt") and "bye" in text(ep, "policy")
    assert ep["reward"] == 1.0


def test_mapping_onto_native_token_fields(client):
    rows = [{"toks": ["a", "b", "c"], "k": ["prompt", "policy", "tool"], "score": 0.5}]
    _, [ep] = stored(
        client, "t.jsonl", _jsonl(rows), mapping='{"tokens": "toks", "kinds": "k", "reward": "score"}'
    )
    assert (
        ep["tokens"] == ["a", "b", "c"]
        and ep["kinds"] == ["prompt", "policy", "tool"]
        and ep["reward"] == 0.5
    )


def test_bad_mappings_are_422_naming_the_field_and_store_nothing(client):
    data = _jsonl(_rows())
    cases = [
        ("not json", "bad_mapping", "mapping"),
        ('{"msgs": "dialog"}', "bad_mapping", "mapping"),
        ('{"reward": "eval.passed"}', "bad_mapping", "mapping"),  # nothing to show
        ('{"messages": "chat"}', "missing_field", "chat"),
        ('{"messages": "model"}', "wrong_type", "model"),
    ]
    for mapping, code, field in cases:
        r = upload(client, "odd.jsonl", data, mapping=mapping)
        assert r.status_code == 422, mapping
        err = r.json()["error"]
        assert (err["code"], err["field"]) == (code, field), (mapping, err)
    assert row_counts(client) == (0, 0)
