"""verl ``rollout_data_dir`` / ``validation_data_dir`` JSONL: ``input``, ``output``, ``score``,
``step`` (+ ``gts``, ``request_id``, reward extras). Text only: ``input`` becomes prompt tokens and
``output`` policy tokens, tokenised with the offline tokenizer (app/core/tokenize.py); ``score`` is the
outcome reward. A multi-turn ``output`` (verl's agent loop decodes the whole response with the chat
template's special tokens stripped) interleaves the policy's text with the tool responses the
environment appended: ``…</tool_call>user\n<tool_response>…</tool_response>\nassistant\n…``. The
text rule of app/ingest/_chat.py splits it: the ``<tool_response>`` blocks are tool tokens, the role
lines around them template (prompt) tokens, and each stretch of policy text is one turn. Group:
``uid`` if present, else a hash of ``input`` (GRPO samples the same prompt several times)."""

from __future__ import annotations

from app.core.schemas import EpisodeIn
from app.core.tokenize import tokenize
from app.ingest._chat import add_text
from app.ingest._common import Record, as_float, scalar_meta, short_hash
from app.ingest._document import Document
from app.ingest._registry import register_format
from app.ingest._spans import SpanBuilder

NAME = "verl_rollout"


def sniff(doc: Document) -> bool:
    return isinstance(doc.first, dict) and "input" in doc.first and "output" in doc.first


def episode_from_record(rec: Record) -> EpisodeIn:
    obj = rec.obj
    if not isinstance(obj, dict):
        raise rec.error("wrong_type", "expected a JSON object with `input`, `output` and `score`.")
    for f in ("input", "output"):
        if not isinstance(obj.get(f), str):
            raise rec.error(
                "missing_field" if f not in obj else "wrong_type", f"field `{f}` must be a string.", f
            )
    score = obj.get("score")
    if isinstance(score, dict):  # reward functions that return a dict keep the scalar under "score"
        score = score.get("score")
    reward = as_float(score, rec, "score")
    b = SpanBuilder()
    b.add(tokenize(obj["input"]), "prompt")
    add_text(b, obj["output"])
    meta = scalar_meta(obj, {"input", "output", "score", "uid"})
    if "data_source" in obj:
        meta.setdefault("task", obj["data_source"])
    meta["source"] = f"upload:{NAME}"
    return b.episode(reward=reward, group=str(obj.get("uid") or short_hash(obj["input"])), meta=meta)


register_format(
    name=NAME,
    description="verl rollout_data_dir JSONL (input, output, score, step): text only, re-tokenised",
    priority=31,  # after verifiers (30): a record with the keys of both stays verifiers
    sniff=sniff,
    record=episode_from_record,
)
