"""slime's debug dumps (``--dump-details DIR`` writes both; ``--save-debug-rollout-data`` and
``--save-debug-train-data`` name them one by one), saved with ``torch.save``:

* rollout dump ``rollout_data/{rollout_id}.pt``: ``{"rollout_id": int, "samples": [...]}``, each
  sample a ``Sample.to_dict()``: ``tokens`` (prompt + response ids), ``response_length``,
  ``loss_mask`` (one entry per response token; 0 = tool/observation token), ``reward`` (a number,
  or a dict when a reward model returns several), ``rollout_log_probs``, ``group_index``,
  ``index``, ``prompt``, ``response``, ``label``, ``status``, ``metadata``, …
* train dump ``train_data/{rollout_id}_{rank}.pt``: ``{"rollout_id", "rank", "samples": [...]}``
  (newer slime, one dict per sample) or ``{"rollout_id", "rank", "rollout_data": {column: [...]}}``
  (older slime, one list per column) with the training columns ``tokens``, ``response_lengths``,
  ``loss_masks``, ``rewards`` (after group normalisation; the raw ones in ``raw_reward``),
  ``advantages``, ``log_probs``, ``ref_log_probs``, ``values``, ``returns``, …, where the
  per-token ones have one entry per response token.

Singular and plural names are both read. The prompt is ``tokens[:len(tokens) - response_length]``;
the response tokens are policy where the loss mask is 1 and tool where it is 0. A sample whose
``status`` is ``truncated`` (or ``truncated`` is 1) is marked truncated. Reward: the raw
reward when the dump has one, else ``reward``/``rewards``. ``advantages`` are the trainer's
advantages (scheme ``uploaded``); ``log_probs`` (else ``rollout_log_probs``) become ``logprobs``,
``rollout_log_probs`` ``rollout_logprobs`` (beside ``log_probs``), ``ref_log_probs``
``ref_logprobs``, ``entropy`` (or ``entropys``) ``entropy``; ``values`` the critic values; the ids
are kept as ``token_ids``. Group: ``group_index``, else the prompt's token ids. Tokens show as the pieces of the ``tokenizer.json``
sent with the upload, else the file's ``vocab`` list, else ``⟨id⟩``.

Loaded with ``torch.load(weights_only=True)`` (tensors, lists, dicts, str and numbers, never
arbitrary pickled objects), after the zip archive's declared sizes are checked.
"""

from __future__ import annotations

import io
import math
import zipfile
from collections.abc import Iterator
from typing import Any

import numpy as np

from app.core.errors import ApiError
from app.core.schemas import EpisodeIn, Kind
from app.ingest._common import Record, id_token, mask_kinds, short_hash
from app.ingest._damage import torch_load_damage
from app.ingest._document import Document
from app.ingest._registry import Pair, register_format
from app.ingest._tokenizer import TokenDecoder
from creditlens.keys import SLIME, first_key

NAME = "slime_pt"

CODE = "bad_slime_dump"
# The archive's entries may declare at most this much once unpacked (torch writes them stored,
# so a real dump declares about its own size; a zip bomb declares far more).
MAX_UNPACKED_BYTES = 512 * 1024 * 1024
_SNIFF_BYTES = 1 << 20


def _pickle_head(doc: Document) -> bytes:
    """The first MiB of the pickle inside a torch file (never inflating more than that)."""
    if doc.is_zip:
        return doc.zip_member_head("data.pkl", _SNIFF_BYTES)
    return doc.data[:_SNIFF_BYTES] if doc.data[:1] == b"\x80" else b""


def sniff(doc: Document) -> bool:
    head = _pickle_head(doc)
    return (
        b"response_length" in head and b"tokens" in head and (b"samples" in head or b"rollout_data" in head)
    )


def _err(message: str, field: str | None = None, episode: int | None = None, code: str = CODE) -> ApiError:
    prefix = f"episode {episode}: " if episode is not None else ""
    return ApiError(422, code, prefix + message, field=field, episode=episode)


def load(data: bytes) -> Any:
    """``torch.load(weights_only=True)`` of an upload whose zip entries fit the unpacked budget."""
    import torch

    if data[:4] == b"PK\x03\x04":
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as zf:
                unpacked = sum(i.file_size for i in zf.infolist())
        except zipfile.BadZipFile as e:
            raise _err(f"could not load this file with torch.load(weights_only=True): {e}.") from None
        if unpacked > MAX_UNPACKED_BYTES:
            raise ApiError(
                413,
                "too_large",
                f"the torch file unpacks to {unpacked} bytes; the limit is {MAX_UNPACKED_BYTES}. "
                "Dump fewer samples per file.",
            )
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:  # UnpicklingError for disallowed globals, RuntimeError for junk
        if (cut := torch_load_damage(e)) is not None:
            raise cut from None
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise _err(
            f"could not load this file with torch.load(weights_only=True): {first}. slime's dumps "
            "hold tensors, lists, dicts, strings and numbers only."
        ) from None


