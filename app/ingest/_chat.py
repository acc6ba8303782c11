"""The one rule for agent trajectories stored as chat messages (tau-bench, SWE-agent, OpenHands,
AgentBench, agent-lightning): which message is the policy's, which is tool output, which is
prompt; and the rule for tool spans inside text (Hermes/Qwen ``<tool_response>`` blocks and the
role headers a stripped chat template leaves behind).

**Messages** (:func:`message_kind`), first match wins:

1. a demonstration (``is_demo: true``, SWE-agent) is prompt: it sits in the prompt, the policy
   did not write it;
2. tool output: ``role`` is ``tool``, ``function``, ``ipython``, ``observation`` or
   ``environment``; or ``message_type`` is ``observation`` (SWE-agent); or it is an event with an
   ``observation`` key or whose ``source`` is ``environment`` (OpenHands);
3. policy: ``role`` is ``assistant``, ``agent`` (AgentBench), ``model`` or ``gpt``; or an event
   whose ``source`` is ``agent`` with an ``action`` other than ``system``/``recall`` (OpenHands);
4. everything else (system, user, a simulated user, task text) is prompt;

and tool output before the policy's first message is prompt: it is the task the environment
opened with (SWE-agent sends the problem statement as an observation), not the answer to a call.

A policy message is one turn: its text and tool calls (objects or JSON strings) are policy,
rendered as in openai_chat.py (``<|assistant|>`` header prompt, ``<|end|>`` policy).

**Text** (:func:`text_spans`), for text-only data (verl rollout ``output``, any assistant text):
a ``<tool_response>…</tool_response>`` block is tool tokens; the template around it — a
``<|im_start|>role`` header, ``<|im_end|>``, and the bare ``user``/``tool``/``assistant`` lines a
stripped template leaves on their own line next to the block — is prompt (template) tokens;
``<tool_call>…</tool_call>`` and everything else stays policy, and each stretch of policy text
between two tool blocks is one turn. The rule reads characters, so it applies the same to text
split by the offline tokenizer and to a tokenizer's decoded pieces (:func:`piece_kinds`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from app.core.schemas import EpisodeIn
from app.core.tokenize import tokenize
from app.ingest._common import Record, as_float, scalar_meta
from app.ingest._spans import SpanBuilder, content_text, parse_tool_call

TOOL_ROLES = frozenset({"tool", "function", "ipython", "observation", "environment"})
POLICY_ROLES = frozenset({"assistant", "agent", "model", "gpt"})
# Keys under which a record keeps its messages, in the order they are looked for.
MESSAGE_KEYS = ("messages", "traj", "history", "conversation", "trajectory")


def message_kind(msg: dict[str, Any], after_policy: bool = True) -> str:
    """The kind ("policy", "tool" or "prompt") of one chat message or event by the rule in the
    module docstring; ``after_policy``: a policy message came before this one."""
    if msg.get("is_demo") is True:
        return "prompt"
    role = msg.get("role")
    if (
        role in TOOL_ROLES
        or msg.get("message_type") == "observation"
        or "observation" in msg
        or msg.get("source") == "environment"
    ):
        return "tool" if after_policy else "prompt"
    if role in POLICY_ROLES:
        return "policy"
    if msg.get("source") == "agent" and "action" in msg and msg["action"] not in ("system", "recall"):
        return "policy"
    return "prompt"


# ---- tool spans in text ---------------------------------------------------------------------

# One observation block: optional template before it (an <|im_start|>role header or a bare role
# line; the <|im_end|> before it closes the policy's text and stays policy), one or more <tool_response> blocks, optional template after it (the closing
# <|im_end|> and the next <|im_start|>assistant header or bare "assistant" line).
_ROLE = r"(?:user|tool|observation|ipython|function)"
_BLOCK = re.compile(
    r"(?P<pre>\s*(?:<\|im_start\|>" + _ROLE + r"\n|(?:(?<=\n)|(?<=^)|(?<=>))" + _ROLE + r"\n)?)"
    r"(?P<body>(?:\s*<tool_response>.*?</tool_response>)+)"
    r"(?P<post>\s*(?:<\|im_end\|>)?\s*(?:<\|im_start\|>assistant\n|assistant\n)?)",
    re.DOTALL,
)
_RESPONSE = re.compile(r"<tool_response>.*?</tool_response>", re.DOTALL)
# Any other template message: <|im_start|>role ... <|im_end|> of a non-assistant role is prompt.
_IM_OTHER = re.compile(r"<\|im_start\|>(?!assistant\n).*?(?:<\|im_end\|>|$)", re.DOTALL)
_IM_MARK = re.compile(r"<\|im_start\|>assistant\n|<\|im_end\|>\s*")


def text_spans(text: str) -> list[tuple[str, str, bool]]:
    """``(kind, text, new_turn)`` pieces of ``text`` by the text rule (module docstring); the
    pieces concatenate back to ``text``. ``new_turn``: a policy piece that starts a new turn."""
    if "<tool_response>" not in text and "<|im_" not in text:
        return [("policy", text, False)] if text else []
    out: list[tuple[str, str, bool]] = []
    new_turn = False

    def policy(s: str) -> None:
        nonlocal new_turn
        # <|im_start|> messages of other roles inside policy text are prompt; the assistant header
        # is template; an <|im_end|> closing the policy's own text is policy (it generated it).
        pos = 0
        for m in _IM_OTHER.finditer(s):
            _policy_marks(s[pos : m.start()])
            out.append(("prompt", m.group(0), False))
            new_turn = True
            pos = m.end()
        _policy_marks(s[pos:])

    def _policy_marks(s: str) -> None:
        nonlocal new_turn
        pos = 0
        for m in _IM_MARK.finditer(s):
            if m.start() > pos:
                out.append(("policy", s[pos : m.start()], new_turn))
                new_turn = False
            mark = m.group(0)
            if mark.startswith("<|im_end|>"):
                out.append(("policy", "<|im_end|>", new_turn))
                new_turn = False
                if len(mark) > len("<|im_end|>"):
                    out.append(("prompt", mark[len("<|im_end|>") :], False))
                new_turn = True
            else:
                out.append(("prompt", mark, False))
                new_turn = True
            pos = m.end()
        if pos < len(s):
            out.append(("policy", s[pos:], new_turn))
            new_turn = False

    pos = 0
    for m in _BLOCK.finditer(text):
        policy(text[pos : m.start()])
        if m.group("pre"):
            out.append(("prompt", m.group("pre"), False))
        body = m.group("body")
        bpos = 0
        for r in _RESPONSE.finditer(body):
            if r.start() > bpos:
                out.append(("prompt", body[bpos : r.start()], False))
            out.append(("tool", r.group(0), False))
            bpos = r.end()
        if m.group("post"):
            out.append(("prompt", m.group("post"), False))
        new_turn = True
        pos = m.end()
    policy(text[pos:])
    return [p for p in out if p[1]]


def add_text(b: SpanBuilder, text: str) -> None:
    """Add policy text to ``b`` split by the text rule (tool blocks tool, template prompt, each
    policy stretch between them its own turn)."""
    for kind, piece, new_turn in text_spans(text):
        if new_turn:
            b.end_turn()
        b.add(tokenize(piece), kind)


def piece_kinds(pieces: Sequence[str], kinds: Sequence[str]) -> list[str]:
    """The kinds of token ``pieces`` (display strings that concatenate to the text, e.g. a
    tokenizer's decoded pieces) after the text rule: a policy or tool token whose first character
    falls in a ``<tool_response>`` block becomes tool, in template text prompt; a policy token
    elsewhere stays policy, a tool token (what an environment appended) stays tool, prompt stays
    prompt."""
    text = "".join(pieces)
    if "<tool_response>" not in text and "<|im_" not in text:
        return list(kinds)
    ends: list[int] = []  # end offset of each span
    span_kinds: list[str] = []
    end = 0
    for kind, piece, _ in text_spans(text):
        end += len(piece)
        ends.append(end)
        span_kinds.append(kind)
    out = []
    pos = 0
    j = 0
    for piece, kind in zip(pieces, kinds, strict=True):
        while j < len(ends) - 1 and ends[j] <= pos:
            j += 1
        k = span_kinds[j]
        out.append(k if kind in ("policy", "tool") and piece and k != "policy" else kind)
        pos += len(piece)
    return out


# ---- messages -> an episode -----------------------------------------------------------------


def message_text(msg: dict[str, Any], rec: Record, field: str) -> str:
    """The text of a message: ``content`` (a string, parts or null), else ``message``/``text``."""
    content = msg.get("content")
    if content is None:
        content = msg.get("message", msg.get("text"))
    return content_text(content, rec, field + ".content")


def find_messages(obj: Any) -> tuple[str, list[Any]] | None:
    """(key, list) of the first of MESSAGE_KEYS that holds a list of message objects, or None."""
    if not isinstance(obj, dict):
        return None
    for key in MESSAGE_KEYS:
        v = obj.get(key)
        if isinstance(v, list) and (not v or isinstance(v[0], dict)):
            return key, v
    return None


def render_messages(
    b: SpanBuilder, messages: Iterable[Any], rec: Record, field: str, after_policy: bool = False
) -> str:
    """Render chat ``messages`` into ``b`` by the message rule; returns the prompt text before the
    first policy message (for a default group). ``after_policy``: the messages continue a
    conversation in which the policy has already spoken."""
    prompt: list[str] = []
    seen_policy = after_policy
    for i, m in enumerate(messages):
        f = f"{field}[{i}]"
        if not isinstance(m, dict):
            raise rec.error("wrong_type", f"field `{f}` must be a message object (role, content).", field=f)
        kind = message_kind(m, seen_policy)
        text = message_text(m, rec, f)
        role = str(m.get("role") or m.get("source") or "message")
        if kind == "policy":
            seen_policy = True
            render_policy(b, text, m.get("tool_calls"), rec, f)
        else:
            b.message(role, text, kind)
            if not seen_policy:
                prompt.append(f"{role}:{text}")
    return "\n".join(prompt)


def render_policy(b: SpanBuilder, text: str, tool_calls: Any, rec: Record, field: str) -> None:
    """One policy turn: header, text (by the text rule), tool calls, ``<|end|>``."""
    b.end_turn()
    b.open_assistant()
    add_text(b, text)
    if tool_calls is not None and not isinstance(tool_calls, list):
        raise rec.error(
            "wrong_type", f"field `{field}.tool_calls` must be a list.", field=f"{field}.tool_calls"
        )
    for j, call in enumerate(tool_calls or []):
        b.tool_call(*parse_tool_call(call, rec, f"{field}.tool_calls[{j}]"))
    b.close_assistant()


def no_messages(rec: Record, field: str, why: str = "") -> Exception:
    return rec.error(
        "empty_episode", f"field `{field}` has no messages{why}; there is nothing to show.", field=field
    )


def chat_episode(
    b: SpanBuilder,
    rec: Record,
    *,
    reward: Any,
    reward_field: str,
    group: Any,
    meta: dict[str, Any],
    truncated: bool = False,
) -> EpisodeIn:
    """The native episode of a rendered conversation: ``reward`` None stays None (no outcome is
    made up; the episode page says there is none)."""
    if "policy" not in b.kinds:
        raise rec.error(
            "no_policy_tokens",
            "the conversation has no message of the policy (role assistant/agent, or an agent "
            "action); there is nothing to give credit to.",
        )
    return b.episode(
        reward=as_float(reward, rec, reward_field),
        group=None if group is None else str(group),
        truncated=truncated,
        meta=meta,
    )


def record_meta(obj: dict[str, Any], skip: set[str], source: str) -> dict[str, Any]:
    """The record's scalar fields as meta (plus ``meta``/``metadata`` objects), with its source."""
    meta: dict[str, Any] = {}
    for key in ("meta", "metadata"):
        if isinstance(obj.get(key), dict):
            meta.update(scalar_meta(obj[key], set()))
    meta.update(scalar_meta(obj, skip))
    meta["source"] = source
    return meta
