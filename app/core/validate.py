"""The one validation of an episode: everything is checked before anything is written.

Every format ends as native episodes (app/ingest/); :func:`prepare_episode` checks each one and
encodes it as an ``episode`` row. The checks the ingest formats run on their own fields (lengths,
finite numbers) raise the same errors from here. Every error is a 4xx naming line, episode and
field (app/core/errors.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.core import domain
from app.core.arrays import (
    F64,
    FLOAT_FIELDS,
    I32,
    MAX_TOKEN_ID,
    id_tokens,
    json_dumps,
    json_loads,
    kind_codes,
    kind_names,
)
from app.core.errors import ApiError, located
from app.core.rows import EpisodeRow
from app.core.schemas import EpisodeIn
from app.core.settings import Settings
from app.core.token_signals import as_json, split

Where = dict[str, int | None]  # {"line": ..., "episode": ...}


def length_mismatch(name: str, got: int, n: int, where: Where, ref: str = "tokens") -> ApiError:
    """422: a per-token field has the wrong number of entries."""
    return located(
        422,
        "length_mismatch",
        f"field `{name}` has {got} entries but `{ref}` has {n}; every per-token field needs one entry "
        "per token.",
        field=name,
        **where,
    )


def check_finite(arr: np.ndarray, name: str, where: Where) -> None:
    """422 ``not_finite`` naming the first non-finite entry of a per-token array."""
    bad = ~np.isfinite(arr)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise located(
            422,
            "not_finite",
            f"field `{name}` has a non-finite number ({arr[i]}) at token {i}; only finite numbers are "
            "allowed.",
            field=name,
            **where,
        )


# The log-prob fields a trainer leaves unscored where its loss masks the position (prompt, tool
# output, padding): NaN or a missing value (null) there means "not scored", never a mismatch.
UNSCORED_OK = ("logprobs", "ref_logprobs", "rollout_logprobs")


def _unscored_to_zero(arr: np.ndarray, policy: np.ndarray, name: str, where: Where) -> tuple[np.ndarray, int]:
    """``arr`` with its non-finite entries off the policy tokens (not scored) as 0.0, and how many
    there were: every summary compares policy tokens only (app/compute/mismatch.py), and 0.0 keeps
    the arithmetic over whole rows finite. A non-finite entry on a policy token is refused (422
    ``not_finite`` naming the field and the token)."""
    bad = ~np.isfinite(arr)
    if not bad.any():
        return arr, 0
    check_finite(np.where(policy, arr, 0.0), name, where)
    return np.where(bad, 0.0, arr), int(bad.sum())


def check_finite_scalar(value: float | None, name: str, where: Where) -> None:
    """422 ``not_finite`` for an infinite or NaN scalar (None passes)."""
    if value is not None and not math.isfinite(value):
        raise located(
            422, "not_finite", f"field `{name}` is {value}; it must be a finite number.", field=name, **where
        )


def _number_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)


def _check_meta(meta: Any, n: int, n_turns: int, where: Where) -> None:
    """The meta fields the service computes with must have the right shape (checked at upload,
    so the advantages API never meets a malformed one)."""
    if not isinstance(meta, dict):
        raise located(422, "wrong_type", "field `meta` must be an object.", field="meta", **where)
    for key, want, what in (
        ("turn_values", n_turns, "one value per turn"),
        ("uploaded_advantages", n, "one advantage per token"),
    ):
        v = meta.get(key)
        if v is None:
            continue
        if not _number_list(v) or not np.isfinite(np.asarray(v, dtype=F64)).all() or len(v) != want:
            got = f"{len(v)} entries" if isinstance(v, list) else type(v).__name__
            raise located(
                422,
                "bad_meta",
                f"field `meta.{key}` must be a list of {want} finite numbers ({what}); got {got}.",
                field=f"meta.{key}",
                **where,
            )
    special = meta.get("special_tokens")
    if special is not None and not (
        isinstance(special, list)
        and all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n for i in special)
    ):
        raise located(
            422,
            "bad_meta",
            f"field `meta.special_tokens` must be a list of token positions between 0 and {n - 1}.",
            field="meta.special_tokens",
            **where,
        )


def check_turn_states(meta: dict[str, Any], n_turns: int, where: Where, name: str) -> None:
    """``turn_states`` (or ``meta.turn_states``): one anchor-state string (or null) per turn."""
    v = meta.get("turn_states")
    if v is None:
        return
    if not isinstance(v, list) or not all(x is None or isinstance(x, str) for x in v) or len(v) != n_turns:
        got = f"{len(v)} entries" if isinstance(v, list) else type(v).__name__
        raise located(
            422,
            "bad_turn_states",
            f"field `{name}` must be a list of {n_turns} strings or nulls (one anchor state per turn); "
            f"got {got}.",
            field=name,
            **where,
        )


def text_column(value: Any) -> str | None:
    """A free-form string for an indexed text column (task, batch name): PostgreSQL text cannot
    hold NUL, so it is dropped there; the exact value stays in the row's JSON (meta)."""
    return None if value is None else str(value).replace("\x00", "")


