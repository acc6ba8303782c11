"""Shared pieces for the upload formats: the parse result, records with their line numbers, numbers
and lists checked field by field, and pydantic-error translation into the one error shape."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import ValidationError

from app.core.errors import ApiError
from app.core.schemas import EpisodeIn, Kind
from app.core.validate import check_finite, check_finite_scalar, length_mismatch

# The JSON reading lives with the document it reads (app/ingest/_document.py); the formats import
# it from here with the other shared pieces.
from app.ingest._document import (
    TOO_DEEP,
    Document,
    Record,
    bad_json,
    head_lines,
    loads,
    looks_like_jsonl,
    strict_loads,
)

__all__ = [
    "TOO_DEEP",
    "Parsed",
    "Record",
    "as_float",
    "bad_json",
    "float_list",
    "head_lines",
    "id_token",
    "loads",
    "looks_like_jsonl",
    "mask_kinds",
    "read_records",
    "scalar_meta",
    "short_hash",
    "strict_loads",
    "sub_object",
    "validate_native",
    "validation_error",
]


@dataclass
class Parsed:
    """What :func:`app.ingest.parse_upload` returns: native episodes and the file line of each (or None)."""

    format: str
    episodes: list[EpisodeIn] = field(default_factory=list)
    lines: list[int | None] = field(default_factory=list)


def read_records(data: bytes) -> list[Record]:
    """Every record of a JSON/JSONL upload (the formats stream them with ``Document.records``)."""
    return list(Document.of(data).records())


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


def short_hash(text: str | bytes) -> str:
    """A stable 12-hex-digit label (used as the group of attempts that share a prompt)."""
    return hashlib.sha1(text.encode() if isinstance(text, str) else text).hexdigest()[:12]


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


def sub_object(obj: dict[str, Any], key: str) -> dict[str, Any]:
    """``obj[key]`` when it is an object, else an empty one (an optional nested object)."""
    value = obj.get(key)
    return value if isinstance(value, dict) else {}


def scalar_meta(obj: dict[str, Any], skip: set[str]) -> dict[str, Any]:
    """The record's other scalar fields (str, number, bool), kept as episode meta."""
    return {k: v for k, v in obj.items() if k not in skip and isinstance(v, (str, int, float, bool))}


def mask_kinds(mask: list[int] | list[bool]) -> list[Kind]:
    """Kinds from a 1 = trained-token mask: 1 -> policy; 0 before the first policy token -> prompt;
    0 after it -> tool (the observation spans of a multi-turn rollout)."""
    kinds: list[Kind] = []
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
