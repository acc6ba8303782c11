"""opencode sessions: a coding agent's plugin hook log, or its ``opencode export`` file, read back
into its transcripts.

opencode (the terminal coding agent) hands its plugins every bus event and a few hooks; a plugin
that logs them writes one JSON array per line, ``[hook, input, output]``:

* ``["event", {"event": {"type", "properties"}}]`` — the bus: ``message.updated`` (a message's
  ``info``: ``id``, ``sessionID``, ``role`` user/assistant, ``time.created``),
  ``message.part.updated`` (a part of a message, sent again whenever it changes: ``text``,
  ``reasoning``, ``tool`` whose ``state`` goes pending → running → completed/error with its
  ``input``, ``output`` or ``error``, ``step-start``/``step-finish``), ``message.part.delta``
  (streamed text of a part), ``session.*`` (title, status);
* ``["chat.message", {sessionID, messageID, ...}, {message, parts}]`` — the user's message as sent;
* ``["experimental.chat.system.transform", {sessionID, model}, {system: [text]}]`` — the system
  prompt of a model call;
* ``["tool.definition", {toolID}, {description, parameters}]`` — the tools offered.

``opencode export SESSION`` writes ``{"info": session, "messages": [{"info": message, "parts":
[part, ...]}], "todos": [...]}``: the same messages and parts, stored whole (no system prompt).

Each session is one transcript: its system prompt (the one sent to the session's own model, not
a side call's such as the title generator), then its messages in the order they were created, each
part as its last update left it (streamed deltas fill a text part whose last update has none). A
user message's text is prompt; an assistant message (one model call) is the model's turn — its
reasoning as ``<think>…</think>``, its text, its tool parts as calls — followed by the calls'
results (``output``, or ``error: …``) as tool results. A call the log ends on before it finished
has no result.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

HOOKS = frozenset({"event", "chat.message", "experimental.chat.system.transform", "tool.definition"})
MESSAGE_EVENTS = frozenset({"message.updated", "message.part.updated", "message.part.delta"})


def is_hook_line(obj: Any) -> bool:
    """True for a line of an opencode plugin's hook log (``[hook, input, output?]``)."""
    if not (isinstance(obj, list) and len(obj) >= 2 and isinstance(obj[0], str) and isinstance(obj[1], dict)):
        return False
    if obj[0] not in HOOKS:
        return False
    if obj[0] != "event":
        return True
    ev = obj[1].get("event")
    return isinstance(ev, dict) and isinstance(ev.get("type"), str) and isinstance(ev.get("properties"), dict)


@dataclass
class _Message:
    id: str
    role: str | None = None
    created: float = 0.0
    seen: int = 0  # order of first appearance in the log
    parts: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class Session:
    """One opencode session as the log tells it."""

    id: str
    seen: int
    title: str | None = None
    model: str | None = None  # the session's own model (its user messages name it)
    systems: dict[str, list[str]] = field(default_factory=dict)  # model id -> system prompt
    messages: dict[str, _Message] = field(default_factory=dict)
    deltas: dict[str, dict[str, str]] = field(default_factory=dict)  # part id -> field -> text
    n_events: int = 0

    def message(self, mid: str, seen: int) -> _Message:
        return self.messages.setdefault(mid, _Message(mid, seen=seen))


class _Log:
    def __init__(self) -> None:
        self.sessions: dict[str, Session] = {}
        self.n = 0

    def session(self, sid: Any) -> Session | None:
        if not isinstance(sid, str):
            return None
        return self.sessions.setdefault(sid, Session(sid, len(self.sessions)))

    def add_part(self, part: Any, message_id: Any = None) -> None:
        if not isinstance(part, dict):
            return
        mid = part.get("messageID", message_id)
        s = self.session(part.get("sessionID"))
        if s is None or not isinstance(mid, str) or not isinstance(part.get("id"), str):
            return
        msg = s.message(mid, self.n)
        msg.parts.setdefault(part["id"], {}).update(part)

    def add_info(self, info: Any) -> None:
        if not isinstance(info, dict) or not isinstance(info.get("id"), str):
            return
        s = self.session(info.get("sessionID"))
        if s is None:
            return
        msg = s.message(info["id"], self.n)
        if isinstance(info.get("role"), str):
            msg.role = info["role"]
        created = (info.get("time") or {}).get("created") if isinstance(info.get("time"), dict) else None
        if isinstance(created, (int, float)):
            msg.created = float(created)
        model = info.get("model")
        if msg.role == "user" and isinstance(model, dict) and isinstance(model.get("modelID"), str):
            s.model = model["modelID"]

    def read(self, obj: list[Any]) -> None:
        self.n += 1
        hook, inp = obj[0], obj[1]
        out = obj[2] if len(obj) > 2 and isinstance(obj[2], dict) else {}
        if hook == "chat.message":
            self.add_info(out.get("message"))
            for p in out.get("parts") or []:
                self.add_part(p, inp.get("messageID"))
        elif hook == "experimental.chat.system.transform":
            s = self.session(inp.get("sessionID"))
            model = inp.get("model")
            system = out.get("system")
            if s is not None and isinstance(model, dict) and isinstance(system, list):
                s.systems[str(model.get("id"))] = [t for t in system if isinstance(t, str)]
        elif hook == "event":
            ev = inp["event"]
            props = ev["properties"]
            s = self.session(props.get("sessionID"))
            if s is not None:
                s.n_events += 1
            t = ev["type"]
            if t == "message.updated":
                self.add_info(props.get("info"))
            elif t == "message.part.updated":
                self.add_part(props.get("part"))
            elif t == "message.part.delta" and s is not None and isinstance(props.get("partID"), str):
                f = str(props.get("field", "text"))
                got = s.deltas.setdefault(props["partID"], {})
                got[f] = got.get(f, "") + str(props.get("delta") or "")
            elif t == "session.updated" and s is not None:
                info = props.get("info")
                if isinstance(info, dict) and isinstance(info.get("title"), str):
                    s.title = info["title"]


