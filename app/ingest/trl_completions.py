"""TRL's logged completions: ``completions/completions_{step:05d}.parquet``, written by
``GRPOTrainer`` (and the trainers built on it) when ``log_completions=True``.

Columns, as TRL 1.16 writes them (``GRPOTrainer.log``): ``step``, ``prompt``, ``completion``, one
float column per reward function (named after the function, e.g. ``accuracy_reward``; NaN where
the function did not score that sample), any ``log_extra`` columns, then ``advantage`` (one
float per completion). Datasets published from these logs also carry a total ``reward`` column.

* Text (a ``prompt``/``completion`` string): the prompt becomes prompt tokens, the completion
  policy tokens, both cut with the offline tokenizer (app/core/tokenize.py). The completion closes
  with an ``<|end|>`` policy token, the model's stop (TRL logs the decoded text without special
  tokens), so an empty completion still has a token to carry its reward.
* Conversations (lists of ``{role, content}`` messages) are rendered as the ``openai_chat``
  format renders them; every prompt message is prompt, the completion's assistant messages are
  policy and its tool messages tool.
* Reward: the ``reward`` column when present, else the sum of the reward-function columns that
  scored the sample (TRL's default weights are 1; a function that returned None logs NaN and is
  left out). Reward-function columns are the numeric columns other than ``step`` and
  ``advantage`` (TRL does not mark which columns are rewards; numeric ``log_extra`` columns are
  counted too). Each one is kept in ``meta.reward_functions``.
* ``advantage``: TRL's group-normalised advantage, the same for every completion token; it is
  stored on every policy token as the trainer's advantages (scheme ``uploaded``).
* Group: a ``group`` column when present, else the step and prompt text (TRL samples each prompt
  ``num_generations`` times in one step).

Read with pyarrow; the uncompressed size the file's metadata declares is checked before any
column is decoded.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Iterator
from typing import Any

from app.core.errors import ApiError
from app.core.schemas import EpisodeIn, Kind
from app.core.tokenize import tokenize
from app.ingest._common import Record, scalar_meta, short_hash
from app.ingest._damage import damaged
from app.ingest._document import Document
from app.ingest._registry import Pair, register_format
from app.ingest.openai_chat import episode_from_messages

NAME = "trl_completions"

_MAGIC = b"PAR1"
END = "<|end|>"
# What the decoded columns may occupy, as the parquet footer declares it (a small file can
# declare gigabytes of dictionary-encoded text).
MAX_UNCOMPRESSED_BYTES = 256 * 1024 * 1024
_RESERVED = {"step", "prompt", "completion", "advantage", "reward", "group", "image", "images"}


def sniff(doc: Document) -> bool:
    return doc.data[:4] == _MAGIC and doc.data[-4:] == _MAGIC


def _err(message: str, field: str | None = None, status: int = 422, code: str = "bad_parquet") -> ApiError:
    return ApiError(status, code, message, field=field)


def read_rows(data: bytes) -> list[dict[str, Any]]:
    """The parquet's rows as dicts; 422 for a file pyarrow cannot read, 413 beyond the size budget."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(pa.BufferReader(data))
        meta = pf.metadata
        declared = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    except Exception as e:  # ArrowInvalid / OSError for a damaged footer
        raise damaged("the parquet footer (its metadata)", f"cannot be read ({_first_line(e)})") from None
    if declared > MAX_UNCOMPRESSED_BYTES:
        raise _err(
            f"the parquet file decodes to {declared} bytes; the limit is {MAX_UNCOMPRESSED_BYTES}. "
            "Upload fewer steps per file.",
            status=413,
            code="too_large",
        )
    try:
        rows: list[dict[str, Any]] = pf.read().to_pylist()
        return rows
    except Exception as e:  # a column chunk whose pages do not decode
        raise damaged("a parquet column chunk", f"cannot be decoded ({_first_line(e)})") from None


def _first_line(e: Exception) -> str:
    s = str(e).strip()
    return s.splitlines()[0] if s else type(e).__name__


def _number(value: Any, rec: Record, name: str, nan_ok: bool) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise rec.error("wrong_type", f"field `{name}` is {value!r}; expected a number.", field=name)
    if math.isnan(value) and nan_ok:
        return None
    if not math.isfinite(value):
        raise rec.error("not_finite", f"field `{name}` is {value}; it must be a finite number.", field=name)
    return float(value)