@dataclass
class ArrayEpisode:
    """One episode as arrays, the way binary formats (safetensors) hand it over: no per-token
    Python objects. :func:`prepare_episode` checks it with the same rules as a native episode.

    kinds:       [T] uint8 codes (0 prompt, 1 policy, 2 tool).
    floats:      per-token float arrays by native field name (any float dtype; absent = None).
    token_ids:   [T] integer ids or None.
    tokens:      the display strings, or None; ``tokens_json`` the same already encoded as JSON.
                 Without either, only the ids are stored and display as ⟨id⟩.
    """

    kinds: np.ndarray
    floats: dict[str, np.ndarray] = field(default_factory=dict)
    token_ids: np.ndarray | None = None
    tokens: list[str] | None = None
    tokens_json: str | None = None
    turn_ids: np.ndarray | None = None
    reward: float | None = None
    group: str | None = None
    truncated: bool = False
    bootstrap_value: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    turn_states: list[str | None] | None = None  # the native field (kept in meta when stored)


def _int_array(vals: list[int], name: str, where: Where) -> np.ndarray:
    try:
        return np.asarray(vals, dtype=np.int64)
    except (OverflowError, ValueError, TypeError):
        raise located(
            422, "wrong_type", f"field `{name}` must hold 64-bit integers.", field=name, **where
        ) from None


def from_native(ep: EpisodeIn, where: Where) -> ArrayEpisode:
    """A native episode as arrays (lengths checked first, so errors name the list field)."""
    n = len(ep.tokens)
    for name in ("kinds", *FLOAT_FIELDS, "turn_ids", "token_ids"):
        arr = getattr(ep, name)
        if arr is not None and len(arr) != n:
            raise length_mismatch(name, len(arr), n, where)
    floats = {}
    for name in FLOAT_FIELDS:
        vals = getattr(ep, name)
        if vals is not None:
            floats[name] = np.asarray(vals, dtype=F64)
    return ArrayEpisode(
        kinds=kind_codes(ep.kinds),
        floats=floats,
        token_ids=None if ep.token_ids is None else _int_array(ep.token_ids, "token_ids", where),
        tokens=ep.tokens,
        turn_ids=None if ep.turn_ids is None else _int_array(ep.turn_ids, "turn_ids", where),
        reward=ep.reward,
        group=ep.group,
        truncated=ep.truncated,
        bootstrap_value=ep.bootstrap_value,
        meta=ep.meta,
        turn_states=ep.turn_states,
    )


def native_of(ep: ArrayEpisode) -> EpisodeIn:
    """An array episode as a native one (for the offline CLI; not validated here). Its
    ``meta.token_signals`` arrays become lists, as the stored episode reads them back."""
    if ep.tokens is not None:
        tokens = list(ep.tokens)
    elif ep.tokens_json is not None and ep.tokens_json != "null":
        tokens = json_loads(ep.tokens_json)
    else:
        tokens = id_tokens(np.asarray(ep.token_ids))
    floats = {
        n: (None if (a := ep.floats.get(n)) is None else np.asarray(a, F64).tolist()) for n in FLOAT_FIELDS
    }
    meta = ep.meta
    if isinstance(signals := meta.get("token_signals"), dict):
        meta = {**meta, "token_signals": {k: as_json(v) for k, v in signals.items()}}
    return EpisodeIn.model_construct(
        tokens=tokens,
        kinds=kind_names(np.asarray(ep.kinds, dtype=np.uint8)),
        reward=ep.reward,
        **floats,
        token_ids=None if ep.token_ids is None else np.asarray(ep.token_ids).tolist(),
        turn_ids=None if ep.turn_ids is None else np.asarray(ep.turn_ids).tolist(),
        group=ep.group,
        truncated=ep.truncated,
        bootstrap_value=ep.bootstrap_value,
        meta=meta,
    )


def prepare_episode(
    ep: EpisodeIn | ArrayEpisode,
    *,
    episode: int | None,
    line: int | None,
    settings: Settings | None = None,
) -> EpisodeRow:
    """Validate one episode (native or :class:`ArrayEpisode`) and prepare its ``episode`` row
    (without batch id and slug): the summary columns, and the arrays as numpy arrays (float64,
    int32, uint8 kind codes) that :func:`app.core.arrays.pack_row` packs just before the row is
    written, so what is computed at ingest reads them without decoding. Both kinds of input go
    through the same checks.

    Raises ApiError (422 with line/episode/field; 413 for too many tokens)."""
    where: Where = {"line": line, "episode": episode}
    if isinstance(ep, EpisodeIn):
        _check_size(len(ep.tokens), where, settings)  # before any array is built from the lists
        ep = from_native(ep, where)
    return _prepare(ep, where, settings)


def _check_size(n: int, where: Where, settings: Settings | None) -> None:
    max_tokens = settings.max_tokens_per_episode if settings else None
    if max_tokens is not None and n > max_tokens:
        raise located(
            413,
            "too_many_tokens",
            f"the episode has {n} tokens; the limit is {max_tokens} tokens per episode "
            "(setting CREDITLENS_MAX_TOKENS_PER_EPISODE).",
            field="tokens",
            **where,
        )
    if n == 0:
        raise located(422, "empty_episode", "field `tokens` is empty.", field="tokens", **where)


