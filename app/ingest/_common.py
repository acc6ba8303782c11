"""Shared pieces for the upload formats: the parse result, JSON/JSONL record reading with line
numbers, and pydantic-error translation into the one error shape."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import ValidationError

from app.core.errors import ApiError, located
from app.core.schemas import EpisodeIn
from app.core.validate import check_finite, check_finite_scalar, length_mismatch

try:
    import orjson

    _loads: Callable[[bytes | str], Any] = orjson.loads
except ImportError:  # pragma: no cover
    _loads = json.loads


def loads(raw: bytes | str) -> Any:
    """orjson speed; the stdlib parser for what orjson refuses but Python tools write (NaN,
    Infinity), so those reach validation and get a `not_finite` error naming the field."""
    try:
        return _loads(raw)
    except ValueError:
        try:
            return json.loads(raw)
        except RecursionError:  # e.g. 10,000 nested arrays: a 4xx, not a crash
            raise ValueError(_TOO_DEEP) from None


_TOO_DEEP = "the JSON nests too deeply (recursion limit exceeded)"


@dataclass
class Parsed:
    """What every format's ``parse`` returns: native episodes and the file line of each (or None)."""

    format: str
    episodes: list[EpisodeIn] = field(default_factory=list)
    lines: list[int | None] = field(default_factory=list)


@dataclass
class Record:
    """One JSON object of an upload with its 1-based line (JSONL) and episode index."""

    line: int | None
    episode: int
    obj: Any

    @property
    def where(self) -> dict:
        return {"line": self.line, "episode": self.episode}

    def error(self, code: str, message: str, field: str | None = None, status: int = 422) -> ApiError:
        """An ApiError about this record (the message starts "line 3, episode 2: ")."""
        return located(status, code, message, field=field, **self.where)


def _bad_json(line: int | None, err: Exception | str) -> ApiError:
    return located(
        422,
        "bad_json",
        f"this is not valid JSON ({err}). Upload JSONL (one JSON object per line) or one JSON document.",
        line=line,
    )


def split_lines(data: bytes) -> list[tuple[int, bytes]]:
    """Non-blank lines with their 1-based numbers."""
    out = []
    for i, raw in enumerate(data.split(b"\n"), start=1):
        s = raw.strip()
        if s:
            out.append((i, s))
    return out


def head_lines(data: bytes, k: int, limit: int) -> list[tuple[int, bytes]]:
    """The first ``k`` non-blank lines (as :func:`split_lines`) of the first ``limit`` bytes,
    found without splitting the rest."""
    view = data[:limit] if len(data) > limit else data
    out: list[tuple[int, bytes]] = []
    start, number = 0, 1
    while len(out) < k and start < len(view):
        end = view.find(b"\n", start)
        if end < 0:
            end = len(view)
        line = view[start:end].strip()
        if line:
            out.append((number, line))
        start, number = end + 1, number + 1
    return out


def looks_like_jsonl(data: bytes) -> bool:
    """True when the first non-blank line is a complete JSON value on its own (JSONL), or the
    document is a single line."""
    lines = head_lines(data, 2, 1 << 20)
    if len(lines) <= 1:
        return False
    first = lines[0][1]
    if first in (b"[", b"{"):
        return False
    try:
        loads(first)
        return True
    except ValueError:
        # A truncated first line in the 1 MiB prefix: decide on its first character.
        return first.startswith(b"{") and len(data) > (1 << 20)


