"""An episode's ``meta.token_signals`` (``{name: [T numbers]}``: a format's per-token fields that
have no column of their own) stored packed, as the other per-token arrays are, in the ``episode``
row's ``token_signals`` column (migration 0014) instead of as JSON text inside ``meta_json``.

At write time :func:`split` takes every entry that is one JSON-typed number (or null) per token
out of the meta as an array; :func:`pack_signals` packs them (app/core/packing.py: float32 when
exact, byte-shuffled, zstd) into one blob. At read time :func:`merge` puts them back as the same
lists, at the same place in the meta and in the same order, so every answer and export reads what
JSON gave before:

* a list of floats (nulls allowed) is a float64 array, null as NaN; it reads back as floats, and
  null wherever the number is not finite (JSON has no NaN or infinity: orjson writes null);
* a list of ints, or of booleans (nulls allowed), is an int64 or uint8 array with a null mask and
  reads back as ints or booleans;
* a 1-D numpy array of one entry per token (a reader may hand its own array over instead of a
  list) is packed as it is, and reads back as the list JSON would have made of it;
* anything else (strings, nested lists, ints mixed with floats, a list of another length than
  the tokens, ints beyond 64 bits) stays in ``meta_json`` as before.

A blob is self-describing::

    b"\\xfeTS", version (1 byte), header length (uint32), header (JSON), packed arrays

The header: ``{"at": the key's index in the meta, "names": every name in order, "fields":
[[name, type, bytes, mask bytes], ...]}`` (type ``f``, ``i`` or ``b``; mask bytes 0: no nulls),
the packed arrays (and masks) following in that order. Rows written before migration 0014 have
no blob and keep their JSON.
"""

from __future__ import annotations

import json
import operator
import struct
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from app.core.packing import pack, unpack

KEY: Final = "token_signals"
MAGIC: Final = b"\xfeTS"
VERSION: Final = 1
_HEAD = struct.Struct("<3sBI")
_DTYPES: Final[dict[str, np.dtype[Any]]] = {"f": np.dtype("<f8"), "i": np.dtype("<i8"), "b": np.dtype("u1")}
_PY: Final = {"f": float, "i": int, "b": bool}


@dataclass
class SignalArrays:
    """``meta.token_signals`` taken out of an episode's meta, its arrays not packed yet.

    at:     the index of ``token_signals`` among the meta's keys.
    names:  every name of ``token_signals`` in order (those left in the JSON meta included).
    arrays: name -> (type ``f``/``i``/``b``, [T] values, [T] bool null mask or None)."""

    at: int
    names: list[str]
    arrays: dict[str, tuple[str, np.ndarray, np.ndarray | None]] = field(default_factory=dict)


def typed_array(values: Any, n: int) -> tuple[str, np.ndarray, np.ndarray | None] | None:
    """(type, array, null mask) of one ``token_signals`` entry, or None when it stays JSON (not a
    list of ``n`` JSON numbers of one type, nulls allowed; see the module docstring)."""
    if isinstance(values, np.ndarray) and values.ndim == 1 and len(values) == n and n:
        if values.dtype.kind == "f":  # a reader's own array: NaN reads as null, as JSON wrote it
            return "f", values.astype(np.float64, copy=False), None
        if values.dtype.kind in "iu" and int(values.max()) < 2**63:
            return "i", values.astype(np.int64, copy=False), None
        if values.dtype == np.dtype(np.bool_):
            return "b", values.view(np.uint8), None
    if not isinstance(values, list) or len(values) != n or n == 0:
        return None
    # The common case, every element a float, in two C-level passes (a type count, then the copy).
    if operator.countOf(map(type, values), float) == n:
        return "f", np.fromiter(values, dtype=np.float64, count=n), None
    types = set(map(type, values))
    types.discard(type(None))
    kind = next((k for k, t in _PY.items() if types == {t}), "f" if not types else None)
    if kind is None:
        return None
    if kind == "f":
        return "f", np.array(values, dtype=np.float64), None  # null -> NaN
    nulls = np.fromiter((v is None for v in values), dtype=np.bool_, count=n)
    filled = [0 if v is None else v for v in values] if nulls.any() else values
    try:
        arr = np.array(filled, dtype=_DTYPES["i"] if kind == "i" else np.dtype(np.bool_))
    except OverflowError:  # beyond int64: stays JSON
        return None
    return kind, arr.view(np.uint8) if kind == "b" else arr, nulls if nulls.any() else None


