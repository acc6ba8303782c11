"""Prompt history: the same prompt followed across a run's steps, computed at ingest over every
episode of a step (kept or not).

A prompt is an episode's leading prompt tokens (those before its first non-prompt token). Its
``key`` is keyed by those tokens, not by a trainer's per-step ids (verl's ``uid`` changes every
step): the sha256 of their token ids when the episode has ids, else of their strings, as 16 hex
digits. Per step and prompt: ``n`` episodes, ``n_passed``, and the sum of |A| over their policy
tokens with the number of those tokens (``mean_abs_adv`` is their ratio; None without advantages).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from app.core import domain
from app.core.arrays import F64, I32, decode, id_tokens, json_loads
from app.core.rows import EpisodeRow
from app.core.tokenize import join_tokens

PROMPT_TEXT_MAX = 4000  # characters of a prompt's text kept for display


@dataclass
class PromptStep:
    """One prompt at one step."""

    key: str
    prompt: str
    n_tokens: int
    n: int = 0
    n_passed: int = 0
    sum_abs_adv: float = 0.0
    n_adv_tokens: int = 0
    has_adv: bool = False
    n_kept: int = 0
    group: str | None = None
    members: list[int] = field(default_factory=list)

    @property
    def mean_abs_adv(self) -> float | None:
        return self.sum_abs_adv / self.n_adv_tokens if self.has_adv and self.n_adv_tokens else None


def prompt_key(row: EpisodeRow) -> tuple[str, int]:
    """(key, number of tokens) of a prepared row's leading prompt (see the module docstring)."""
    kinds = row["kinds"]
    not_prompt = np.flatnonzero(kinds != domain.PROMPT)
    k = int(not_prompt[0]) if len(not_prompt) else len(kinds)
    ids = row.get("token_ids")
    if ids is not None:
        key_bytes = b"ids:" + ids[:k].astype("<i4").tobytes()
    else:
        key_bytes = b"text:" + "\x00".join((_tokens(row) or [])[:k]).encode()
    return hashlib.sha256(key_bytes).hexdigest()[:16], k


def prompt_text(row: EpisodeRow, k: int) -> str:
    """The display text of a prepared row's first ``k`` tokens (at most :data:`PROMPT_TEXT_MAX`
    characters; each token is at least one character, so no more tokens than that are read)."""
    tokens = _tokens(row)
    if tokens is None:
        ids = decode(row.get("token_ids"), I32)
        tokens = [] if ids is None else id_tokens(ids[: min(k, PROMPT_TEXT_MAX)])
    return join_tokens(tokens[: min(k, PROMPT_TEXT_MAX)])[:PROMPT_TEXT_MAX]


def _tokens(row: EpisodeRow) -> list[str] | None:
    text_json = row.get("tokens_json")
    if not text_json or text_json == "null":
        return None
    tokens: list[str] = json_loads(text_json)
    return tokens


def prompt_steps(rows: list[EpisodeRow], kept: set[int] | None = None) -> list[PromptStep]:
    """A step's prompts over all its prepared rows; ``kept``: the indices stored in full."""
    out: dict[str, PromptStep] = {}
    for i, row in enumerate(rows):
        key, n_tokens = prompt_key(row)
        p = out.get(key)
        if p is None:  # the text once per prompt, not once per episode
            text = prompt_text(row, n_tokens)
            p = out[key] = PromptStep(key=key, prompt=text, n_tokens=n_tokens, group=row.get("group"))
        p.n += 1
        p.n_passed += bool(row["passed"])
        p.n_kept += kept is None or i in kept
        p.members.append(i)
        adv = decode(row.get("advantages"), F64)
        if adv is not None:
            policy = row["kinds"] == domain.POLICY
            p.has_adv = True
            p.sum_abs_adv += float(np.abs(adv[policy]).sum())
            p.n_adv_tokens += int(policy.sum())
    return list(out.values())


def count_kept(prompts: list[PromptStep], kept: set[int]) -> None:
    """Set each prompt's ``n_kept`` to its episodes among ``kept`` (the indices stored in full)."""
    for p in prompts:
        p.n_kept = sum(1 for i in p.members if i in kept)
