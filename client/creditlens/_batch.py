"""Turning the arguments of ``Run.log_tensors`` into the safetensors wire format.

Split in two so a training loop pays only for the cheap half: :func:`snapshot` runs on the
caller's thread (copies the tensors to numpy so the trainer may reuse its buffers, checks
shapes); :func:`build` runs on the sender thread (kinds, token text, serialisation).

The kinds rule, per row:

1. a position where ``attention_mask`` is 0 is padding (dropped); without ``attention_mask``
   every position is kept;
2. ``kinds`` when given: codes 0 prompt / 1 policy / 2 tool / 255 padding, or the strings;
3. else ``policy_mask``: 1 is policy; a 0 before the row's first policy token is prompt, a 0
   after it is tool (the observations between the turns of a multi-turn rollout);
4. else every kept position is policy.

``token_signals`` (``{name: [B, T]}``, the caller's own per-token numbers) travel as
``token_signals.<name>`` tensors (``creditlens.wire``): floats as float32 or float64, integers as
int64, booleans as BOOL.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, cast

import numpy as np

from .tokens import Mode, display_pieces, piece_text, vocab_mode
from .wire import FLOAT_FIELDS, KIND_CODES, PADDING, SIGNAL_PREFIX, encode

_KIND_OF_STR = {**KIND_CODES, "padding": PADDING, "pad": PADDING}
_ROLE = {"token_ids": "ids", "policy_mask": "mask", "attention_mask": "mask", "kinds": "codes"}


def to_numpy(x: Any, name: str, role: str = "float") -> np.ndarray:
    """A numpy array the caller can no longer change, from a numpy array, torch tensor (any
    device or dtype) or nested list, in the smallest faithful form for its ``role``:

    ``"mask"``: bool; ``"ids"``: int32 when the values fit (else int64); ``"float"``: float32 or
    float64 (bfloat16/float16 widened to float32); ``"int"``: int64; ``"codes"``: uint8;
    ``"signal"``: bool as it is, other integers int64, floats as ``"float"`` (a nested list
    with None: float64, None as NaN).
    Only a result that shares memory with the input is copied (a conversion already is one)."""
    if x is None:
        raise ValueError(f"{name} is None")
    a: np.ndarray
    if type(x).__module__.startswith("torch"):
        # No torch operators here: on a busy machine their thread pool costs more than the copy.
        t = x.detach()
        if str(t.dtype) == "torch.bfloat16":  # no numpy dtype: the top half of a float32
            u = t.view(_torch().int16).cpu().numpy()
            a, fresh = (u.astype(np.uint32) << 16).view(np.float32), True
        else:
            a, fresh = t.cpu().numpy(), t.device.type != "cpu"
    else:
        fresh = not isinstance(x, np.ndarray)
        a = np.asarray(x)
    if role == "mask":
        return np.asarray(np.not_equal(a, 0))
    if role == "signal":
        if a.dtype == np.bool_:
            return a if fresh else a.copy()
        if a.dtype == object:  # nested lists with None (not scored): NaN, as JSON null reads
            try:
                return a.astype(np.float64)
            except (TypeError, ValueError):
                pass
        if a.dtype.kind in "iu":
            if a.dtype == np.uint64 and a.size and int(a.max()) >= 2**63:
                raise ValueError(f"`{name}` holds {int(a.max())}, beyond a 64-bit signed integer.")
            return a.astype(np.int64)
        if a.dtype.kind != "f":
            raise ValueError(f"`{name}` must hold numbers or booleans; it has dtype {a.dtype}.")
        role = "float"
    if role == "ids":
        if a.dtype.kind not in "iub":
            raise ValueError(f"`{name}` must hold integers; it has dtype {a.dtype}.")
        fits = a.size == 0 or (int(a.min()) >= -(2**31) and int(a.max()) < 2**31)
        want = np.int32 if fits else np.int64
        return a.copy() if a.dtype == want and not fresh else a.astype(want, copy=False)
    if role == "float":
        if a.dtype.kind not in "fiub":
            raise ValueError(f"`{name}` must hold numbers; it has dtype {a.dtype}.")
        if a.dtype in (np.float32, np.float64):
            return a if fresh else a.copy()
        return a.astype(np.float32)
    if role == "codes":
        if a.size:
            _check_codes(int(a.min()), int(a.max()), name)
        return a.astype(np.uint8)
    return a.astype(np.int64)


def _check_codes(lo: int, hi: int, name: str) -> None:
    if lo < 0 or hi > 255:
        raise ValueError(
            f"`{name}` holds {lo if lo < 0 else hi}; use 0 prompt, 1 policy, 2 tool, 255 padding."
        )


def _torch() -> ModuleType:
    import torch

    return torch


@dataclass
class Snapshot:
    """Everything ``log_tensors`` was given, as numpy copies; ``nbytes`` is what it holds."""

    B: int
    T: int
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    kinds_str: list[list[str]] | None = None
    tokens: list[list[str]] | None = None
    group_labels: list[str] | None = None
    tokenizer: Any = None
    meta: Any = None
    nbytes: int = 0
    signals: dict[str, np.ndarray] = field(default_factory=dict)  # token_signals by name


# The per-token [B, T] arguments of ``log_tensors``, in the order they are checked.
_PER_TOKEN = ("token_ids", "policy_mask", "attention_mask", *FLOAT_FIELDS)
_OTHER = ("tokens", "kinds", "reward", "groups", "tokenizer", "meta", "token_signals")


def snapshot(**given: Any) -> Snapshot:
    """Copy and shape-check the keyword arguments of ``Run.log_tensors`` (the same names, each
    optional; ValueError naming the argument, TypeError for a name it does not take)."""
    unknown = sorted(set(given) - set(_PER_TOKEN) - set(_OTHER))
    if unknown:
        raise TypeError(f"snapshot() got unexpected keyword arguments {unknown}")
    per_token = {name: given.get(name) for name in _PER_TOKEN}
    token_ids = per_token["token_ids"]
    tokens: Sequence[Sequence[str]] | None = given.get("tokens")
    kinds, reward, groups = given.get("kinds"), given.get("reward"), given.get("groups")
    tokenizer, meta = given.get("tokenizer"), given.get("meta")
    kinds_str = None
    if kinds is not None:
        if _is_nested_str(kinds):
            kinds_str = [list(r) for r in kinds]
        else:
            per_token["kinds"] = kinds
    arrays: dict[str, np.ndarray] = {}
    shape: tuple[int, int] | None = None
    for name, value in per_token.items():
        if value is None:
            continue
        arr = to_numpy(value, name, _ROLE.get(name, "float"))
        if arr.ndim != 2:
            raise ValueError(f"`{name}` must be 2-D [B, T]; it has shape {tuple(arr.shape)}.")
        if shape is None:
            shape = arr.shape
        elif arr.shape != shape:
            raise ValueError(f"`{name}` has shape {tuple(arr.shape)} but the batch is {shape} [B, T].")
        arrays[name] = arr
    if shape is None:
        if tokens is None:
            raise ValueError("give `token_ids` or `tokens` (and per-token tensors of shape [B, T]).")
        B = len(tokens)
        T = max((len(r) for r in tokens), default=0)
        shape = (B, T)
    B, T = shape
    if token_ids is None and tokens is None:
        raise ValueError("give `token_ids` (with `tokenizer=` for readable text) or `tokens`.")
    if kinds_str is not None and (len(kinds_str) != B or any(len(r) != T for r in kinds_str)):
        raise ValueError(f"`kinds` must have B={B} rows of T={T} kinds.")
    tok_rows = None
    if tokens is not None:
        tok_rows = [list(map(str, r)) for r in tokens]
        if len(tok_rows) != B:
            raise ValueError(f"`tokens` has {len(tok_rows)} rows but the batch has B={B}.")
    for name, value in (("reward", reward), ("groups", groups)):
        if value is None:
            continue
        if name == "groups" and _is_str_list(value):
            if len(value) != B:
                raise ValueError(f"`groups` has {len(value)} labels but the batch has B={B}.")
            continue
        role = "float" if name == "reward" else "int"
        vec = to_numpy(value, name, role).reshape(-1) if not np.isscalar(value) else None
        if vec is None or vec.shape != (B,):
            got = None if vec is None else tuple(vec.shape)
            raise ValueError(f"`{name}` must have shape [B] = ({B},); got {got}.")
        arrays[name] = vec
    labels = [str(g) for g in groups] if groups is not None and _is_str_list(groups) else None
    signals = _signals(given.get("token_signals"), (B, T))
    snap = Snapshot(B, T, arrays, kinds_str, tok_rows, labels, tokenizer, meta, signals=signals)
    # Kinds now, from the masks (a few cheap passes): one uint8 array is kept instead of two masks.
    arrays["kinds"] = kinds_codes(snap)
    arrays.pop("policy_mask", None)
    arrays.pop("attention_mask", None)
    snap.kinds_str = None
    nbytes = sum(a.nbytes for a in arrays.values()) + sum(a.nbytes for a in signals.values())
    if tok_rows is not None:
        nbytes += sum(sum(len(s) for s in r) + 8 * len(r) for r in tok_rows)
    snap.nbytes = nbytes
    return snap


def _signals(given: Any, shape: tuple[int, int]) -> dict[str, np.ndarray]:
    """``token_signals`` as numpy copies of the batch's [B, T] (ValueError naming the signal)."""
    if given is None:
        return {}
    if not isinstance(given, dict):
        raise ValueError(
            f"`token_signals` must be a dict {{name: [B, T] array}}; got {type(given).__name__}."
        )
    out: dict[str, np.ndarray] = {}
    for name, value in given.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"`token_signals` names must be non-empty strings; got {name!r}.")
        label = f"token_signals[{name}]"
        arr = to_numpy(value, label, "signal")
        if arr.shape != shape:
            raise ValueError(f"`{label}` has shape {tuple(arr.shape)} but the batch is {shape} [B, T].")
        out[name] = arr
    return out


