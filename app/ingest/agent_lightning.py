"""agent-lightning store archives: one record per rollout, ``{"rollout": {...}, "events": [...],
"reward": ...}`` — the rollout (``rollout_id``, ``input``, ``status``, …) and the LLM calls its
agent made through agent-lightning's LLM proxy, in order (``spans`` is read the same way).

An event is one model call: ``request.messages`` (the chat it was sent), the proxy's vLLM answer
``response`` with ``prompt_token_ids`` (on the event or on the response) and
``choices[0].token_ids`` (vLLM's ``return_token_ids``), ``choices[0].message`` and optional
``choices[0].logprobs.content[].logprob``. A streamed call's ``response`` is its list of chunks:
their ``choices[0].delta.content``, ``token_ids`` and logprobs are joined in order.

* tokens: when every call has prompt and response ids, the episode is those ids as they were
  sampled (token-in/token-out, app/ingest/_drift.py): the first call's prompt ids are prompt; a
  later call's prompt adds only what follows the ids sampled before it, what the environment
  appended between the calls (tool tokens); a prompt that re-renders those ids as other ids (a
  tool call re-serialised by the chat template) is accepted and measured in ``meta.drift`` (per
  turn: the re-rendered ids, how many sampled ids differ, the first differing pair), the episode
  keeping the sampled ids; a prompt that replaces the context (the agent rebuilt it: it departs
  inside an earlier prompt and keeps less than half of what followed) is prompt again; each
  response is policy, one turn per call, with its logprobs. Shown through a ``tokenizer`` part
  (tool blocks left inside a response then follow the text rule of app/ingest/_chat.py), else as
  ``⟨id⟩``;
* otherwise the text: the first call's messages and, for each later call, the messages added since
  the one before, by the shared message rule (app/ingest/_chat.py), each response as a policy turn;
* ``reward`` (else ``rollout.final_reward``/``rollout.reward``) is the outcome — none: ``null``;
  group: ``rollout.input``'s ``task_id``/``id``, else a hash of the first prompt.
"""

from __future__ import annotations

from typing import Any

from app.core.schemas import EpisodeIn
from app.ingest._chat import chat_episode, piece_kinds, record_meta, render_messages, render_policy
from app.ingest._common import Record, scalar_meta, short_hash, sub_object
from app.ingest._document import Document
from app.ingest._drift import TurnAssembler, keep_drift
from app.ingest._ids import shown_tokens
from app.ingest._registry import register_format
from app.ingest._spans import SpanBuilder, content_text
from app.ingest._tokenizer import TokenDecoder

NAME = "agent_lightning"
EVENT_KEYS = ("events", "spans")


def _events(obj: Any) -> tuple[str, list[Any]] | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("rollout"), dict):
        return None
    for key in EVENT_KEYS:
        if isinstance(obj.get(key), list):
            return key, obj[key]
    return None


def sniff(doc: Document) -> bool:
    return _events(doc.first) is not None


class _Call:
    """One model call, streamed chunks joined: prompt ids, response ids, text, tool calls, logprobs."""

    def __init__(self, ev: dict[str, Any], rec: Record, f: str) -> None:
        resp = ev.get("response")
        chunks = resp if isinstance(resp, list) else [resp] if isinstance(resp, dict) else []
        self.prompt_ids = ev.get("prompt_token_ids")
        self.ids: list[int] | None = []
        self.logprobs: list[Any] | None = []  # checked to be numbers below
        texts: list[str] = []
        self.tool_calls: list[Any] = []
        for j, ch in enumerate(chunks):
            if not isinstance(ch, dict):
                raise rec.error(
                    "wrong_type", f"field `{f}.response[{j}]` must be an object.", field=f + ".response"
                )
            if self.prompt_ids is None and isinstance(ch.get("prompt_token_ids"), list):
                self.prompt_ids = ch["prompt_token_ids"]
            choices = ch.get("choices")
            c = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
            msg = c.get("message") if isinstance(c.get("message"), dict) else c.get("delta")
            if isinstance(msg, dict):
                texts.append(
                    content_text(msg.get("content"), rec, f + ".response.choices[0].message.content")
                )
                self.tool_calls += [t for t in msg.get("tool_calls") or [] if t]
            ids = c.get("token_ids")
            if isinstance(ids, list) and self.ids is not None:
                self.ids += ids
            else:
                self.ids = None
            lp = c.get("logprobs")
            content = lp.get("content") if isinstance(lp, dict) else None
            if isinstance(content, list) and self.logprobs is not None:
                self.logprobs += [x.get("logprob") if isinstance(x, dict) else None for x in content]
            else:
                self.logprobs = None
        self.text = "".join(texts)
        self.messages = None
        req = ev.get("request")
        msgs = req.get("messages") if isinstance(req, dict) else ev.get("messages")
        if isinstance(msgs, list):
            self.messages = msgs
        for name, v in (("prompt_token_ids", self.prompt_ids), ("response.choices[0].token_ids", self.ids)):
            if v is not None and not all(
                isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v
            ):
                raise rec.error(
                    "wrong_type", f"field `{f}.{name}` must be a list of token ids.", field=f"{f}.{name}"
                )
        if self.ids is not None and self.logprobs is not None:
            if len(self.logprobs) != len(self.ids) or any(
                not isinstance(x, (int, float)) for x in self.logprobs
            ):
                self.logprobs = None

    @property
    def has_ids(self) -> bool:
        return isinstance(self.prompt_ids, list) and bool(self.ids)


