"""When no format fits: the fields a record has, a suggested mapping, and uploads read through a
mapping of record keys onto the native fields.

A mapping is a JSON object ``{native field: record key}``; a key may be a dotted path into nested
objects (``"output.history"``). Targets:

* ``messages``: chat messages, kinds by the shared message rule (app/ingest/_chat.py);
* ``prompt`` and ``response`` (or ``completion``): text (the response split by the text rule of
  app/ingest/_chat.py) or chat message lists;
* ``tokens``, ``kinds`` and the other per-token fields of the native format, taken as they are;
* ``reward``, ``group``, ``truncated``, ``bootstrap_value``, ``task`` (to ``meta.task``).

The record's other scalar fields go to ``meta``. A record without a mapped key is a 422 naming its
line, episode and the key (optional targets — reward, group, … — are then just absent).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from app.core.errors import ApiError
from app.core.schemas import EpisodeIn
from app.ingest._chat import add_text, chat_episode, find_messages, record_meta, render_messages
from app.ingest._common import Record, read_records, short_hash, validate_native
from app.ingest._spans import SpanBuilder

NAME = "mapped"
FIELD = "mapping"
PER_TOKEN = (
    "tokens",
    "kinds",
    "rewards",
    "values",
    "logprobs",
    "advantages",
    "ref_logprobs",
    "rollout_logprobs",
    "entropy",
    "token_ids",
    "turn_ids",
)
SCALARS = ("reward", "group", "truncated", "bootstrap_value", "task")
TARGETS = ("messages", "prompt", "response", "completion", *PER_TOKEN, *SCALARS)
_MISSING = object()


def _bad(message: str) -> ApiError:
    return ApiError(422, "bad_mapping", f"parameter `mapping`: {message}", field=FIELD)


def parse_mapping(raw: str | dict | None) -> dict[str, str] | None:
    """The mapping from a JSON text (query or form field) or an object; None when not given;
    422 ``bad_mapping`` naming the field ``mapping`` when it is not a usable mapping."""
    if raw is None or raw == "":
        return None
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError as e:
            raise _bad(
                f'is not JSON ({e}); send an object such as {{"messages": "traj", "reward": "reward"}}.'
            ) from None
    if not isinstance(raw, dict) or not raw:
        raise _bad("must be a non-empty JSON object {native field: record key}.")
    for target, key in raw.items():
        if target not in TARGETS:
            raise _bad(f"{target!r} is not a field it can fill; choose from {', '.join(TARGETS)}.")
        if not isinstance(key, str) or not key:
            raise _bad(f"the record key for {target!r} must be a non-empty string (a dotted path is fine).")
    if not any(t in raw for t in ("messages", "prompt", "response", "completion", "tokens")):
        raise _bad("map at least `messages`, `prompt`/`response` or `tokens`/`kinds`: the episode's text.")
    if "tokens" in raw and "kinds" not in raw:
        raise _bad("`tokens` needs `kinds` too (prompt, policy or tool per token).")
    return dict(raw)


def lookup(obj: Any, path: str) -> Any:
    """``obj[path]``, following dots into nested objects; _MISSING when absent."""
    if isinstance(obj, dict) and path in obj:
        return obj[path]
    cur = obj
    for part in path.split("."):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            return _MISSING
    return cur


def _get(rec: Record, mapping: dict, target: str, required: bool = False) -> Any:
    key = mapping.get(target)
    if key is None:
        return None
    v = lookup(rec.obj, key)
    if v is _MISSING:
        if required:
            raise rec.error("missing_field", f"field `{key}` (mapped to `{target}`) is missing.", field=key)
        return None
    return v


def episode_from_mapped(rec: Record, mapping: dict[str, str]) -> EpisodeIn:
    """One record read through ``mapping`` into a native episode."""
    if not isinstance(rec.obj, dict):
        raise rec.error("wrong_type", f"expected a JSON object per record, got {type(rec.obj).__name__}.")
    used = {k.split(".")[0] for k in mapping.values()}
    meta = record_meta(rec.obj, used, f"upload:{NAME}")
    task = _get(rec, mapping, "task")
    if task is not None:
        meta["task"] = str(task)
    group = _get(rec, mapping, "group")
    truncated = _get(rec, mapping, "truncated") is True
    reward = _get(rec, mapping, "reward")
    if "tokens" in mapping:
        native: dict[str, Any] = {
            t: _get(rec, mapping, t, required=t in ("tokens", "kinds")) for t in PER_TOKEN
        }
        native = {k: v for k, v in native.items() if v is not None}
        native.update(
            reward=reward, group=None if group is None else str(group), truncated=truncated, meta=meta
        )
        bv = _get(rec, mapping, "bootstrap_value")
        if bv is not None:
            native["bootstrap_value"] = bv
        return validate_native(native, rec)
    b = SpanBuilder()
    prompt_text = ""
    if "messages" in mapping:
        key = mapping["messages"]
        msgs = _get(rec, mapping, "messages", required=True)
        if not isinstance(msgs, list):
            raise rec.error(
                "wrong_type", f"field `{key}` (mapped to `messages`) must be a list of messages.", field=key
            )
        prompt_text = render_messages(b, msgs, rec, key)
    else:
        prompt = _get(rec, mapping, "prompt", required="prompt" in mapping)
        out_target = "response" if "response" in mapping else "completion"
        response = _get(rec, mapping, out_target, required=out_target in mapping)
        for value, target in ((prompt, "prompt"), (response, out_target)):
            key = mapping.get(target, target)
            if value is None:
                continue
            if isinstance(value, list):
                text = render_messages(b, value, rec, key)
                prompt_text = prompt_text or text
            elif isinstance(value, str):
                if target == "prompt":
                    b.message("user", value, "prompt")
                    prompt_text = value
                else:
                    b.end_turn()
                    b.open_assistant()
                    add_text(b, value)
                    b.close_assistant()
            else:
                raise rec.error(
                    "wrong_type",
                    f"field `{key}` (mapped to `{target}`) must be text or a list of messages.",
                    field=key,
                )
    return chat_episode(
        b,
        rec,
        reward=reward,
        reward_field=mapping.get("reward", "reward"),
        group=group if group is not None else short_hash(prompt_text),
        meta=meta,
        truncated=truncated,
    )


def iter_mapped(data: bytes, mapping: dict[str, str]) -> Iterator[tuple[int | None, EpisodeIn]]:
    for rec in read_records(data):
        yield rec.line, episode_from_mapped(rec, mapping)


# ---- what the 422 says when nothing fits --------------------------------------------------------


def _type(v: Any) -> str:
    if isinstance(v, bool):
        return "true/false"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "text"
    if isinstance(v, list):
        if v and isinstance(v[0], dict) and ("role" in v[0] or "content" in v[0]):
            return f"list of {len(v)} messages"
        return f"list of {len(v)}"
    if isinstance(v, dict):
        return "object"
    return "null"


def fields_seen(first: Any, limit: int = 24) -> list[tuple[str, str]]:
    """(key, type) of the first record's fields, one level into nested objects (``output.history``)."""
    out: list[tuple[str, str]] = []
    if not isinstance(first, dict):
        return out
    for k, v in first.items():
        out.append((k, _type(v)))
        if isinstance(v, dict):
            out.extend((f"{k}.{k2}", _type(v2)) for k2, v2 in v.items() if not isinstance(v2, dict))
    return out[:limit]


