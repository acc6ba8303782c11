"""Property test of the structural reader: records with a transcript at a random depth under random
keys, in each message shape, are found and read with their turns and tool results.

The generated transcript alternates a user prompt, then ``n`` model replies each followed by a
tool result; whatever the shape, the episode must have ``n`` policy turns, ``n`` tool spans, the
reply texts in its policy tokens and the results in its tool tokens."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.core.schemas import EpisodeIn
from app.ingest._document import Document
from app.ingest.transcript import episodes

WORD = st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=3, max_size=8)
# Keys that name nothing the reader looks for, so only the shape can find the list.
KEY = WORD.map(lambda w: "k_" + w)


def _prompt(shape: str, text: str) -> dict[str, Any]:
    if shape == "sharegpt":
        return {"from": "human", "value": text}
    if shape == "gemini":
        return {"role": "user", "parts": [{"text": text}]}
    if shape == "responses":
        return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    if shape == "langchain":
        return {"type": "human", "content": text}
    return {"role": "user", "content": text}


def _turn(shape: str, reply: str, result: str) -> list[dict[str, Any]]:
    """One model reply that calls a tool, then the tool's result, in ``shape``."""
    if shape == "openai":
        return [
            {
                "role": "assistant",
                "content": reply,
                "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
            },
            {"role": "tool", "tool_call_id": "c", "content": result},
        ]
    if shape == "anthropic":
        return [
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": reply},
                    {"type": "tool_use", "id": "c", "name": "f", "input": {}},
                ],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c", "content": result}]},
        ]
    if shape == "gemini":
        return [
            {"role": "model", "parts": [{"text": reply}, {"functionCall": {"name": "f", "args": {}}}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {"output": result}}}]},
        ]
    if shape == "sharegpt":
        return [{"from": "gpt", "value": reply}, {"from": "observation", "value": result}]
    if shape == "responses":
        return [
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": reply}]},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": result},
        ]
    if shape == "langchain":
        return [{"type": "ai", "content": reply}, {"type": "tool", "content": result}]
    assert shape == "steps"
    return [{"action": reply, "observation": result}]


SHAPES = ("openai", "anthropic", "gemini", "sharegpt", "responses", "langchain", "steps")


@st.composite
def records(draw: st.DrawFn) -> tuple[dict[str, Any], str, list[str], list[str]]:
    shape = draw(st.sampled_from(SHAPES))
    prompt = draw(WORD)
    n = draw(st.integers(min_value=1, max_value=4))
    replies = [f"r{i}{draw(WORD)}" for i in range(n)]
    results = [f"o{i}{draw(WORD)}" for i in range(n)]
    items: list[dict[str, Any]] = [] if shape == "steps" else [_prompt(shape, prompt)]
    for r, o in zip(replies, results, strict=True):
        items.extend(_turn(shape, r, o))
    # Nest the list 0..3 levels deep under random keys, with scalar siblings on the way.
    value: Any = items
    depth = draw(st.integers(min_value=0, max_value=3))
    for _ in range(depth):
        # Not the siblings' own names: {"k_note": [...], "k_note": "x"} would drop the list.
        key = draw(KEY.filter(lambda k: k not in ("k_note", "k_count")))
        value = {key: value, "k_note": draw(WORD), "k_count": draw(st.integers(0, 9))}
    record = value if isinstance(value, dict) else {draw(KEY): value}
    if shape == "steps":
        record["task"] = prompt
    return record, prompt, replies, results


def _read(record: dict[str, Any]) -> EpisodeIn:
    [(_, ep)] = list(episodes(Document.of(json.dumps(record).encode())))
    assert isinstance(ep, EpisodeIn)
    return ep


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records())
def test_a_transcript_anywhere_in_any_shape_is_found(case):
    record, prompt, replies, results = case
    ep = _read(record)
    kinds = ep.kinds
    policy = "".join(t for t, k in zip(ep.tokens, kinds, strict=True) if k == "policy")
    tool = "".join(t for t, k in zip(ep.tokens, kinds, strict=True) if k == "tool")
    prompt_text = "".join(t for t, k in zip(ep.tokens, kinds, strict=True) if k == "prompt")
    assert ep.turn_ids is not None
    turns = {t for t, k in zip(ep.turn_ids, kinds, strict=True) if k == "policy"}
    spans = sum(1 for i in range(len(kinds)) if kinds[i] == "tool" and (i == 0 or kinds[i - 1] != "tool"))
    assert len(turns) == len(replies)
    assert spans == len(results)
    assert all(r in policy for r in replies)
    assert all(o in tool for o in results)
    assert prompt in prompt_text


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(records(), min_size=1, max_size=4), KEY, st.sampled_from(["json", "jsonl"]))
def test_each_record_of_a_list_under_any_key_is_an_episode(cases, key, container):
    # The records side by side under one key of one object (an eval log's samples), or one per
    # line: one episode each, in order, whatever the shape and depth of each.
    recs = [c[0] for c in cases]
    if container == "json":
        data = json.dumps({key: recs, "k_summary": {"k_n": len(recs)}}).encode()
    else:
        data = "".join(json.dumps(r) + "\n" for r in recs).encode()
    eps = [ep for _, ep in episodes(Document.of(data))]
    assert len(eps) == len(cases)
    for ep, (_, _, replies, _) in zip(eps, cases, strict=True):
        policy = "".join(t for t, k in zip(ep.tokens, ep.kinds, strict=True) if k == "policy")
        assert all(r in policy for r in replies)