def _samples(obj: Any) -> list[Any]:
    if isinstance(obj, list):
        return obj
    if not isinstance(obj, dict):
        raise _err(f"expected a dict with `samples` (slime's dump), got {type(obj).__name__}.")
    samples = obj.get("samples")
    if isinstance(samples, list):
        return samples
    cols = obj.get("rollout_data")
    if isinstance(cols, dict):
        n = len(cols.get("tokens") or [])
        for k, v in cols.items():
            if isinstance(v, (list, tuple)) and len(v) != n and k in _PER_SAMPLE:
                raise _err(f"column `rollout_data.{k}` has {len(v)} entries but `tokens` has {n}.", k)
        return [
            {k: v[i] for k, v in cols.items() if isinstance(v, (list, tuple)) and len(v) == n}
            for i in range(n)
        ]
    raise _err(
        "field `samples` is missing; a slime dump is {'rollout_id': ..., 'samples': [...]} "
        "(or {'rollout_data': {column: [...]}}).",
        "samples",
    )


_PER_SAMPLE = {"tokens", "response_lengths", "loss_masks", "rewards", "advantages", "log_probs"}


def _get(s: dict[str, Any], field: str) -> tuple[str, Any]:
    """(the key present, its value) for the first of slime's keys for ``field`` (the table
    creditlens.keys.SLIME) the sample has, else (the first key, None)."""
    key = first_key(SLIME, field, s)
    return (SLIME[field][0], None) if key is None else (key, s[key])


def _ints(value: Any, rec: Record, name: str) -> list[int]:
    import torch

    if torch.is_tensor(value):
        if value.dim() != 1 or value.is_floating_point() or value.is_complex():
            raise rec.error(
                "wrong_type",
                f"field `{name}` is a {value.dtype} tensor of shape {tuple(value.shape)}; expected 1-D integers.",
                name,
            )
        return value.tolist()
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value):
        return [int(v) for v in value]
    raise rec.error("wrong_type", f"field `{name}` must be a list (or 1-D tensor) of integers.", name)


def _floats(value: Any, rec: Record, name: str, n: int) -> list[float]:
    import torch

    if torch.is_tensor(value):
        if value.dim() != 1 or value.is_complex():
            raise rec.error(
                "wrong_type", f"field `{name}` has shape {tuple(value.shape)}; expected 1-D.", name
            )
        vals = value.to(torch.float64).tolist()
    elif isinstance(value, (list, tuple)):
        vals = list(value)
    else:
        raise rec.error(
            "wrong_type", f"field `{name}` is {type(value).__name__}; expected a list of numbers.", name
        )
    if len(vals) != n:
        raise rec.error(
            "length_mismatch",
            f"field `{name}` has {len(vals)} entries but `response_length` is {n}; it needs one per "
            "response token.",
            name,
        )
    for i, v in enumerate(vals):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise rec.error("wrong_type", f"field `{name}` entry {i} is {v!r}; expected a number.", name)
        if not math.isfinite(v):
            raise rec.error(
                "not_finite", f"field `{name}` entry {i} is {v}; it must be a finite number.", name
            )
    return [float(v) for v in vals]