GROUP_NAMES = ("group", "task_id", "instance_id", "uid", "prompt_id", "example_id", "task", "index", "id")
REWARD_NAMES = (
    "reward",
    "score",
    "rewards",
    "result",
    "return",
    "correct",
    "success",
    "passed",
    "pass",
    "acc",
    "accuracy",
)


def suggest(first: Any) -> dict[str, str]:
    """A mapping guessed from the first record's fields (what the 422 shows as an example)."""
    seen = fields_seen(first, limit=200)
    names = {k: t for k, t in seen}
    out: dict[str, str] = {}
    msgs = next((k for k, t in seen if t.endswith("messages")), None)
    if msgs is None:
        found = find_messages(first)
        msgs = found[0] if found else None
    if msgs is not None:
        out["messages"] = msgs
    else:
        text = [k for k, t in seen if t == "text"]
        for target, cands in (
            ("prompt", ("prompt", "input", "question", "query")),
            ("response", ("response", "output", "completion", "answer")),
        ):
            hit = next((k for k in text if k.split(".")[-1] in cands), None)
            if hit:
                out[target] = hit
        if not out and text:
            out["response"] = text[0]
    for target, cands in (("reward", REWARD_NAMES), ("group", GROUP_NAMES)):
        hit = next(
            (k for k in names if k.split(".")[-1] in cands and (target == "group" or names[k] == "number")),
            None,
        )
        if hit:
            out[target] = hit
    return out or {"messages": "<key of the message list>", "reward": "<key of the reward>"}


def unknown_format_hint(first: Any) -> str:
    """The part of the 422 that lists the fields seen and shows how to map them."""
    seen = fields_seen(first)
    listed = ", ".join(f"`{k}` ({t})" for k, t in seen) if seen else type(first).__name__
    example = json.dumps(suggest(first))
    return (
        f"The first record has the fields: {listed}. Map them onto the native fields with a mapping "
        f"{{native field: record key}}, e.g. mapping={example} (POST /api/uploads?mapping=…, "
        "`creditlens upload --map '…'`, or the mapping form on the upload page); fields it can fill: "
        + ", ".join(TARGETS)
        + "."
    )
