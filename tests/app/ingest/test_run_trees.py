"""Traced runs (LangSmith) read by the `transcript` format: one episode per trace, its model and tool
runs merged in time order (app/ingest/_run_trees.py).

The runs are written here from LangSmith's documented run schema (langchain-ai/langsmith-sdk
``python/langsmith/schemas.py`` @ d3f159af2015da0b0723505171252404fb8ca986: ``id``, ``trace_id``,
``parent_run_id``, ``dotted_order`` ("{time}{run-uuid}" joined by dots, which sorts a trace in the
order it ran), ``run_type``, ``inputs``/``outputs``, ``start_time``), with the messages serialized
as LangChain serializes them (``{"lc": 1, "type": "constructor", "id": [..., "AIMessage"],
"kwargs": {...}}``, tool calls in ``additional_kwargs.tool_calls``), and the run operations the
SDK sends (a create with ``inputs``, a patch with ``outputs`` of the same ``id``) as its own bench
data of a LangGraph trace holds them (same repository, ``python/bench/data/run_ops_*.jsonl``).
"""

from __future__ import annotations

import json
from typing import Any

from app.core.schemas import EpisodeIn
from app.ingest import _notes, detect
from app.ingest._document import Document
from app.ingest.transcript import episodes
from tests.app.ingest.fmt_helpers import spans


def _lc(cls: str, content: str, **kwargs: Any) -> dict[str, Any]:
    kind = {"SystemMessage": "system", "HumanMessage": "human", "AIMessage": "ai", "ToolMessage": "tool"}[cls]
    return {
        "lc": 1,
        "type": "constructor",
        "id": ["langchain", "schema", "messages", cls],
        "kwargs": {"content": content, "type": kind, **kwargs},
    }


CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "search", "arguments": '{"q": "capital of France"}'},
}
SYSTEM = _lc("SystemMessage", "You answer with the tool's help.")
USER = _lc("HumanMessage", "What is the capital of France?")
AI_CALL = _lc("AIMessage", "", additional_kwargs={"tool_calls": [CALL]})
TOOL_MSG = _lc("ToolMessage", "Paris is the capital of France.", tool_call_id="call_1")
T0 = "20250101T100000000000Z"


def _dotted(*parts: tuple[str, str]) -> str:
    return ".".join(f"{t}{i}" for t, i in parts)


def _agent_trace(tid: str = "t1", start: str = "2025-01-01T10:00:0") -> list[dict[str, Any]]:
    """A ReAct agent's trace: chain → llm (a call) → tool → llm (the answer), as full runs."""
    root = (T0, tid)
    return [
        {
            "id": tid, "trace_id": tid, "parent_run_id": None, "run_type": "chain", "name": "agent",
            "start_time": start + "0", "dotted_order": _dotted(root),
            "inputs": {"messages": [USER]}, "outputs": {"messages": [USER]},
        },
        {
            "id": tid + "-llm1", "trace_id": tid, "parent_run_id": tid, "run_type": "llm", "name": "ChatOpenAI",
            "start_time": start + "1", "dotted_order": _dotted(root, ("20250101T100001000000Z", tid + "-llm1")),
            "inputs": {"messages": [[SYSTEM, USER]]},
            "outputs": {"generations": [[{"text": "", "type": "ChatGeneration", "message": AI_CALL}]]},
        },
        {
            "id": tid + "-tool", "trace_id": tid, "parent_run_id": tid, "run_type": "tool", "name": "search",
            "start_time": start + "2", "dotted_order": _dotted(root, ("20250101T100002000000Z", tid + "-tool")),
            "inputs": {"input": "capital of France"}, "outputs": {"output": "Paris is the capital of France."},
        },
        {
            "id": tid + "-llm2", "trace_id": tid, "parent_run_id": tid, "run_type": "llm", "name": "ChatOpenAI",
            "start_time": start + "3", "dotted_order": _dotted(root, ("20250101T100003000000Z", tid + "-llm2")),
            # The agent's second call re-sends the conversation, the tool's result included.
            "inputs": {"messages": [[SYSTEM, USER, AI_CALL, TOOL_MSG]]},
            "outputs": {"generations": [[{"text": "Paris.", "message": _lc("AIMessage", "Paris.")}]]},
        },
    ]  # fmt: skip


def _read(rows: list[Any]) -> tuple[list[EpisodeIn], list[str]]:
    raw = "".join(json.dumps(r) + "\n" for r in rows).encode()
    with _notes.collecting() as warnings:
        eps = [ep for _, ep in episodes(Document.of(raw))]
    return eps, warnings


