"""Per-token array codecs: kind names <-> uint8 codes, arrays <-> little-endian bytes, token lists <->
JSON, and a native episode -> :class:`EpisodeArrays` for computation (a stored row decodes through
app/storage/codecs.py into the same dataclass).

Numeric arrays are read with fixed dtypes (float64, int32, uint8 kind codes) from the bytes
app/core/packing.py wrote (lossless, compact, little-endian, so a database moves between machines
unchanged) or, for rows stored before it, the plain little-endian arrays; no per-token Python.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, overload

import numpy as np

from app.core import domain
from app.core.domain import KIND_CODES, KIND_NAMES, POLICY
from app.core.packing import pack, pack_text, unpack
from app.core.schemas import EpisodeIn, Kind
from app.core.token_signals import SignalArrays, pack_signals

try:  # orjson is several times faster for the big token lists; json is the fallback.
    import orjson

    def json_dumps(obj: Any) -> str:
        """Compact JSON text."""
        return orjson.dumps(obj).decode()

    json_loads = orjson.loads
except ImportError:  # pragma: no cover
    json_dumps = json.dumps
    json_loads = json.loads  # type: ignore[assignment]

F64 = np.dtype("<f8")
I32 = np.dtype("<i4")
I64 = np.dtype("<i8")
# Token ids are stored as int32 (every vocabulary is far below 2**31) and read as int64.
MAX_TOKEN_ID = 2**31 - 1
# Per-token float64 fields of the native format, stored as bytes columns of the same name.
FLOAT_FIELDS = ("rewards", "values", "logprobs", "advantages", "ref_logprobs", "rollout_logprobs", "entropy")
# The trainer's per-token signals (optional; shown as signal rows, never used by the estimators).
SIGNAL_FIELDS = ("ref_logprobs", "rollout_logprobs", "entropy")
_KIND_NAMES = np.array(KIND_NAMES, dtype=object)


def kind_codes(kinds: Sequence[str]) -> np.ndarray:
    """[T] uint8 codes of validated kind names (a C-level map: no per-token Python bytecode)."""
    return np.frombuffer(bytes(map(KIND_CODES.__getitem__, kinds)), dtype=np.uint8)


def kind_names(codes: np.ndarray) -> list[Kind]:
    """[T] kind names of uint8 codes."""
    names: list[Kind] = _KIND_NAMES[codes].tolist()
    return names


def id_tokens(ids: np.ndarray) -> list[str]:
    """The ⟨id⟩ display strings of token ids (no token strings or tokenizer came with them)."""
    return [f"⟨{i}⟩" for i in ids.tolist()]


@overload
def decode(b: None, dtype: np.dtype) -> None: ...
@overload
def decode(b: bytes | np.ndarray, dtype: np.dtype) -> np.ndarray: ...
@overload
def decode(b: bytes | np.ndarray | None, dtype: np.dtype) -> np.ndarray | None: ...
def decode(b: bytes | np.ndarray | None, dtype: np.dtype) -> np.ndarray | None:
    """An array of ``dtype`` from a column's bytes (packed, or an old row's plain array), or from
    a prepared row's array not packed yet (app/core/validate.py); None stays None."""
    if b is None:
        return None
    if isinstance(b, np.ndarray):
        return b.astype(dtype, copy=False)
    return unpack(b, dtype)


# The array columns of an episode row, and the dtype each is read as.
ARRAY_COLUMNS = {
    **{name: F64 for name in FLOAT_FIELDS},
    "kinds": np.dtype(np.uint8),
    "turn_ids": I32,
    "token_ids": I32,
}


def pack_row(row: dict[str, Any]) -> int:
    """Pack a prepared episode row in place (its arrays, token JSON and token signals,
    app/core/packing.py) just before it is written; returns the bytes its columns then take
    (arrays, tokens, token signals and meta)."""
    size = 0
    signals = row.get("token_signals")
    if isinstance(signals, SignalArrays):
        row["token_signals"] = pack_signals(signals)
    size += len(row.get("token_signals") or b"")
    for name in ARRAY_COLUMNS:
        arr = row.get(name)
        if isinstance(arr, np.ndarray):
            row[name] = pack(arr)
        if row.get(name) is not None:
            size += len(row[name])
    text = row.get("tokens_json")
    if text and text != "null" and row.get("tokens_packed") is None:
        row["tokens_packed"] = pack_text(text)
        row["tokens_json"] = ""
    size += len(row.get("tokens_json") or "") + len(row.get("tokens_packed") or b"")
    return size + len(row.get("meta_json") or "")


def _floats(x: Any) -> np.ndarray | None:
    return None if x is None else np.asarray(x, dtype=F64)


