"""Row codecs of the episode store: a stored ``episode`` row -> :class:`EpisodeArrays` for
computation, or -> the native episode exactly as uploaded. The array and JSON codecs themselves are
pure (app/core/arrays.py, app/core/token_signals.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from app.core.arrays import (
    F64,
    FLOAT_FIELDS,
    I32,
    I64,
    EpisodeArrays,
    arrays_of,
    decode,
    id_tokens,
    json_loads,
    kind_names,
)
from app.core.packing import unpack_text
from app.core.schemas import EpisodeIn
from app.core.token_signals import merge
from app.storage.models import Episode


def stored_meta(ep: Episode) -> Any:
    """The episode's meta as uploaded: ``meta_json`` with ``meta.token_signals`` put back from the
    ``token_signals`` column (migration 0014); a row stored before it has them in the JSON."""
    return merge(json_loads(ep.meta_json), ep.token_signals)


def stored_tokens(ep: Episode) -> list[str]:
    """The display strings of a stored episode: its token strings, or ⟨id⟩ of its token ids when
    only ids were uploaded (the tokens JSON is then ``null``: nothing is built at ingest). Since
    migration 0009 the JSON is packed in ``tokens_packed``; older rows have it in ``tokens_json``."""
    packed = getattr(ep, "tokens_packed", None)
    tokens: list[str] | None = json_loads(ep.tokens_json if packed is None else unpack_text(packed))
    if tokens is None:  # a row without token strings has token ids (app/core/validate.py)
        ids = decode(ep.token_ids, I32)
        return [] if ids is None else id_tokens(ids)
    return tokens


def episode_arrays(ep: Episode) -> EpisodeArrays:
    """Decode a stored row for computation (no per-token Python work besides the token JSON)."""
    floats = {name: decode(getattr(ep, name), F64) for name in FLOAT_FIELDS}
    kinds = decode(ep.kinds, np.dtype(np.uint8))
    return arrays_of(
        ep,
        kinds,
        floats,
        decode(ep.turn_ids, I32),
        stored_tokens(ep),
        stored_meta(ep),
        None if ep.token_ids is None else decode(ep.token_ids, I32).astype(I64),
    )


def episode_to_native(ep: Episode) -> EpisodeIn:
    """The stored episode in the native format, exactly as uploaded (arrays round-trip bit-exact)."""

    def fl(b: bytes | None) -> list[float] | None:
        return None if b is None else decode(b, F64).tolist()

    meta = stored_meta(ep)
    adv = ep.advantages
    old = meta.get("uploaded_advantages") if isinstance(meta, dict) else None
    if adv is not None and old is not None:
        if np.asarray(old, dtype=F64).tobytes() == decode(adv, F64).tobytes():
            adv = None  # filled from meta.uploaded_advantages, which round-trips as uploaded
    return EpisodeIn.model_construct(
        tokens=stored_tokens(ep),
        kinds=kind_names(decode(ep.kinds, np.dtype(np.uint8))),
        reward=ep.reward,
        rewards=fl(ep.rewards),
        values=fl(ep.values),
        logprobs=fl(ep.logprobs),
        advantages=fl(adv),
        ref_logprobs=fl(ep.ref_logprobs),
        rollout_logprobs=fl(ep.rollout_logprobs),
        entropy=fl(ep.entropy),
        token_ids=None if ep.token_ids is None else decode(ep.token_ids, I32).tolist(),
        turn_ids=None if ep.turn_ids is None else decode(ep.turn_ids, I32).tolist(),
        group=ep.group,
        truncated=ep.truncated,
        bootstrap_value=ep.bootstrap_value,
        meta=meta,
    )
