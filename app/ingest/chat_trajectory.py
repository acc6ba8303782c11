"""Agent trajectories as chat messages in any other container: a JSON array or JSONL whose records
keep their messages under ``messages``, ``traj``, ``history``, ``conversation`` or ``trajectory``
(the first of these that is a list of messages with a ``role``), with an optional ``reward`` (or
``score``) and group (``group``, ``task_id``, ``task``, ``uid``, ``instance_id``; else a hash of the
prompt). The formats with a known shape (openai_chat, tau_bench, swe_agent, agentbench, openhands)
are sniffed first; this one takes the rest.

Kinds by the shared message rule (app/ingest/_chat.py). No reward: stored with ``reward: null``.
"""

from __future__ import annotations

import json
from typing import Any

from app.core.schemas import EpisodeIn
from app.ingest._chat import (
    POLICY_ROLES,
    TOOL_ROLES,
    chat_episode,
    find_messages,
    no_messages,
    record_meta,
    render_messages,
)
from app.ingest._common import Record, short_hash
from app.ingest._document import Document
from app.ingest._registry import register_format
from app.ingest._spans import SpanBuilder

NAME = "chat_trajectory"

GROUP_KEYS = ("group", "task_id", "task", "uid", "instance_id")


def sniff(doc: Document) -> bool:
    found = find_messages(doc.first)
    return found is not None and (not found[1] or "role" in found[1][0]) and all(_plain(m) for m in found[1])


KNOWN_ROLES = POLICY_ROLES | TOOL_ROLES | {"system", "user", "developer"}


def _plain(m: Any) -> bool:
    """A message the shared message rule reads as it is: a role it knows, tool calls that name
    their function. Any other (a role outside the table, a call without a name) is the structural
    reader's (app/ingest/transcript.py), which keeps it and says so in the answer's warnings."""
    if not isinstance(m, dict) or m.get("role") not in KNOWN_ROLES:
        return False
    calls = m.get("tool_calls") or []
    if not isinstance(calls, list):
        return False
    for c in calls:
        if isinstance(c, str):
            try:
                c = json.loads(c)
            except ValueError:
                return False
        fn = c.get("function", c) if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            return False
    return True


def episode_from_record(rec: Record) -> EpisodeIn:
    found = find_messages(rec.obj)
    if found is None:
        raise rec.error(
            "missing_field",
            "no list of chat messages under `messages`, `traj`, `history`, `conversation` or `trajectory`.",
            field="messages",
        )
    key, messages = found
    if not messages:
        raise no_messages(rec, key)
    b = SpanBuilder()
    prompt = render_messages(b, messages, rec, key)
    obj = rec.obj
    meta = record_meta(obj, {"reward", "score", "group"}, f"upload:{NAME}")
    group = next((obj[k] for k in GROUP_KEYS if obj.get(k) not in (None, "")), None)
    return chat_episode(
        b,
        rec,
        reward=obj.get("reward", obj.get("score")),
        reward_field="reward",
        group=group if group is not None else short_hash(prompt),
        meta=meta,
        truncated=obj.get("truncated") is True,
    )


register_format(
    name=NAME,
    description="chat messages under messages/traj/history/conversation/trajectory + optional reward",
    priority=60,
    sniff=sniff,
    record=episode_from_record,
)
