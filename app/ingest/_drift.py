"""Token-in/token-out: where a turn's prompt re-renders the tokens sampled before it.

A multi-turn loop that keeps token ids (NeMo Gym, agent-lightning, SkyRL, verifiers, prime-rl) hands
each turn's prompt to the engine as ids. When the loop decodes the model's reply to text and the
chat template encodes it again for the next turn, that prompt no longer starts with the ids the
model sampled: the trained sequence holds tokens the model never chose (a tool call re-serialised,
whitespace normalised). An episode is stored as it was sampled — the generated ids are the policy
tokens, and only what a turn's prompt adds after the sampled ids (tool output, template) is new — and
the re-rendered span is kept beside it, measured by :func:`align_turn`.

The alignment: ``p`` is the length of the common prefix of the ids sampled so far and the next
prompt. Past ``p`` the sampled tail ``S`` and the prompt's re-render of it are matched by
:class:`difflib.SequenceMatcher` over a window of the prompt (the re-render is about as long as what
it re-renders); the re-render ends where the last matched block ends, plus the unmatched sampled
tokens after it, one for one. What follows in the prompt is the turn's new part.
"""

from __future__ import annotations

from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Any

import numpy as np

from app.ingest._notes import warn
from app.ingest._tokenizer import TokenDecoder

DRIFT_WARNING = (
    "token-in/token-out: a turn's prompt re-renders tokens the model sampled as other tokens; the "
    "episode is stored as sampled and the re-render kept per turn in its `meta.drift`"
)

# How far past the sampled tail's length the re-render may run (a template that adds a few tokens
# around a re-serialised tool call).
WINDOW_SLACK = 64


@dataclass(frozen=True)
class TurnDrift:
    """How one turn's prompt re-renders the ids sampled before it.

    start:      index (in the ids sampled so far) where the prompt first differs.
    sampled:    the sampled ids from ``start`` on (what the model chose).
    rerendered: the prompt's ids that stand for them (what a trainer that reads the prompt trains on).
    differing:  sampled ids without a counterpart in the re-render (0: the turn re-renders nothing).
    new_from:   index in the prompt where its new part (tool output, template) begins.
    unmatched:  offsets in ``sampled`` of the ids without a counterpart (``differing`` of them).
    """

    start: int
    sampled: list[int]
    rerendered: list[int]
    differing: int
    new_from: int
    unmatched: tuple[int, ...] = ()

    @property
    def first_pair(self) -> tuple[int | None, int | None]:
        """(sampled id, re-rendered id) at the first position where they differ."""
        s = self.sampled[0] if self.sampled else None
        r = self.rerendered[0] if self.rerendered else None
        return s, r

    def as_meta(self, turn: int, position: int, at: list[int] | None = None) -> dict[str, object]:
        """The JSON an episode's ``meta.drift`` keeps for this turn (``position``: where the sampled
        span starts in the stored token row; ``at``: the stored positions of the sampled ids without
        a counterpart, by default ``position`` plus each unmatched offset)."""
        s, r = self.first_pair
        return {
            "turn": turn,
            "position": position,
            "sampled": len(self.sampled),
            "rerendered_ids": self.rerendered,
            "differing": self.differing,
            "first": [s, r],
            "at": at if at is not None else [position + k for k in self.unmatched],
        }


