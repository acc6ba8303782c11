"""The native format (app/ingest/native.py): fixtures/formats/native.jsonl (written by
fixtures/formats/make_examples.py from the schema in app/core/schemas.py) is auto-detected, stored
and read back field for field; a JSON array and ``{"episodes": [...]}`` hold the same episodes;
a bad field is a 422 naming line, episode and field, with nothing stored."""

from __future__ import annotations

import json

from tests.app.ingest.fmt_helpers import example, lines, refused, stored

KEYS = ("tokens", "kinds", "reward", "values", "turn_ids", "group", "truncated", "bootstrap_value")


def test_native(client):
    batch, eps = stored(client, "native.jsonl", example("native.jsonl"))
    assert batch["source"] == "upload:native"
    for sent, got in zip(lines("native.jsonl"), eps, strict=True):
        for k in KEYS:
            assert got[k] == sent.get(k, {"truncated": False}.get(k)), k
        assert got["meta"]["calls"] == sent["meta"]["calls"]


def test_json_array_and_episodes_object_hold_the_same_episodes(client):
    sent = lines("native.jsonl")
    for body in (json.dumps(sent), json.dumps({"episodes": sent})):
        _, eps = stored(client, "native.json", body)
        assert [e["tokens"] for e in eps] == [s["tokens"] for s in sent]
        assert [e["reward"] for e in eps] == [s.get("reward") for s in sent]


def test_a_bad_kind_names_line_episode_and_field(client):
    sent = lines("native.jsonl")
    sent[1]["kinds"][0] = "user"
    err = refused(client, "bad.jsonl", "".join(json.dumps(s) + "\n" for s in sent))
    assert (err["code"], err["line"], err["episode"], err["field"]) == ("unknown_kind", 2, 2, "kinds")
