"""SWE-agent trajectories (``<instance>.traj``): one JSON object with ``history`` (the messages the
model saw and wrote: ``role``, ``content``, ``message_type`` thought/action/observation, optional
``tool_calls``, ``is_demo``), ``trajectory`` (the steps), ``info`` (``exit_status``,
``submission``, ``model_stats``) and ``replay_config``; or JSONL of such objects.

Kinds by the shared message rule (app/ingest/_chat.py): observations are tool tokens,
demonstrations (``is_demo``) prompt, the assistant's thoughts, actions and tool calls policy.
SWE-agent writes no reward: ``reward`` (or ``score``) is read when a record has one, else the
episode is stored with ``reward: null``. ``info.exit_status`` goes to meta; an exit on a limit
(``exit_cost``, ``exit_context``, …, also when autosubmitted) marks the episode truncated. Group:
``group``, else ``instance_id``/``environment`` (attempts at the same instance).
"""

from __future__ import annotations

from app.core.schemas import EpisodeIn
from app.ingest._chat import chat_episode, no_messages, record_meta, render_messages
from app.ingest._common import Record, sub_object
from app.ingest._document import Document
from app.ingest._registry import register_format
from app.ingest._spans import SpanBuilder

NAME = "swe_agent"

LIMIT_EXITS = ("exit_cost", "exit_context", "exit_total_execution_time", "exit_command_timeout", "exit_api")


def sniff(doc: Document) -> bool:
    first = doc.first
    if not isinstance(first, dict) or not isinstance(first.get("history"), list):
        return False
    h = first["history"]
    head = h[0] if h and isinstance(h[0], dict) else {}
    return "role" in head and ("message_type" in head or isinstance(first.get("trajectory"), list))


def episode_from_record(rec: Record) -> EpisodeIn:
    obj = rec.obj
    if not isinstance(obj, dict) or not isinstance(obj.get("history"), list):
        raise rec.error("missing_field", "field `history` (a list of messages) is missing.", field="history")
    if not obj["history"]:
        raise no_messages(rec, "history")
    b = SpanBuilder()
    render_messages(b, obj["history"], rec, "history")
    info = sub_object(obj, "info")
    meta = record_meta(obj, {"reward", "score", "group"}, f"upload:{NAME}")
    status = info.get("exit_status")
    if isinstance(status, str):
        meta["exit_status"] = status
    if isinstance(info.get("submission"), str):
        meta["submitted"] = bool(info["submission"].strip())
    group = obj.get("group") or obj.get("instance_id") or obj.get("environment")
    return chat_episode(
        b,
        rec,
        reward=obj.get("reward", obj.get("score")),
        reward_field="reward",
        group=group,
        meta=meta,
        truncated=isinstance(status, str) and any(e in status for e in LIMIT_EXITS),
    )


register_format(
    name=NAME,
    description="SWE-agent .traj (history with message_type, trajectory, info.exit_status)",
    priority=23,
    sniff=sniff,
    record=episode_from_record,
)
