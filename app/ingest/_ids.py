"""Token ids shown as tokens: the pieces of the upload's tokenizer.json, else ``⟨id⟩``. Shared by
the formats that read trainers' token dumps (prime-rl, SkyRL, miles, verifiers traces)."""

from __future__ import annotations

from typing import Any

import numpy as np

from app.ingest._common import id_token
from app.ingest._tokenizer import TokenDecoder


def shown_tokens(ids: list[int], tokenizer: TokenDecoder | None, meta: dict[str, Any]) -> list[str]:
    """The display strings of ``ids``; with a tokenizer its special tokens go to
    ``meta["special_tokens"]``."""
    if tokenizer is None:
        return [id_token(i) for i in ids]
    tokens, special = tokenizer.row(np.asarray(ids, dtype=np.int64))
    if special:
        meta["special_tokens"] = special
    return tokens
