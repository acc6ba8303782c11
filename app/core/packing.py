"""Lossless, compact bytes of one per-token array (or one text): what the episode store keeps in
its ``LargeBinary`` columns since migration 0009.

A packed blob is self-describing::

    0xFF, version, encoding, dtype, n (uint32), payload length (uint32), payload, 0-3 pad bytes

and its length is always 3 modulo 4. A column written before packing existed holds the array's
plain little-endian bytes: float64 and int32 arrays are a multiple of 4 bytes long, and kind codes
are bytes 0, 1 and 2, so no old blob both starts with 0xFF and has such a length. :func:`unpack`
tells them apart by that alone (no column says which rows are old), and old rows keep decoding.

What is stored, per array (the smallest of what applies, all exact to the bit):

* ``CONST``: every element has the same bits: one element (a GRPO step's rewards of a
  prompt-only span, a batch of zero values).
* ``RLE``: few runs (kind codes, turn ids, a GRPO episode's advantages: one value per response):
  the run values and lengths, byte-shuffled and zstd-compressed.
* ``ZSTD``: the values byte-shuffled (every element's first byte, then every second byte, ...: the
  sign/exponent bytes of floats and the high bytes of ids are nearly constant and compress to
  little) and compressed with zstd (Apache Arrow's build of it, ``pyarrow.Codec``).
* ``RAW``: the values as they are, when compression would not make them smaller.

Floats are stored as float32 when every element survives the round trip float64 -> float32 ->
float64 bit for bit (what a trainer logs is float32 or bfloat16), else as float64; int64 arrays
as int32 when every element fits. :func:`unpack` returns the dtype the caller asks for, so
readers see float64 and int32 exactly as before.
"""

from __future__ import annotations

import struct
from typing import Any, Final

import numpy as np
import pyarrow as pa

MARK: Final = 0xFF
VERSION: Final = 1
# Encodings.
RAW: Final = 0
ZSTD: Final = 1
CONST: Final = 2
RLE: Final = 3
# Stored dtypes (code -> numpy dtype); TEXT is UTF-8 bytes decoded by unpack_text.
DTYPES: Final[dict[int, np.dtype[Any]]] = {
    1: np.dtype("u1"),
    2: np.dtype("<i4"),
    3: np.dtype("<i8"),
    4: np.dtype("<f4"),
    5: np.dtype("<f8"),
    6: np.dtype("u1"),
}
TEXT: Final = 6
_CODES: Final[dict[np.dtype[Any], int]] = {
    np.dtype("u1"): 1,
    np.dtype("<i4"): 2,
    np.dtype("<i8"): 3,
    np.dtype("<f4"): 4,
    np.dtype("<f8"): 5,
}
_HEADER = struct.Struct("<BBBBII")
# Level 3 (zstd's default): within a few percent of level 6's size at half its time (32 kB of
# float32 logprobs: ~70 µs to compress, ~20 µs to decompress on this project's 2-core machines).
_ZSTD = pa.Codec("zstd", compression_level=3)
# Runs are worth storing as runs when they are this many times fewer than the elements.
_RLE_FACTOR = 8
_U: Final[dict[int, np.dtype[Any]]] = {1: np.dtype("u1"), 4: np.dtype("<u4"), 8: np.dtype("<u8")}


def is_packed(blob: bytes | memoryview | None) -> bool:
    """True when ``blob`` was written by :func:`pack` / :func:`pack_text` (False for an old
    column's plain little-endian bytes; see the module docstring)."""
    return blob is not None and len(blob) % 4 == 3 and blob[0] == MARK


def _narrow(a: np.ndarray) -> np.ndarray:
    """``a`` in the smallest dtype that holds it exactly (little-endian)."""
    if a.dtype.kind == "f":
        x = a.astype("<f8", copy=False)
        with np.errstate(over="ignore"):  # beyond float32's range: inf, so not exact
            f32 = x.astype("<f4")
        if np.array_equal(f32.astype("<f8").view("<u8"), x.view("<u8")):
            return f32
        return x
    if a.dtype.kind in "iu" and a.dtype.itemsize > 1:
        if a.size and a.dtype.kind == "u" and a.dtype.itemsize == 8 and int(a.max()) >= 2**63:
            raise ValueError("cannot pack unsigned integers of 2**63 or more")
        if a.dtype.itemsize < 4 or (a.dtype.itemsize == 4 and a.dtype.kind == "i"):
            return a.astype("<i4", copy=False)
        x = a.astype("<i8", copy=False)
        if not x.size or (int(x.min()) >= -(2**31) and int(x.max()) < 2**31):
            return x.astype("<i4")
        return x
    if a.dtype in (np.dtype("u1"), np.dtype("bool")):
        return a.astype("u1", copy=False)
    raise TypeError(f"cannot pack an array of dtype {a.dtype}")


def _shuffle(a: np.ndarray) -> bytes:
    """Byte planes: every element's byte 0, then every byte 1, ... (a no-op for 1-byte items)."""
    if a.dtype.itemsize == 1:
        return a.tobytes()
    return np.ascontiguousarray(a.view("u1").reshape(-1, a.dtype.itemsize).T).tobytes()


def _unshuffle(b: bytes, dtype: np.dtype, n: int) -> np.ndarray:
    planes = np.frombuffer(b, dtype="u1", count=n * dtype.itemsize)
    if dtype.itemsize == 1:
        return planes.view(dtype)
    return np.ascontiguousarray(planes.reshape(dtype.itemsize, n).T).view(dtype).reshape(n)