def split(meta: dict[str, Any], n: int) -> tuple[dict[str, Any], SignalArrays | None]:
    """``meta`` without the ``token_signals`` entries that pack (see the module docstring), and
    those entries as arrays; ``(meta, None)`` unchanged when none does. ``n``: the tokens."""
    signals = meta.get(KEY)
    if not isinstance(signals, dict) or not signals:
        return meta, None
    out = SignalArrays(at=list(meta).index(KEY), names=list(signals))
    left: dict[str, Any] = {}
    for name, values in signals.items():
        got = typed_array(values, n) if isinstance(name, str) else None
        if got is None:
            left[name] = values
        else:
            out.arrays[name] = got
    if not out.arrays:
        return meta, None
    rest = {k: v for k, v in meta.items() if k != KEY}
    if left:
        rest = dict(list(rest.items())[: out.at] + [(KEY, left)] + list(rest.items())[out.at :])
    return rest, out


def pack_signals(s: SignalArrays) -> bytes:
    """The blob of ``s`` (see the module docstring)."""
    parts: list[bytes] = []
    fields = []
    for name, (kind, arr, nulls) in s.arrays.items():
        body = pack(arr)
        mask = b"" if nulls is None or not nulls.any() else pack(nulls.view(np.uint8))
        parts += [body, mask]
        fields.append([name, kind, len(body), len(mask)])
    head = json.dumps({"at": s.at, "names": s.names, "fields": fields}, separators=(",", ":")).encode()
    return _HEAD.pack(MAGIC, VERSION, len(head)) + head + b"".join(parts)


def _as_list(kind: str, arr: np.ndarray, nulls: np.ndarray | None) -> list[Any]:
    """The JSON-typed list of one packed entry (null where masked, or a float not finite)."""
    if kind == "b":
        arr = arr.astype(np.bool_)
    elif kind == "f":
        bad = ~np.isfinite(arr)
        nulls = bad if nulls is None else nulls | bad
    if nulls is None or not nulls.any():
        out: list[Any] = arr.tolist()
        return out
    boxed = arr.astype(object)
    boxed[nulls] = None
    return list(boxed.tolist())


def as_json(values: Any) -> Any:
    """One ``token_signals`` entry as it reads back once stored: a reader's numpy array as the
    list JSON gives (null where a float is not finite); anything else as it is."""
    if not isinstance(values, np.ndarray):
        return values
    got = typed_array(values, len(values)) if values.ndim == 1 else None
    return values.tolist() if got is None else _as_list(*got)


def unpack_signals(blob: bytes | memoryview) -> tuple[int, list[str], dict[str, list[Any]]]:
    """(at, names, {name: list}) of :func:`pack_signals`'s bytes; ValueError for another blob."""
    mv = memoryview(blob)
    if len(mv) < _HEAD.size:
        raise ValueError("not a token_signals blob")
    magic, version, size = _HEAD.unpack_from(mv)
    if magic != MAGIC or version != VERSION:
        raise ValueError(f"a token_signals blob of an unknown version ({magic!r}, {version})")
    head = json.loads(bytes(mv[_HEAD.size : _HEAD.size + size]))
    pos = _HEAD.size + size
    lists: dict[str, list[Any]] = {}
    for name, kind, n_body, n_mask in head["fields"]:
        arr = unpack(mv[pos : pos + n_body], _DTYPES[kind])
        pos += n_body
        nulls = None if not n_mask else unpack(mv[pos : pos + n_mask], _DTYPES["b"])
        pos += n_mask
        if arr is None:  # pragma: no cover - unpack returns None for None only
            raise ValueError("a token_signals blob without its array")
        lists[name] = _as_list(kind, arr, None if nulls is None else nulls.astype(np.bool_))
    return int(head["at"]), list(head["names"]), lists


def merge(meta: Any, blob: bytes | memoryview | None) -> Any:
    """``meta`` (the row's decoded ``meta_json``) with the packed ``token_signals`` put back as
    lists, where and in the order they were uploaded; unchanged without a blob (a row stored
    before migration 0014 keeps its JSON)."""
    if blob is None or not isinstance(meta, dict):
        return meta
    at, names, lists = unpack_signals(blob)
    left = meta.get(KEY)
    left = left if isinstance(left, dict) else {}
    signals = {
        name: lists[name] if name in lists else left[name] for name in names if name in lists or name in left
    }
    items = [(k, v) for k, v in meta.items() if k != KEY]
    items.insert(min(at, len(items)), (KEY, signals))
    return dict(items)
