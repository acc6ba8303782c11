"""opencode plugin hook logs read by the `transcript` format: one episode per session, its turns and
tool spans (app/ingest/_opencode.py).

The lines are written here in the shape of the public recordings of opencode sessions the LangSmith
SDK replays in its tests (langchain-ai/langsmith-sdk ``js/src/tests/opencode/ses_basic.jsonl``,
``ses_subagents.jsonl`` @ 75de3d085f7440e0f26df3ccbf25791e76dbcb07): ``["event", {"event": {type,
properties}}]`` bus events (``message.updated``, ``message.part.updated`` with text / reasoning /
tool parts whose ``state`` goes pending → running → completed or error, ``message.part.delta``),
``["chat.message", input, {message, parts}]``, ``["experimental.chat.system.transform", {sessionID,
model}, {system}]`` (the title generator's call included) and ``["tool.definition", ...]``.
An ``opencode export`` file is written in the shape its command writes it (anomalyco/opencode
``packages/opencode/src/cli/cmd/export.ts`` @ 07fa81066b429d56c0e74a51d201010efb586b63:
``{info: session, messages: [{info, parts}], todos}``).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.core.errors import ApiError
from app.core.schemas import EpisodeIn
from app.ingest import _notes, detect
from app.ingest._document import Document
from app.ingest.transcript import episodes
from tests.app.ingest.fmt_helpers import spans


def _ev(t: str, **props: Any) -> list[Any]:
    return ["event", {"event": {"type": t, "properties": props}}]


def _info(sid: str, mid: str, role: str, created: int) -> list[Any]:
    info: dict[str, Any] = {"id": mid, "sessionID": sid, "role": role, "time": {"created": created}}
    if role == "user":
        info["model"] = {"providerID": "opencode", "modelID": "big-pickle"}
    return _ev("message.updated", sessionID=sid, info=info)


def _part(sid: str, mid: str, pid: str, **part: Any) -> list[Any]:
    return _ev(
        "message.part.updated", sessionID=sid, part={"id": pid, "messageID": mid, "sessionID": sid, **part}
    )


def _tool(sid: str, mid: str, pid: str, call: str, name: str, status: str, **state: Any) -> list[Any]:
    return _part(sid, mid, pid, type="tool", tool=name, callID=call, state={"status": status, **state})


def _system(sid: str, model: str, text: str) -> list[Any]:
    return [
        "experimental.chat.system.transform",
        {"sessionID": sid, "model": {"id": model}},
        {"system": [text]},
    ]


S = "ses_main"


def _session() -> list[list[Any]]:
    """A user asks; the model reads a file (a call that errors first), then answers."""
    return [
        _ev("session.created", sessionID=S, info={"id": S, "title": "New session"}),
        [
            "chat.message",
            {"sessionID": S, "messageID": "m0", "model": {"modelID": "big-pickle"}},
            {
                "message": {"id": "m0", "sessionID": S, "role": "user", "time": {"created": 10}, "model": {"modelID": "big-pickle"}},
                "parts": [{"id": "p0", "type": "text", "text": "Describe the project", "messageID": "m0", "sessionID": S}],
            },
        ],
        ["tool.definition", {"toolID": "read"}, {"description": "Read a file", "parameters": {}}],
        _info(S, "m1", "assistant", 20),
        _system(S, "gpt-5-nano", "You are a title generator."),  # a side call, not the agent's prompt
        _system(S, "big-pickle", "You are opencode, an interactive CLI tool."),
        _part(S, "m1", "p1", type="reasoning", text=""),
        _ev("message.part.delta", sessionID=S, messageID="m1", partID="p1", field="text", delta="Let me look "),
        _ev("message.part.delta", sessionID=S, messageID="m1", partID="p1", field="text", delta="at the files."),
        _tool(S, "m1", "p2", "c1", "glob", "pending", input={}),
        _tool(S, "m1", "p3", "c2", "read", "pending", input={}),
        _tool(S, "m1", "p2", "c1", "glob", "error", input={}, error="invalid arguments: pattern"),
        _tool(S, "m1", "p3", "c2", "read", "running", input={"filePath": "README.md"}),
        _tool(S, "m1", "p3", "c2", "read", "completed", input={"filePath": "README.md"}, output="# ls-opencode"),
        _part(S, "m1", "p4", type="step-finish", reason="tool-calls"),
        _info(S, "m2", "assistant", 30),
        _part(S, "m2", "p5", type="text", text="It is a LangSmith plugin for opencode."),
        _ev("session.updated", sessionID=S, info={"id": S, "title": "Project overview"}),
        _ev("session.idle", sessionID=S),
    ]  # fmt: skip


def _read(rows: list[Any]) -> tuple[list[EpisodeIn], list[str]]:
    raw = "".join(json.dumps(r) + "\n" for r in rows).encode()
    with _notes.collecting() as warnings:
        eps = [ep for _, ep in episodes(Document.of(raw))]
    return eps, warnings


def _spans(ep: EpisodeIn, kind: str) -> list[str]:
    return spans(ep.tokens, ep.kinds, kind)


def test_a_session_opens_with_its_turns_calls_and_results():
    rows = _session()
    assert detect(Document.of(json.dumps(rows[0]).encode() + b"\n")) == "transcript"
    [ep], _ = _read(rows)
    prompt = "".join(_spans(ep, "prompt"))
    assert "You are opencode, an interactive CLI tool." in prompt and "title generator" not in prompt
    assert "Describe the project" in prompt
    policy = _spans(ep, "policy")
    assert len(policy) == 2  # two model calls: the tool calls, then the answer
    # The reasoning came only as deltas; the calls are the model's, with their input.
    assert "<think>Let me look at the files.</think>" in policy[0]
    assert "glob" in policy[0] and "read" in policy[0] and "README.md" in policy[0]
    assert policy[1].strip().startswith("It is a LangSmith plugin for opencode.")
    tools = _spans(ep, "tool")
    assert len(tools) == 2 and "error: invalid arguments: pattern" in tools[0] and "# ls-opencode" in tools[1]
    meta = ep.meta
    assert (meta["session_id"], meta["title"], meta["tool_calls"], meta["tool_errors"]) == (
        S,
        "Project overview",
        2,
        1,
    )
    assert meta["format_of_file"] == "opencode hook log"


def test_a_subagent_session_is_an_episode_of_its_own_and_an_unfinished_call_has_no_result():
    child = "ses_child"
    rows = _session() + [
        _info(child, "c0", "user", 40),
        _part(child, "c0", "cp0", type="text", text="Get the time"),
        _info(child, "c1", "assistant", 41),
        _tool(child, "c1", "cp1", "k1", "bash", "running", input={"command": "date"}),
    ]
    eps, _ = _read(rows)
    assert [e.meta["session_id"] for e in eps] == [S, child]
    sub = eps[1]
    assert "date" in "".join(_spans(sub, "policy")) and _spans(sub, "tool") == []
    assert sub.meta["unfinished_calls"] == 1


def test_a_log_without_a_model_message_says_what_it_is():
    rows = [
        _ev("session.created", sessionID=S, info={"id": S}),
        _info(S, "m0", "user", 1),
        _part(S, "m0", "p0", type="text", text="hi"),
    ]
    with pytest.raises(ApiError) as e:
        _read(rows)
    assert e.value.code == "not_episodes"
    assert (
        "opencode plugin's hook log (3 lines" in e.value.message
        and "no message of the model" in e.value.message
    )


def test_an_opencode_export_file_opens_as_its_session():
    export = {
        "info": {"id": S, "title": "Project overview", "time": {"created": 1, "updated": 2}},
        "messages": [
            {"info": {"id": "m0", "sessionID": S, "role": "user", "time": {"created": 10}},
             "parts": [{"id": "p0", "messageID": "m0", "type": "text", "text": "Describe the project"}]},
            {"info": {"id": "m1", "sessionID": S, "role": "assistant", "time": {"created": 20}},
             "parts": [
                 {"id": "p1", "messageID": "m1", "type": "step-start"},
                 {"id": "p2", "messageID": "m1", "type": "tool", "tool": "read", "callID": "c1",
                  "state": {"status": "completed", "input": {"filePath": "README.md"}, "output": "# ls-opencode"}},
             ]},
            {"info": {"id": "m2", "sessionID": S, "role": "assistant", "time": {"created": 30}},
             "parts": [{"id": "p3", "messageID": "m2", "type": "text", "text": "A LangSmith plugin."}]},
        ],
        "todos": [],
    }  # fmt: skip
    raw = json.dumps(export, indent=2).encode()
    assert detect(Document.of(raw)) == "transcript"
    with _notes.collecting():
        [ep] = [e for _, e in episodes(Document.of(raw))]
    policy = _spans(ep, "policy")
    assert (
        len(policy) == 2 and "README.md" in policy[0] and policy[1].strip().startswith("A LangSmith plugin.")
    )
    assert ["# ls-opencode" in t for t in _spans(ep, "tool")] == [True]
    assert "Describe the project" in "".join(_spans(ep, "prompt"))
    assert (ep.meta["title"], ep.meta["format_of_file"]) == ("Project overview", "opencode session export")