def _blob(encoding: int, code: int, n: int, payload: bytes) -> bytes:
    head = _HEADER.pack(MARK, VERSION, encoding, code, n, len(payload))
    pad = (3 - (len(head) + len(payload))) % 4
    return head + payload + b"\0" * pad


def _compressed(raw: bytes) -> bytes | None:
    """zstd of ``raw``, or None when it is no smaller."""
    z = _ZSTD.compress(raw, asbytes=True)
    return z if len(z) < len(raw) else None


def pack(a: np.ndarray) -> bytes:
    """The packed bytes of a 1-D array (uint8/bool, integers, floats): exact to the bit."""
    a = np.asarray(a)
    if a.ndim != 1:
        raise ValueError(f"pack takes a 1-D array; got shape {a.shape}")
    x = _narrow(a)
    code, n = _CODES[x.dtype], len(x)
    if n >= 2**32:
        raise ValueError("an array of 2**32 or more elements cannot be packed")
    if n == 0:
        return _blob(RAW, code, 0, b"")
    bits = x.view(_U[x.dtype.itemsize])
    starts = np.flatnonzero(bits[1:] != bits[:-1]) + 1
    if not len(starts):
        return _blob(CONST, code, n, x[:1].tobytes())
    if (len(starts) + 1) * _RLE_FACTOR <= n:
        starts = np.concatenate(([0], starts))
        lengths = np.diff(np.append(starts, n)).astype("<u4")
        runs = _shuffle(x[starts]) + _shuffle(lengths)
        z = _compressed(runs)
        head = struct.pack("<I", len(starts))
        return _blob(RLE, code, n, head + (b"\1" + z if z is not None else b"\0" + runs))
    raw = x.tobytes()
    z = _compressed(_shuffle(x))
    return _blob(RAW, code, n, raw) if z is None else _blob(ZSTD, code, n, z)


def _parts(blob: bytes | memoryview) -> tuple[int, np.dtype, int, int, memoryview]:
    """(encoding, stored dtype, its code, n, payload) of a packed blob; ValueError when it is not
    one this version reads."""
    mv = memoryview(blob)
    if len(mv) < _HEADER.size or not is_packed(mv):
        raise ValueError("not a packed blob")
    mark, version, encoding, code, n, size = _HEADER.unpack_from(mv)
    if version != VERSION or code not in DTYPES or _HEADER.size + size > len(mv):
        raise ValueError(f"a packed blob of an unknown version or dtype ({version}, {code})")
    return encoding, DTYPES[code], code, n, mv[_HEADER.size : _HEADER.size + size]


def _values(encoding: int, dtype: np.dtype, n: int, payload: memoryview) -> np.ndarray:
    size = n * dtype.itemsize
    if encoding == RAW:
        if len(payload) != size:
            raise ValueError("a packed blob's payload has the wrong length")
        return np.frombuffer(payload, dtype=dtype).copy()
    if encoding == ZSTD:
        return _unshuffle(_ZSTD.decompress(payload, decompressed_size=size, asbytes=True), dtype, n)
    if encoding == CONST:
        return np.full(n, np.frombuffer(payload, dtype=dtype, count=1)[0], dtype=dtype)
    if encoding == RLE:
        (k,) = struct.unpack_from("<I", payload)
        body = payload[5:]
        width = k * (dtype.itemsize + 4)
        runs = _ZSTD.decompress(body, decompressed_size=width, asbytes=True) if payload[4] else bytes(body)
        values = _unshuffle(runs[: k * dtype.itemsize], dtype, k)
        lengths = _unshuffle(runs[k * dtype.itemsize : width], np.dtype("<u4"), k)
        if int(lengths.sum(dtype=np.int64)) != n:
            raise ValueError("a packed blob's runs do not add up to its length")
        return np.repeat(values, lengths)
    raise ValueError(f"a packed blob of an unknown encoding ({encoding})")


def unpack(blob: bytes | memoryview | None, dtype: np.dtype | str) -> np.ndarray | None:
    """A writable 1-D array of ``dtype`` from a column's bytes: a packed blob (converted exactly:
    stored float32 read as float64, int32 as int64), or an old row's plain little-endian bytes of
    ``dtype``. None stays None."""
    if blob is None:
        return None
    dtype = np.dtype(dtype)
    if not is_packed(blob):
        return np.frombuffer(blob, dtype=dtype).copy()
    encoding, stored, code, n, payload = _parts(blob)
    if code == TEXT:
        raise ValueError("a packed text, not an array")
    return _values(encoding, stored, n, payload).astype(dtype, copy=False)


def packed_length(blob: bytes | memoryview, dtype: np.dtype | str) -> int:
    """The number of elements of a column's array, from its header (no decoding)."""
    if is_packed(blob):
        return _parts(blob)[3]
    return len(blob) // np.dtype(dtype).itemsize


def pack_text(text: str) -> bytes:
    """The packed bytes of a text (UTF-8, zstd when that is smaller)."""
    raw = text.encode()
    z = _compressed(raw) if raw else None
    return _blob(RAW, TEXT, len(raw), raw) if z is None else _blob(ZSTD, TEXT, len(raw), z)


def unpack_text(blob: bytes | memoryview) -> str:
    """The text of :func:`pack_text`'s bytes."""
    encoding, _, code, n, payload = _parts(blob)
    if code != TEXT:
        raise ValueError("a packed array, not a text")
    return _values(encoding, DTYPES[TEXT], n, payload).tobytes().decode()
