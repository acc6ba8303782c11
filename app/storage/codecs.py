"""Row codecs of the episode store: a stored ``episode`` row -> :class:`EpisodeArrays` for
computation, or -> the native episode exactly as uploaded. The array and JSON codecs themselves are
pure (app/core/arrays.py).
"""

from __future__ import annotations

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
from app.core.schemas import EpisodeIn
from app.storage.models import Episode


def stored_tokens(ep: Episode) -> list[str]:
    """The display strings of a stored episode: its token strings, or ⟨id⟩ of its token ids when
    only ids were uploaded (``tokens_json`` is then JSON ``null``: nothing is built at ingest)."""
    tokens = json_loads(ep.tokens_json)
    if tokens is None:
        return id_tokens(np.frombuffer(ep.token_ids, dtype=I32))
    return tokens


def episode_arrays(ep: Episode) -> EpisodeArrays:
    """Decode a stored row for computation (no per-token Python work besides the token JSON)."""
    floats = {name: decode(getattr(ep, name), F64) for name in FLOAT_FIELDS}
    kinds = np.frombuffer(ep.kinds, dtype=np.uint8)
    return arrays_of(
        ep,
        kinds,
        floats,
        decode(ep.turn_ids, I32),
        stored_tokens(ep),
        json_loads(ep.meta_json),
        None if ep.token_ids is None else np.frombuffer(ep.token_ids, dtype=I32).astype(I64),
    )


def episode_to_native(ep: Episode) -> EpisodeIn:
    """The stored episode in the native format, exactly as uploaded (arrays round-trip bit-exact)."""

    def fl(b: bytes | None) -> list[float] | None:
        return None if b is None else np.frombuffer(b, dtype=F64).tolist()

    meta = json_loads(ep.meta_json)
    adv = ep.advantages
    old = meta.get("uploaded_advantages") if isinstance(meta, dict) else None
    if adv is not None and old is not None and np.asarray(old, dtype=F64).tobytes() == adv:
        adv = None  # filled from meta.uploaded_advantages, which round-trips as uploaded
    return EpisodeIn.model_construct(
        tokens=stored_tokens(ep),
        kinds=kind_names(np.frombuffer(ep.kinds, dtype=np.uint8)),
        reward=ep.reward,
        rewards=fl(ep.rewards),
        values=fl(ep.values),
        logprobs=fl(ep.logprobs),
        advantages=fl(adv),
        ref_logprobs=fl(ep.ref_logprobs),
        rollout_logprobs=fl(ep.rollout_logprobs),
        entropy=fl(ep.entropy),
        token_ids=None if ep.token_ids is None else np.frombuffer(ep.token_ids, dtype=I32).tolist(),
        turn_ids=None if ep.turn_ids is None else np.frombuffer(ep.turn_ids, dtype=I32).tolist(),
        group=ep.group,
        truncated=ep.truncated,
        bootstrap_value=ep.bootstrap_value,
        meta=meta,
    )
