"""The structural reader for transcripts: it finds the messages of a record by their shape, reads a
message in any of the common shapes, and builds the episode's turns, tool spans, reward and group.

**Finding the messages** (:func:`find_transcript`). A list is a *message list* when most of its
first items look like messages (:func:`item_shape`); it is looked for under any key, up to
:data:`MAX_DEPTH` levels deep, or is the record itself. Of the lists found, the one with a policy
turn wins, then the one reached without passing through a list of records, then the longest. A list
found *inside* a list of records (``samples[].messages``, ``simulations[].messages``,
``episodes[].transitions``) makes each of those records an episode. A list named like a prompt
(``prompt``, ``input``, ``request``, …) and one named like an output (``completion``, ``output``,
``response``, ``choices``, …) are read one after the other (verifiers, Responses API, completion
logs). A transcript with no prompt of its own takes one from a text field (``task``, ``prompt``,
``question``, ``instruction``, …).

**Message shapes** (:func:`read_item`):

* role/content (OpenAI, Anthropic, Inspect, tau2, LangChain dicts with ``type`` human/ai), ShareGPT
  ``from``/``value``, Gemini ``role`` + ``parts``; content as a string or a list of typed blocks
  (``text``, ``input_text``, ``output_text``, ``thinking``; Anthropic ``tool_use``/``tool_result``;
  Gemini ``text``/``functionCall``/``functionResponse``);
* Responses-API items by ``type``: ``message``, ``reasoning``, ``function_call`` (and the other
  ``*_call`` items) are the policy's, ``function_call_output`` (``*_call_output``) a tool result;
  consecutive policy items are one model call, one turn;
* wrappers: an item holding its message under ``message``, ``raw_item``, ``item`` or ``data``;
  streamed chunks (``candidates[0].content``, ``choices[0].message|delta``), one turn per reply;
* steps of an action/observation stream (``action``/``llm_output``/``model_response`` and
  ``observation``/``tool_observation``/``tool_result``; OpenHands events by ``source``; OpenDevin
  ``[action, observation]`` pairs): the action is the policy's, the observation a tool result.

Roles by the one table of app/ingest/_roles.py; an unknown role is kept as prompt and reported.

**Tool calls** (:func:`call_of`): OpenAI ``tool_calls`` (objects or JSON strings; with or without
``function.name``), Inspect's ``{function: name, arguments}``, tau2's ``{name, arguments}``,
``function_call``, Anthropic ``tool_use``, Gemini ``functionCall``, BFCL's ``{name: args}``, and
Hermes/Qwen ``<tool_call>`` text (policy by the text rule of app/ingest/_chat.py). A call is policy,
its result tool; a user message that is only a tool result (``<tool_response>``, ``OBSERVATION:``,
``<returncode>``) after the policy has spoken is tool.

**Reward** (:func:`find_reward`): the first of :data:`REWARD_KEYS` holding a number, a
true/false, a pass/fail letter (Inspect's C/I/P/N) or a numeric string, in the record or in one
of its :data:`REWARD_NESTS` (``eval``, ``info``, ``reward_info``, ``test_result``, ``scores``,
…); a ``scores`` object with one score is that score. Pass/fail is kept as such
(``meta.outcome``). None found: ``reward`` is null and the answer names the keys looked at.

**Group** (:func:`find_group`): the first of :data:`GROUP_KEYS`; else an ``id`` with a trial
suffix (``task_7_trial_2``, ``q12-3``) stripped; else a hash of the prompt.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.core.schemas import EpisodeIn
from app.ingest._chat import add_text
from app.ingest._common import scalar_meta, short_hash
from app.ingest._roles import ROLE_KINDS, Kind, normalise, role_kind
from app.ingest._spans import SpanBuilder, arguments_text

MAX_DEPTH = 4
MAX_RECORD_LISTS = 2  # lists of records passed through on the way to a message list
SAMPLE = 8  # items of a list looked at to decide whether it is a message list

# ---- what a message looks like -----------------------------------------------------------------

RESPONSES_POLICY = frozenset(
    {
        "reasoning",
        "function_call",
        "custom_tool_call",
        "computer_call",
        "web_search_call",
        "file_search_call",
        "code_interpreter_call",
        "local_shell_call",
        "shell_call",
        "mcp_call",
        "image_generation_call",
        "tool_call",
        "tool_use",
    }
)
RESPONSES_TOOL = frozenset(
    {
        "function_call_output",
        "custom_tool_call_output",
        "computer_call_output",
        "local_shell_call_output",
        "shell_call_output",
        "tool_result",
        "tool_call_output",
        "mcp_call_output",
    }
)
RESPONSES_TYPES = RESPONSES_POLICY | RESPONSES_TOOL | {"message"}
# LangChain message dicts (``type``) and serialized classes (``id[-1]``).
LANGCHAIN_ROLES = {
    "human": "user",
    "ai": "assistant",
    "system": "system",
    "tool": "tool",
    "function": "tool",
    "humanmessage": "user",
    "aimessage": "assistant",
    "aimessagechunk": "assistant",
    "systemmessage": "system",
    "toolmessage": "tool",
    "functionmessage": "tool",
}
WRAPPER_KEYS = ("message", "raw_item", "item", "data", "msg")
ACTION_KEYS = (
    "action",
    "llm_output",
    "model_response",
    "model_output",
    "response",
    "completion",
    "thought",
    "agent_action",
)
OBSERVATION_KEYS = (
    "observation",
    "tool_observation",
    "tool_result",
    "obs",
    "next_observation",
    "env_response",
    "tool_output",
    "feedback",
)
TEXT_KEYS = ("content", "value", "text", "message", "parts")
# Names of lists that hold a prompt and of lists that hold what the model wrote.
PROMPT_NAMES = frozenset({"prompt", "input", "inputs", "original_input", "request", "question", "context"})
OUTPUT_NAMES = frozenset(
    {"completion", "output", "outputs", "response", "responses", "choices", "generated_items", "answer"}
)
# Text fields that can stand for the prompt of a transcript that has none.
PROMPT_TEXT_KEYS = (
    "prompt",
    "task",
    "instruction",
    "question",
    "query",
    "problem",
    "goal",
    "original_input",
    "input",
    "prompt_used",
)
FINAL_TEXT_KEYS = ("final_answer",)
# A user-role message that is only an environment's answer (after the policy has spoken).
_TOOL_TEXT = re.compile(
    r"\A\s*(?:<tool_response>|<returncode>|<function_results>|observation:|tool result:|tool output:)",
    re.IGNORECASE,
)


def _role_of(x: dict[str, Any]) -> str | None:
    for key in ("role", "from", "speaker", "author", "sender"):
        v = x.get(key)
        if isinstance(v, str) and v:
            return v
        if isinstance(v, dict) and isinstance(v.get("role"), str):  # {"author": {"role": ...}}
            return str(v["role"])
    return None


def _langchain_role(x: dict[str, Any]) -> str | None:
    ident = x.get("id")
    if x.get("lc") is not None and isinstance(ident, list) and ident and isinstance(ident[-1], str):
        return LANGCHAIN_ROLES.get(ident[-1].lower())
    t = x.get("type")
    if isinstance(t, str) and "content" in x:
        return LANGCHAIN_ROLES.get(t.lower())
    return None


def _is_step(x: dict[str, Any]) -> bool:
    return any(k in x for k in ACTION_KEYS) and any(k in x for k in OBSERVATION_KEYS)


def _is_event(x: dict[str, Any]) -> bool:
    return x.get("source") in ("agent", "user", "environment") and ("action" in x or "observation" in x)


_CALL_NAME = re.compile(r"^[A-Za-z_][\w.\-]*$")
# Session events typed "<speaker>.<what>" (Anthropic's managed agents: agent.message,
# agent.tool_use, agent.mcp_tool_result, user.message, …).
_TYPED_EVENT = re.compile(
    r"^[a-z_]+\.(message|thinking|[a-z_]*tool_use|[a-z_]*tool_result|tool_confirmation)$"
)


def item_shape(x: Any) -> str | None:
    """The shape of one list item when it looks like a message, else None: ``role``, ``sharegpt``,
    ``responses``, ``langchain``, ``wrapper``, ``chunk``, ``step``, ``event``, ``pair`` or
    ``call`` (a bare ``{"name": "<JSON arguments>"}``) or ``typed_event`` (``agent.tool_use``)."""
    if isinstance(x, list):
        if len(x) == 2 and all(isinstance(e, dict) and (_is_event(e) or "observation" in e) for e in x):
            return "pair"
        return None
    if not isinstance(x, dict):
        return None
    role = x.get("role")
    if isinstance(role, str) and role and "source" not in x:  # the common case, decided at once
        return "responses" if x.get("type") == "message" else "role"
    if _is_event(x):
        return "event"
    t = x.get("type")
    if isinstance(t, str) and t in RESPONSES_TYPES and not isinstance(x.get("from"), str):
        return "responses"
    if _role_of(x) is not None and ("from" not in x or "value" in x):
        if "from" in x and "role" not in x:
            return "sharegpt"
        return "role"
    if _langchain_role(x) is not None:
        return "langchain"
    for key in WRAPPER_KEYS:
        v = x.get(key)
        if isinstance(v, dict) and item_shape(v) in ("role", "responses", "langchain", "sharegpt"):
            return "wrapper"
    if _chunk_message(x) is not None:
        return "chunk"
    if _is_step(x):
        return "step"
    t = x.get("type")
    if isinstance(t, str) and _TYPED_EVENT.match(t) and role_kind(t.split(".", 1)[0]) is not None:
        return "typed_event"
    if len(x) == 1:
        ((name, args),) = x.items()
        if isinstance(args, str) and args.startswith("{") and _CALL_NAME.match(name):
            return "call"  # BFCL's decoded call: {"name": "<JSON arguments>"}
    return None


def _chunk_message(x: dict[str, Any]) -> dict[str, Any] | None:
    """The message of a streamed chunk or a completion (``candidates[0].content``,
    ``choices[0].message``/``delta``), or None."""
    for key, inner in (("candidates", "content"), ("choices", "message"), ("choices", "delta")):
        v = x.get(key)
        if isinstance(v, list) and v and isinstance(v[0], dict):
            got = v[0].get(inner)
            if isinstance(got, dict):
                return got
    msg = x.get("message")
    if isinstance(msg, dict) and ("finish_reason" in x or "stop_reason" in x):
        return msg
    return None


def is_message_list(v: Any) -> bool:
    """True when most of the first :data:`SAMPLE` items of ``v`` look like messages, or ``v`` is
    a log whose nested lists and objects of lists hold messages (BFCL's turns of steps)."""
    if not isinstance(v, list) or not v:
        return False
    head = [x for x in v[:SAMPLE] if x is not None]
    if not head:
        return False
    hits = sum(1 for x in head if item_shape(x) is not None)
    if hits * 2 > len(head):
        return True
    if all(isinstance(x, (list, dict)) and item_shape(x) is None for x in head):
        nested = [m for _, m in zip(range(SAMPLE), flatten(head, 3), strict=False)]
        return len(nested) >= 2 and not all(isinstance(x, dict) for x in head)
    return False


def _last_if_growing(items: Iterable[Any]) -> Iterable[Any]:
    """The last of a list of message lists where each one repeats the one before and adds to it
    (NeMo Gym's transitions, a trajectory's per-step message lists); else ``items`` itself."""
    if not isinstance(items, list) or len(items) < 2 or not all(isinstance(x, list) and x for x in items):
        return items
    for a, b in zip(items, items[1:], strict=False):
        if len(b) <= len(a) or b[0] != a[0]:
            return items
    return [items[-1]]


def flatten(items: Iterable[Any], depth: int = 3) -> Iterator[Any]:
    """The message-like items of ``items`` in order, looking into nested lists and into objects
    whose values are lists (``{"step_0": [...], "step_1": [...]}``) up to ``depth`` levels."""
    items = _last_if_growing(items)
    for x in items:
        if item_shape(x) is not None:
            yield x
        elif depth > 0 and isinstance(x, list):
            yield from flatten(x, depth - 1)
        elif depth > 0 and isinstance(x, dict) and x and all(isinstance(v, list) for v in x.values()):
            for v in x.values():
                yield from flatten(v, depth - 1)


# ---- finding the message lists -----------------------------------------------------------------

Path = tuple[str, ...]  # keys; "[]" stands for "each record of this list"
WILD = "[]"


@dataclass
class Candidate:
    """A message list found in a record: its path, how many of its items are messages and
    whether the policy speaks in it."""

    path: Path
    n: int
    policy: bool

    @property
    def wild(self) -> int:
        return self.path.count(WILD)

    def rank(self) -> tuple[bool, int, int]:
        return (self.policy, -self.wild, self.n)


def _has_policy(items: Sequence[Any]) -> bool:
    for x in flatten(items[:64]):
        sh = item_shape(x)
        if sh in ("step", "event", "pair", "chunk", "call"):
            return True
        if sh == "typed_event" and str(x.get("type", "")).split(".")[0] in ("agent", "assistant", "model"):
            return True
        if sh is None:
            continue
        for m in read_item(x, _Ctx()):
            if m.kind == "policy":
                return True
    return False


def candidates(obj: Any, depth: int = MAX_DEPTH) -> list[Candidate]:
    """Every message list in ``obj`` (a record) up to ``depth`` levels, including the record
    itself when it is one (path ``()``); each record of a list of records (``samples[]``) is
    looked into ``depth`` levels again."""
    out: list[Candidate] = []

    def walk(v: Any, path: Path, d: int) -> None:
        if isinstance(v, list):
            if is_message_list(v):
                out.append(Candidate(path, len(v), _has_policy(v)))
                return
            if d <= 0 or not v:
                return
            first = v[0]
            if len(v) == 1 and is_message_list(first):  # LangChain's [[messages]]
                walk(first, (*path, "0"), d - 1)
            elif isinstance(first, dict) and path.count(WILD) < MAX_RECORD_LISTS:
                # A list of records: each record is looked into as deep as the file itself.
                walk(first, (*path, WILD), depth)
            elif isinstance(first, (dict, list)):
                walk(first, (*path, WILD), d - 1)
        elif isinstance(v, dict) and d > 0:
            for k, x in v.items():
                if isinstance(x, (dict, list)):
                    walk(x, (*path, str(k)), d - 1)

    walk(obj, (), depth)
    return out


def best(cands: Sequence[Candidate]) -> Candidate | None:
    """The candidate read as the transcript (module docstring's order)."""
    return max(cands, key=Candidate.rank, default=None)


def _names(path: Path) -> set[str]:
    return {p.lower() for p in path}


@dataclass
class Plan:
    """Where a record's episodes and their messages are: ``root`` leads to the list of episode
    records (empty: the record is the episode), ``parts`` are the message lists of one episode,
    relative to it, read in order."""

    root: Path
    parts: list[Path]
    # No message list: (prompt key or None, completion key) of a record of two texts.
    texts: tuple[str | None, str] | None = None


COMPLETION_WORDS = ("completion", "response", "output", "generation", "answer")
PROMPT_WORDS = ("prompt", "question", "query", "instruction", "input", "task")


def _text_keys(obj: Any) -> tuple[str | None, str] | None:
    """(prompt key, completion key) of a record that holds a prompt and a completion as text
    (``prompt_used`` + ``llm_completion_raw``), or None."""
    if not isinstance(obj, dict):
        return None
    texts = [k for k, v in obj.items() if isinstance(v, str) and v.strip()]
    out = next((k for k in texts if any(w in k.lower() for w in COMPLETION_WORDS)), None)
    if out is None:
        return None
    prompt = next((k for k in texts if k != out and any(w in k.lower() for w in PROMPT_WORDS)), None)
    return prompt, out


def plan_of(obj: Any) -> Plan | None:
    """The :class:`Plan` of a record, or None when it holds no message list."""
    cands = candidates(obj)
    top = best(cands)
    if top is None:
        pair = _text_keys(obj)
        return None if pair is None else Plan((), [], pair)
    root: Path = ()
    if WILD in top.path:
        cut = len(top.path) - 1 - top.path[::-1].index(WILD)
        root = top.path[: cut + 1]
    rel = top.path[len(root) :]
    parts = [rel]
    same = [
        c for c in cands if c.path[: len(root)] == root and c is not top and WILD not in c.path[len(root) :]
    ]
    names = _names(rel)
    if names & OUTPUT_NAMES and not names & PROMPT_NAMES:
        prompt = [c for c in same if _names(c.path[len(root) :]) & PROMPT_NAMES]
        if prompt:
            parts.insert(0, max(prompt, key=Candidate.rank).path[len(root) :])
    elif names & PROMPT_NAMES:
        output = [c for c in same if _names(c.path[len(root) :]) & OUTPUT_NAMES]
        if output:
            parts.append(max(output, key=Candidate.rank).path[len(root) :])
    if len(parts) == 1 and _opens_with_policy(obj, top.path):
        # The model's list has no prompt of its own: another list of the record without a
        # model turn (BFCL's inference_log beside its result) is read before it.
        prompt = [c for c in same if not c.policy]
        if prompt:
            parts.insert(0, max(prompt, key=Candidate.rank).path[len(root) :])
    return Plan(root, parts)


def _opens_with_policy(obj: Any, path: Path) -> bool:
    """True when the first message of the list at ``path`` (first record through ``[]``) is the
    model's."""
    cur = obj
    for p in path:
        cur = cur[0] if p == WILD and isinstance(cur, list) and cur else get_path(cur, (p,))
    if not isinstance(cur, list):
        return False
    first = next(flatten(cur), None)
    msgs = read_item(first, _Ctx()) if first is not None else []
    return bool(msgs) and msgs[0].kind == "policy"


def get_path(obj: Any, path: Path) -> Any:
    """``obj`` at ``path`` (no wildcards), or None."""
    cur = obj
    for p in path:
        if isinstance(cur, dict):
            cur = cur.get(p)
        elif isinstance(cur, list) and p.isdigit() and int(p) < len(cur):
            cur = cur[int(p)]
        else:
            return None
    return cur


def episode_records(obj: Any, plan: Plan) -> Iterator[tuple[Any, str]]:
    """(episode record, where) for each episode of ``obj`` under ``plan.root`` (wildcards
    expanded); ``where`` is the record's path, for messages (``simulations[3]``)."""

    def walk(v: Any, path: Path, where: str) -> Iterator[tuple[Any, str]]:
        if not path:
            yield v, where
            return
        head, rest = path[0], path[1:]
        if head == WILD:
            if isinstance(v, list):
                for i, x in enumerate(v):
                    yield from walk(x, rest, f"{where}[{i}]")
        else:
            nxt = get_path(v, (head,))
            if nxt is not None:
                yield from walk(nxt, rest, f"{where}.{head}" if where else head)

    yield from walk(obj, plan.root, "")


# ---- reading one message -----------------------------------------------------------------------


@dataclass
class Msg:
    """One message of a transcript: its kind, the role to show, its text and (policy) tool calls;
    ``same_reply``: it continues the model reply before it (one turn)."""

    kind: Kind
    role: str
    text: str
    calls: list[tuple[str, str]] = field(default_factory=list)
    same_reply: bool = False


@dataclass
class _Ctx:
    """What reading a transcript noticed: roles not in the table (with counts)."""

    unknown_roles: dict[str, int] = field(default_factory=dict)

    def kind(self, role: str) -> Kind:
        k = ROLE_KINDS.get(role)  # the table's own spelling: no normalising needed
        if k is None:
            k = role_kind(role)
        if k is None:
            r = normalise(role)
            self.unknown_roles[r] = self.unknown_roles.get(r, 0) + 1
            return "prompt"
        return k


def text_of(v: Any) -> str:
    """The text of a content value: a string, a list of text blocks or strings, an object with
    ``text``/``content``; other values as compact JSON."""
    if v is None:
        return ""
    if isinstance(v, str):
        return v
    if isinstance(v, list):
        return "".join(_block_text(b) for b in v)
    if isinstance(v, dict):
        for key in ("text", "content", "thinking", "value", "output"):
            if key in v and isinstance(v[key], (str, list)):
                return text_of(v[key])
    return json.dumps(v, ensure_ascii=False)


def _block_text(b: Any) -> str:
    if isinstance(b, str):
        return b
    if not isinstance(b, dict):
        return "" if b is None else str(b)
    for key in ("text", "thinking", "refusal", "reasoning"):
        t = b.get(key)
        if isinstance(t, str):
            return t
    src = b.get("source")
    if isinstance(src, dict) and isinstance(src.get("data"), str) and src.get("type") in (None, "text"):
        return str(src["data"])  # Anthropic's document block with a text source
    if b.get("type") in ("image", "image_url", "input_image"):
        return "[image]"
    return ""


def call_of(c: Any) -> tuple[str, str]:
    """(name, arguments) of a tool call in any of the shapes of the module docstring; a call with
    no name has the name ""."""
    if isinstance(c, str):
        try:
            c = json.loads(c)
        except ValueError:
            return "", c
    if not isinstance(c, dict):
        return "", arguments_text(c)
    fn = c.get("function")
    if isinstance(fn, dict):
        name = fn.get("name")
        args = fn.get("arguments", fn.get("args", c.get("arguments")))
    else:
        name = fn if isinstance(fn, str) else None
        name = name or c.get("name") or c.get("tool_name") or c.get("tool") or c.get("recipient_name")
        args = next(
            (c[k] for k in ("arguments", "args", "input", "parameters", "tool_args", "tool_input") if k in c),
            None,
        )
        if name is None and len(c) == 1:  # BFCL: {"ls": "{}"}
            (name, args) = next(iter(c.items()))
    return (name if isinstance(name, str) else ""), arguments_text(args)


def _calls_of_message(x: dict[str, Any]) -> list[tuple[str, str]]:
    calls: list[tuple[str, str]] = []
    tc = x.get("tool_calls")
    if tc is None and isinstance(x.get("additional_kwargs"), dict):
        tc = x["additional_kwargs"].get("tool_calls")
    if isinstance(tc, list):
        calls.extend(call_of(c) for c in tc)
    elif isinstance(tc, (dict, str)):
        calls.append(call_of(tc))
    fc = x.get("function_call")
    if isinstance(fc, (dict, str)):
        calls.append(call_of(fc))
    return calls


def _content(x: dict[str, Any]) -> Any:
    for key in TEXT_KEYS:
        if key in x and x[key] is not None:
            return x[key]
    return None


_CHAT_POLICY = frozenset({"assistant", "model", "gpt", "agent", "ai"})


def _read_role_message(x: dict[str, Any], role: str, ctx: _Ctx) -> list[Msg]:
    """A role/content message; typed blocks split it into the policy's text and calls, tool
    results and prompt text."""
    kind = ctx.kind(role)
    content = _content(x)
    has_calls = "tool_calls" in x or "function_call" in x or "additional_kwargs" in x
    calls = _calls_of_message(x) if kind == "policy" and has_calls else []
    if kind == "policy" and role not in _CHAT_POLICY and isinstance(content, str):
        if normalise(role) in ("function_call", "tool_call"):
            return [Msg("policy", role, "", [call_of(content)])]  # ShareGPT: the value is the call
    if kind == "prompt" and has_calls:
        user_calls = _calls_of_message(x)
        if user_calls:
            # A simulated user that calls tools (tau2 telecom): shown, never trained on.
            content = text_of(content) + "".join(f"\n<tool_call>{n} {a}</tool_call>" for n, a in user_calls)
    if not isinstance(content, list):
        return [Msg(kind, role, text_of(content), calls)]
    out: list[Msg] = []
    text: list[str] = []
    for b in content:
        if not isinstance(b, dict):
            text.append(_block_text(b))
            continue
        t = b.get("type")
        if kind == "policy" and t is None and len(b) == 1 and "text" not in b:  # BFCL: {"ls": "{}"}
            calls.append(call_of(b))
        elif "functionCall" in b or t in ("tool_use", "function_call", "tool_call", "server_tool_use"):
            fc = b.get("functionCall", b)
            calls.append(call_of(fc))
        elif "functionResponse" in b or t in ("tool_result", "function_call_output", "function_response"):
            fr = b.get("functionResponse", b)
            body = fr.get("response", fr.get("content", fr.get("output")))
            out.append(Msg("tool", "tool", text_of(body)))
        else:
            text.append(_block_text(b))
    joined = "".join(text)
    if kind == "policy":
        out.insert(0, Msg("policy", role, joined, calls))
    elif joined or not out:
        out.insert(0, Msg(kind, role, joined))
    return out


def _read_responses(x: dict[str, Any], ctx: _Ctx) -> list[Msg]:
    t = x["type"]
    if t == "message":
        role = str(x.get("role") or "assistant")
        msgs = _read_role_message(x, role, ctx)
        for m in msgs:
            m.same_reply = m.kind == "policy"
        return msgs
    if t in RESPONSES_TOOL:
        return [Msg("tool", "tool", text_of(x.get("output", x.get("content"))))]
    if t == "reasoning":
        body = text_of(x.get("summary")) + text_of(x.get("content"))
        return [Msg("policy", "assistant", f"<think>{body}</think>" if body else "", same_reply=True)]
    name, args = call_of(x)
    if not name and t != "function_call":
        name = t
    return [Msg("policy", "assistant", "", [(name, args)], same_reply=True)]


def _read_step(x: dict[str, Any], ctx: _Ctx) -> list[Msg]:
    """An action/observation step: the action (text, a call, or a message) is policy, the
    observation a tool result."""
    out: list[Msg] = []
    text = ""
    calls: list[tuple[str, str]] = []
    for key in ("thought", "llm_output", "model_response", "model_output", "response", "completion"):
        v = x.get(key)
        if isinstance(v, str) and v:
            text = v if not text else text + "\n" + v
    action = x.get("action", x.get("agent_action"))
    result: Any = None
    if isinstance(action, dict):
        if item_shape(action) in ("role", "langchain") or action.get("type") == "message":
            for m in read_item(action, ctx):
                if m.kind == "policy":
                    text = text + m.text if not text else text + "\n" + m.text
                    calls.extend(m.calls)
        else:
            name, args = call_of(action)
            if name or args:
                calls.append((name, args))
            result = action.get("tool_result", action.get("result"))
    elif isinstance(action, str) and action and action not in text:
        text = action if not text else text + "\n" + action
    out.append(Msg("policy", "assistant", text, calls))
    obs = next((x[k] for k in OBSERVATION_KEYS if x.get(k) not in (None, "")), None)
    if result is not None:
        out.append(Msg("tool", "tool", text_of(result)))
    elif obs is not None:
        out.append(Msg("tool", "observation", text_of(obs)))
    return out


def _read_event(x: dict[str, Any]) -> list[Msg]:
    """An OpenHands/OpenDevin event: the agent's actions are policy, observations tool, the
    user's messages prompt."""
    if "observation" in x:
        return [Msg("tool", "observation", text_of(x.get("content", x.get("message"))))]
    raw_args = x.get("args")
    args: dict[str, Any] = raw_args if isinstance(raw_args, dict) else {}
    raw_text = x.get("message")
    text = raw_text if isinstance(raw_text, str) else ""
    if x.get("source") == "user" or x.get("action") in ("system", "recall"):
        return [Msg("prompt", "user", str(args.get("content") or text))]
    body = next(
        (args[k] for k in ("code", "command", "content", "thought") if isinstance(args.get(k), str)), ""
    )
    action = str(x.get("action") or "")
    calls = [(action, body)] if action and action not in ("message", "finish") and body else []
    shown = text if calls else (body or text)
    return [Msg("policy", "assistant", shown, calls)]


def _read_typed_event(x: dict[str, Any], ctx: _Ctx) -> list[Msg]:
    """A ``<speaker>.<what>`` session event: a tool use is the speaker's call, a tool result a
    tool result, a message or thinking the speaker's text, anything else (a confirmation) prompt."""
    speaker, what = str(x["type"]).split(".", 1)
    kind = ctx.kind(speaker)
    if what.endswith("tool_result"):
        return [Msg("tool", "tool", text_of(x.get("content")))]
    if what.endswith("tool_use"):
        if kind != "policy":
            return [Msg(kind, speaker, f"<tool_call>{call_of(x)[0]} {call_of(x)[1]}</tool_call>")]
        return [Msg("policy", speaker, "", [call_of(x)], same_reply=True)]
    if what in ("message", "thinking"):
        body = text_of(x.get("content"))
        return [
            Msg(
                kind,
                speaker,
                f"<think>{body}</think>" if what == "thinking" and body else body,
                same_reply=True,
            )
        ]
    detail = next((x[k] for k in ("deny_message", "result", "content") if x.get(k)), "")
    return [Msg("prompt", speaker, f"{what}: {text_of(detail)}")]


def read_item(x: Any, ctx: _Ctx, shape: str | None = None) -> list[Msg]:
    """The messages of one list item (a message may split into several: an assistant's text and
    calls, a user turn carrying tool results). ``shape``: its :func:`item_shape`, when known."""
    sh = shape or item_shape(x)
    if sh is None:
        return []
    if sh == "pair":
        return [m for e in x for m in read_item(e, ctx)]
    assert isinstance(x, dict)
    if sh == "event":
        return _read_event(x)
    if sh == "responses":
        return _read_responses(x, ctx)
    if sh == "langchain":
        role = _langchain_role(x) or "user"
        kwargs = x.get("kwargs")
        body: dict[str, Any] = kwargs if isinstance(kwargs, dict) else x
        return _read_role_message(body, role, ctx)
    if sh == "wrapper":
        inner = next(x[k] for k in WRAPPER_KEYS if isinstance(x.get(k), dict) and item_shape(x[k]))
        return read_item(inner, ctx)
    if sh == "chunk":
        msg = _chunk_message(x) or {}
        role = _role_of(msg) or "assistant"
        msgs = _read_role_message(msg, role, ctx)
        for m in msgs:
            m.same_reply = m.kind == "policy"
        return msgs
    if sh == "step":
        return _read_step(x, ctx)
    if sh == "typed_event":
        return _read_typed_event(x, ctx)
    if sh == "call":  # parallel calls of one reply: one turn
        return [Msg("policy", "assistant", "", [call_of(x)], same_reply=True)]
    role = _role_of(x) or "user"
    if sh == "sharegpt":
        return _read_role_message({"content": x.get("value"), **x}, role, ctx)
    return _read_role_message(x, role, ctx)


def read_messages(items: Iterable[Any], ctx: _Ctx) -> list[Msg]:
    """The messages of a message list, in order (items that are not messages are skipped)."""
    out: list[Msg] = []
    for x in flatten(items):
        if (
            type(x) is dict
            and type(x.get("role")) is str
            and x["role"]
            and "source" not in x
            and "type" not in x
        ):
            out.extend(_read_role_message(x, x["role"], ctx))  # the common case, read at once
        else:
            out.extend(read_item(x, ctx))
    return out


# ---- turns ---------------------------------------------------------------------------------------


def render(b: SpanBuilder, msgs: Sequence[Msg]) -> str:
    """Render ``msgs`` into ``b``: a policy message is one turn (header prompt, text by the text
    rule, calls, ``<|end|>`` policy) unless it continues the reply before it; other messages are
    tool or prompt; tool output before the policy's first turn is prompt. Returns the prompt text
    before the first policy turn (for a default group)."""
    prompt: list[str] = []
    seen_policy = False
    prev_policy = False
    for m in msgs:
        if m.kind == "policy":
            if not (m.same_reply and prev_policy):
                b.end_turn()
            b.open_assistant()
            add_text(b, m.text)
            for name, args in m.calls:
                b.tool_call(name, args)
            b.close_assistant()
            seen_policy = prev_policy = True
            continue
        kind: Kind = m.kind
        if not seen_policy:
            kind = "prompt"
        elif kind == "prompt" and _TOOL_TEXT.match(m.text):
            kind = "tool"
        b.message(m.role, m.text, kind)
        if not seen_policy:
            prompt.append(f"{m.role}:{m.text}")
        prev_policy = False
    return "\n".join(prompt)


# ---- reward and group ----------------------------------------------------------------------------

REWARD_KEYS = (
    "reward",
    "score",
    "scores",
    "total_reward",
    "return",
    "success",
    "resolved",
    "passed",
    "pass",
    "correct",
    "is_correct",
    "result",
    "acc",
    "accuracy",
    "value",
)
REWARD_NESTS = (
    "reward_info",
    "eval",
    "evaluation",
    "info",
    "test_result",
    "result",
    "results",
    "scores",
    "metrics",
    "outcome",
    "judgement",
)
GROUP_KEYS = (
    "group",
    "uid",
    "task_id",
    "instance_id",
    "example_id",
    "data_idx",
    "prompt_id",
    "problem_id",
    "question_id",
    "item_id",
    "_ng_task_index",
    "task_index",
)
ID_KEYS = ("id", "request_id", "trajectory_id", "episode_id", "sample_id", "run_id")
# Inspect's score letters and the common verdict words.
VERDICTS = {
    "c": 1.0,
    "i": 0.0,
    "p": 0.5,
    "n": 0.0,
    "correct": 1.0,
    "incorrect": 0.0,
    "pass": 1.0,
    "passed": 1.0,
    "fail": 0.0,
    "failed": 0.0,
    "true": 1.0,
    "false": 0.0,
    "yes": 1.0,
    "no": 0.0,
    "success": 1.0,
    "failure": 0.0,
    "resolved": 1.0,
    "unresolved": 0.0,
}
_TRIAL = re.compile(
    r"^(.+?)(?:[_\-:.](?:trial|run|sample|attempt|epoch|rollout|try)[_\-]?\d+|#\d+)$", re.IGNORECASE
)


@dataclass
class Reward:
    """A reward found in a record: its value, the path it came from and whether it is pass/fail."""

    value: float
    key: str
    binary: bool


def _as_reward(v: Any, key: str) -> Reward | None:
    if isinstance(v, bool):
        return Reward(float(v), key, True)
    if isinstance(v, (int, float)):
        f = float(v)
        return Reward(f, key, False) if f == f and abs(f) != float("inf") else None
    if isinstance(v, str):
        s = v.strip().lower()
        if s in VERDICTS:
            return Reward(VERDICTS[s], key, True)
        try:
            f = float(s)
        except ValueError:
            return None
        return Reward(f, key, False) if f == f and abs(f) != float("inf") else None
    if isinstance(v, dict):
        if "value" in v:
            return _as_reward(v["value"], f"{key}.value")
        nums = [(k, x) for k, x in v.items() if isinstance(x, dict) and "value" in x]
        if len(nums) == 1:  # a scores object with one score (Inspect: {"match": {"value": "C"}})
            k, x = nums[0]
            return _as_reward(x["value"], f"{key}.{k}.value")
        scalars = [(k, x) for k, x in v.items() if isinstance(x, (int, float)) and not isinstance(x, bool)]
        if key.split(".")[-1] == "scores" and len(scalars) == 1:
            return _as_reward(scalars[0][1], f"{key}.{scalars[0][0]}")
    return None


def find_reward(obj: Any, depth: int = 2, prefix: str = "") -> Reward | None:
    """The episode's reward by the order of the module docstring, or None."""
    if not isinstance(obj, dict):
        return None
    for key in REWARD_KEYS:
        if key in obj:
            r = _as_reward(obj[key], prefix + key)
            if r is not None:
                return r
    if depth > 0:
        for key in REWARD_NESTS:
            v = obj.get(key)
            if isinstance(v, dict):
                r = find_reward(v, depth - 1, f"{prefix}{key}.")
                if r is not None:
                    return r
    return None


def reward_keys_looked_at() -> str:
    """The keys :func:`find_reward` looks at, for the answer when it found none."""
    return ", ".join(REWARD_KEYS) + " (also inside " + ", ".join(REWARD_NESTS) + ")"


def find_group(obj: Any) -> str | None:
    """The group of an episode record (module docstring), or None."""
    if not isinstance(obj, dict):
        return None
    for key in GROUP_KEYS:
        v = obj.get(key)
        if isinstance(v, (str, int)) and not isinstance(v, bool) and v != "":
            return str(v)
    if "epoch" in obj and isinstance(obj.get("id"), (str, int)):  # Inspect: id is the sample, epoch the trial
        return str(obj["id"])
    for key in ID_KEYS:
        v = obj.get(key)
        if isinstance(v, str):
            m = _TRIAL.match(v)
            if m:
                return m.group(1)
    return None


def prompt_text(obj: Any) -> str | None:
    """A text field that can stand for the prompt of a transcript that has none."""
    if not isinstance(obj, dict):
        return None
    for key in PROMPT_TEXT_KEYS:
        v = obj.get(key)
        if isinstance(v, str) and v.strip():
            return v
    return None


# ---- one episode ---------------------------------------------------------------------------------


@dataclass
class Built:
    """An episode read from a record, or why it is not one."""

    episode: EpisodeIn | None
    problem: str | None = None
    unknown_roles: dict[str, int] = field(default_factory=dict)
    reward_missing: bool = False


def build_episode(
    obj: Any,
    parts: Sequence[Path],
    where: str,
    source: str,
    texts: tuple[str | None, str] | None = None,
) -> Built:
    """The episode of one episode record ``obj`` whose messages are at ``parts``."""
    ctx = _Ctx()
    msgs: list[Msg] = []
    if texts is not None and isinstance(obj, dict):
        if texts[0] is not None:
            msgs.append(Msg("prompt", "user", str(obj[texts[0]])))
        msgs.append(Msg("policy", "assistant", str(obj[texts[1]])))
    seen: list[Any] = []
    for p in parts:
        v = obj if not p else get_path(obj, p)
        if isinstance(v, list):
            items = list(flatten(v))
            # A list that starts by repeating the prompt already read (an output that carries
            # its input again) is read from where it goes on.
            k = 0
            while k < min(len(seen), len(items)) and items[k] == seen[k]:
                k += 1
            msgs.extend(read_messages(items[k:], ctx))
            seen.extend(items)
    if not msgs or msgs[0].kind == "policy":
        task = prompt_text(obj) if isinstance(obj, dict) else None
        if task is not None:
            msgs.insert(0, Msg("prompt", "user", task))
    if isinstance(obj, dict) and msgs:
        final = next((obj[k] for k in FINAL_TEXT_KEYS if isinstance(obj.get(k), str)), None)
        if final and not any(final in m.text for m in msgs[-2:] if m.kind == "policy"):
            msgs.append(Msg("policy", "assistant", final))
    shown = [".".join(p) or "(the record)" for p in parts] or [k for k in texts or () if k]
    label = (where + " " if where else "") + "/".join(shown)
    if any(m.kind == "policy" for m in msgs) and not any(
        m.text.strip() or m.calls for m in msgs if m.kind == "policy"
    ):
        return Built(
            None,
            f"every turn of the model in the transcript at {label.strip()} is empty "
            f"({sum(m.kind == 'policy' for m in msgs)} turns without text or calls).",
            ctx.unknown_roles,
        )
    if not any(m.kind == "policy" for m in msgs):
        roles = sorted({m.role for m in msgs})
        return Built(
            None,
            f"the transcript at {label.strip()} has {len(msgs)} messages ("
            + ", ".join(roles)
            + ") and no turn of the model; there is nothing to give credit to.",
            ctx.unknown_roles,
        )
    b = SpanBuilder()
    prompt = render(b, msgs)
    meta: dict[str, Any] = scalar_meta(obj, set()) if isinstance(obj, dict) else {}
    for key in ("meta", "metadata"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            meta.update({k: v for k, v in scalar_meta(obj[key], set()).items() if k not in meta})
    meta["source"] = source
    meta["messages_at"] = label.strip()
    reward = find_reward(obj) if isinstance(obj, dict) else None
    if reward is not None:
        meta["reward_key"] = reward.key
        meta["outcome"] = "pass/fail" if reward.binary else "real"
    group = find_group(obj) or short_hash(prompt)
    truncated = isinstance(obj, dict) and obj.get("truncated") is True
    ep = b.episode(
        reward=None if reward is None else reward.value, group=group, truncated=truncated, meta=meta
    )
    return Built(ep, None, ctx.unknown_roles, reward is None)
