"""Native format: JSON or JSONL, one episode object per line/element (see app/core/schemas.py EpisodeIn;
JSON Schema at GET /api/schema/episode)."""

from __future__ import annotations

import io
from collections.abc import Iterator

from pydantic import ValidationError

from app.core.schemas import EpisodeIn
from app.ingest._common import Record, looks_like_jsonl, validate_native, validation_error
from app.ingest._document import Document
from app.ingest._registry import Pair, register_format


def sniff(doc: Document) -> bool:
    first = doc.first
    return isinstance(first, dict) and "tokens" in first and "kinds" in first


def episodes(doc: Document) -> Iterator[Pair]:
    """Lazy ``(line, episode)`` pairs."""
    if looks_like_jsonl(doc.data):
        # Fast path: pydantic parses and validates each line in one pass (no intermediate dicts),
        # reading lines lazily from the buffer.
        n = 0
        for line, raw in enumerate(io.BytesIO(doc.data), start=1):
            if not raw.strip():
                continue
            n += 1
            try:
                yield line, EpisodeIn.model_validate_json(raw)
            except ValidationError as e:
                raise validation_error(e, Record(line, n, None)) from None
        return
    for rec in doc.records():
        yield rec.line, validate_native(rec.obj, rec)


register_format(
    name="native",
    description=(
        "creditlens native JSON/JSONL: tokens, kinds, reward/rewards, values, logprobs, turn_ids, group, meta"
    ),
    priority=10,
    sniff=sniff,
    episodes=episodes,
)