def sessions(records: Iterable[Any]) -> list[Session]:
    """The sessions a hook log tells of, in the order they first appear."""
    log = _Log()
    for obj in records:
        if is_hook_line(obj):
            log.read(obj)
    return sorted(log.sessions.values(), key=lambda s: s.seen)


def is_export(obj: Any) -> bool:
    """True for what ``opencode export`` writes: ``{info: session, messages: [{info, parts}]}``."""
    msgs = obj.get("messages") if isinstance(obj, dict) else None
    return (
        isinstance(obj, dict)
        and isinstance(obj.get("info"), dict)
        and isinstance(msgs, list)
        and bool(msgs)
        and all(
            isinstance(m, dict) and isinstance(m.get("info"), dict) and isinstance(m.get("parts"), list)
            for m in msgs[:8]
        )
    )


def export_session(obj: dict[str, Any]) -> Session:
    """The session of an ``opencode export`` file (its messages and their parts as stored; it has
    no system prompt)."""
    log = _Log()
    info = obj["info"]
    sid = info.get("id") if isinstance(info.get("id"), str) else "session"
    for m in obj["messages"]:
        log.n += 1
        minfo = {"sessionID": sid, **m["info"]}
        log.add_info(minfo)
        for p in m["parts"]:
            if isinstance(p, dict):
                log.add_part({"sessionID": sid, **p}, minfo.get("id"))
    s = log.sessions.get(sid) or Session(sid, 0)
    s.title = info.get("title") if isinstance(info.get("title"), str) else None
    return s


def _text(s: Session, part: dict[str, Any]) -> str:
    text = part.get("text")
    if isinstance(text, str) and text:
        return text
    return s.deltas.get(str(part.get("id")), {}).get("text", "")


def items(s: Session) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The session's transcript as role/content messages (OpenAI's shape, calls as
    ``tool_calls``), and counts of what it holds (calls, tool errors, calls without a result)."""
    out: list[dict[str, Any]] = []
    system = s.systems.get(s.model or "") or next(iter(s.systems.values()), None)
    if system:
        out.append({"role": "system", "content": "\n".join(system)})
    counts = {"tool_calls": 0, "tool_errors": 0, "unfinished_calls": 0}
    for msg in sorted(s.messages.values(), key=lambda m: (m.created or float("inf"), m.seen)):
        parts = list(msg.parts.values())
        if msg.role == "user":
            text = "".join(_text(s, p) for p in parts if p.get("type") == "text")
            if text:
                out.append({"role": "user", "content": text})
            continue
        if msg.role != "assistant":
            continue
        thinking = "".join(_text(s, p) for p in parts if p.get("type") == "reasoning")
        text = "".join(_text(s, p) for p in parts if p.get("type") == "text")
        tools = [p for p in parts if p.get("type") == "tool"]
        if not (thinking or text or tools):
            continue
        reply: dict[str, Any] = {
            "role": "assistant",
            "content": (f"<think>{thinking}</think>" if thinking else "") + text,
        }
        if tools:
            reply["tool_calls"] = [
                {
                    "id": p.get("callID"),
                    "type": "function",
                    "function": {
                        "name": p.get("tool"),
                        "arguments": json.dumps((p.get("state") or {}).get("input") or {}),
                    },
                }
                for p in tools
            ]
        out.append(reply)
        for p in tools:
            counts["tool_calls"] += 1
            state = p.get("state") or {}
            if state.get("status") == "completed":
                out.append(
                    {"role": "tool", "tool_call_id": p.get("callID"), "content": str(state.get("output", ""))}
                )
            elif state.get("status") == "error":
                counts["tool_errors"] += 1
                out.append(
                    {
                        "role": "tool",
                        "tool_call_id": p.get("callID"),
                        "content": f"error: {state.get('error', '')}",
                    }
                )
            else:
                counts["unfinished_calls"] += 1
    return out, counts


def session_record(s: Session) -> dict[str, Any]:
    """One session as an episode record: its messages, id, title and counts."""
    msgs, counts = items(s)
    return {
        "session_id": s.id,
        "title": s.title,
        "model": s.model,
        "events": s.n_events,
        **counts,
        "messages": msgs,
    }
