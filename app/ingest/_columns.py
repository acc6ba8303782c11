"""JSON lines whose values are long lists of numbers (a trainer's per-token dump: prime-rl's token
exports), read as columns: every list of numbers becomes one numpy array straight from the text,
with no Python object per number.

Two readers, each exact (every decimal the float64 Python's ``float`` reads from it, every list of
integers named in ``integer_fields`` as int64, every other list of numbers as float64):

* the compiled one (app/ingest/_numbers.c, built by ``pip install`` when a C compiler is there)
  reads every list of the line on two threads with the GIL released, so a line is read while the
  server goes on receiving the upload; Python's ``json`` reads what is left (keys, scalars, small
  objects: a few hundred bytes). It takes a line whose every "[" opens a top-level list of numbers
  alone or of true/false alone, and hands any other line to
* simdjson (the ``pysimdjson`` package), which parses the line and copies each list of numbers
  out. A list that is not all numbers (booleans, nulls, strings, nested lists or objects) comes
  back as the Python list the generic JSON reader would have made, and every other value as its
  Python value, so a reader goes on with its list rules (and its errors naming the entry) for
  those.

A list of booleans comes as a bool array. A line neither takes (NaN or Infinity, which Python's
``json`` writes; a number beyond float64 or int64; a key given twice, where simdjson keeps the
first and the generic reader the last; a list nested in a list, which simdjson would flatten into
its parent's numbers; JSON that is not valid) gives None: the caller reads that line with the
generic reader, which reads what it can and names the line otherwise.

On this machine the compiled reader takes a prime-rl line of 8,192 tokens × 16 fields at
~1,400 MB/s on two threads (~830 MB/s on one), simdjson at ~780 MB/s with the GIL held, orjson
followed by one ``numpy.fromiter`` per list at ~370 MB/s (bench/drift.py); nothing per number is
left for the garbage collector.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Collection
from typing import Any

import numpy as np
import simdjson

try:  # the compiled list reader (app/ingest/_numbers.c), built when a C compiler is present
    import app.ingest._numbers as _numbers  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - not built: simdjson reads every line
    _numbers = None


def compiled_available() -> bool:
    """True when the compiled list reader (app/ingest/_numbers.c) is built."""
    return _numbers is not None


class ColumnReader:
    """Reads one JSON line at a time as columns (see the module docstring). One parser is reused
    for every line (simdjson's buffers are allocated once); not thread-safe: one per upload.

    ``null_as_nan``: a list of numbers and nulls (prime-rl writes null for a non-finite number, and
    a whole row of nulls for a loss term it did not use) comes as float64 with NaN for each null
    instead of as a list; the caller counts the NaNs, which no JSON number can be. ``threads``: the
    compiled reader's (default: two, or one on a one-core machine). ``compiled=False`` reads every
    line with simdjson, as a server built without a C compiler does."""

    def __init__(
        self,
        integer_fields: Collection[str] = (),
        threads: int | None = None,
        compiled: bool = True,
        null_as_nan: bool = False,
    ) -> None:
        self._parser = simdjson.Parser()
        self._ints = frozenset(integer_fields)
        self._null_as_nan = null_as_nan
        self._threads = threads or min(2, os.cpu_count() or 1)
        self._compiled_on = compiled and _numbers is not None

    def read(self, raw: bytes, start: int = 0, stop: int | None = None) -> dict[str, Any] | None:
        """The object of the line ``raw[start:stop]`` (read in place, not copied) with each list of
        numbers as a 1-D array; None when the line is not one JSON object read exactly as the
        generic reader would (the caller falls back)."""
        stop = len(raw) if stop is None else stop
        if self._compiled_on:
            obj = self._compiled(raw, start, stop)
            if obj is not None:
                return obj
        return self._simdjson(raw, start, stop)

    def _compiled(self, raw: bytes, start: int, stop: int) -> dict[str, Any] | None:
        """The line through the compiled reader: its lists (each a flat list of numbers or of
        booleans, read on ``threads`` threads without the GIL) cut out, and what is left -- the
        keys, the scalars, small objects: a few hundred bytes -- read by Python's ``json`` with
        each list as ``[]``. None (simdjson then tries) when a list is anything else, a "[" sits
        in a string, a list is not a top-level value, a key is given twice, or a value is NaN or
        Infinity (which simdjson, and so this reader, leaves to the generic reader)."""
        lists = _numbers.read_lists(raw, start, stop, self._threads)
        if lists is None:
            return None
        pieces, at = [], start
        for open_, close, _, _ in lists:
            pieces.append(raw[at : open_ + 1])
            at = close
        pieces.append(raw[at:stop])
        try:
            pairs = json.loads(b"".join(pieces), object_pairs_hook=_Pairs, parse_constant=_no_constant)
        except (ValueError, RecursionError):
            return None
        if type(pairs) is not _Pairs or len({key for key, _ in pairs}) != len(pairs):
            return None
        out: dict[str, Any] = {}
        values = iter(lists)
        try:
            for key, value in pairs:
                if "[" in key:
                    return None
                if type(value) is list:  # one of the lists cut out (any other list: _Unsure)
                    out[key] = self._array(key, *next(values)[2:])
                else:
                    out[key] = _plain(value)
        except (_Unsure, StopIteration):
            return None
        return out if next(values, None) is None else None

    def _array(self, key: str, kind: int, data: Any) -> np.ndarray:
        if key in self._ints:
            if kind == _numbers.EMPTY:
                return np.empty(0, dtype=np.int64)
            if kind != _numbers.INT:  # not all integers: simdjson's path gives the list
                raise _Unsure
            return np.frombuffer(data, dtype=np.int64)
        if kind == _numbers.EMPTY:
            return np.empty(0, dtype=np.float64)
        if kind == _numbers.BOOL:
            return np.frombuffer(data, dtype=np.bool_)
        if kind == _numbers.NULLS and not self._null_as_nan:
            raise _Unsure
        if kind == _numbers.INT:  # integers in a list of floats, as float(int) reads them
            return np.frombuffer(data, dtype=np.int64).astype(np.float64)
        return np.frombuffer(data, dtype=np.float64)

    def _simdjson(self, raw: bytes, start: int, stop: int) -> dict[str, Any] | None:
        try:
            doc = self._parser.parse(memoryview(raw)[start:stop] if start or stop < len(raw) else raw)
        except (ValueError, RuntimeError):  # not JSON, NaN/Infinity, numbers beyond 64 bits
            return None
        values: list[tuple[str, Any]] = []
        try:
            if not isinstance(doc, simdjson.Object):
                return None
            values = [(key, doc[key]) for key in doc.keys()]
            if len({key for key, _ in values}) != len(values):
                return None
            # simdjson copies the numbers of a nested list into its parent's ([[1, 2], [3]] would
            # read as [1, 2, 3]): only a line whose every "[" opens one of its top-level lists is
            # read here ("[" inside a string, or a list inside an object, also sends it back).
            # Then the i-th "[" of the line opens its i-th list (keys come in the line's order).
            opens = _brackets(raw, start, stop)
            if sum(isinstance(v, simdjson.Array) for _, v in values) != len(opens):
                return None
            at = iter(opens)
            return {
                key: self._list(key, value, raw, next(at), stop)
                if isinstance(value, simdjson.Array)
                else value.as_dict()
                if isinstance(value, simdjson.Object)
                else value
                for key, value in values
            }
        finally:
            del doc, values  # the parser is reused only once nothing refers to its last document

    def _list(self, key: str, value: Any, raw: bytes, at: int, stop: int) -> Any:
        """One top-level list (opening at ``raw[at]``): an array when it holds numbers or
        booleans alone, else the list as JSON gives it."""
        if key in self._ints:
            try:
                return np.frombuffer(value.as_buffer(of_type="i"), dtype=np.int64)
            except TypeError:  # not all integers (or beyond int64)
                return value.as_list()
        try:
            return np.frombuffer(value.as_buffer(of_type="d"), dtype=np.float64)
        except TypeError:  # booleans, nulls, strings, nested values
            flags = _booleans(raw, at, stop, len(value))
            if flags is not None:
                return flags
            items = value.as_list()
            arr = _with_nulls(items) if self._null_as_nan else None
            return items if arr is None else arr


class _Pairs(list):  # type: ignore[type-arg]
    """A JSON object as its (key, value) pairs, in order (json's ``object_pairs_hook``)."""


class _Unsure(Exception):
    """The compiled path cannot vouch for a line; simdjson's path reads it."""


def _no_constant(name: str) -> Any:
    raise ValueError(name)


def _plain(value: Any) -> Any:
    """A scalar or object of a line's skeleton as the generic reader gives it (objects as dicts,
    the last of a repeated key winning); _Unsure when it holds a list or a "[" in a string, where
    a list cut out of the line may have been."""
    if type(value) is _Pairs:
        return {_plain(k): _plain(v) for k, v in value}
    if type(value) is list or (type(value) is str and "[" in value):
        raise _Unsure
    return value


def _with_nulls(items: list[Any]) -> np.ndarray | None:
    """A list of numbers and nulls as float64 with NaN for each null (``null_as_nan``); None for
    any other list."""
    if not all(v is None or type(v) is int or type(v) is float for v in items):
        return None
    return np.array([math.nan if v is None else v for v in items], dtype=np.float64)


def _brackets(raw: bytes, start: int, stop: int) -> list[int]:
    """Where the "[" of ``raw[start:stop]`` are: one ``find`` (memchr) per bracket, ~40x faster
    than ``bytes.count`` on a line of a few brackets and megabytes of numbers."""
    out, at = [], raw.find(b"[", start, stop)
    while at >= 0:
        out.append(at)
        at = raw.find(b"[", at + 1, stop)
    return out


# true -> 1 and false -> 0 by their first letters; the other letters of true/false, commas and
# whitespace deleted. Anything else (null, a digit, a quote) stays as a byte above 1.
_FIRST_LETTERS = bytes.maketrans(b"tf", b"\x01\x00")
_DROPPED = b"rueals, \t\r\n"


def _booleans(raw: bytes, at: int, stop: int, n: int) -> np.ndarray | None:
    """The list that opens at ``raw[at]`` as a bool array read from its text, when it is ``n``
    entries of true/false alone (a loss mask, prime-rl's ``is_masked``): 3-4x faster than
    simdjson's list of Python bools typed again. None otherwise (a null, a number, a string): the
    caller takes the list. The line is valid JSON with no list inside a list, so the list ends at
    the next "]" unless a string holds one (whose quotes then stay); with the letters of true/false
    other than their first, the commas and the whitespace deleted, a list of booleans alone leaves
    exactly one byte per entry, 1 for true and 0 for false."""
    end = raw.find(b"]", at, stop)
    if end < 0:
        return None
    first = raw[at + 1 : end].translate(_FIRST_LETTERS, _DROPPED)
    if len(first) != n or first.translate(None, b"\x00\x01"):
        return None
    return np.frombuffer(first, dtype=np.bool_)
