"""OpenHands event streams: a saved trajectory (a bare JSON array of events: one episode), or
evaluation output records (JSON array / JSONL) holding their events under ``history``.

An event has ``source`` (``user``, ``agent``, ``environment``) and either ``action`` (``message``,
``run``, ``edit``, ``finish``, …, with ``args``) or ``observation`` (with ``content``). Kinds by the
shared message rule (app/ingest/_chat.py): observations are tool tokens; the agent's actions are
policy, one turn per model call: an action's ``tool_call_metadata.model_response`` is that call
(its message text and every tool call in it, rendered once even when the call produced several
actions); an action without one shows its ``thought``/``content``. User messages and system or
recall actions are prompt. OpenHands writes no reward: ``reward`` (or ``score``) is read when a
record has one, else the episode is stored with ``reward: null``. Group: ``instance_id``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from app.core.schemas import EpisodeIn
from app.ingest._chat import chat_episode, message_kind, no_messages, record_meta, render_policy
from app.ingest._common import Record, sub_object
from app.ingest._document import Document
from app.ingest._registry import Pair, register_format
from app.ingest._spans import SpanBuilder, content_text

NAME = "openhands"


def _is_event(x: Any) -> bool:
    return isinstance(x, dict) and "source" in x and ("action" in x or "observation" in x)


def sniff(doc: Document) -> bool:
    first = doc.first
    if _is_event(first):
        return True
    h = first.get("history") if isinstance(first, dict) else None
    return isinstance(h, list) and bool(h) and _is_event(h[0])


def _model_message(ev: dict[str, Any]) -> tuple[Any, dict[str, Any] | None]:
    """(id, message) of the model call behind an action, from ``tool_call_metadata``."""
    meta = ev.get("tool_call_metadata")
    resp = meta.get("model_response") if isinstance(meta, dict) else None
    if not isinstance(resp, dict):
        return None, None
    choices = resp.get("choices")
    msg = (
        choices[0].get("message")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict)
        else None
    )
    return resp.get("id"), msg if isinstance(msg, dict) else None


def render_events(b: SpanBuilder, events: list[Any], rec: Record, field: str) -> None:
    done: set[Any] = set()
    seen_policy = False
    for i, ev in enumerate(events):
        f = f"{field}[{i}]"
        if not isinstance(ev, dict):
            raise rec.error("wrong_type", f"field `{f}` must be an event object.", field=f)
        args = sub_object(ev, "args")
        kind = message_kind(ev, seen_policy)
        if kind == "policy":
            seen_policy = True
            rid, msg = _model_message(ev)
            if rid is not None and rid in done:
                continue  # one model call, several actions: rendered with the first
            if msg is not None:
                done.add(rid)
                text = content_text(msg.get("content"), rec, f + ".tool_call_metadata.model_response")
                render_policy(b, text, msg.get("tool_calls"), rec, f + ".tool_call_metadata.model_response")
            else:
                text = args.get("thought") or args.get("content") or ev.get("message") or ""
                render_policy(b, str(text), None, rec, f)
            continue
        content = ev.get("content") if "observation" in ev else args.get("content")
        if content is None:
            content = ev.get("message")
        text = content_text(content, rec, f + ".content")
        if text:
            b.message(str(ev.get("observation") or ev.get("source") or "event"), text, kind)


def episode_from_events(rec: Record, events: list[Any], field: str, obj: dict[str, Any] | None) -> EpisodeIn:
    if not events:
        raise no_messages(rec, field)
    b = SpanBuilder()
    render_events(b, events, rec, field)
    obj = obj or {}
    meta = record_meta(obj, {"reward", "score", "history"}, f"upload:{NAME}")
    return chat_episode(
        b,
        rec,
        reward=obj.get("reward", obj.get("score")),
        reward_field="reward",
        group=obj.get("group") or obj.get("instance_id"),
        meta=meta,
    )


def episodes(doc: Document) -> Iterator[Pair]:
    """A saved trajectory (records that are events) as one episode; else one per record."""
    if _is_event(doc.first):
        # A saved trajectory: the whole array (or JSONL of events) is one episode.
        events = list(doc.records())
        yield (
            events[0].line,
            episode_from_events(Record(events[0].line, 1, None), [r.obj for r in events], "events", None),
        )
        return
    for rec in doc.records():
        obj = rec.obj
        if not isinstance(obj, dict) or not isinstance(obj.get("history"), list):
            raise rec.error(
                "missing_field", "field `history` (a list of events) is missing.", field="history"
            )
        yield rec.line, episode_from_events(rec, obj["history"], "history", obj)


register_format(
    name=NAME,
    description=(
        "OpenHands trajectory (a JSON array of action/observation events) or records with `history` of events"
    ),
    priority=25,
    sniff=sniff,
    episodes=episodes,
)
