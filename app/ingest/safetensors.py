"""safetensors: a batch as [B, T] tensors, the binary wire format of the Python client.

The tensors are named like the native fields (see ``client/creditlens/wire.py`` for the full table):
``kinds`` uint8 [B, T] (0 prompt, 1 policy, 2 tool, 255 padding, dropped), ``token_ids`` int
[B, T], float [B, T] ``rewards``, ``values``, ``logprobs``, ``ref_logprobs``,
``rollout_logprobs``, ``entropy``, ``advantages``; [B] ``reward`` (float) and ``groups`` (int);
any number of ``token_signals.<name>`` [B, T] (float, int or BOOL: the user's own per-token
signals). The file's ``__metadata__`` may carry JSON strings: ``tokens`` (B lists of display
strings, one per non-padding position), ``special_tokens``, ``groups`` (B labels) and ``meta``.

The file is never trusted: the header is validated before any tensor is touched (its declared
length against the file size, JSON, known names, dtypes per tensor, shapes, byte ranges that tile
the data exactly), and tensors are then read in place with ``numpy.frombuffer`` (zero copies;
nothing is allocated from a declared size). Every problem is a 422 naming the tensor, and the
episode and token where it applies. Without ``tokens`` the tokens show as the pieces of the
``tokenizer.json`` sent with the upload, else as ⟨id⟩.

Every tensor fills the native field of its name (``advantages`` included, on every token);
``special_tokens`` goes to each episode's ``meta.special_tokens``; each ``token_signals.<name>``
tensor becomes ``meta.token_signals[<name>]`` (a 1-D array of the row's non-padding positions:
float64, NaN and infinities allowed and read back as null; int64; numpy bool), in name order after
any ``token_signals`` the ``meta`` metadata carries. A name in both is refused (422 ``bad_meta``):
two values for one signal. Episodes are handed over as arrays
(:class:`app.core.validate.ArrayEpisode`): no per-token Python objects are made, except the token
strings when they came in the metadata.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np

from app.core.errors import ApiError
from app.core.protocol import PROTOCOL_KEY, check_protocol
from app.core.validate import ArrayEpisode
from app.ingest._document import Document
from app.ingest._registry import Pair, register_format
from app.ingest._tokenizer import TokenDecoder

# The wire format is defined once, by the client that writes it.
from creditlens.wire import FLOAT_FIELDS, PADDING, SIGNAL_PREFIX

_INTS = {
    "U8": "<u1",
    "I8": "<i1",
    "U16": "<u2",
    "I16": "<i2",
    "U32": "<u4",
    "I32": "<i4",
    "U64": "<u8",
    "I64": "<i8",
}
_FLOATS = {"F16": "<f2", "BF16": "<u2", "F32": "<f4", "F64": "<f8"}
# Every dtype the format reads (a signal may have any). BOOL is one byte; non-zero reads as true.
_DTYPES = {**_INTS, **_FLOATS, "BOOL": "<u1"}
# What each tensor may be: dtype family and rank (2 = [B, T], 1 = [B]).
_SPEC: dict[str, tuple[dict[str, str], int]] = {
    "kinds": (_INTS, 2),
    "token_ids": (_INTS, 2),
    **{n: (_FLOATS, 2) for n in FLOAT_FIELDS},
    "reward": (_FLOATS, 1),
    "groups": (_INTS, 1),
}
_SIGNAL_SPEC = (_DTYPES, 2)
_METADATA_KEYS = ("tokens", "special_tokens", "groups", "meta")


def _spec(name: str) -> tuple[dict[str, str], int] | None:
    """Dtypes and rank a tensor of this name may have; None for a name outside the format."""
    if name.startswith(SIGNAL_PREFIX) and len(name) > len(SIGNAL_PREFIX):
        return _SIGNAL_SPEC
    return _SPEC.get(name)


def sniff(doc: Document) -> bool:
    data = doc.data
    if len(data) < 10:
        return False
    (n,) = struct.unpack_from("<Q", data)
    return 2 <= n <= len(data) - 8 and data[8:9] == b"{"


def _err(
    message: str,
    field: str | None = None,
    episode: int | None = None,
    code: str = "bad_safetensors",
    status: int = 422,
) -> ApiError:
    prefix = f"episode {episode}: " if episode is not None else ""
    return ApiError(status, code, prefix + message, field=field, episode=episode)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _err(f"the header names `{k}` twice.", field=k)
        out[k] = v
    return out


def read_header(data: bytes) -> tuple[dict[str, dict[str, Any]], dict[str, str], int]:
    """(tensor entries by name, metadata, start of the data section), all validated; ApiError 422
    naming the tensor otherwise. Reads nothing but the header."""
    if len(data) < 8:
        raise _err(f"the file has {len(data)} bytes; a safetensors file starts with an 8-byte header length.")
    (n,) = struct.unpack_from("<Q", data)
    if n > len(data) - 8:
        raise _err(
            f"the header declares {n} bytes but only {len(data) - 8} follow: the file is truncated or "
            "not a safetensors file."
        )
    try:
        header = json.loads(data[8 : 8 + n].decode("utf-8"), object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        if isinstance(e, ApiError):
            raise
        raise _err(f"the header is not valid JSON ({e}).") from None
    if not isinstance(header, dict):
        raise _err("the header must be a JSON object of tensors.")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in meta.items()
    ):
        raise _err("`__metadata__` must map strings to strings.", field="__metadata__")
    start = 8 + n
    size = len(data) - start
    spans = []
    for name, entry in header.items():
        spec = _spec(name)
        if spec is None:
            empty = " (a signal needs a name after the prefix)" if name == SIGNAL_PREFIX else ""
            raise _err(
                f"tensor `{name}` is not part of the format{empty}; known tensors: {', '.join(_SPEC)}, "
                f"{SIGNAL_PREFIX}<name>.",
                field=name,
                code="unknown_field",
            )
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            raise _err(
                f"tensor `{name}` needs exactly dtype, shape and data_offsets in the header.", field=name
            )
        dtype, shape, offs = entry["dtype"], entry["shape"], entry["data_offsets"]
        allowed, rank = spec
        if dtype not in allowed:
            want = "a float (F16, BF16, F32 or F64)"
            if allowed is _INTS:
                want = "an integer"
            elif allowed is _DTYPES:
                want += ", an integer or BOOL"
            raise _err(
                f"tensor `{name}` has dtype {dtype!r}; it must be {want} dtype.",
                field=name,
                code="wrong_type",
            )
        if not (
            isinstance(shape, list)
            and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
        ):
            raise _err(f"tensor `{name}` has shape {shape!r}; expected a list of sizes.", field=name)
        if len(shape) != rank:
            want = "[B, T]" if rank == 2 else "[B]"
            raise _err(
                f"tensor `{name}` has shape {shape}; it must be {want}.", field=name, code="length_mismatch"
            )
        if not (
            isinstance(offs, list)
            and len(offs) == 2
            and all(isinstance(o, int) and not isinstance(o, bool) for o in offs)
            and 0 <= offs[0] <= offs[1] <= size
        ):
            raise _err(
                f"tensor `{name}` has data_offsets {offs!r} outside the {size} data bytes of the file "
                "(the header lies about offsets, or the file is truncated).",
                field=name,
            )
        itemsize = np.dtype(allowed[dtype]).itemsize
        count = int(np.prod(shape, dtype=object)) if shape else 1
        if count * itemsize != offs[1] - offs[0]:
            raise _err(
                f"tensor `{name}` declares shape {shape} of {dtype} ({count * itemsize} bytes) but its "
                f"data_offsets span {offs[1] - offs[0]} bytes.",
                field=name,
            )
        spans.append((offs[0], offs[1], name))
    spans.sort()
    at = 0
    for begin, end, name in spans:
        if begin != at:
            raise _err(
                f"tensor `{name}` starts at byte {begin} of the data but the previous tensor ends at {at}: "
                "tensors must cover the data section with no gap or overlap.",
                field=name,
            )
        at = end
    if at != size:
        raise _err(f"the tensors cover {at} bytes but the data section has {size}.")
    return header, meta, start


def _array(data: bytes, start: int, entry: dict[str, Any]) -> np.ndarray:
    dtype = entry["dtype"]
    begin, end = entry["data_offsets"]
    np_dtype = _DTYPES[dtype]
    count = (end - begin) // np.dtype(np_dtype).itemsize
    arr = np.frombuffer(data, dtype=np_dtype, count=count, offset=start + begin).reshape(entry["shape"])
    if dtype == "BF16":  # bfloat16 is the top half of a float32
        arr = (arr.astype(np.uint32) << 16).view(np.float32)
    elif dtype == "BOOL":
        arr = arr != 0
    return arr


def _metadata(meta: dict[str, str]) -> dict[str, Any]:
    out = {}
    for key, raw in meta.items():
        if key not in _METADATA_KEYS:
            continue  # other writers' notes (e.g. "format": "pt") are harmless
        try:
            out[key] = json.loads(raw)
        except (ValueError, RecursionError) as e:
            raise _err(f"metadata `{key}` is not valid JSON ({e}).", field=key) from None
    return out


def _rows(value: Any, B: int, key: str) -> list[Any]:
    if not isinstance(value, list) or len(value) != B:
        got = f"{len(value)} entries" if isinstance(value, list) else type(value).__name__
        raise _err(f"metadata `{key}` must be a list of {B} entries (one per row); got {got}.", field=key)
    return value


def episodes(doc: Document, tokenizer: TokenDecoder | None = None) -> Iterator[Pair]:
    """Validate the whole file first (every error before any episode), then hand over the
    episodes one row at a time as arrays (app/core/validate.py checks and stores them as they are)."""
    yield from _episodes(*_validated(doc.data), tokenizer=tokenizer)


# What _validated checked and _episodes reads: arrays by name, the non-padding mask, then the
# optional tokens, special-token positions, group labels, group ids, rewards and user meta.
_Checked = tuple[
    dict[str, np.ndarray],
    np.ndarray,
    list[Any] | None,
    list[Any] | None,
    list[Any] | None,
    list[Any] | None,
    list[Any] | None,
    Any,
]


def _validated(data: bytes) -> _Checked:
    header, raw_meta, start = read_header(data)
    check_protocol(raw_meta.get(PROTOCOL_KEY), f"__metadata__.{PROTOCOL_KEY}")  # none: version 1
    if "kinds" not in header:
        raise _err(
            "tensor `kinds` is missing; it marks each position prompt/policy/tool/padding.",
            "kinds",
            code="missing_field",
        )
    kinds = _array(data, start, header["kinds"])
    B, T = kinds.shape
    if B == 0:
        raise _err("the batch has no rows (tensor `kinds` has B = 0).", "kinds")
    arrays: dict[str, np.ndarray] = {"kinds": kinds}
    for name, entry in header.items():
        if name == "kinds":
            continue
        want = (B, T) if _SPEC.get(name, _SIGNAL_SPEC)[1] == 2 else (B,)
        if tuple(entry["shape"]) != want:
            raise _err(
                f"tensor `{name}` has shape {entry['shape']} but `kinds` makes the batch {list(want)}.",
                field=name,
                code="length_mismatch",
            )
        arrays[name] = _array(data, start, entry)
    bad = ~np.isin(kinds, (0, 1, 2, PADDING))
    if bad.any():
        b, t = (int(i) for i in np.argwhere(bad)[0])
        raise _err(
            f"tensor `kinds` holds {int(kinds[b, t])} at position {t}; codes are 0 prompt, 1 policy, 2 tool, "
            "255 padding.",
            field="kinds",
            episode=b + 1,
            code="unknown_kind",
        )
    keep = kinds != PADDING
    n_keep = keep.sum(axis=1)
    if (n_keep == 0).any():
        b = int(np.flatnonzero(n_keep == 0)[0])
        raise _err("the row is all padding (every `kinds` entry is 255).", "kinds", episode=b + 1)
    for name, arr in arrays.items():
        if arr.dtype.kind != "f" or name.startswith(SIGNAL_PREFIX):  # a signal's NaN: not scored
            continue
        nonfinite = ~np.isfinite(arr)
        if arr.ndim == 2:
            nonfinite &= keep
        if nonfinite.any():
            idx = np.argwhere(nonfinite)[0]
            b = int(idx[0])
            at = f" at position {int(idx[1])}" if arr.ndim == 2 else ""
            raise _err(
                f"tensor `{name}` has a non-finite number ({arr[tuple(idx)]}){at}; only finite numbers are "
                "allowed on non-padding positions.",
                field=name,
                episode=b + 1,
                code="not_finite",
            )
    meta = _metadata(raw_meta)
    ids = arrays.get("token_ids")
    tokens = meta.get("tokens")
    if tokens is None and ids is None:
        raise _err(
            "the batch needs tensor `token_ids` or metadata `tokens` (the token strings).",
            "token_ids",
            code="missing_field",
        )
    if tokens is not None:
        for b, row in enumerate(_rows(tokens, B, "tokens")):
            if not isinstance(row, list) or len(row) != n_keep[b] or not all(isinstance(s, str) for s in row):
                got = f"{len(row)} entries" if isinstance(row, list) else type(row).__name__
                raise _err(
                    f"metadata `tokens` row must be a list of {int(n_keep[b])} strings (one per non-padding "
                    f"position); got {got}.",
                    field="tokens",
                    episode=b + 1,
                )
    elif ids is not None:
        kept_ids = ids[keep]
        if ids.dtype.kind == "i" and kept_ids.size and kept_ids.min() < 0:
            b = int(np.argwhere((ids < 0) & keep)[0][0])
            raise _err("tensor `token_ids` holds a negative id.", field="token_ids", episode=b + 1)
        # Without strings only the ids are stored; they display as ⟨id⟩ (app/storage/codecs.py).
    special = _rows(meta["special_tokens"], B, "special_tokens") if "special_tokens" in meta else None
    for b, row in enumerate(special or ()):
        if not (isinstance(row, list) and all(isinstance(i, int) and 0 <= i < n_keep[b] for i in row)):
            raise _err(
                f"metadata `special_tokens` row must list positions between 0 and {int(n_keep[b]) - 1}.",
                field="special_tokens",
                episode=b + 1,
            )
    labels = _rows(meta["groups"], B, "groups") if "groups" in meta else None
    user_meta = meta.get("meta")
    if isinstance(user_meta, list):
        _rows(user_meta, B, "meta")
    if user_meta is not None and not isinstance(user_meta, (dict, list)):
        raise _err("metadata `meta` must be an object or a list of objects.", field="meta")
    group_ids = arrays["groups"].tolist() if "groups" in arrays else None
    reward = arrays["reward"].astype(np.float64).tolist() if "reward" in arrays else None
    if labels is not None:
        for b, label in enumerate(labels):
            if isinstance(label, str) and "\x00" in label:
                raise _err("metadata `groups` label contains a NUL character.", field="groups", episode=b + 1)
    if isinstance(user_meta, list):
        for b, m in enumerate(user_meta):
            if m is not None and not isinstance(m, dict):
                raise _err("metadata `meta` entry must be an object.", field="meta", episode=b + 1)
    _check_signals(arrays, keep, user_meta)
    return (arrays, keep, tokens, special, labels, group_ids, reward, user_meta)


def _check_signals(arrays: dict[str, np.ndarray], keep: np.ndarray, user_meta: Any) -> None:
    """The ``token_signals.<name>`` tensors fit int64 and do not repeat a signal ``meta`` has."""
    names = [name[len(SIGNAL_PREFIX) :] for name in arrays if name.startswith(SIGNAL_PREFIX)]
    if not names:
        return
    for name in names:
        arr = arrays[SIGNAL_PREFIX + name]
        if arr.dtype == np.dtype("<u8") and (big := (arr >= 2**63) & keep).any():
            raise _err(
                f"tensor `{SIGNAL_PREFIX}{name}` holds {int(arr[big][0])}, beyond a 64-bit signed integer.",
                field=SIGNAL_PREFIX + name,
                episode=int(np.argwhere(big)[0][0]) + 1,
                code="wrong_type",
            )
    metas = user_meta if isinstance(user_meta, list) else [user_meta] * len(keep)
    for b, m in enumerate(metas):
        given = m.get("token_signals") if isinstance(m, dict) else None
        if given is None:
            continue
        where = b + 1 if isinstance(user_meta, list) else None
        if not isinstance(given, dict):
            raise _err(
                "metadata `meta.token_signals` must be an object ({name: one value per token}) when "
                f"`{SIGNAL_PREFIX}<name>` tensors come too.",
                field="meta.token_signals",
                episode=where,
                code="bad_meta",
            )
        both = [n for n in names if n in given]
        if both:
            raise _err(
                f"signal `{both[0]}` comes both as tensor `{SIGNAL_PREFIX}{both[0]}` and in metadata "
                "`meta`'s `token_signals`; send each signal once.",
                field=SIGNAL_PREFIX + both[0],
                episode=where,
                code="bad_meta",
            )


def _signal_row(arr: np.ndarray) -> np.ndarray:
    """One row of a signal as the stored type: float64, int64 or numpy bool."""
    if arr.dtype.kind == "f":
        return arr.astype(np.float64)
    if arr.dtype.kind in "iu":
        return arr.astype(np.int64)
    return np.ascontiguousarray(arr)


def _episodes(
    arrays: dict[str, np.ndarray],
    keep: np.ndarray,
    tokens: list[Any] | None,
    special: list[Any] | None,
    labels: list[Any] | None,
    group_ids: list[Any] | None,
    reward: list[Any] | None,
    user_meta: Any,
    tokenizer: TokenDecoder | None = None,
) -> Iterator[tuple[int | None, ArrayEpisode]]:
    kinds = arrays["kinds"]
    ids = arrays.get("token_ids")
    floats = {name: arrays[name] for name in FLOAT_FIELDS if name in arrays}
    signals = sorted(
        ((name[len(SIGNAL_PREFIX) :], arr) for name, arr in arrays.items() if name.startswith(SIGNAL_PREFIX)),
        key=lambda item: item[0],
    )
    all_kept = bool(keep.all())
    for b in range(kinds.shape[0]):
        k = slice(None) if all_kept else keep[b]
        ep_meta: dict[str, Any] = {}
        m = user_meta[b] if isinstance(user_meta, list) else user_meta
        if m is not None:
            ep_meta.update(m)
        ep_meta.setdefault("row", b)
        if signals:  # a fresh dict: one `meta` object may be every row's
            given = ep_meta.get("token_signals")
            ep_meta["token_signals"] = {
                **(given if isinstance(given, dict) else {}),
                **{name: _signal_row(arr[b][k]) for name, arr in signals},
            }
        row_ids = ids[b][k] if ids is not None else None
        row_tokens = tokens[b] if tokens is not None else None
        marks = special[b] if special is not None else None
        if row_tokens is None and tokenizer is not None and row_ids is not None:
            row_tokens, found = tokenizer.row(row_ids)
            marks = marks if marks is not None else (found or None)
        if marks is not None:
            ep_meta["special_tokens"] = marks
        if labels is not None:
            group = None if labels[b] is None else str(labels[b])
        else:
            group = None if group_ids is None else str(group_ids[b])
        yield (
            None,
            ArrayEpisode(
                kinds=np.ascontiguousarray(kinds[b][k], dtype=np.uint8),
                floats={name: arr[b][k] for name, arr in floats.items()},
                token_ids=row_ids,
                tokens=row_tokens,
                reward=None if reward is None else reward[b],
                group=group,
                meta=ep_meta,
            ),
        )


register_format(
    name="safetensors",
    description=(
        "safetensors file of [B, T] tensors (kinds, token_ids, rewards, values, logprobs, advantages, ...) "
        "as written by the creditlens Python client"
    ),
    priority=1,  # before verl_pt: a header length can start with 0x80, a pickle's first byte
    sniff=sniff,
    episodes=episodes,
    takes_tokenizer=True,
)