def _scalar(value: Any, rec: Record, name: str) -> float | None:
    import torch

    if value is None:
        return None
    if torch.is_tensor(value):
        if value.numel() != 1:
            raise rec.error("wrong_type", f"field `{name}` has {value.numel()} numbers; expected one.", name)
        value = value.item()
    if isinstance(value, dict):  # a reward model that returns several numbers: slime's reward_key
        if "score" in value:
            return _scalar(value["score"], rec, f"{name}.score")
        nums = [k for k, v in value.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if len(nums) != 1:
            raise rec.error(
                "wrong_type",
                f"field `{name}` is a dict without a `score` entry ({', '.join(map(str, value)) or 'empty'}); "
                "put the scalar reward under `score`.",
                name,
            )
        return _scalar(value[nums[0]], rec, f"{name}.{nums[0]}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise rec.error("wrong_type", f"field `{name}` is {value!r}; expected a number.", name)
    if not math.isfinite(value):
        raise rec.error("not_finite", f"field `{name}` is {value}; it must be a finite number.", name)
    return float(value)


_META_KEYS = (
    "index",
    "group_index",
    "status",
    "label",
    "prompt",
    "response",
    "rollout_position",
    "sample_index",
)


def episode_from_sample(
    rec: Record, raw_reward: list[Any] | None, vocab: Any, step: Any, tokenizer: TokenDecoder | None = None
) -> EpisodeIn:
    """One slime sample dict -> one native episode (errors name the field and the episode)."""
    s = rec.obj
    if not isinstance(s, dict):
        raise rec.error("wrong_type", f"each sample must be a dict, got {type(s).__name__}.")
    t_name, raw_ids = _get(s, "tokens")
    if raw_ids is None:
        raise rec.error("missing_field", f"required field `{t_name}` is missing.", t_name)
    ids = _ints(raw_ids, rec, t_name)
    rl_name, rlen = _get(s, "response_length")
    if rlen is None:
        raise rec.error("missing_field", "required field `response_length` is missing.", "response_length")
    rlen = _scalar(rlen, rec, rl_name)
    if rlen is None or rlen != int(rlen) or not 0 < rlen <= len(ids):
        raise rec.error(
            "wrong_type",
            f"field `{rl_name}` is {rlen:g}; expected an integer in 1..{len(ids)} (the length of `tokens`).",
            rl_name,
        )
    R = int(rlen)
    P = len(ids) - R
    m_name, mask = _get(s, "loss_mask")
    mask = [1] * R if mask is None else [int(x) for x in _floats(mask, rec, m_name, R)]
    kinds: list[Kind] = ["prompt"] * P
    kinds += ["policy" if x else "tool" for x in mask]
    if P == 0:  # no prompt: zeros before the first policy token are the prompt after all
        kinds = mask_kinds(mask)
    special = None
    if tokenizer is not None:
        tokens, special = tokenizer.row(np.asarray(ids, dtype=np.int64))
    else:
        tokens = [id_token(i, vocab) for i in ids]
    fields: dict[str, Any] = {
        "tokens": tokens,
        "token_ids": ids,
        "kinds": kinds,
        "meta": {"source": f"upload:{NAME}"},
    }
    pad = [0.0] * P
    pos = s.get("rollout_position", rec.episode - 1)
    if raw_reward is not None and isinstance(pos, int) and 0 <= pos < len(raw_reward):
        fields["reward"] = _scalar(raw_reward[pos], rec, "raw_reward")
    else:
        r_name, r = _get(s, "reward")
        fields["reward"] = _scalar(r, rec, r_name)
    lp_name, lp = _get(s, "logprobs")
    if lp is not None:
        fields["logprobs"] = pad + _floats(lp, rec, lp_name, R)
    for name in ("rollout_logprobs", "ref_logprobs", "entropy", "values", "advantages"):
        key, v = _get(s, name)
        # Rollout log-probs standing in for `logprobs` (a rollout dump) are not a second signal.
        if v is not None and not (name == "rollout_logprobs" and lp_name == key):
            fields[name] = pad + _floats(v, rec, key, R)
    meta = fields["meta"]
    if special:
        meta["special_tokens"] = special
    for k in _META_KEYS:
        v = s.get(k)
        if isinstance(v, (str, int, float, bool)):
            meta[k] = v
    if isinstance(step, int):
        meta["step"] = step
    # Cut off at the length limit (slime's Status.TRUNCATED; the train dump's `truncated` column).
    fields["truncated"] = s.get("status") == "truncated" or s.get("truncated") in (1, True)
    group = _get(s, "group")[1]
    fields["group"] = str(group) if isinstance(group, (int, str)) else short_hash(",".join(map(str, ids[:P])))
    return EpisodeIn.model_construct(**fields)


def episodes(doc: Document, tokenizer: TokenDecoder | None = None) -> Iterator[Pair]:
    """(line, episode) pairs, one per sample (a torch file has no lines)."""
    obj = load(doc.data)
    samples = _samples(obj)
    if not samples:
        raise _err("field `samples` is empty; there is nothing to show.", "samples")
    top = obj if isinstance(obj, dict) else {}
    raw: Any = top.get("raw_reward")
    raw = raw.tolist() if hasattr(raw, "tolist") else raw
    if isinstance(top.get("rollout_data"), dict):
        raw = raw if raw is not None else top["rollout_data"].get("raw_reward")
        raw = raw.tolist() if hasattr(raw, "tolist") else raw
    if raw is not None and (not isinstance(raw, list) or len(raw) != len(samples)):
        raw = None  # a partial raw_reward (one rank's share) cannot be lined up: use each sample's own
    vocab = top.get("vocab")
    step = top.get("rollout_id")
    for i, s in enumerate(samples, start=1):
        yield None, episode_from_sample(Record(None, i, s), raw, vocab, step, tokenizer)


register_format(
    name=NAME,
    description=(
        "slime --dump-details .pt (samples with tokens, response_length, loss_mask, reward, advantages, log_probs)"
    ),
    priority=2,  # before verl_pt, which claims every torch file
    sniff=sniff,
    episodes=episodes,
    takes_tokenizer=True,
)
