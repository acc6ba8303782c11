"""Building an episode span by span, for the text formats that carry chat messages or Responses-API
items (NeMo Gym, verifiers, the chat-trajectory formats of app/ingest/_chat.py): each span is text
split by the offline tokenizer (app/core/tokenize.py), with one kind, and policy spans carry a
turn index.

Rendering is the one openai_chat.py uses: a message opens with a template token ``<|role|>\\n``
(prompt) and closes with ``<|end|>``; an assistant's text and tool calls (``<tool_call>name
{arguments}</tool_call>``) and its closing ``<|end|>`` are policy; a tool result is tool tokens.
"""

from __future__ import annotations

import json
from typing import Any, cast

from app.core.schemas import EpisodeIn, Kind
from app.core.tokenize import tokenize
from app.ingest._common import Record


class SpanBuilder:
    """Token strings, kinds, turn ids (and optional per-token ids/logprobs) grown span by span."""

    def __init__(self) -> None:
        self.tokens: list[str] = []
        self.kinds: list[str] = []
        self.turn_ids: list[int] = []
        self.turn = -1
        self._in_turn = False

    def add(self, pieces: list[str], kind: str) -> None:
        """Append ``pieces`` of one kind; a policy span after a non-policy one opens a new turn."""
        if not pieces:
            return
        if kind == "policy":
            if not self._in_turn:
                self.turn += 1
                self._in_turn = True
        self.tokens.extend(pieces)
        self.kinds.extend([kind] * len(pieces))
        self.turn_ids.extend([self.turn if kind == "policy" else -1] * len(pieces))

    def end_turn(self) -> None:
        """The next policy span starts a new turn (a tool result or a user message came between)."""
        self._in_turn = False

    def text(self, text: str, kind: str) -> None:
        self.add(tokenize(text), kind)

    def message(self, role: str, text: str, kind: str) -> None:
        """A non-assistant message: header and end are template (prompt), the body ``kind``."""
        self.end_turn()
        self.add([f"<|{role}|>\n"], "prompt")
        self.text(text, kind)
        self.add(["<|end|>\n"], "prompt")

    def open_assistant(self) -> None:
        self.add(["<|assistant|>\n"], "prompt")

    def close_assistant(self) -> None:
        self.add(["<|end|>"], "policy")
        self.add(["\n"], "prompt")

    def tool_call(self, name: str, arguments: str) -> None:
        self.add(["<tool_call>", *tokenize(" " + name + " " + arguments), "</tool_call>"], "policy")

    def episode(self, **fields: Any) -> EpisodeIn:
        """The native episode (validated later by app/core/validate.py, like every format's); the
        fields not given keep EpisodeIn's defaults (absent, not truncated)."""
        base: dict[str, Any] = {"turn_ids": self.turn_ids, "meta": {}}
        base.update(fields)
        if base.get("token_ids") is None and isinstance(base["meta"], dict):
            # Text split by the offline tokenizer: the counts are words, not the model's tokens.
            base["meta"].setdefault("tokens", "words")
        kinds = cast("list[Kind]", self.kinds)  # add() is only ever given the three kinds
        return EpisodeIn.model_construct(tokens=self.tokens, kinds=kinds, **base)


def content_text(content: Any, rec: Record, field: str) -> str:
    """The text of a message's ``content``: a string, null, or a list of parts (``{"type":
    "output_text" | "input_text" | "text" | "reasoning_text" | "summary_text", "text": ...}``)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for p in content:
            if isinstance(p, dict):
                t = p.get("text", p.get("refusal", ""))
                out.append(t if isinstance(t, str) else "")
            elif isinstance(p, str):
                out.append(p)
        return "".join(out)
    raise rec.error("wrong_type", f"field `{field}` must be a string, a list of parts or null.", field=field)


def arguments_text(args: Any) -> str:
    """Tool-call arguments as written: a JSON string stays as is, an object is dumped."""
    if isinstance(args, str):
        return args
    if args is None:
        return ""
    return json.dumps(args, ensure_ascii=False)


def parse_tool_call(call: Any, rec: Record, field: str) -> tuple[str, str]:
    """(name, arguments) of an OpenAI tool call given as an object or as a JSON string of one
    (verifiers writes ``tool_calls`` as a list of JSON strings)."""
    if isinstance(call, str):
        try:
            call = json.loads(call)
        except ValueError:
            raise rec.error(
                "wrong_type", f"field `{field}` is a string that is not a JSON tool call.", field=field
            ) from None
    if not isinstance(call, dict):
        raise rec.error("wrong_type", f"field `{field}` must be a tool call object.", field=field)
    fn = call.get("function", call)
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise rec.error("missing_field", f"field `{field}.function.name` is missing.", field=field)
    return fn["name"], arguments_text(fn.get("arguments"))
