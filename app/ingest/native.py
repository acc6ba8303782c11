"""Native format: JSON or JSONL, one episode object per line/element (see app/schemas.py EpisodeIn;
JSON Schema at GET /api/schema/episode)."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from ..schemas import EpisodeIn
from ._common import (
    Parsed,
    Record,
    looks_like_jsonl,
    read_records,
    split_lines,
    validate_native,
    validation_error,
)

NAME = "native"
DESCRIPTION = (
    "creditlens native JSON/JSONL: tokens, kinds, reward/rewards, values, logprobs, turn_ids, group, meta"
)
PRIORITY = 10


def sniff(data: bytes, first: Any) -> bool:
    return isinstance(first, dict) and "tokens" in first and "kinds" in first


def parse(data: bytes, filename: str | None = None) -> Parsed:
    out = Parsed(NAME)
    if looks_like_jsonl(data):
        # Fast path: pydantic parses and validates each line in one pass (no intermediate dicts).
        for n, (line, raw) in enumerate(split_lines(data), start=1):
            try:
                ep = EpisodeIn.model_validate_json(raw)
            except ValidationError as e:
                raise validation_error(e, Record(line, n, None)) from None
            out.episodes.append(ep)
            out.lines.append(line)
        return out
    for rec in read_records(data):
        out.episodes.append(validate_native(rec.obj, rec))
        out.lines.append(rec.line)
    return out