@dataclass
class EpisodeArrays:
    """An episode decoded for computation. T = number of tokens.

    kinds:      [T] uint8 (0 prompt, 1 policy, 2 tool).
    rewards:    [T] float64 effective rewards (:func:`app.core.domain.effective_rewards`).
    values:     [T] float64 or None.
    advantages: [T] float64 or None: the trainer's own advantages, as uploaded.
    turn_ids:   [T] int32, -1 off-policy; uploaded ids or, by default, maximal policy runs.
    ref_logprobs, rollout_logprobs, entropy: [T] float64 or None, as uploaded.
    token_ids:  [T] int64 or None: the tokenizer ids, as uploaded.
    """

    tokens: list[str]
    kinds: np.ndarray
    rewards: np.ndarray
    values: np.ndarray | None
    logprobs: np.ndarray | None
    turn_ids: np.ndarray
    advantages: np.ndarray | None = None
    ref_logprobs: np.ndarray | None = None
    rollout_logprobs: np.ndarray | None = None
    entropy: np.ndarray | None = None
    token_ids: np.ndarray | None = None
    reward: float | None = None
    group: str | None = None
    truncated: bool = False
    bootstrap_value: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    slug: str | None = None
    batch_id: int | None = None
    # False: uploaded with neither a reward nor per-token rewards (app.core.domain.rewarded).
    rewarded: bool = True

    @property
    def policy(self) -> np.ndarray:
        """[T] bool policy mask."""
        return np.asarray(self.kinds == POLICY)

    @property
    def score(self) -> float:
        """The episode's score (:func:`app.core.domain.score`)."""
        return domain.score(self.kinds, self.rewards)


def turn_ids_of(policy: np.ndarray, uploaded: np.ndarray | None) -> np.ndarray:
    """[T] int32 turn ids: the uploaded ones on policy tokens (-1 elsewhere), else the default."""
    if uploaded is None:
        return domain.default_turn_ids(policy)
    return np.where(policy, uploaded, -1).astype(I32)


def uploaded_advantages(ep: EpisodeIn) -> list[float] | None:
    """The trainer's advantages of a native episode: ``advantages``, else the older spelling
    ``meta.uploaded_advantages`` (both mean the same)."""
    if ep.advantages is not None:
        return ep.advantages
    meta = ep.meta if isinstance(ep.meta, dict) else {}
    return meta.get("uploaded_advantages")


class EpisodeScalars(Protocol):
    """The per-episode scalars :func:`arrays_of` reads: a native episode, a stored row, or a
    prepared row's namespace."""

    @property
    def reward(self) -> float | None: ...
    @property
    def group(self) -> str | None: ...
    @property
    def truncated(self) -> bool: ...
    @property
    def bootstrap_value(self) -> float | None: ...


def arrays_of(
    src: EpisodeScalars,
    kinds: np.ndarray,
    floats: Mapping[str, np.ndarray | None],
    turn_ids: np.ndarray | None,
    tokens: list[str],
    meta: dict[str, Any],
    token_ids: np.ndarray | None,
) -> EpisodeArrays:
    """The :class:`EpisodeArrays` of decoded columns (``floats``: every name of FLOAT_FIELDS) and
    the episode's scalars; ``slug`` and ``batch_id`` are read when ``src`` has them."""
    return EpisodeArrays(
        tokens=tokens,
        kinds=kinds,
        rewards=domain.effective_rewards(kinds, floats["rewards"], src.reward),
        values=floats["values"],
        logprobs=floats["logprobs"],
        advantages=floats["advantages"],
        ref_logprobs=floats["ref_logprobs"],
        rollout_logprobs=floats["rollout_logprobs"],
        entropy=floats["entropy"],
        token_ids=token_ids,
        turn_ids=turn_ids_of(kinds == POLICY, turn_ids),
        reward=src.reward,
        group=src.group,
        truncated=src.truncated,
        bootstrap_value=src.bootstrap_value,
        meta=meta,
        slug=getattr(src, "slug", None),
        batch_id=getattr(src, "batch_id", None),
        rewarded=domain.rewarded(src.reward, floats["rewards"]),
    )


def arrays_from_native(ep: EpisodeIn) -> EpisodeArrays:
    """Decode an (already validated) native episode for computation, e.g. in the offline CLI."""
    floats = {name: _floats(getattr(ep, name)) for name in FLOAT_FIELDS}
    floats["advantages"] = _floats(uploaded_advantages(ep))
    tids = None if ep.turn_ids is None else np.asarray(ep.turn_ids, dtype=I32)
    ids = None if ep.token_ids is None else np.asarray(ep.token_ids, dtype=I64)
    meta = dict(ep.meta) | ({} if ep.turn_states is None else {"turn_states": ep.turn_states})
    return arrays_of(ep, kind_codes(ep.kinds), floats, tids, list(ep.tokens), meta, ids)