def _token_episode(calls: list[_Call], tokenizer: TokenDecoder | None) -> dict[str, Any]:
    """The calls as they were sampled (app/ingest/_drift.py): a later call's prompt adds only what
    follows the ids sampled before it (tool); one that re-renders them is kept with its drift
    (``meta.drift``); one that replaces the context starts over as prompt."""
    asm = TurnAssembler(restarts=True)
    logprobs: list[float] | None = []
    for c in calls:
        n_new = asm.add_turn(list(c.prompt_ids or []), list(c.ids or []), "tool")
        if logprobs is not None and c.logprobs is not None:
            logprobs += [0.0] * n_new + [float(x) for x in c.logprobs]
        else:
            logprobs = None
    ids, kinds = asm.ids, asm.kinds
    meta: dict[str, Any] = {}
    tokens = shown_tokens(ids, tokenizer, meta)
    if tokenizer is not None:
        kinds = piece_kinds(tokens, kinds)  # tool blocks left inside a response (text rule)
    keep_drift(meta, asm.drift, tokenizer)
    return {
        "tokens": tokens,
        "kinds": kinds,
        "turns": asm.turns,
        "ids": ids,
        "logprobs": logprobs,
        "meta": meta,
    }


def episode_from_record(rec: Record, tokenizer: TokenDecoder | None = None) -> EpisodeIn:
    found = _events(rec.obj)
    if found is None:
        raise rec.error(
            "missing_field",
            "required fields `rollout` and `events` (the LLM calls) are missing.",
            field="events",
        )
    key, events = found
    if not events:
        raise rec.error(
            "empty_episode", f"field `{key}` has no LLM calls; there is nothing to show.", field=key
        )
    calls = []
    for i, ev in enumerate(events):
        if not isinstance(ev, dict):
            raise rec.error("wrong_type", f"field `{key}[{i}]` must be an event object.", field=f"{key}[{i}]")
        calls.append(_Call(ev, rec, f"{key}[{i}]"))
    obj = rec.obj
    rollout = obj["rollout"]
    meta = record_meta(obj, {"reward", key, "rollout"}, f"upload:{NAME}")
    meta.update({f"rollout.{k}": v for k, v in scalar_meta(rollout, {"input"}).items()})
    reward = obj.get("reward", rollout.get("final_reward", rollout.get("reward")))
    inp = sub_object(rollout, "input")
    group = obj.get("group") or inp.get("task_id") or inp.get("id")
    b = SpanBuilder()
    prompt = ""
    seen = 0
    for k, c in enumerate(calls):
        if c.messages is not None:
            text = render_messages(b, c.messages[seen:], rec, f"{key}[{k}].request.messages", k > 0)
            prompt = prompt or text
            seen = len(c.messages)
        render_policy(b, c.text, c.tool_calls, rec, f"{key}[{k}].response")
        seen += 1  # the call's own answer is in the next call's messages
    fields: dict[str, Any] = {}
    if all(c.has_ids for c in calls):
        t = _token_episode(calls, tokenizer)
        b.tokens, b.kinds, b.turn_ids = t["tokens"], t["kinds"], t["turns"]
        fields = {"token_ids": t["ids"], "logprobs": t["logprobs"]}
        meta.update(t["meta"])
    ep = chat_episode(
        b,
        rec,
        reward=reward,
        reward_field="reward",
        group=group if group is not None else short_hash(prompt or str(calls[0].prompt_ids)),
        meta=meta,
        truncated=rollout.get("status") in ("timeout", "truncated"),
    )
    if fields:
        ep = ep.model_copy(update=fields)
    return ep


register_format(
    name=NAME,
    description=(
        "agent-lightning store archive (rollout + LLM-call events with prompt_token_ids, choices[].token_ids)"
    ),
    priority=26,
    sniff=sniff,
    record=episode_from_record,
    takes_tokenizer=True,
)
