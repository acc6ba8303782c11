"""A gzip upload is inflated before any format looks at it (app/ingest/__init__.py ``_opened``):
a gzipped file of any format opens as that format with the same episodes as the plain file, a
mapping reads through it, and a damaged gzip is a 422 with nothing stored."""

from __future__ import annotations

import gzip
import json

from app.ingest import detect
from tests.app.ingest.fmt_helpers import example, refused, stored


def test_a_gzipped_file_opens_as_its_own_format(client):
    for name, fmt in (("native.jsonl", "native"), ("verl_rollout.jsonl", "verl_rollout")):
        raw = example(name)
        packed = gzip.compress(raw, mtime=0)
        assert detect(packed) == detect(raw) == fmt
        plain_batch, plain = stored(client, name, raw)
        batch, eps = stored(client, name + ".gz", packed)
        assert batch["source"] == plain_batch["source"] == f"upload:{fmt}"
        assert [e["tokens"] for e in eps] == [e["tokens"] for e in plain]
        assert [e["reward"] for e in eps] == [e["reward"] for e in plain]


def test_a_mapping_reads_a_gzipped_file(client):
    rows = [{"ask": "2+2?", "said": s, "ok": r} for s, r in (("4", 1.0), ("5", 0.0))]
    packed = gzip.compress("".join(json.dumps(x) + "\n" for x in rows).encode(), mtime=0)
    mapping = json.dumps({"prompt": "ask", "response": "said", "reward": "ok"})
    _, eps = stored(client, "odd.jsonl.gz", packed, mapping=mapping)
    assert [e["reward"] for e in eps] == [1.0, 0.0]


def test_a_damaged_gzip_is_refused(client):
    packed = gzip.compress(example("native.jsonl"), mtime=0)
    err = refused(client, "cut.jsonl.gz", packed[: len(packed) // 2])
    assert err["code"] == "damaged_file" and "gzip" in err["message"]
