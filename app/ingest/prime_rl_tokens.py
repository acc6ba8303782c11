"""prime-rl token exports: ``token_exports/step_N/rank_R.jsonl`` (the trainer's
``enable_token_export``), one JSON line per trained sample, written by every rank; a ``STABLE`` file
lands in the step folder once all ranks flushed (``creditlens watch`` waits for it).

A line holds the sample's scalars (``schema_version``, ``step``, ``export_step``, ``rank``,
``micro_step``, ``micro_sequence_idx``, ``export_sequence_idx``, ``run_id``, ``env_name``, in schema
2 also ``sample_id`` and ``preflight_only``; kept as meta) and one list per token field, all as long
as ``token_ids``:

* ``loss_mask`` (bool): true -> policy; false before the first trained token -> prompt, after it
  -> tool (the environment's turns of a multi-turn sample);
* ``advantages`` -> ``advantages`` (the scheme ``uploaded``, as the loss saw them);
  ``trainer_logprobs`` -> ``logprobs``, ``inference_logprobs`` -> ``rollout_logprobs``,
  ``entropy`` -> ``entropy``; ``rewards`` (per token, null when the trainer had none): the reward
  is the value at the last trained token;
* every other per-token field (``mismatch_kl``, ``importance_ratio``, ``log_importance_ratio``,
  ``prob_delta``, ``is_masked``, ``is_masked_high``, ``is_masked_low``, ``temperatures``, the loss
  term weights ``rl_weights``/``ce_weights``/``ref_kl_weights``/``sdpo_weights``, ...) is kept row
  by row in ``meta.token_signals`` (a list of booleans as booleans, numbers as float64, null
  where the trainer wrote null);
* prime-rl writes ``null`` for a non-finite number. In the arrays the service computes with, such
  an entry is 0 and ``meta.non_finite`` counts them per field;
* schema 1's ``losses`` (per token, ``{loss: {advantage, mask}}``) is kept in meta as it is.

A ``loss_mask`` longer or shorter than ``token_ids`` is kept: the missing entries are read as
"not trained", and ``meta.mask_misaligned`` names the positions (the audit's ``mask_misaligned``).
Any other per-token field of the wrong length is refused, naming it. Group: the hash of the prompt
ids (their int64 bytes; the rollouts of one example share their prompt).

A step of 512 samples x 8,192 tokens is ~800 MB of JSON numbers, so each line is read as columns
(app/ingest/_columns.py): every list of numbers (nulls as NaN: prime-rl's non-finite numbers and
its unused loss terms) or of booleans becomes one array straight from the text, exactly and with
no Python object per number, by the compiled reader on two threads (~1,400 MB/s here) or else by
simdjson (~800 MB/s; orjson and one ``numpy.fromiter`` per list: ~370 MB/s). A list that is
anything else comes as a Python list and is typed in one C-level call (``bytes`` for booleans,
``array``/``numpy.fromiter`` otherwise); a line neither reader takes (NaN, a nested list, a single
JSON document) is read as any JSON is, with the same rules. The episode is handed over as arrays
(:class:`~app.core.validate.ArrayEpisode`), its signals as arrays (bool, or float64 with NaN where
the trainer wrote null); no per-token Python loop runs unless a field will not convert and the
entry at fault is named. One line is read at a time (the upload never holds more than one sample's
arrays).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterator
from typing import Any

import numpy as np

from app.core.validate import ArrayEpisode
from app.ingest._columns import ColumnReader
from app.ingest._common import Record, scalar_meta, short_hash
from app.ingest._document import Document, looks_like_jsonl, record_of
from app.ingest._registry import Pair, register_format
from app.ingest._tokenizer import TokenDecoder

# Export field -> the native per-token field it becomes.
NATIVE = {
    "advantages": "advantages",
    "trainer_logprobs": "logprobs",
    "inference_logprobs": "rollout_logprobs",
    "entropy": "entropy",
}
NOT_SIGNALS = {"token_ids", "loss_mask", "position_ids", "rewards", "losses", *NATIVE}
PROMPT, POLICY, TOOL = 0, 1, 2  # app/core kind codes


def sniff(doc: Document) -> bool:
    first = doc.first
    return (
        isinstance(first, dict)
        and "schema_version" in first
        and isinstance(first.get("token_ids"), list)
        and "loss_mask" in first
        and ("trainer_logprobs" in first or "inference_logprobs" in first)
    )


# The list -> array conversions are the reader's largest cost after the JSON parse: the stdlib's
# typed arrays and numpy's fromiter take a list of Python numbers 1.5-4x faster than
# ``np.asarray`` (which first looks at every element to find the dtype).


def _array(raw: list[Any], dtype: Any = None) -> np.ndarray | None:
    """``raw`` as a 1-D array in one numpy call; None when it will not convert to one."""
    try:
        arr = np.asarray(raw, dtype=dtype)
    except (TypeError, ValueError, OverflowError):
        return None
    return arr if arr.ndim == 1 and arr.shape[0] == len(raw) else None


def _ints(raw: list[Any] | np.ndarray, code: str, dtype: Any) -> np.ndarray | None:
    """A list of integers (booleans as 0/1) as an array of ``dtype`` (the ``array`` type ``code``);
    None when an entry is not an integer; ints beyond the type go through numpy. An array (the
    column reader's: int64, or float64 when the JSON list held numbers) converts when every
    entry is a whole number within int64, as the list does."""
    if isinstance(raw, np.ndarray):
        if raw.dtype == dtype:  # the column reader's int64 ids: nothing to check
            return raw
        if raw.dtype.kind == "f" and raw.size:
            whole = bool(np.array_equal(raw, np.trunc(raw)))
            if not (whole and -(2.0**63) <= raw.min() and raw.max() < 2.0**63):
                return None
        return raw.astype(dtype if _fits(raw, dtype) else np.int64, copy=False)
    try:
        return np.frombuffer(array(code, raw), dtype=dtype)
    except TypeError:
        return None
    except OverflowError:
        arr = _array(raw)
        return arr if arr is not None and arr.dtype.kind in "iu" else None


def _fits(arr: np.ndarray, dtype: Any) -> bool:
    info = np.iinfo(dtype)
    return arr.size == 0 or (info.min <= arr.min() and arr.max() <= info.max)


def _flags(raw: list[Any] | np.ndarray) -> np.ndarray | None:
    """A list that starts with a boolean, as a bool array in one C-level pass (``bytes`` takes
    True/False as 1/0); None when an entry is not a boolean or 0/1 (a null, a number). The column
    reader's bool array as it is."""
    if isinstance(raw, np.ndarray):
        return raw if raw.dtype == np.bool_ else None
    if not raw or type(raw[0]) is not bool:
        return None
    try:
        flags = np.frombuffer(bytes(raw), dtype=np.uint8)
    except (TypeError, ValueError):
        return None
    return flags.view(np.bool_) if int(flags.max()) <= 1 else None


def _floats(raw: list[Any]) -> np.ndarray | None:
    """A list of numbers as float64 (booleans 0/1, null NaN); None when an entry is not a number."""
    try:
        return np.fromiter(raw, dtype=np.float64, count=len(raw))
    except (TypeError, ValueError, OverflowError):
        return None


def _ids(rec: Record) -> np.ndarray:
    raw = rec.obj.get("token_ids")
    arr = _ints(raw, "q", np.int64) if isinstance(raw, (list, np.ndarray)) else None
    if arr is None:
        raise rec.error(
            "wrong_type", "field `token_ids` must be a list of token ids (integers).", "token_ids"
        )
    return arr.astype(np.int64, copy=False)


def _mask(rec: Record, n: int) -> tuple[np.ndarray, dict[str, Any] | None]:
    """The loss mask fitted to ``n`` ids, and the ``mask_misaligned`` meta when it does not fit."""
    raw = rec.obj.get("loss_mask")
    arr = None
    if isinstance(raw, (list, np.ndarray)):
        arr = _flags(raw)
        if arr is None:  # 0/1 (or other) integers
            arr = _ints(raw, "b", np.int8)
    if arr is None:
        raise rec.error("wrong_type", "field `loss_mask` must be a list of booleans.", "loss_mask")
    mask = np.zeros(n, dtype=bool)
    k = min(n, len(raw))
    mask[:k] = arr[:k].astype(bool)
    if len(raw) == n:
        return mask, None
    # Shorter: the ids past its end have no entry. Longer: the last ids are the ones its extra
    # entries were meant for (a mask shifted by the difference).
    at = list(range(len(raw), n)) if len(raw) < n else list(range(max(0, n - (len(raw) - n)), n))
    return mask, {
        "reason": f"`loss_mask` has {len(raw)} entries for {n} token ids",
        "mask_length": len(raw),
        "ids_length": n,
        "at": at,
    }


def _kinds(mask: np.ndarray) -> np.ndarray:
    """Kind codes from the loss mask: trained -> policy; untrained before the first trained token
    -> prompt, after it -> tool (the environment's turns)."""
    seen = np.logical_or.accumulate(mask) if mask.size else mask
    return np.where(mask, POLICY, np.where(seen, TOOL, PROMPT)).astype(np.uint8)


def _numbers(rec: Record, name: str, n: int) -> tuple[np.ndarray, int] | None:
    """A per-token field as float64 [n] (booleans 0/1, null as NaN), and how many entries are not
    finite. The list is converted in one numpy call; only a field that will not convert is walked,
    to name the entry."""
    raw = rec.obj.get(name)
    if raw is None:
        return None
    if isinstance(raw, np.ndarray):  # the column reader's: JSON numbers, NaN where a null was
        if len(raw) != n:
            raise rec.error(
                "length_mismatch", f"field `{name}` has {len(raw)} entries but `token_ids` has {n}.", name
            )
        return raw, int(np.count_nonzero(np.isnan(raw))) if raw.dtype.kind == "f" else 0
    if not isinstance(raw, list):
        raise rec.error("wrong_type", f"field `{name}` must be a list with one entry per token.", name)
    if len(raw) != n:
        raise rec.error(
            "length_mismatch", f"field `{name}` has {len(raw)} entries but `token_ids` has {n}.", name
        )
    arr = _floats(raw)
    if arr is None:
        for i, v in enumerate(raw):
            if v is not None and not isinstance(v, (int, float)):
                raise rec.error("wrong_type", f"field `{name}` entry {i} is {v!r}; expected a number.", name)
        raise rec.error("wrong_type", f"field `{name}` must be a list of numbers.", name)
    nulls = int(np.count_nonzero(~np.isfinite(arr)))
    return arr, nulls


def _top_k(value: list[Any] | np.ndarray) -> bool:
    """A list of per-token lists (sdpo_*_topk_*): not one number per token. Stops at the first
    number, so a number row costs one look."""
    if isinstance(value, np.ndarray):
        return False
    return bool(value) and all(isinstance(v, list) or v is None for v in value)


def episode_from_record(rec: Record, tokenizer: TokenDecoder | None = None) -> ArrayEpisode:
    """One export line as an array episode (see the module docstring)."""
    obj = rec.obj
    if not isinstance(obj, dict):
        raise rec.error("wrong_type", "expected a JSON object with `token_ids` and `loss_mask`.")
    ids = _ids(rec)
    n = len(ids)
    mask, misaligned = _mask(rec, n)
    meta: dict[str, Any] = scalar_meta(obj, set())
    if misaligned is not None:
        meta["mask_misaligned"] = misaligned
    floats: dict[str, np.ndarray] = {}
    non_finite: dict[str, int] = {}
    for src, dst in NATIVE.items():
        got = _numbers(rec, src, n)
        if got is None or got[1] == n:  # absent, or every entry null
            continue
        row, nulls = got
        if nulls:
            row = np.nan_to_num(row, nan=0.0, posinf=0.0, neginf=0.0)
            non_finite[src] = nulls
        floats[dst] = row
    # Handed over as arrays (bool, or float64 with NaN where the trainer wrote null): stored packed
    # as they are (app/core/token_signals.py) and read back as the lists JSON gave, null for NaN.
    signals: dict[str, np.ndarray] = {}
    for name, value in obj.items():
        if name in NOT_SIGNALS or not isinstance(value, (list, np.ndarray)) or _top_k(value):
            continue
        flags = _flags(value) if len(value) == n else None
        if flags is not None:
            signals[name] = flags
            continue
        got = _numbers(rec, name, n)
        if got is not None and got[1] < n:
            signals[name] = got[0]
    if signals:
        meta["token_signals"] = signals
    if isinstance(obj.get("losses"), list):
        meta["losses"] = obj["losses"]
    if non_finite:
        meta["non_finite"] = non_finite
    rewards = _numbers(rec, "rewards", n)
    trained = np.flatnonzero(mask)
    reward = None
    if rewards is not None and trained.size:
        last = float(rewards[0][trained[-1]])
        reward = last if math.isfinite(last) else None
    tokens = None
    if tokenizer is not None:
        tokens, special = tokenizer.row(ids)
        if special:
            meta["special_tokens"] = special
    first = int(trained[0]) if trained.size else n
    return ArrayEpisode(
        kinds=_kinds(mask),
        floats=floats,
        token_ids=ids,
        tokens=tokens,  # None: the stored ids show as ⟨id⟩
        reward=reward,
        group=short_hash(ids[:first].astype("<i8", copy=False).tobytes()),
        meta=meta,
    )


def _records(doc: Document) -> Iterator[Record]:
    """The export's records: JSONL line by line as columns (app/ingest/_columns.py; a line the
    column reader leaves, such as one with NaN, read as any JSON line is), else as any JSON."""
    if not looks_like_jsonl(doc.data):  # the head of a streamed upload: the same answer
        yield from doc.records()
        return
    reader = ColumnReader(integer_fields=("token_ids", "position_ids"), null_as_nan=True)
    for n, (line, buf, start, stop) in enumerate(doc.spans(), start=1):
        obj = reader.read(buf, start, stop)
        yield record_of(line, n, buf[start:stop]) if obj is None else Record(line, n, obj)


def episodes(doc: Document, tokenizer: TokenDecoder | None = None) -> Iterator[Pair]:
    """Each export line, as it is read, as an array episode."""
    for rec in _records(doc):
        yield rec.line, episode_from_record(rec, tokenizer)


register_format(
    name="prime_rl_tokens",
    description=(
        "prime-rl token exports (token_exports/step_N/rank_R.jsonl: token_ids, loss_mask, advantages, "
        "trainer/inference logprobs, entropy, mismatch_kl, importance_ratio, is_masked, loss weights)"
    ),
    priority=14,
    sniff=sniff,
    episodes=episodes,
    takes_tokenizer=True,
    streams=True,  # a step's rank file is read line by line while it uploads
)
