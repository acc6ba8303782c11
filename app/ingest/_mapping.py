"""When no format and no transcript shape fits: the record's tree, a mapping proposed from what it
holds, and uploads read through a mapping of record paths onto the native fields.

A mapping is a JSON object ``{native field: record path}``. A path is dotted keys into nested
objects (``output.history``), list indexes (``turns.0``) and ``[]`` for "each element of this
list" (``steps[].observation``: the ``observation`` of every step, in order). Targets:

* ``messages``: the transcript: a list of messages in any shape the structural reader knows
  (app/ingest/_structure.py); with ``[]`` the lists of each element, one after the other. Inside
  each message, ``role`` and ``content`` name the keys of the speaker and the text when they
  are not ones the reader knows (``{"messages": "dialog", "role": "speaker_name", "content":
  "utterance"}``);
* ``prompt`` and ``response`` (or ``completion``): text (the response split by the text rule of
  app/ingest/_chat.py) or message lists; with ``[]`` a list of texts, each response one turn;
  ``observation``: tool results, one after each response (``{"response": "steps[].action",
  "observation": "steps[].observation"}``);
* ``tokens``, ``kinds`` and the other per-token fields of the native format, taken as they are;
* ``reward``, ``group``, ``truncated``, ``bootstrap_value``, ``task`` (to ``meta.task``).

The record's other scalar fields go to ``meta``. A record without a mapped path is a 422 naming
its line, episode and the path (optional targets — reward, group, … — are then just absent).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from app.core.errors import ApiError
from app.core.schemas import EpisodeIn
from app.ingest._chat import chat_episode, record_meta
from app.ingest._common import Record, read_records, short_hash, validate_native
from app.ingest._notes import unknown_roles
from app.ingest._spans import SpanBuilder
from app.ingest._structure import (
    Msg,
    _Ctx,
    candidates,
    find_group,
    find_reward,
    read_messages,
    render,
    text_of,
)

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
ITEM_KEYS = ("role", "content")
TARGETS = ("messages", "prompt", "response", "completion", "observation", *ITEM_KEYS, *PER_TOKEN, *SCALARS)
_MISSING: Any = object()


def _bad(message: str) -> ApiError:
    return ApiError(422, "bad_mapping", f"parameter `mapping`: {message}", field=FIELD)


def parse_mapping(raw: str | dict[str, Any] | None) -> dict[str, str] | None:
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
        raise _bad("must be a non-empty JSON object {native field: record path}.")
    for target, key in raw.items():
        if target not in TARGETS:
            raise _bad(f"{target!r} is not a field it can fill; choose from {', '.join(TARGETS)}.")
        if not isinstance(key, str) or not key:
            raise _bad(f"the record path for {target!r} must be a non-empty string (dots and [] are fine).")
    if not any(t in raw for t in ("messages", "prompt", "response", "completion", "tokens")):
        raise _bad("map at least `messages`, `prompt`/`response` or `tokens`/`kinds`: the episode's text.")
    if "tokens" in raw and "kinds" not in raw:
        raise _bad("`tokens` needs `kinds` too (prompt, policy or tool per token).")
    return {str(k): str(v) for k, v in raw.items()}


def _split(path: str) -> list[str]:
    """``"steps[].observation"`` -> ``["steps", "[]", "observation"]``."""
    out: list[str] = []
    for part in path.split("."):
        n = 0
        while part.endswith("[]"):
            part, n = part[:-2], n + 1
        if part:
            out.append(part)
        out.extend(["[]"] * n)
    return out


def lookup(obj: Any, path: str) -> Any:
    """The value at ``path`` (module docstring): a ``[]`` gives the list of the rest of the path
    over each element (missing ones left out); _MISSING when absent."""
    if isinstance(obj, dict) and path in obj:
        return obj[path]

    def walk(cur: Any, parts: list[str]) -> Any:
        for i, part in enumerate(parts):
            if part == "[]":
                if not isinstance(cur, list):
                    return _MISSING
                got = [walk(x, parts[i + 1 :]) for x in cur]
                return [g for g in got if g is not _MISSING]
            if isinstance(cur, dict) and part in cur:
                cur = cur[part]
            elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
                cur = cur[int(part)]
            else:
                return _MISSING
        return cur

    return walk(obj, _split(path))


def _get(rec: Record, mapping: dict[str, str], target: str, required: bool = False) -> Any:
    key = mapping.get(target)
    if key is None:
        return None
    v = lookup(rec.obj, key)
    if v is _MISSING:
        if required:
            raise rec.error("missing_field", f"field `{key}` (mapped to `{target}`) is missing.", field=key)
        return None
    return v


def _flat_lists(v: list[Any]) -> list[Any]:
    """``[]`` over lists of messages gives a list of lists: one after the other."""
    if v and all(isinstance(x, list) for x in v):
        return [m for x in v for m in x]
    return v


def _item_keys(items: list[Any], mapping: dict[str, str]) -> list[Any]:
    """Messages whose speaker and text sit under the mapped ``role``/``content`` keys, renamed."""
    rk, ck = mapping.get("role"), mapping.get("content")
    if rk is None and ck is None:
        return items
    out = []
    for m in items:
        if isinstance(m, dict):
            m = dict(m)
            if rk is not None and rk in m:
                m["role"] = str(m[rk])
            if ck is not None and ck in m:
                m["content"] = m[ck]
        out.append(m)
    return out


def episode_from_mapped(rec: Record, mapping: dict[str, str]) -> EpisodeIn:
    """One record read through ``mapping`` into a native episode."""
    if not isinstance(rec.obj, dict):
        raise rec.error("wrong_type", f"expected a JSON object per record, got {type(rec.obj).__name__}.")
    used = {_split(k)[0] for t, k in mapping.items() if t not in ITEM_KEYS}
    meta = record_meta(rec.obj, used, f"upload:{NAME}")
    task = _get(rec, mapping, "task")
    if task is not None:
        meta["task"] = str(task)
    group = _get(rec, mapping, "group")
    truncated = _get(rec, mapping, "truncated") is True
    reward = _get(rec, mapping, "reward")
    if isinstance(reward, dict | str):  # {"value": "C"}, "0.83", "pass": read as the reader does
        found = find_reward({"reward": reward})
        reward = found.value if found is not None else reward
    elif isinstance(reward, bool):
        reward = float(reward)
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
    ctx = _Ctx()
    msgs: list[Msg] = []
    if "messages" in mapping:
        key = mapping["messages"]
        items = _get(rec, mapping, "messages", required=True)
        if not isinstance(items, list):
            raise rec.error(
                "wrong_type", f"field `{key}` (mapped to `messages`) must be a list of messages.", field=key
            )
        msgs = read_messages(_item_keys(_flat_lists(items), mapping), ctx)
        if items and not msgs:
            raise rec.error(
                "wrong_type",
                f"field `{key}` (mapped to `messages`) holds no message the reader knows; name the "
                'keys of the speaker and the text with "role" and "content" in the mapping.',
                field=key,
            )
    else:
        msgs = _text_messages(rec, mapping, ctx)
    unknown_roles(ctx.unknown_roles)
    b = SpanBuilder()
    prompt_text = render(b, msgs)
    if group is None:
        group = find_group(rec.obj) if "group" not in mapping else None
    return chat_episode(
        b,
        rec,
        reward=reward,
        reward_field=mapping.get("reward", "reward"),
        group=group if group is not None else short_hash(prompt_text),
        meta=meta,
        truncated=truncated,
    )


def _text_messages(rec: Record, mapping: dict[str, str], ctx: _Ctx) -> list[Msg]:
    """The messages of the ``prompt``/``response``/``observation`` targets."""
    msgs: list[Msg] = []
    prompt = _get(rec, mapping, "prompt", required="prompt" in mapping)
    out_target = "response" if "response" in mapping else "completion"
    response = _get(rec, mapping, out_target, required=out_target in mapping)
    observation = _get(rec, mapping, "observation", required="observation" in mapping)
    for value, target in ((prompt, "prompt"), (response, out_target)):
        key = mapping.get(target, target)
        if value is None:
            continue
        if isinstance(value, list) and value and not all(isinstance(v, str) for v in value):
            msgs.extend(read_messages(_item_keys(_flat_lists(value), mapping), ctx))
        elif isinstance(value, (str, list)):
            texts = [value] if isinstance(value, str) else [str(v) for v in value]
            obs = observation if isinstance(observation, list) else [observation]
            for i, t in enumerate(texts):
                if target == "prompt":
                    msgs.append(Msg("prompt", "user", t))
                    continue
                msgs.append(Msg("policy", "assistant", t))
                if target != "prompt" and i < len(obs) and obs[i] is not None:
                    msgs.append(Msg("tool", "observation", text_of(obs[i])))
        else:
            raise rec.error(
                "wrong_type",
                f"field `{key}` (mapped to `{target}`) must be text or a list of messages.",
                field=key,
            )
    return msgs


def iter_mapped(data: bytes, mapping: dict[str, str]) -> Iterator[tuple[int | None, EpisodeIn]]:
    """(line, episode) of every record read through ``mapping``."""
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


def tree(first: Any, depth: int = 3, limit: int = 40) -> list[str]:
    """The record's tree, one line per field (``steps[]: list of 12 objects``), ``depth`` levels
    deep, lists shown by their first element, at most ``limit`` lines."""
    lines: list[str] = []

    def walk(v: Any, path: str, d: int) -> None:
        if len(lines) >= limit:
            return
        if isinstance(v, dict):
            if path:
                lines.append(f"{path}: object ({len(v)} keys)")
            if d > 0:
                for k, x in v.items():
                    walk(x, f"{path}.{k}" if path else str(k), d - 1)
        elif isinstance(v, list):
            kinds = {type(x).__name__ for x in v[:8]}
            what = "objects" if kinds == {"dict"} else ("lists" if kinds == {"list"} else "items")
            lines.append(f"{path or '(the record)'}: list of {len(v)} {what}")
            if v and d > 0 and isinstance(v[0], (dict, list)):
                walk(v[0], f"{path}[]", d - 1)
        else:
            lines.append(f"{path}: {_type(v)}")

    walk(first, "", depth)
    return lines[:limit]


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


def _dict_lists(obj: Any, path: str = "", depth: int = 3) -> Iterator[tuple[str, list[Any]]]:
    """(path, list) of every list of objects in ``obj``, ``[]`` through lists of records."""
    if isinstance(obj, dict) and depth > 0:
        for k, v in obj.items():
            p = f"{path}.{k}" if path else str(k)
            if isinstance(v, list) and v and isinstance(v[0], dict):
                yield p, v
                yield from _dict_lists(v[0], p + "[]", depth - 1)
            elif isinstance(v, dict):
                yield from _dict_lists(v, p, depth - 1)


def _speaker_and_text(items: list[Any]) -> tuple[str | None, str | None]:
    """(the key whose values look like speakers: short, few distinct; the key holding the longest
    text) over the first items of a list of objects."""
    head = [x for x in items[:20] if isinstance(x, dict)]
    keys = {k for x in head for k, v in x.items() if isinstance(v, str)}
    best_text, text_len = None, -1
    speaker, speaker_n = None, 1 << 30
    for k in sorted(keys):
        vals = [x[k] for x in head if isinstance(x.get(k), str)]
        mean = sum(len(v) for v in vals) / max(len(vals), 1)
        if mean > text_len:
            best_text, text_len = k, int(mean)
        distinct = len(set(vals))
        if mean <= 24 and 1 < distinct <= 6 and distinct < speaker_n:
            speaker, speaker_n = k, distinct
    return speaker, (best_text if best_text != speaker else None)


def suggest(first: Any) -> dict[str, str]:
    """A mapping filled from the first record: the path to the most message-like list (with the
    keys of speaker and text when the reader does not know them), the reward and group it finds."""
    out: dict[str, str] = {}
    cands = [c for c in candidates(first) if c.path]
    if cands:
        top = max(cands, key=lambda c: c.rank())
        out["messages"] = ".".join(top.path).replace(".[]", "[]")
    else:
        lists = sorted(_dict_lists(first), key=lambda kv: -len(kv[1]))
        if lists:
            path, items = lists[0]
            out["messages"] = path
            speaker, body = _speaker_and_text(items)
            if speaker:
                out["role"] = speaker
            if body:
                out["content"] = body
        else:
            seen = fields_seen(first, limit=200)
            text = [k for k, t in seen if t == "text"]
            for target, cands_ in (
                ("prompt", ("prompt", "input", "question", "query")),
                ("response", ("response", "output", "completion", "answer")),
            ):
                hit = next((k for k in text if k.split(".")[-1] in cands_), None)
                if hit:
                    out[target] = hit
            if not out and len(text) == 1:
                out["response"] = text[0]
            elif not out and text:
                # Texts under names that say nothing: the first is the prompt, the longest other
                # one what the model wrote.
                values = {k: str(lookup(first, k)) for k in text}
                out["prompt"] = text[0]
                out["response"] = max(text[1:], key=lambda k: len(values[k]))
    reward = find_reward(first) if isinstance(first, dict) else None
    if reward is not None:
        out["reward"] = reward.key
    else:
        seen = fields_seen(first, limit=200)
        hit = next((k for k, t in seen if t == "number" and k.split(".")[-1] in REWARD_NAMES), None)
        if hit:
            out["reward"] = hit
    if isinstance(first, dict):
        hit = next((k for k in GROUP_NAMES if isinstance(first.get(k), (str, int)) and k != "task"), None)
        if hit:
            out["group"] = hit
    return out or {"messages": "<path of the message list>", "reward": "<path of the reward>"}


def unknown_format_hint(first: Any) -> str:
    """The part of the 422 that shows the record's tree and proposes a mapping."""
    lines = tree(first)
    shown = "; ".join(lines) if lines else type(first).__name__
    example = json.dumps(suggest(first))
    return (
        f"The first record's tree: {shown}. Proposed mapping={example} — send it as "
        "POST /api/uploads?mapping=… (or `creditlens upload --map '…'`, or the button on the upload "
        "page); paths take dots and [] (steps[].observation); fields it can fill: " + ", ".join(TARGETS) + "."
    )
