"""The prepared episode row: what :func:`app.core.validate.prepare_episode` makes of one validated
episode, what the computations of an upload or a run step read (app/compute/step.py) and what the
episode store packs and writes (app/storage/store.py), one per ``episode`` table row.

Its arrays are numpy arrays, not packed yet: float64 per-token fields, uint8 kind codes, int32
token and turn ids (None where the upload has none). The store adds the row's slug, its position
in the upload and its batch id when it writes it.
"""

from __future__ import annotations

from typing import Literal, TypedDict, get_args

import numpy as np

from app.core.token_signals import SignalArrays

# The per-token float64 fields, by name (app/core/arrays.py FLOAT_FIELDS, as a type).
FloatField = Literal[
    "rewards", "values", "logprobs", "advantages", "ref_logprobs", "rollout_logprobs", "entropy"
]
FLOAT_COLUMNS: tuple[FloatField, ...] = get_args(FloatField)


class EpisodeRow(TypedDict):
    """One validated episode as an ``episode`` row (app/storage/models.py ``Episode``), its arrays
    not packed yet. T = number of tokens."""

    rewards: np.ndarray | None  # [T] float64
    values: np.ndarray | None  # [T] float64
    logprobs: np.ndarray | None  # [T] float64
    advantages: np.ndarray | None  # [T] float64 (also from the older meta.uploaded_advantages)
    ref_logprobs: np.ndarray | None  # [T] float64
    rollout_logprobs: np.ndarray | None  # [T] float64
    entropy: np.ndarray | None  # [T] float64
    token_ids: np.ndarray | None  # [T] int32
    turn_ids: np.ndarray | None  # [T] int32, as uploaded
    kinds: np.ndarray  # [T] uint8 codes
    group: str | None
    task: str | None
    n_tokens: int
    n_policy: int
    n_turns: int
    reward: float | None
    score: float
    passed: bool
    truncated: bool
    bootstrap_value: float | None
    tokens_json: str  # the token strings as JSON ("null": only ids were uploaded)
    meta_json: str  # the meta without the token_signals entries below
    # meta.token_signals' per-token number lists as arrays (app/core/token_signals.py), packed
    # into the ``token_signals`` column; None when the meta has none.
    token_signals: SignalArrays | None