def _is_nested_str(x: Any) -> bool:
    return (
        isinstance(x, (list, tuple))
        and bool(x)
        and isinstance(x[0], (list, tuple))
        and (not x[0] or isinstance(x[0][0], str))
    )


def _is_str_list(x: Any) -> bool:
    return isinstance(x, (list, tuple)) and any(isinstance(g, str) for g in x)


def kinds_codes(s: Snapshot) -> np.ndarray:
    """uint8 [B, T] kinds by the rule in the module docstring."""
    a = s.arrays
    if "kinds" in a:
        k = a["kinds"]
        if not np.isin(k, (0, 1, 2, PADDING)).all():
            bad = k[~np.isin(k, (0, 1, 2, PADDING))][0]
            raise ValueError(f"`kinds` holds the code {bad}; use 0 prompt, 1 policy, 2 tool, 255 padding.")
        kinds = k.copy()
    elif s.kinds_str is not None:
        try:
            kinds = np.array([[_KIND_OF_STR[x] for x in r] for r in s.kinds_str], dtype=np.uint8)
        except KeyError as e:
            raise ValueError(f'`kinds` holds {e.args[0]!r}; use "prompt", "policy" or "tool".') from None
    elif "policy_mask" in a:
        pm = a["policy_mask"]
        first = np.where(pm.any(axis=1), pm.argmax(axis=1), s.T)  # the row's first policy token
        kinds = (np.arange(s.T)[None, :] >= first[:, None]).astype(np.uint8) * 2  # tool after it
        kinds[pm] = 1
    else:
        kinds = np.ones((s.B, s.T), dtype=np.uint8)
    if "attention_mask" in a:
        kinds[~a["attention_mask"]] = PADDING
    return kinds


