"""Token ids shown as tokens: the pieces of the upload's tokenizer.json, else ``⟨id⟩``. Shared by
the formats that read trainers' token dumps (prime-rl, SkyRL, miles, verifiers traces)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from app.core.schemas import EpisodeIn, Kind
from app.ingest._common import id_token
from app.ingest._tokenizer import TokenDecoder


def shown_tokens(ids: list[int], tokenizer: TokenDecoder | None, meta: dict[str, Any]) -> list[str]:
    """The display strings of ``ids``; with a tokenizer its special tokens go to
    ``meta["special_tokens"]``."""
    if tokenizer is None:
        return [id_token(i) for i in ids]
    tokens, special = tokenizer.row(np.asarray(ids, dtype=np.int64))
    if special:
        meta["special_tokens"] = special
    return tokens


# EpisodeIn's per-token signal fields: what a trainer's dump may hold besides the ids.
TOKEN_FIELDS = ("rewards", "values", "logprobs", "advantages", "ref_logprobs", "rollout_logprobs", "entropy")


def dump_episode(
    tokens: list[str],
    kinds: list[Kind],
    ids: list[int],
    *,
    group: str | None,
    meta: dict[str, Any],
    signals: Mapping[str, list[float] | None],
    reward: float | None = None,
) -> EpisodeIn:
    """One episode of a token dump, built without validation (the reader has checked lengths and
    finiteness): ``signals`` by EpisodeIn's field names (others, such as verl's ``returns``, are
    not fields and are left out)."""
    arrays: dict[str, Any] = {name: signals.get(name) for name in TOKEN_FIELDS}
    return EpisodeIn.model_construct(
        tokens=tokens, kinds=kinds, token_ids=ids, reward=reward, group=group, meta=meta, **arrays
    )