def read_records(data: bytes) -> list[Record]:
    """JSON (one object, a list of objects, or ``{"episodes": [...]}``) or JSONL -> records.

    Bad JSON raises ApiError 422 ``bad_json`` naming the line."""
    if not data.strip():
        raise ApiError(422, "empty_upload", "the upload is empty.")
    if looks_like_jsonl(data):
        out = []
        for n, (line, raw) in enumerate(split_lines(data), start=1):
            try:
                out.append(Record(line, n, loads(raw)))
            except ValueError as e:
                raise _bad_json(line, e) from None
        return out
    found, doc = _recall(data)
    try:
        if not found:
            doc = _loads(data)
    except ValueError:
        try:  # the stdlib parser reports the line of the error
            doc = json.loads(data)
        except json.JSONDecodeError as e:
            raise _bad_json(e.lineno, e.msg + f" at column {e.colno}") from None
        except RecursionError:
            raise _bad_json(None, _TOO_DEEP) from None
        except ValueError as e:
            raise _bad_json(None, e) from None
    if isinstance(doc, dict) and isinstance(doc.get("episodes"), list):
        doc = doc["episodes"]
    if isinstance(doc, list):
        return [Record(None, i, obj) for i, obj in enumerate(doc, start=1)]
    return [Record(1, 1, doc)]


def parse_records(name: str, data: bytes, episode_from_record: Callable[[Record], EpisodeIn]) -> Parsed:
    """A JSONL/JSON format whose records map one-to-one onto episodes: read, convert, keep lines."""
    out = Parsed(name)
    for rec in read_records(data):
        out.episodes.append(episode_from_record(rec))
        out.lines.append(rec.line)
    return out


def first_object(data: bytes) -> Any:
    """The first record of a JSON/JSONL upload without parsing the rest (for format detection), or None.

    JSONL: the first line. A JSON array: its first element, parsed from a prefix of the file. A
    single JSON document (one object, ``{"episodes": [...]}``) is the first record itself: it is
    parsed once, and :func:`read_records` takes that parse instead of parsing the file again."""
    try:
        if looks_like_jsonl(data):
            return loads(head_lines(data, 1, 1 << 22)[0][1])
        found, first = _first_of_array(data)
        if found:
            return first
        doc = loads(data)
    except (ValueError, IndexError):
        return None
    _remember(data, doc)
    if isinstance(doc, dict) and isinstance(doc.get("episodes"), list):
        doc = doc["episodes"]
    if isinstance(doc, list):
        return doc[0] if doc else None
    return doc


_DECODER = json.JSONDecoder()


def _first_of_array(data: bytes) -> tuple[bool, Any]:
    """(True, first element) of a JSON array, parsed from a prefix of ``data`` (1 MiB, then 16 MiB,
    then all of it: only the first element is ever parsed), (True, None) for an empty array;
    (False, None) when ``data`` is not an array or its first element is not valid JSON (the
    caller's whole-document parse then reports where)."""
    head = data[:64].lstrip()
    if not head.startswith(b"["):
        return False, None
    for size in (1 << 20, 1 << 24, len(data)):
        text = data[:size].decode("utf-8", errors="ignore")
        i = text.index("[") + 1
        while i < len(text) and text[i].isspace():
            i += 1
        if text[i : i + 1] == "]":
            return True, None
        try:
            return True, _DECODER.raw_decode(text, i)[0]  # parses the first element only
        except RecursionError:  # nested too deeply: the whole-document parse reports it
            break
        except ValueError:
            if size >= len(data):
                break
            # the first element runs past this prefix
    return False, None


# The documents first_object parsed, by id of the upload's bytes (the bytes kept, compared with
# `is`, so an id reused after garbage collection never matches): read_records takes its parse.
_DOCS: dict[int, tuple[bytes, Any]] = {}
_DOCS_LOCK = threading.Lock()
_DOCS_MAX = 4


def _remember(data: bytes, doc: Any) -> None:
    with _DOCS_LOCK:
        while len(_DOCS) >= _DOCS_MAX:
            _DOCS.pop(next(iter(_DOCS)))
        _DOCS[id(data)] = (data, doc)


def forget_document(data: bytes) -> None:
    """Drop the parse :func:`first_object` kept for ``data`` (nothing will read it)."""
    _recall(data)


def _recall(data: bytes) -> tuple[bool, Any]:
    with _DOCS_LOCK:
        hit = _DOCS.get(id(data))
        if hit is not None and hit[0] is data:
            del _DOCS[id(data)]
            return True, hit[1]
    return False, None