def _special_tokens(tokenizer: Any) -> set[str]:
    out = set(getattr(tokenizer, "all_special_tokens", None) or [])
    get_added = getattr(tokenizer, "get_added_tokens_decoder", None)
    if callable(get_added):  # tokenizers.Tokenizer (and transformers' fast tokenizers)
        try:
            out |= {str(t) if isinstance(t, str) else t.content for t in get_added().values() if t.special}
        except Exception:  # an exotic tokenizer: the special set only marks, never required
            pass
    return out


def pieces(tokenizer: Any, ids: list[int]) -> list[str]:
    """The vocabulary pieces of ``ids``: ``convert_ids_to_tokens`` (transformers) or
    ``id_to_token`` (``tokenizers.Tokenizer``); an unknown id becomes ⟨id⟩."""
    conv = getattr(tokenizer, "convert_ids_to_tokens", None)
    if callable(conv):
        got = conv(ids)
    else:
        got = [tokenizer.id_to_token(i) for i in ids]
    return [p if isinstance(p, str) else f"⟨{i}⟩" for p, i in zip(got, ids, strict=True)]


@dataclass
class _TokInfo:
    tokenizer: Any
    mode: Mode
    special: set[str]
    text: dict[int, str | None] = field(default_factory=dict)  # id -> piece_text (or the special)
    special_ids: set[int] = field(default_factory=set)
    windows: dict[tuple[int, ...], list[str]] = field(default_factory=dict)  # split characters


_MAX_WINDOWS = 65536

# id(tokenizer) -> what we know of it; the tokenizer is kept so the id stays its.
_TOKENIZERS: dict[int, _TokInfo] = {}


def tokenizer_info(tokenizer: Any) -> _TokInfo:
    """The piece encoding of ``tokenizer``'s vocabulary and its special tokens (computed once)."""
    got = _TOKENIZERS.get(id(tokenizer))
    if got is None or got.tokenizer is not tokenizer:
        try:
            mode: Mode = vocab_mode(list(tokenizer.get_vocab()))
        except Exception:  # noqa: BLE001 - no vocabulary to look at: decide per sequence
            mode = "auto"
        got = _TokInfo(tokenizer, mode, _special_tokens(tokenizer))
        _TOKENIZERS[id(tokenizer)] = got
    return got