def _messages(value: Any, rec: Record, name: str) -> list[dict[str, Any]]:
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in value):
        raise rec.error("wrong_type", f"field `{name}` must be a string or a list of chat messages.", name)
    # pyarrow gives every struct field to every message; drop the absent ones (None).
    return [{k: v for k, v in m.items() if v is not None} for m in value]


def episode_from_row(rec: Record) -> EpisodeIn:
    """One parquet row -> one native episode."""
    row = rec.obj
    for name in ("prompt", "completion"):
        if name not in row:
            raise rec.error(
                "missing_field",
                f"required column `{name}` is missing; TRL's completions parquet has "
                "step, prompt, completion, the reward columns and advantage.",
                field=name,
            )
        if row[name] is None:
            raise rec.error("wrong_type", f"field `{name}` is empty (null).", field=name)
    prompt, completion = row["prompt"], row["completion"]
    if isinstance(prompt, str) and isinstance(completion, str):
        p, c = tokenize(prompt), tokenize(completion) + [END]
        tokens = p + c
        kinds: list[Kind] = ["prompt"] * len(p)
        kinds += ["policy"] * len(c)
        turn_ids: list[int] | None = None
        prompt_key = prompt
    elif isinstance(prompt, list) and isinstance(completion, list):
        pm, cm = _messages(prompt, rec, "prompt"), _messages(completion, rec, "completion")
        head = episode_from_messages(Record(rec.line, rec.episode, {"messages": pm}))
        tail = episode_from_messages(Record(rec.line, rec.episode, {"messages": cm}))
        tokens = head.tokens + tail.tokens
        kinds = ["prompt"] * len(head.tokens)
        kinds += tail.kinds
        turn_ids = [-1] * len(head.tokens) + (tail.turn_ids or [])
        prompt_key = json.dumps(pm, sort_keys=True, default=str)
    else:
        bad = "prompt" if not isinstance(prompt, (str, list)) else "completion"
        raise rec.error(
            "wrong_type",
            f"field `{bad}` is {type(row[bad]).__name__}; `prompt` and `completion` must both be "
            "strings or both lists of chat messages.",
            field=bad,
        )
    by_fn: dict[str, float | None] = {}
    for name, v in row.items():
        if name in _RESERVED or isinstance(v, (str, list, dict)) or v is None:
            continue
        by_fn[name] = _number(v, rec, name, nan_ok=True)
    if "reward" in row:
        reward = _number(row["reward"], rec, "reward", nan_ok=False)
    else:
        scored = [v for v in by_fn.values() if v is not None]
        reward = math.fsum(scored) if scored else None
    meta = scalar_meta(row, _RESERVED | set(by_fn))
    meta["source"] = f"upload:{NAME}"
    if "step" in row:
        meta["step"] = row["step"]
    if by_fn:
        meta["reward_functions"] = by_fn
    fields: dict[str, Any] = {
        "tokens": tokens,
        "kinds": kinds,
        "reward": reward,
        "turn_ids": turn_ids,
        "meta": meta,
    }
    if "advantage" in row:
        adv = _number(row["advantage"], rec, "advantage", nan_ok=False)
        if adv is not None:
            fields["advantages"] = [adv if k == "policy" else 0.0 for k in kinds]
    group = row.get("group")
    if group is not None and not isinstance(group, (str, int)):
        raise rec.error("wrong_type", f"field `group` is {group!r}; expected a string.", field="group")
    fields["group"] = str(group) if group is not None else short_hash(f"{row.get('step')}\n{prompt_key}")
    return EpisodeIn.model_construct(**fields)


def episodes(doc: Document) -> Iterator[Pair]:
    """(line, episode) pairs, one per parquet row (rows have no line number)."""
    for i, row in enumerate(read_rows(doc.data), start=1):
        yield None, episode_from_row(Record(None, i, row))


def write_example(rows: list[dict[str, Any]]) -> bytes:
    """Parquet bytes of ``rows`` (for tests and fixture generators)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf)
    return buf.getvalue()


register_format(
    name=NAME,
    description="TRL GRPO completions parquet (step, prompt, completion, <reward functions>, advantage)",
    priority=3,
    sniff=sniff,
    episodes=episodes,
)
