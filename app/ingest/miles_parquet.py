"""miles (and slime-derived) dashboard columns: ``{dump-details}/dashboard_columns/rollout_{id}.parquet``,
the per-token mirror of a rollout dump that miles writes for its dashboard's token view (one row
per sample; ``save_dashboard_columns``). Columns:

* ``sample_index``, ``response_length``, ``total_length``; ``tokens`` (``total_length`` ids: the
  prompt, then the response's ``response_length`` ids);
* ``loss_mask`` (over the response): 1 -> policy; 0 -> tool after the first trained id (a
  multi-turn sample's environment turns), prompt before it; null: every response id trained;
* ``rollout_log_probs`` (over the response; null when the engine gave none): the engine's
  log-probs -> ``logprobs`` (``rollout_logprobs`` when a training-side ``log_probs`` column is
  there too); 0.0 at loss-masked positions is miles' placeholder (never scored) and is kept as it is;
* columns of the dashboard's token view when a file carries them, all over the response:
  ``log_probs`` / ``train_log_probs`` -> ``logprobs``, ``ref_log_probs`` -> ``ref_logprobs``,
  ``entropy``, ``advantages`` (the scheme ``uploaded``); ``returns``, ``lp_diff``, ``imp_ratio``,
  ``ref_entropy`` -> ``meta.token_signals``; null entries are 0 in the arrays, counted in
  ``meta.non_finite``;
* ``reward`` and ``group_index`` when present (else the group is the prompt's hash).

A ``loss_mask`` of another length than the response is kept (missing entries untrained) with
``meta.mask_misaligned``; ``tokens`` not ``total_length`` long, or another per-token column of the
wrong length, is a 422 naming the column and the sample.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from app.core.errors import ApiError, located
from app.core.schemas import EpisodeIn, Kind
from app.ingest._common import short_hash
from app.ingest._document import Document
from app.ingest._ids import dump_episode, shown_tokens
from app.ingest._registry import Pair, register_format
from app.ingest._tokenizer import TokenDecoder

_MAGIC = b"PAR1"
REQUIRED = ("tokens", "total_length", "response_length")
# Response-side column -> native field.
NATIVE = {
    "log_probs": "logprobs",
    "train_log_probs": "logprobs",
    "ref_log_probs": "ref_logprobs",
    "entropy": "entropy",
    "advantages": "advantages",
}
SIGNALS = ("returns", "lp_diff", "imp_ratio", "ref_entropy")


def _schema_names(data: bytes) -> set[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return set(pq.read_schema(pa.BufferReader(data)).names)
    except Exception:  # noqa: BLE001 - a file pyarrow cannot read is not this format's to claim
        return set()


def sniff(doc: Document) -> bool:
    if doc.data[:4] != _MAGIC or doc.data[-4:] != _MAGIC:
        return False
    names = _schema_names(doc.data)
    return all(c in names for c in REQUIRED) and ("loss_mask" in names or "rollout_log_probs" in names)


def _err(message: str, field: str | None = None, episode: int | None = None) -> ApiError:
    return located(422, "bad_miles_columns", message, field=field, episode=episode)


def _numbers(row: dict[str, Any], name: str, n: int, i: int) -> tuple[list[float], int] | None:
    v = row.get(name)
    if v is None:
        return None
    if not isinstance(v, list) or len(v) != n:
        got = len(v) if isinstance(v, list) else type(v).__name__
        raise _err(f"column `{name}` has {got} entries for a response of {n} ids.", name, i + 1)
    out, nulls = [], 0
    for x in v:
        if x is None or (isinstance(x, float) and not math.isfinite(x)):
            nulls += 1
            out.append(0.0)
        else:
            out.append(float(x))
    return out, nulls


def _episode(row: dict[str, Any], i: int, tokenizer: TokenDecoder | None) -> EpisodeIn:
    tokens = row.get("tokens")
    total, resp = row.get("total_length"), row.get("response_length")
    if not isinstance(total, int) or not isinstance(resp, int) or not 0 <= resp <= total:
        raise _err(
            f"`response_length` {resp!r} and `total_length` {total!r} do not fit.", "response_length", i + 1
        )
    if not isinstance(tokens, list) or len(tokens) != total:
        have = len(tokens) if isinstance(tokens, list) else type(tokens).__name__
        raise _err(f"column `tokens` has {have} ids; `total_length` says {total}.", "tokens", i + 1)
    ids = [int(t) for t in tokens]
    p = total - resp
    meta: dict[str, Any] = {
        k: v
        for k, v in row.items()
        if isinstance(v, (str, int, float, bool)) and k not in ("reward", "group_index")
    }
    raw = row.get("loss_mask")
    mask = [1] * resp if raw is None else [int(bool(x)) for x in raw[:resp]] + [0] * (resp - len(raw))
    if raw is not None and len(raw) != resp:
        lo = len(raw) if len(raw) < resp else max(0, resp - (len(raw) - resp))
        meta["mask_misaligned"] = {
            "reason": f"`loss_mask` has {len(raw)} entries for a response of {resp} ids",
            "mask_length": len(raw),
            "ids_length": resp,
            "at": [p + k for k in range(lo, resp)],
        }
    kinds: list[Kind] = ["prompt"] * p
    seen = False
    for m in mask:
        seen = seen or bool(m)
        kinds.append("policy" if m else ("tool" if seen else "prompt"))
    pad = [0.0] * p
    fields: dict[str, list[float] | None] = {}
    non_finite: dict[str, int] = {}
    for src, dst in NATIVE.items():
        got = _numbers(row, src, resp, i)
        if got is not None and dst not in fields:
            fields[dst] = pad + got[0]
            if got[1]:
                non_finite[src] = got[1]
    rollout = _numbers(row, "rollout_log_probs", resp, i)
    if rollout is not None:
        fields["rollout_logprobs" if "logprobs" in fields else "logprobs"] = pad + rollout[0]
        if rollout[1]:
            non_finite["rollout_log_probs"] = rollout[1]
    signals: dict[str, list[float]] = {}
    for s in SIGNALS:
        got = _numbers(row, s, resp, i)
        if got is not None:
            signals[s] = pad + got[0]
    if signals:
        meta["token_signals"] = signals
    if non_finite:
        meta["non_finite"] = non_finite
    shown = shown_tokens(ids, tokenizer, meta)
    reward = row.get("reward")
    group = row.get("group_index")
    return dump_episode(
        shown,
        kinds,
        ids,
        reward=float(reward) if isinstance(reward, (int, float)) and math.isfinite(reward) else None,
        group=str(group) if group is not None else short_hash(str(ids[:p])),
        meta=meta,
        signals=fields,
    )


def episodes(doc: Document, tokenizer: TokenDecoder | None) -> Iterator[Pair]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(pa.BufferReader(doc.data))
    except Exception as exc:  # noqa: BLE001 - pyarrow's own message says which part is damaged
        raise ApiError(
            422, "damaged_file", f"the parquet file could not be read: {exc}.", field="file"
        ) from None
    names = set(pf.schema_arrow.names)
    missing = [c for c in REQUIRED if c not in names]
    if missing:
        raise _err(f"the parquet file has no column `{missing[0]}` (miles' dashboard columns).", missing[0])
    i = 0
    for rg in range(pf.num_row_groups):
        try:
            batch = pf.read_row_group(rg)
        except Exception as exc:  # noqa: BLE001
            raise ApiError(
                422,
                "damaged_file",
                f"row group {rg} of the parquet file could not be read: {exc}.",
                field="file",
            ) from None
        for row in batch.to_pylist():
            yield None, _episode(row, i, tokenizer)
            i += 1


register_format(
    name="miles_parquet",
    description=(
        "miles dashboard columns parquet (dashboard_columns/rollout_N.parquet: tokens, loss_mask, "
        "rollout_log_probs, response/total lengths; token-view columns when present)"
    ),
    priority=0,  # before trl_completions, which claims every parquet file
    sniff=sniff,
    episodes=episodes,
    takes_tokenizer=True,
)
