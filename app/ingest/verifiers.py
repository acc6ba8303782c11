"""verifiers / prime-rl evaluation results (``vf-eval`` / ``prime eval`` ``results.jsonl``): one
rollout per line.

* ``prompt`` and ``completion``: chat message lists (or plain strings). The prompt is prompt
  tokens; the completion follows the message rule of app/ingest/_chat.py: each assistant message
  is one policy turn (its text, split by the tool-span text rule, and its ``tool_calls``, given as
  objects or as JSON strings of objects, rendered ``<tool_call>name {arguments}</tool_call>``),
  ``tool`` messages are tool tokens and other roles (an environment's user turns) prompt;
* ``reward`` is the outcome; the per-reward-function columns (``correct_answer_reward_func``,
  ...), ``answer``, ``task``, ``info`` and the other scalar columns go to meta;
* the rollouts of one example share ``example_id`` (older files: ``id``): that is the group
  (else a hash of the prompt). An empty ``completion`` (a failed generation) is one empty
  assistant turn: its ``<|end|>`` is the only policy token.
"""

from __future__ import annotations

from typing import Any

from app.core.schemas import EpisodeIn
from app.ingest._chat import render_messages
from app.ingest._common import Record, as_float, scalar_meta, short_hash
from app.ingest._document import Document
from app.ingest._registry import register_format
from app.ingest._spans import SpanBuilder, content_text


def sniff(doc: Document) -> bool:
    first = doc.first
    return (
        isinstance(first, dict)
        and "prompt" in first
        and "completion" in first
        and isinstance(first["prompt"], (list, str))
        and isinstance(first["completion"], (list, str))
        and ("reward" in first or "example_id" in first)
    )


def _messages(value: Any, rec: Record, field: str) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": "user" if field == "prompt" else "assistant", "content": value}]
    if not isinstance(value, list):
        raise rec.error("wrong_type", f"field `{field}` must be a list of chat messages or a string.", field)
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise rec.error(
                "wrong_type",
                f"field `{field}[{i}]` must be a chat message with a `role`.",
                f"{field}[{i}].role",
            )
    return value


def episode_from_record(rec: Record) -> EpisodeIn:
    obj = rec.obj
    if not isinstance(obj, dict):
        raise rec.error("wrong_type", "expected a JSON object (one rollout) per line.")
    for key in ("prompt", "completion"):
        if key not in obj:
            raise rec.error("missing_field", f"required field `{key}` is missing.", key)
    b = SpanBuilder()
    prompt = _messages(obj["prompt"], rec, "prompt")
    prompt_text = []
    for i, m in enumerate(prompt):
        text = content_text(m.get("content"), rec, f"prompt[{i}].content")
        b.message(m["role"], text, "prompt")
        prompt_text.append(f"{m['role']}:{text}")
    completion = _messages(obj["completion"], rec, "completion")
    if not completion or completion == [{"role": "assistant", "content": ""}]:
        # A failed generation: the model's (empty) answer is its stop token, as TRL shows one.
        completion = [{"role": "assistant", "content": ""}]
    render_messages(b, completion, rec, "completion")  # the one message rule (app/ingest/_chat.py)
    meta: dict[str, Any] = scalar_meta(obj, {"reward", "prompt", "completion"})
    for key in ("info", "answer", "metrics"):
        if isinstance(obj.get(key), (dict, list)):
            meta[key] = obj[key]
    group = obj.get("example_id", obj.get("id"))
    return b.episode(
        reward=as_float(obj.get("reward"), rec, "reward"),
        group=str(group) if group is not None else short_hash("\n".join(prompt_text)),
        meta=meta,
    )


register_format(
    name="verifiers",
    description=(
        "verifiers / prime-rl eval results JSONL (prompt, completion as chat messages, reward, example_id)"
    ),
    priority=30,
    sniff=sniff,
    record=episode_from_record,
)
