"""The one role table: which speaker of a transcript is the policy, which is a tool, which is prompt.

Every chat-shaped reader (app/ingest/_structure.py and the formats built on it) classifies a
message's role (``role``, ShareGPT's ``from``, LangChain's ``type``, an event's ``source``) by
:data:`ROLE_KINDS`, case-insensitively:

========  =================================================================================
kind      roles
========  =================================================================================
policy    assistant, model (Gemini), gpt (ShareGPT), bot, agent (AgentBench, OpenHands),
          ai (LangChain), chatbot, copilot, llm, completion, generate (Inspect's source),
          function_call, tool_call (ShareGPT tool-call turns: the text is the call)
tool      tool, function, ipython, observation, environment, env, tool_result,
          function_response, tool_response, exit (mini-swe-agent's final submission message),
          output, result
prompt    user, human, system, developer, instructions, prompt, input, context, question,
          task, user_simulator, customer
========  =================================================================================

A role outside the table is kept as prompt (shown, never given credit) and the upload's answer
warns about it (:func:`role_kind` returns it as unknown); nothing it can classify is refused.
A tool result before the policy's first turn is prompt: it is the task the environment opened
with, not the answer to a call (that rule lives with the turn builder).
"""

from __future__ import annotations

from typing import Final, Literal

Kind = Literal["policy", "tool", "prompt"]

POLICY: Final = frozenset(
    {
        "assistant",
        "model",
        "gpt",
        "bot",
        "agent",
        "ai",
        "chatbot",
        "copilot",
        "llm",
        "completion",
        "generate",
        "function_call",
        "tool_call",
    }
)
TOOL: Final = frozenset(
    {
        "tool",
        "function",
        "ipython",
        "observation",
        "environment",
        "env",
        "tool_result",
        "function_response",
        "tool_response",
        "exit",
        "output",
        "result",
    }
)
PROMPT: Final = frozenset(
    {
        "user",
        "human",
        "system",
        "developer",
        "instructions",
        "prompt",
        "input",
        "context",
        "question",
        "task",
        "user_simulator",
        "customer",
    }
)
_POLICY: Kind = "policy"
_TOOL: Kind = "tool"
_PROMPT: Kind = "prompt"
ROLE_KINDS: Final[dict[str, Kind]] = (
    dict.fromkeys(POLICY, _POLICY) | dict.fromkeys(TOOL, _TOOL) | dict.fromkeys(PROMPT, _PROMPT)
)


def normalise(role: str) -> str:
    """``"Assistant"``, ``"AI"``, ``"tool-result"`` -> the table's spelling (lower case, ``_``)."""
    return role.strip().lower().replace("-", "_").replace(" ", "_")


def role_kind(role: str) -> Kind | None:
    """The kind of ``role`` by the table, or None for a role the table does not list (the caller
    keeps it as prompt and warns)."""
    return ROLE_KINDS.get(normalise(role))


def is_known(role: str) -> bool:
    """True when ``role`` is in the table."""
    return normalise(role) in ROLE_KINDS