def validation_error(exc: ValidationError, rec: Record, model: str = "native") -> ApiError:
    """Translate the first pydantic error into the one error shape, naming field and entry."""
    err = exc.errors()[0]
    loc = tuple(err.get("loc", ()))
    typ = err.get("type", "")
    top = str(loc[0]) if loc else None
    idx = loc[1] if len(loc) > 1 and isinstance(loc[1], int) else None
    entry = f" entry {idx}" if idx is not None else ""
    got = err.get("input")
    got_s = repr(got) if not isinstance(got, (dict, list)) else type(got).__name__
    if typ == "json_invalid":
        return rec.error("bad_json", f"this is not valid JSON ({err.get('msg')}).")
    if typ == "missing":
        return rec.error("missing_field", f"required field `{top}` is missing.", field=top)
    if typ == "extra_forbidden":
        return rec.error(
            "unknown_field",
            f"field `{top}` is not part of the {model} format; known fields: "
            + ", ".join(EpisodeIn.model_fields)
            + ". Put extra information under `meta`.",
            field=top,
        )
    if typ == "literal_error" and top == "kinds":
        return rec.error(
            "unknown_kind",
            f'field `kinds`{entry} is {got_s}; each kind must be "prompt", "policy" or "tool".',
            field="kinds",
        )
    return rec.error("wrong_type", f"field `{top}`{entry} is {got_s}: {err.get('msg')}.", field=top)


def validate_native(obj: Any, rec: Record) -> EpisodeIn:
    if not isinstance(obj, dict):
        raise rec.error("wrong_type", f"expected a JSON object per episode, got {type(obj).__name__}.")
    try:
        return EpisodeIn.model_validate(obj)
    except ValidationError as e:
        raise validation_error(e, rec) from None


def short_hash(text: str) -> str:
    """A stable 12-hex-digit label (used as the group of attempts that share a prompt)."""
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def as_float(value: Any, rec: Record, name: str) -> float | None:
    """A finite float, or None; ApiError naming the field otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise rec.error("wrong_type", f"field `{name}` is {value!r}; expected a number.", field=name)
    check_finite_scalar(value, name, rec.where)
    return float(value)


def float_list(
    value: Any, rec: Record, name: str, n: int | None = None, ref: str | None = None
) -> list[float] | None:
    """A list of numbers with (optionally) the same length ``n`` as field ``ref``; None stays None."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise rec.error(
            "wrong_type", f"field `{name}` is {type(value).__name__}; expected a list of numbers.", field=name
        )
    if n is not None and len(value) != n:
        raise length_mismatch(name, len(value), n, rec.where, ref or "tokens")
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise rec.error(
                "wrong_type", f"field `{name}` entry {i} is {v!r}; expected a number.", field=name
            )
    out = [float(v) for v in value]
    check_finite(np.asarray(out), name, rec.where)
    return out


def scalar_meta(obj: dict, skip: set[str]) -> dict:
    """The record's other scalar fields (str, number, bool), kept as episode meta."""
    return {k: v for k, v in obj.items() if k not in skip and isinstance(v, (str, int, float, bool))}


def mask_kinds(mask: list[int] | list[bool]) -> list[str]:
    """Kinds from a 1 = trained-token mask: 1 -> policy; 0 before the first policy token -> prompt;
    0 after it -> tool (the observation spans of a multi-turn rollout)."""
    kinds = []
    seen = False
    for m in mask:
        if m:
            seen = True
            kinds.append("policy")
        else:
            kinds.append("tool" if seen else "prompt")
    return kinds


def id_token(i: int, vocab: Any = None) -> str:
    """The display string of token id ``i``: the vocab entry when a vocab is given, else ⟨i⟩."""
    if vocab is not None:
        try:
            return str(vocab[i])
        except (IndexError, KeyError, TypeError):
            pass
    return f"⟨{i}⟩"