def decode_rows(tokenizer: Any, rows: list[list[int]]) -> tuple[list[list[str]], list[list[int]]]:
    """Display text and special positions of each row of ids, as :func:`display_pieces` gives
    them. Each distinct id is looked up once per tokenizer; a row whose pieces all read on their
    own (no character split over tokens) is a dictionary lookup per token."""
    info = tokenizer_info(tokenizer)
    missing = list({i for r in rows for i in r}.difference(info.text))
    if missing:
        for i, p in zip(missing, pieces(tokenizer, missing), strict=True):
            if p in info.special:
                info.text[i] = p
                info.special_ids.add(i)
            else:
                info.text[i] = piece_text(p, info.mode)
    texts: list[list[str]] = []
    marks: list[list[int]] = []
    table = info.text
    for ids in rows:
        shown = [table[i] for i in ids]
        if None in shown:
            _split_characters(tokenizer, info, ids, shown)
        texts.append(cast(list[str], shown))  # _split_characters filled every None
        sp = info.special_ids
        marks.append([j for j, i in enumerate(ids) if i in sp] if sp else [])
    return texts, marks


def _split_characters(tokenizer: Any, info: _TokInfo, ids: list[int], shown: list[str | None]) -> None:
    """Fill the None entries of ``shown``: each run of pieces that do not read on their own (a
    character split over tokens) is decoded with display_pieces together with the piece after
    it, which is where leftover bytes would show; before a run the decoder has nothing pending,
    so the result equals decoding the whole row."""
    n = len(ids)
    j = 0
    while j < n:
        if shown[j] is not None:
            j += 1
            continue
        end = j
        while end < n and shown[end] is None:
            end += 1
        stop = min(end + 1, n)
        key = tuple(ids[j:stop])
        window = info.windows.get(key)
        if window is None:
            window = display_pieces(pieces(tokenizer, list(key)), info.special, mode=info.mode).text
            if len(info.windows) >= _MAX_WINDOWS:
                info.windows.clear()  # bounded memory; the common splits come back quickly
            info.windows[key] = window
        shown[j:stop] = window
        j = stop


def build(s: Snapshot) -> bytes:
    """The safetensors file for one snapshot (runs on the sender thread)."""
    kinds = s.arrays["kinds"]
    keep = kinds != PADDING
    tensors: dict[str, np.ndarray] = {"kinds": kinds}
    for name in FLOAT_FIELDS:
        if name in s.arrays:
            arr = s.arrays[name]
            # Float32 unless the caller had float64: half the bytes and what trainers hold anyway.
            tensors[name] = arr.astype(np.float64 if arr.dtype == np.float64 else np.float32, copy=False)
    for name, arr in s.signals.items():
        tensors[SIGNAL_PREFIX + name] = arr  # bool, int64, float32 or float64 since snapshot
    if "reward" in s.arrays:
        tensors["reward"] = s.arrays["reward"].astype(np.float64, copy=False)
    if "token_ids" in s.arrays:
        tensors["token_ids"] = s.arrays["token_ids"].astype(np.int64, copy=False)
    if "groups" in s.arrays:
        g = s.arrays["groups"]
        if g.dtype.kind not in "iu":
            raise ValueError("`groups` must be integers [B] or a list of B strings.")
        tensors["groups"] = g.astype(np.int64, copy=False)
    metadata: dict[str, Any] = {}
    if s.tokens is not None:
        rows = []
        for b, r in enumerate(s.tokens):
            if len(r) == s.T:
                rows.append([t for t, k in zip(r, keep[b], strict=True) if k])
            elif len(r) == int(keep[b].sum()):
                rows.append(r)
            else:
                raise ValueError(
                    f"`tokens` row {b} has {len(r)} strings; expected T={s.T} or one per non-padding "
                    f"position ({int(keep[b].sum())})."
                )
        metadata["tokens"] = rows
    elif s.tokenizer is not None and "token_ids" in s.arrays:
        ids = tensors["token_ids"]
        texts, marks = decode_rows(s.tokenizer, [ids[b][keep[b]].tolist() for b in range(s.B)])
        metadata["tokens"] = texts
        if any(marks):
            metadata["special_tokens"] = marks
    if s.group_labels is not None:
        metadata["groups"] = s.group_labels
    if s.meta is not None:
        metadata["meta"] = s.meta
    return encode(tensors, metadata)