def _text(ep: EpisodeIn, kind: str) -> str:
    return "".join(t for t, k in zip(ep.tokens, ep.kinds, strict=True) if k == kind)


def _spans(ep: EpisodeIn, kind: str) -> list[str]:
    return spans(ep.tokens, ep.kinds, kind)


def test_one_episode_per_trace_with_its_calls_and_tool_result_once():
    [ep], _ = _read(_agent_trace())
    policy = _spans(ep, "policy")
    assert len(policy) == 2  # the call, then the answer: two turns of the model
    assert "search" in policy[0] and "capital of France" in policy[0]
    assert policy[1].strip().startswith("Paris.")
    # The tool's run and the ToolMessage the second call re-sends are one tool result.
    [tool] = _spans(ep, "tool")
    assert "Paris is the capital of France." in tool
    assert _text(ep, "prompt").count("What is the capital of France?") == 1
    assert ep.meta["trace_id"] == "t1" and ep.meta["n_llm_runs"] == 2 and ep.meta["n_tool_runs"] == 1


def test_run_operations_are_merged_by_id_and_the_file_order_does_not_matter():
    runs = _agent_trace()
    creates = [{k: v for k, v in r.items() if k != "outputs"} for r in runs]
    patches = [
        {
            "id": r["id"],
            "name": r["name"],
            "end_time": "2025-01-01T10:00:09",
            "outputs": r["outputs"],
            "error": None,
        }
        for r in runs
    ]
    # The SDK sends patches as runs end: inner runs first, out of start order.
    [ep], _ = _read(creates + patches[::-1])
    [whole], _ = _read(runs)
    assert ep.tokens == whole.tokens and ep.kinds == whole.kinds
    assert detect(Document.of(json.dumps(creates[0]).encode() + b"\n")) == "transcript"


def test_traces_are_told_apart_by_parent_alone_and_ordered_by_start_time():
    a, b = _agent_trace("a", "2025-01-01T10:00:0"), _agent_trace("b", "2025-01-01T09:00:0")
    for r in a + b:  # an export without trace ids or dotted orders: the parents say the tree
        r.pop("trace_id")
        r.pop("dotted_order")
    mixed = [a[0], b[0], a[2], b[1], a[1], b[3], a[3], b[2]]
    eps, _ = _read(mixed)
    assert [e.meta["trace_id"] for e in eps] == ["b", "a"]  # b started first
    for ep in eps:
        policy = _spans(ep, "policy")
        assert len(policy) == 2 and "search" in policy[0] and policy[1].strip().startswith("Paris.")


def test_a_trace_without_a_model_run_is_skipped_and_said():
    lonely = [
        {"id": "x", "trace_id": "x", "run_type": "chain", "name": "etl", "start_time": "2025-01-02T00:00:00", "inputs": {}},
        {"id": "x1", "trace_id": "x", "parent_run_id": "x", "run_type": "retriever", "name": "r", "start_time": "2025-01-02T00:00:01", "inputs": {"query": "q"}, "outputs": {"documents": [{"page_content": "doc"}]}},
    ]  # fmt: skip
    eps, warnings = _read(_agent_trace() + lonely)
    assert len(eps) == 1
    assert any("trace x: 2 runs and no `llm` run" in w for w in warnings)


def test_retrieved_documents_before_the_first_call_are_its_prompt_and_text_completions_read():
    runs = [
        {"id": "r", "trace_id": "r", "run_type": "chain", "name": "rag", "start_time": "2025-01-03T00:00:00", "inputs": {"question": "q"}},
        {"id": "r1", "trace_id": "r", "parent_run_id": "r", "run_type": "retriever", "name": "VectorStoreRetriever", "start_time": "2025-01-03T00:00:01", "inputs": {"query": "q"}, "outputs": {"documents": [{"page_content": "first doc", "metadata": {}}, {"page_content": "second doc"}]}},
        {"id": "r2", "trace_id": "r", "parent_run_id": "r", "run_type": "llm", "name": "OpenAI", "start_time": "2025-01-03T00:00:02", "inputs": {"prompts": ["Answer from the documents: q"]}, "outputs": {"generations": [[{"text": "the answer"}]]}},
    ]  # fmt: skip
    [ep], _ = _read(runs)
    # A tool result before the model's first turn is prompt (what the model was given to start).
    prompt = _text(ep, "prompt")
    assert prompt.index("first doc") < prompt.index("second doc") < prompt.index("Answer from the documents")
    assert _spans(ep, "tool") == []
    assert _text(ep, "policy").strip().startswith("the answer")
