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

With the rollout's ``trajectory`` saved (``vf-eval --state-columns trajectory``; verifiers 0.1.8 and
later: one ``TrajectoryStep`` per model call, ``tokens`` = ``prompt_ids``, ``completion_ids``,
``completion_mask``, ``completion_logprobs``) and ids on every step, the episode is those ids as
they were sampled (token-in/token-out, app/ingest/_drift.py): the first step's prompt ids prompt,
then per step the new part of its prompt (tool when a ``tool`` message came in since the step
before, else prompt) and its completion ids (``completion_mask`` 1 policy, 0 tool) with
``completion_logprobs`` -> ``logprobs``; a prompt that re-renders the ids sampled before it is
accepted and measured in ``meta.drift`` (prime-rl's "exact prefix" broken). Shown through a
``tokenizer`` part, else as ``⟨id⟩``.
"""

from __future__ import annotations

from typing import Any

from app.core.schemas import EpisodeIn
from app.ingest._chat import render_messages
from app.ingest._common import Record, as_float, float_list, scalar_meta, short_hash
from app.ingest._document import Document
from app.ingest._drift import TurnAssembler, keep_drift
from app.ingest._ids import shown_tokens
from app.ingest._registry import register_format
from app.ingest._spans import SpanBuilder, content_text
from app.ingest._tokenizer import TokenDecoder


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


def _token_steps(obj: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The trajectory's steps' ``tokens`` when every step has prompt and completion ids."""
    traj = obj.get("trajectory")
    if not isinstance(traj, list) or not traj:
        return None
    steps = []
    for step in traj:
        tok = step.get("tokens") if isinstance(step, dict) else None
        if not (
            isinstance(tok, dict) and isinstance(tok.get("prompt_ids"), list) and tok.get("completion_ids")
        ):
            return None
        steps.append(step)
    return steps


def _id_list(v: Any, rec: Record, field: str) -> list[int]:
    if not isinstance(v, list) or not all(
        isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v
    ):
        raise rec.error("wrong_type", f"field `{field}` must be a list of token ids.", field)
    return v


def _new_kind(prev: dict[str, Any], step: dict[str, Any]) -> str:
    """tool when a ``tool`` message came into the prompt since the step before, else prompt."""
    p, q = prev.get("prompt"), step.get("prompt")
    done = prev.get("completion")
    if isinstance(p, list) and isinstance(q, list) and isinstance(done, list):
        new = q[len(p) + len(done) :]
        return "tool" if any(isinstance(m, dict) and m.get("role") == "tool" for m in new) else "prompt"
    return "tool"


def _token_fields(
    steps: list[dict[str, Any]], rec: Record, tokenizer: TokenDecoder | None, meta: dict[str, Any]
) -> dict[str, Any]:
    """The episode's fields from the trajectory's token ids, as sampled."""
    asm = TurnAssembler()
    logprobs: list[float] | None = []
    reasons: list[str] = []
    at: list[int] = []
    for k, step in enumerate(steps):
        tok, f = step["tokens"], f"trajectory[{k}].tokens"
        prompt = _id_list(tok["prompt_ids"], rec, f + ".prompt_ids")
        comp = _id_list(tok["completion_ids"], rec, f + ".completion_ids")
        raw = tok.get("completion_mask")
        raw = raw if isinstance(raw, list) else [1] * len(comp)
        mask = [bool(m) for m in raw[: len(comp)]] + [False] * (len(comp) - len(raw))
        kinds = ["policy" if m else "tool" for m in mask]
        n_new = asm.add_turn(prompt, comp, _new_kind(steps[k - 1], step) if k else "prompt", kinds)
        if len(raw) != len(comp):  # kept: the ids without an entry untrained (the audit's mask_misaligned)
            start = len(asm.ids) - len(comp)
            reasons.append(f"`{f}.completion_mask` has {len(raw)} entries for {len(comp)} completion ids")
            at += [start + i for i in range(min(len(raw), len(comp)), len(comp))] or [len(asm.ids) - 1]
        lp = tok.get("completion_logprobs")
        if logprobs is not None and isinstance(lp, list) and len(lp) == len(comp):
            vals = float_list(lp, rec, f + ".completion_logprobs", len(comp)) or []
            logprobs += [0.0] * n_new + vals
        else:
            logprobs = None
    ids = asm.ids
    tokens = shown_tokens(ids, tokenizer, meta)
    keep_drift(meta, asm.drift, tokenizer)
    if reasons:
        meta["mask_misaligned"] = {"reason": "; ".join(reasons), "at": at}
    return {
        "tokens": tokens,
        "kinds": asm.kinds,
        "turn_ids": asm.turns,
        "token_ids": ids,
        "logprobs": logprobs,
    }


def episode_from_record(rec: Record, tokenizer: TokenDecoder | None = None) -> EpisodeIn:
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
    steps = _token_steps(obj)
    fields = {} if steps is None else _token_fields(steps, rec, tokenizer, meta)
    ep = b.episode(
        reward=as_float(obj.get("reward"), rec, "reward"),
        group=str(group) if group is not None else short_hash("\n".join(prompt_text)),
        meta=meta,
    )
    return ep.model_copy(update=fields) if fields else ep


register_format(
    name="verifiers",
    description=(
        "verifiers / prime-rl eval results JSONL (prompt, completion as chat messages, reward, example_id)"
    ),
    priority=30,
    sniff=sniff,
    record=episode_from_record,
    takes_tokenizer=True,
)
