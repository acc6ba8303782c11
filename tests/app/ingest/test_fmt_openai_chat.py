"""OpenAI chat messages with a reward (app/ingest/openai_chat.py): fixtures/formats/openai_chat.jsonl
(written by fixtures/formats/make_examples.py from OpenAI's chat message schema: role, content,
tool_calls, tool_call_id) is auto-detected; tool results are exactly the tool tokens, each
assistant message its own policy turn; with ``format=openai_chat`` a role the schema does not
have is a 422 naming it."""

from __future__ import annotations

import json

from tests.app.ingest.fmt_helpers import example, lines, pick, refused, stored


def test_openai_chat(client):
    batch, eps = stored(client, "openai_chat.jsonl", example("openai_chat.jsonl"))
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


def test_an_unknown_role_is_named(client):
    sent = lines("openai_chat.jsonl")
    sent[0]["messages"][1]["role"] = "narrator"
    body = "".join(json.dumps(s) + "\n" for s in sent)
    # Detection leaves messages of other roles to the chat readers; chosen by name, it says why not.
    err = refused(client, "chat.jsonl", body, format="openai_chat")
    assert (err["code"], err["line"], err["field"]) == ("unknown_role", 1, "messages[1].role")