def _prepare(ep: ArrayEpisode, where: Where, settings: Settings | None) -> EpisodeRow:
    kinds = np.asarray(ep.kinds)
    n = len(kinds)
    _check_size(n, where, settings)
    if kinds.dtype != np.uint8 or int(kinds.max()) > 2:
        raise located(
            422, "unknown_kind", "field `kinds` holds a code other than 0, 1, 2.", field="kinds", **where
        )
    if ep.tokens is not None and len(ep.tokens) != n:
        raise length_mismatch("tokens", len(ep.tokens), n, where, ref="kinds")
    for name in (*FLOAT_FIELDS, "token_ids", "turn_ids"):
        arr = ep.floats.get(name) if name in FLOAT_FIELDS else getattr(ep, name)
        if arr is not None and len(arr) != n:
            raise length_mismatch(name, len(arr), n, where)
    policy = kinds == domain.POLICY
    if not policy.any():
        raise located(
            422,
            "empty_policy_span",
            "no token has kind `policy`, so there is nothing to credit; mark the tokens the model "
            "generated as `policy`.",
            field="kinds",
            **where,
        )
    row: dict[str, Any] = {}
    not_scored: dict[str, int] = {}
    for name in FLOAT_FIELDS:
        arr = ep.floats.get(name)
        if arr is None:
            row[name] = None
            continue
        arr = np.asarray(arr, dtype=F64)  # float16/32 -> float64 is exact
        if name in UNSCORED_OK:
            arr, k = _unscored_to_zero(arr, policy, name, where)
            if k:
                not_scored[name] = k
        else:
            check_finite(arr, name, where)
        row[name] = arr
    for name in ("reward", "bootstrap_value"):
        check_finite_scalar(getattr(ep, name), name, where)
    if ep.token_ids is not None:
        ids = np.asarray(ep.token_ids)
        if ids.dtype.kind not in "iu" or (ids.size and (ids.min() < 0 or ids.max() > MAX_TOKEN_ID)):
            raise located(
                422,
                "bad_token_ids",
                f"field `token_ids` must hold integer ids between 0 and {MAX_TOKEN_ID}.",
                field="token_ids",
                **where,
            )
        row["token_ids"] = ids.astype(I32)
    else:
        row["token_ids"] = None
    if ep.turn_ids is not None:
        tids = np.asarray(ep.turn_ids, dtype=np.int64)
        # 0 <= turn < T on policy tokens: per-turn arrays are sized by the largest index.
        if ((tids[policy] < 0) | (tids[policy] >= n)).any():
            raise located(
                422,
                "bad_turn_ids",
                f"field `turn_ids` needs a turn index between 0 and {n - 1} on every policy token "
                "(-1 or anything is fine elsewhere).",
                field="turn_ids",
                **where,
            )
        row["turn_ids"] = tids.astype(I32)
        n_turns = len(np.unique(tids[policy]))
    else:
        row["turn_ids"] = None
        n_turns = int(domain.default_turn_ids(policy).max()) + 1
    _check_meta(ep.meta, n, n_turns, where)
    meta = ep.meta
    if ep.turn_states is not None:  # the native field is kept in meta (no column, no migration)
        meta = {**ep.meta, "turn_states": ep.turn_states}
    if not_scored:
        meta = {**meta, "not_scored": not_scored}
    check_turn_states(meta, n_turns, where, "meta.turn_states" if ep.turn_states is None else "turn_states")
    if row["advantages"] is None and (adv := ep.meta.get("uploaded_advantages")) is not None:
        row["advantages"] = np.asarray(adv, dtype=F64)  # the older spelling, checked above
    if ep.tokens_json is not None:
        tokens_json = ep.tokens_json
    elif ep.tokens is not None:
        tokens_json = json_dumps(ep.tokens)
    elif ep.token_ids is not None:
        tokens_json = "null"  # display ⟨id⟩ of the stored ids (codecs.stored_tokens)
    else:
        raise located(422, "missing_field", "field `tokens` is missing.", field="tokens", **where)
    rewards = row["rewards"]
    score = domain.score(kinds, domain.effective_rewards(kinds, rewards, ep.reward))
    meta, signals = split(meta, n)  # per-token number lists: packed, not JSON text
    return EpisodeRow(
        rewards=rewards,
        values=row["values"],
        logprobs=row["logprobs"],
        advantages=row["advantages"],
        ref_logprobs=row["ref_logprobs"],
        rollout_logprobs=row["rollout_logprobs"],
        entropy=row["entropy"],
        token_ids=row["token_ids"],
        turn_ids=row["turn_ids"],
        group=ep.group,
        task=text_column(ep.meta.get("task")),
        n_tokens=n,
        n_policy=int(policy.sum()),
        n_turns=n_turns,
        reward=ep.reward,
        score=score,
        passed=domain.passed(ep.reward, score),
        truncated=ep.truncated,
        bootstrap_value=ep.bootstrap_value,
        tokens_json=tokens_json,
        kinds=kinds,
        meta_json=json_dumps(meta),
        token_signals=signals,
    )
