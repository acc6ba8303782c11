"""OpenAI-style chat messages with a per-episode reward, as agent frameworks write them.

One episode per JSON object: ``{"messages": [...], "reward": 1.0, "group": "...", "meta": {...}}``
(``score`` is accepted for ``reward``; ``group`` defaults to ``uid``, ``task``, or a hash of the
messages before the first assistant message, so attempts at the same prompt share a group).

Rendering, with the offline tokenizer (app/core/tokenize.py): every message opens with a template
token ``<|role|>`` and closes with ``<|end|>``. Assistant content and tool calls
(``<tool_call>name {arguments}</tool_call>``) and the assistant's ``<|end|>`` are policy tokens
(the model generated them), one turn per assistant message; tool results are tool tokens;
everything else (system, developer, user, headers) is prompt. Tool responses left inside an
assistant's text (``<tool_response>`` blocks and the role lines around them) follow the text rule
of app/ingest/_chat.py.
"""

from __future__ import annotations

from typing import Any, cast

from app.core.schemas import EpisodeIn, Kind
from app.core.tokenize import tokenize
from app.ingest._chat import text_spans
from app.ingest._common import Record, as_float, scalar_meta, short_hash
from app.ingest._document import Document
from app.ingest._registry import register_format

NAME = "openai_chat"

ROLES = {"system", "developer", "user", "assistant", "tool", "function"}


def sniff(doc: Document) -> bool:
    first = doc.first
    msgs = first.get("messages") if isinstance(first, dict) else None
    return (
        isinstance(msgs, list)
        and (not msgs or (isinstance(msgs[0], dict) and "role" in msgs[0]))
        and all(_plain(m) for m in msgs)
    )


def _plain(m: Any) -> bool:
    """A message this format reads: a known role and tool calls that name their function (other
    roles and call shapes are the structural reader's, app/ingest/transcript.py)."""
    if not isinstance(m, dict) or m.get("role") not in ROLES:
        return False
    calls = m.get("tool_calls") or []
    return isinstance(calls, list) and all(
        isinstance(c, dict) and isinstance(c.get("function"), dict) and "name" in c["function"] for c in calls
    )


def _text(content: Any, rec: Record, field: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: [{"type": "text", "text": "..."}]
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    raise rec.error("wrong_type", f"field `{field}` must be a string, a list of parts or null.", field=field)


def episode_from_messages(rec: Record) -> EpisodeIn:
    obj = rec.obj
    if not isinstance(obj, dict) or not isinstance(obj.get("messages"), list):
        raise rec.error(
            "missing_field", "required field `messages` (a list of chat messages) is missing.", "messages"
        )
    tokens: list[str] = []
    kinds: list[str] = []
    turn_ids: list[int] = []
    turn = -1
    prompt_text = []

    def add(pieces: list[str], kind: str) -> None:
        tokens.extend(pieces)
        kinds.extend([kind] * len(pieces))
        turn_ids.extend([turn if kind == "policy" else -1] * len(pieces))

    for i, m in enumerate(obj["messages"]):
        f = f"messages[{i}]"
        if not isinstance(m, dict):
            raise rec.error("wrong_type", f"field `{f}` must be an object with `role` and `content`.", f)
        role = m.get("role")
        if role not in ROLES:
            raise rec.error(
                "unknown_role",
                f"field `{f}.role` is {role!r}; expected one of {', '.join(sorted(ROLES))}.",
                f + ".role",
            )
        text = _text(m.get("content"), rec, f + ".content")
        if role == "assistant":
            turn += 1
            add([f"<|{role}|>\n"], "prompt")
            # Tool spans left inside the text (app/ingest/_chat.py text rule): tool/template
            # tokens, and each policy stretch after one a turn of its own.
            for kind, piece, new_turn in text_spans(text):
                turn += new_turn
                add(tokenize(piece), kind)
            for j, call in enumerate(m.get("tool_calls") or []):
                fn = call.get("function", {}) if isinstance(call, dict) else {}
                if not isinstance(fn, dict) or "name" not in fn:
                    raise rec.error(
                        "wrong_type",
                        f"field `{f}.tool_calls[{j}].function.name` is missing.",
                        f"{f}.tool_calls",
                    )
                args = fn.get("arguments", "")
                args = args if isinstance(args, str) else str(args)
                add(
                    ["<tool_call>"] + tokenize(" " + str(fn["name"]) + " " + args) + ["</tool_call>"],
                    "policy",
                )
            add(["<|end|>"], "policy")
            add(["\n"], "prompt")
        else:
            kind = "tool" if role in ("tool", "function") else "prompt"
            add([f"<|{role}|>\n"], "prompt")
            add(tokenize(text), kind)
            add(["<|end|>\n"], "prompt")
            if turn < 0:
                prompt_text.append(f"{role}:{text}")
    reward = as_float(obj.get("reward", obj.get("score")), rec, "reward")
    meta = obj.get("meta") or obj.get("metadata") or {}
    if not isinstance(meta, dict):
        raise rec.error("wrong_type", "field `meta` must be an object.", "meta")
    meta = dict(meta)
    meta.update(
        {k: v for k, v in scalar_meta(obj, {"reward", "score", "group", "uid"}).items() if k not in meta}
    )
    meta.setdefault("source", f"upload:{NAME}")
    group = obj.get("group") or obj.get("uid") or obj.get("task") or short_hash("\n".join(prompt_text))
    return EpisodeIn.model_construct(
        tokens=tokens,
        kinds=cast("list[Kind]", kinds),  # built from the three kinds only
        reward=reward,
        turn_ids=turn_ids,
        group=str(group),
        truncated=bool(obj.get("truncated", False)),
        meta=meta,
    )


register_format(
    name=NAME,
    description="OpenAI chat messages (role, content, tool_calls, tool_call_id) + a per-episode reward",
    priority=20,
    sniff=sniff,
    record=episode_from_messages,
)