def common_prefix(a: list[int], b: list[int]) -> int:
    """The length of the longest common prefix of ``a`` and ``b``."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # the usual case: the prompt extends what was sampled (one C-level compare)
        return n
    # Bisect on slice comparisons (each in C) down to a short span, then step through it.
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 16:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    while lo < hi and a[lo] == b[lo]:
        lo += 1
    return lo


def align_turn(sampled_so_far: list[int], prompt: list[int]) -> TurnDrift | None:
    """None when ``prompt`` starts with ``sampled_so_far`` (token-in/token-out holds: the prompt's
    new part is ``prompt[len(sampled_so_far):]``); otherwise the :class:`TurnDrift` of the turn."""
    p = common_prefix(sampled_so_far, prompt)
    if p == len(sampled_so_far):
        return None
    tail = sampled_so_far[p:]
    window = prompt[p : p + len(tail) + WINDOW_SLACK]
    m = SequenceMatcher(None, tail, window, autojunk=False)
    blocks = [b for b in m.get_matching_blocks() if b.size]
    matched = sum(b.size for b in blocks)
    covered = bytearray(len(tail))
    for blk in blocks:
        covered[blk.a : blk.a + blk.size] = b"\x01" * blk.size
    if blocks:
        last = blocks[-1]
        end = last.b + last.size + (len(tail) - (last.a + last.size))
    else:
        end = len(tail)
    end = min(end, len(prompt) - p)
    return TurnDrift(
        start=p,
        sampled=tail,
        rerendered=prompt[p : p + end],
        differing=len(tail) - matched,
        new_from=p + end,
        unmatched=tuple(k for k, c in enumerate(covered) if not c),
    )


class TurnAssembler:
    """An episode assembled turn by turn as it was sampled (token-in/token-out).

    Each :meth:`add_turn` gives a model call's prompt ids and generated ids. The stored row
    (``ids``/``kinds``/``turns``) is the first prompt, then per turn the new part of its prompt and
    its generation. A prompt is compared with what the engine held one turn before (that turn's
    prompt plus its generation), so a re-render is counted once, in the turn whose prompt makes it;
    ``drift`` is the ``meta.drift`` entry of each such turn, with the stored positions of the
    sampled ids it changed (``at``; a re-rendered id that was itself never sampled has none).

    ``restarts``: for loops whose agent may replace its context rather than extend it (compaction,
    a sub-agent; agent-lightning's calls). A prompt that departs from the context inside an earlier
    prompt (not in the ids generated since) and keeps less than half of the context after that
    point is a new context, not a re-render: its whole prompt is stored as prompt, no drift.
    """

    def __init__(self, restarts: bool = False) -> None:
        self.ids: list[int] = []
        self.kinds: list[str] = []
        self.turns: list[int] = []
        self.drift: list[dict[str, object]] = []
        self.turn = -1
        self.restarts = restarts
        self._context: list[int] = []
        self._prompt_len = 0  # length of the last turn's prompt within the context
        self._where: list[int] = []  # stored position of each context id, -1 for a re-render

    def _rebuilt(self, d: TurnDrift) -> bool:
        """The prompt replaces the context (see ``restarts``) rather than re-rendering it."""
        return self.restarts and d.start < self._prompt_len and 2 * d.differing > len(d.sampled)

    def add_turn(
        self,
        prompt: list[int],
        generated: list[int],
        new_kind: str,
        generated_kinds: list[str] | None = None,
    ) -> int:
        """Append one model call: the new part of ``prompt`` (as ``new_kind``; the first turn's whole
        prompt is "prompt") and ``generated`` (policy, or ``generated_kinds`` per id: a trainer's
        response that holds the environment's ids after the model's). Returns how many prompt ids
        were new."""
        where = self._where
        if self.turn < 0:
            new_from, new_kind = 0, "prompt"
        else:
            d = align_turn(self._context, prompt)
            if d is None:
                new_from = len(self._context)
            elif self._rebuilt(d):
                new_from, new_kind = 0, "prompt"
                where.clear()
            else:
                new_from = d.new_from
                stored = [where[d.start + k] for k in range(len(d.sampled))]
                at = [stored[k] for k in d.unmatched if stored[k] >= 0]
                first = next((x for x in stored if x >= 0), len(self.ids))
                self.drift.append(d.as_meta(turn=self.turn + 1, position=first, at=at))
                warn(DRIFT_WARNING)
                del where[d.start :]
                where.extend([-1] * (d.new_from - d.start))
        new = prompt[new_from:]
        start = len(self.ids)
        self.ids += new
        self.kinds += [new_kind] * len(new)
        self.turns += [-1] * len(new)
        self.turn += 1
        gen_kinds = generated_kinds if generated_kinds is not None else ["policy"] * len(generated)
        self.ids += generated
        self.kinds += gen_kinds
        self.turns += [self.turn if k == "policy" else -1 for k in gen_kinds]
        where.extend(range(start, len(self.ids)))
        self._context = prompt + generated
        self._prompt_len = len(prompt)
        return len(new)


def keep_drift(meta: dict[str, Any], drift: list[dict[str, Any]], tokenizer: TokenDecoder | None) -> None:
    """``meta["drift"]``: the episode's re-renders (none: no key), named by the tokenizer's pieces."""
    if drift:
        name_rerenders(drift, tokenizer)
        meta["drift"] = drift


def name_rerenders(drift: list[dict[str, Any]], tokenizer: TokenDecoder | None) -> None:
    """Each drift record's re-rendered ids as the tokenizer's pieces (``rerendered_tokens``), for
    the episode page to draw under the sampled ones; nothing without a tokenizer."""
    if tokenizer is None:
        return
    for d in drift:
        d["rerendered_tokens"] = tokenizer.row(np.asarray(d["rerendered_ids"], dtype=np.int64))[0]
