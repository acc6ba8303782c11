"""Native format: JSON or JSONL, one episode object per line/element (see app/core/schemas.py EpisodeIn;
JSON Schema at GET /api/schema/episode)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

from pydantic import ValidationError

from app.core.schemas import EpisodeIn
from app.ingest._common import (
    Parsed,
    Record,
    looks_like_jsonl,
    read_records,
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


def iter_parse(data: bytes, filename: str | None = None) -> Iterator[tuple[int | None, EpisodeIn]]:
    """Lazy ``(line, episode)`` pairs."""
    if looks_like_jsonl(data):
        # Fast path: pydantic parses and validates each line in one pass (no intermediate dicts),
        # reading lines lazily from the buffer.
        n = 0
        for line, raw in enumerate(io.BytesIO(data), start=1):
            if not raw.strip():
                continue
            n += 1
            try:
                yield line, EpisodeIn.model_validate_json(raw)
            except ValidationError as e:
                raise validation_error(e, Record(line, n, None)) from None
        return
    for rec in read_records(data):
        yield rec.line, validate_native(rec.obj, rec)


def parse(data: bytes, filename: str | None = None) -> Parsed:
    out = Parsed(NAME)
    for line, ep in iter_parse(data, filename):
        out.episodes.append(ep)
        out.lines.append(line)
    return out
