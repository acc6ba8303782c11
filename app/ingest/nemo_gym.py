"""NeMo Gym rollouts (``ng_collect_rollouts`` JSONL): one rollout per line, OpenAI Responses API
shaped.

* the prompt is ``responses_create_params.input`` (a string or a list of message items; an
  ``instructions`` string is a system message before it);
* ``response.output[]`` items: ``message`` (role assistant), ``reasoning`` and ``function_call``
  are policy, ``function_call_output`` is tool; a ``message`` of another role (a simulated user)
  is prompt. A run of policy items between two non-policy items is one turn (one model call);
* tokens: when every turn ends with an item carrying non-empty ``generation_token_ids`` (NeMo
  Gym's vLLM model server adds ``prompt_token_ids``, ``generation_token_ids`` and
  ``generation_log_probs``), the episode is those ids, as NeMo-RL assembles them: the first
  turn's ``prompt_token_ids`` are prompt, each later turn's new prompt ids (what the environment
  appended) are tool when a ``function_call_output`` came between, else prompt, and the
  generation ids are policy with ``generation_log_probs`` as ``logprobs``. Otherwise (no ids,
  empty id lists, or ids on some turns only) the items' text is shown, split by the offline
  tokenizer;
* ``reward`` (else ``response.reward``) is the outcome; ``truncated`` (or an
  ``incomplete_details`` reason) marks a truncated episode, ``terminated`` goes to meta;
* rollouts of one task share ``_ng_task_index``: that is the group (else a hash of the prompt).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from app.core.schemas import EpisodeIn
from app.core.tokenize import tokenize
from app.ingest._chat import add_text
from app.ingest._common import Record, as_float, float_list, id_token, scalar_meta, short_hash
from app.ingest._document import Document
from app.ingest._drift import TurnAssembler, name_rerenders
from app.ingest._registry import register_format
from app.ingest._spans import SpanBuilder, arguments_text, content_text
from app.ingest._tokenizer import TokenDecoder

POLICY_ITEMS = ("reasoning", "function_call")


def sniff(doc: Document) -> bool:
    first = doc.first
    if not (
        isinstance(first, dict)
        and isinstance(first.get("responses_create_params"), dict)
        and isinstance(first.get("response"), dict)
    ):
        return False
    # Output as a list of transitions (message lists: the verifiers bridge's
    # `contains_transitions`) is the structural reader's (app/ingest/transcript.py).
    output = first["response"].get("output")
    return not (isinstance(output, list) and output and isinstance(output[0], list))


def _is_policy(item: dict[str, Any]) -> bool:
    t = item.get("type", "message")
    return t in POLICY_ITEMS or (t == "message" and item.get("role", "assistant") == "assistant")


def _ids(item: dict[str, Any], key: str) -> list[Any] | None:
    v = item.get(key)
    return v if isinstance(v, list) and v else None


def _ints(v: list[Any]) -> bool:
    arr = np.asarray(v)
    return arr.ndim == 1 and arr.dtype.kind in "iu" and bool not in set(map(type, v))


def _int_list(v: Any, rec: Record, field: str) -> list[int]:
    # One numpy conversion checks the list (booleans, floats and nulls give another dtype); a turn's
    # prompt ids are thousands long and every turn repeats them.
    if isinstance(v, list) and (not v or _ints(v)):
        return v
    raise rec.error("wrong_type", f"field `{field}` must be a list of token ids (integers).", field=field)


def _token_mode(output: list[Any]) -> bool:
    """True when every run of policy items ends with an item carrying generation ids."""
    saw = False
    for i, item in enumerate(output):
        if not isinstance(item, dict) or not _is_policy(item):
            continue
        nxt = output[i + 1] if i + 1 < len(output) else None
        if isinstance(nxt, dict) and _is_policy(nxt):
            continue  # not the last item of its run
        if _ids(item, "generation_token_ids") is None:
            return False
        saw = True
    return saw


def _input_messages(b: SpanBuilder, params: dict[str, Any], rec: Record) -> str:
    """Render the prompt; returns its text (for the default group)."""
    texts = []
    instr = params.get("instructions")
    if isinstance(instr, str) and instr:
        b.message("system", instr, "prompt")
        texts.append(instr)
    inp = params.get("input")
    if isinstance(inp, str):
        b.message("user", inp, "prompt")
        return "\n".join([*texts, inp])
    if inp is None:
        inp = []
    if not isinstance(inp, list):
        raise rec.error(
            "wrong_type",
            "field `responses_create_params.input` must be a string or a list of items.",
            field="responses_create_params.input",
        )
    for j, item in enumerate(inp):
        f = f"responses_create_params.input[{j}]"
        if not isinstance(item, dict):
            raise rec.error("wrong_type", f"field `{f}` must be an object.", field=f)
        _render_item(b, item, rec, f, seeded=True)
        texts.append(str(item.get("content", item.get("output", ""))))
    return "\n".join(texts)


def _render_item(b: SpanBuilder, item: dict[str, Any], rec: Record, f: str, seeded: bool = False) -> None:
    """One Responses item as text spans. ``seeded``: a prior turn given in the input (prompt)."""
    t = item.get("type", "message")
    pol = "prompt" if seeded else "policy"
    if t == "message":
        role = item.get("role", "assistant")
        text = content_text(item.get("content"), rec, f + ".content")
        if role == "assistant":
            b.open_assistant()
            if seeded:
                b.text(text, pol)
            else:  # tool spans left inside the text (app/ingest/_chat.py text rule)
                add_text(b, text)
            b.add(["<|end|>"], pol)
            b.add(["\n"], "prompt")
        else:
            b.message(str(role), text, "prompt")
    elif t == "reasoning":
        text = content_text(item.get("summary"), rec, f + ".summary") + content_text(
            item.get("content"), rec, f + ".content"
        )
        b.add(["<think>"], pol)
        b.text(text, pol)
        b.add(["</think>"], pol)
    elif t == "function_call":
        name = item.get("name")
        if not isinstance(name, str):
            raise rec.error("missing_field", f"field `{f}.name` is missing.", field=f + ".name")
        b.add(
            [
                "<tool_call>",
                *tokenize(" " + name + " " + arguments_text(item.get("arguments"))),
                "</tool_call>",
            ],
            pol,
        )
    elif t == "function_call_output":
        out = item.get("output")
        b.message("tool", out if isinstance(out, str) else content_text(out, rec, f + ".output"), "tool")
    else:  # other item types (web_search_call, ...): shown, never trained on
        b.message(str(t), content_text(item.get("content"), rec, f + ".content"), "prompt")


def _text_episode(rec: Record, output: list[Any]) -> tuple[SpanBuilder, str]:
    b = SpanBuilder()
    prompt = _input_messages(b, rec.obj["responses_create_params"], rec)
    for i, item in enumerate(output):
        f = f"response.output[{i}]"
        if not isinstance(item, dict):
            raise rec.error("wrong_type", f"field `{f}` must be an object.", field=f)
        if not _is_policy(item):
            b.end_turn()
        _render_item(b, item, rec, f)
    return b, prompt


def _token_episode(
    rec: Record, output: list[Any], tokenizer: TokenDecoder | None
) -> tuple[list[str], list[str], list[int], list[int], list[float] | None, list[int] | None, list[Any]]:
    """The episode as it was sampled (token-in/token-out): the first turn's prompt ids, then per
    turn its generation ids (policy) and the new part of the next turn's prompt (tool when a
    function call or its output came between, else prompt). A prompt that re-renders the ids
    sampled before it differently is measured (app/ingest/_drift.py), not refused: the last item
    returned is the drift of each such turn (``meta.drift``)."""
    asm = TurnAssembler()
    logprobs: list[float] = []
    have_lp = True
    tool_between = False
    calls = False  # this turn sampled a function call: the next prompt holds its output
    for i, item in enumerate(output):
        if not isinstance(item, dict):
            continue
        if item.get("type") == "function_call_output":
            tool_between = True
        calls = calls or item.get("type") == "function_call"
        gen = _ids(item, "generation_token_ids")
        if gen is None:
            continue
        f = f"response.output[{i}]"
        gen = _int_list(gen, rec, f + ".generation_token_ids")
        prompt = _int_list(item.get("prompt_token_ids") or [], rec, f + ".prompt_token_ids")
        n_new = asm.add_turn(prompt, gen, "tool" if tool_between else "prompt")
        logprobs += [0.0] * n_new
        lp = item.get("generation_log_probs")
        if lp is None:
            have_lp = False
            logprobs += [0.0] * len(gen)
        else:
            lp = float_list(lp, rec, f + ".generation_log_probs", len(gen), f + ".generation_token_ids")
            logprobs += lp or []
        tool_between, calls = calls, False
    ids = asm.ids
    special = None
    if tokenizer is not None:
        tokens, special = tokenizer.row(np.asarray(ids, dtype=np.int64))
        name_rerenders(asm.drift, tokenizer)
    else:
        tokens = [id_token(x) for x in ids]
    return tokens, asm.kinds, asm.turns, ids, (logprobs if have_lp else None), special, asm.drift


def episode_from_record(rec: Record, tokenizer: TokenDecoder | None = None) -> EpisodeIn:
    obj = rec.obj
    if not isinstance(obj, dict) or not isinstance(obj.get("responses_create_params"), dict):
        raise rec.error(
            "missing_field",
            "required field `responses_create_params` (the request: input, tools) is missing.",
            field="responses_create_params",
        )
    resp = obj.get("response")
    if not isinstance(resp, dict):
        raise rec.error("missing_field", "required field `response` (with `output`) is missing.", "response")
    output = resp.get("output") or []
    if not isinstance(output, list):
        raise rec.error("wrong_type", "field `response.output` must be a list of items.", "response.output")
    reward = as_float(obj.get("reward", resp.get("reward")), rec, "reward")
    meta: dict[str, Any] = scalar_meta(obj, {"reward", "truncated"})
    meta.update(
        {f"response.{k}": v for k, v in scalar_meta(resp, {"reward", "object", "created_at"}).items()}
    )
    agent = obj.get("agent_ref")
    if isinstance(agent, dict) and isinstance(agent.get("name"), str):
        meta["agent"] = agent["name"]
    if isinstance(resp.get("metrics"), dict):
        meta["metrics"] = resp["metrics"]
    incomplete = resp.get("incomplete_details")
    truncated = bool(obj.get("truncated", False)) or bool(
        isinstance(incomplete, dict) and incomplete.get("reason")
    )
    b, prompt = _text_episode(rec, output)
    if _token_mode(output):
        tokens, kinds, turns, ids, logprobs, special, drift = _token_episode(rec, output, tokenizer)
        if special:
            meta["special_tokens"] = special
        if drift:
            meta["drift"] = drift
        fields: dict[str, Any] = {"token_ids": ids, "logprobs": logprobs}
    else:
        tokens, kinds, turns = b.tokens, b.kinds, b.turn_ids
        fields = {}
    group = obj.get("_ng_task_index", obj.get("task_index"))
    b.tokens, b.kinds, b.turn_ids = tokens, kinds, turns  # the ids replace the text in token mode
    return b.episode(
        reward=reward,
        group=str(group) if group is not None else short_hash(prompt),
        truncated=truncated,
        meta=meta,
        **fields,
    )


register_format(
    name="nemo_gym",
    description=(
        "NeMo Gym rollouts JSONL (responses_create_params, response.output items, reward, _ng_task_index)"
    ),
    priority=15,
    sniff=sniff,
    record=episode_from_record,
    takes_tokenizer=True,
)
