"""AgentBench runs (``outputs/<run>/<agent>/<task>/runs.jsonl``): one line per sample
``{"index", "error", "info", "output": {"index", "status", "result", "history"}, "time"}``;
``output.history`` holds the conversation with roles ``user`` (the task and the environment's
replies) and ``agent`` (the model).

Kinds by the shared message rule (app/ingest/_chat.py): ``agent`` messages are policy, one turn
each; AgentBench sends the environment's replies as ``user`` messages, so they are prompt. The
reward is ``output.result`` when it is a number (or an object with a numeric ``reward``/``score``),
else the episode is stored with ``reward: null`` and the result kept in ``meta.result``.
``output.status`` goes to meta; ``task limit reached`` and ``agent context limit`` mark the episode
truncated. The runs of one sample ``index`` form a group.
"""

from __future__ import annotations

import json
from typing import Any

from app.core.schemas import EpisodeIn
from app.ingest._chat import chat_episode, no_messages, record_meta, render_messages
from app.ingest._common import Record
from app.ingest._document import Document
from app.ingest._registry import register_format
from app.ingest._spans import SpanBuilder

NAME = "agentbench"

TRUNCATED = ("task limit reached", "agent context limit")


def sniff(doc: Document) -> bool:
    out = doc.first.get("output") if isinstance(doc.first, dict) else None
    return isinstance(out, dict) and isinstance(out.get("history"), list)


def _reward(result: Any) -> Any:
    if isinstance(result, dict):
        result = result.get("reward", result.get("score"))
    if isinstance(result, (int, float)) and not isinstance(result, bool):
        return result
    return None


def episode_from_record(rec: Record) -> EpisodeIn:
    obj = rec.obj
    out = obj.get("output") if isinstance(obj, dict) else None
    if not isinstance(out, dict) or not isinstance(out.get("history"), list):
        raise rec.error("missing_field", "field `output.history` is missing.", field="output.history")
    if not out["history"]:
        raise no_messages(rec, "output.history")
    b = SpanBuilder()
    render_messages(b, out["history"], rec, "output.history")
    meta = record_meta(obj, {"output"}, f"upload:{NAME}")
    status = out.get("status")
    if isinstance(status, str):
        meta["status"] = status
    result = out.get("result")
    reward = _reward(result)
    if reward is None and result is not None:
        meta["result"] = result if isinstance(result, str) else json.dumps(result)[:2000]
    index = obj.get("index", out.get("index"))
    return chat_episode(
        b,
        rec,
        reward=reward,
        reward_field="output.result",
        group=index,
        meta=meta,
        truncated=status in TRUNCATED,
    )


register_format(
    name=NAME,
    description="AgentBench runs.jsonl (output.history with user/agent roles, output.status, output.result)",
    priority=24,
    sniff=sniff,
    record=episode_from_record,
)
