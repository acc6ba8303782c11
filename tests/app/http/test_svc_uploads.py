"""Uploads: all-or-nothing storage, the one error shape naming line/episode/field, size limits,
round trips, delete tokens and the write token."""

from __future__ import annotations

import json

import pytest

from tests.app.svc_helpers import episode, jsonl, make_client, row_counts, upload


def assert_error(r, status, code, line=None, episode=None, field=None):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"status", "code", "message", "line", "episode", "field"}
    assert (err["status"], err["code"], err["line"], err["episode"], err["field"]) == (
        status,
        code,
        line,
        episode,
        field,
    )
    assert err["message"]
    return err


def test_native_round_trip_is_exact(client):
    eps = [
        episode(reward=1.0, values=[0.0, 0.0, 0.1, 0.2, 1 / 3], logprobs=[0, 0, -0.5, -1e-9, -2.25]),
        episode(
            reward=0.0,
            rewards=[0, 0, -0.05, 0, 0],
            turn_ids=[-1, -1, 0, 0, 1],
            meta={"task": "t", "x": [1, 2]},
        ),
    ]
    r = upload(client, eps)
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["batch_id"] >= 1 and len(body["episodes"]) == 2 and body["delete_token"]
    for sent, created in zip(eps, body["episodes"], strict=True):
        assert created["url"] == f"/e/{created['slug']}"
        got = client.get(f"/api/episodes/{created['slug']}").json()
        for k, v in sent.items():
            if k != "meta":
                assert got[k] == v, k  # float64 storage: 1/3 and -1e-9 come back bit-exact
        assert got["meta"]["task"] == sent["meta"]["task"] if "meta" in sent else True
        assert got["slug"] == created["slug"] and got["batch_id"] == body["batch_id"]
    assert row_counts(client) == (1, 2)


def test_json_body_and_raw_body_uploads(client):
    r = client.post("/api/uploads", json=[episode(), episode(reward=0.0)])
    assert r.status_code == 201 and len(r.json()["episodes"]) == 2
    r = client.post("/api/uploads", json={"episodes": [episode()]})
    assert r.status_code == 201 and len(r.json()["episodes"]) == 1
    r = client.post(
        "/api/uploads?name=raw&format=native",
        content=jsonl([episode()]).encode(),
        headers={"content-type": "application/octet-stream"},
    )
    assert r.status_code == 201
    assert client.get(f"/api/batches/{r.json()['batch_id']}").json()["name"] == "raw"


def test_slugs_are_long_random_and_not_sequential(client):
    slugs = [e["slug"] for e in upload(client, [episode() for _ in range(20)]).json()["episodes"]]
    assert len(set(slugs)) == 20
    # token_urlsafe(18): 24 URL-safe characters = 144 random bits >= 128.
    assert all(len(s) == 24 and all(c.isalnum() or c in "-_" for c in s) for s in slugs)


@pytest.mark.parametrize(
    "bad, code, field",
    [
        ({"values": [0.0] * 4}, "length_mismatch", "values"),
        ({"kinds": ["prompt", "prompt", "policy", "assistant", "policy"]}, "unknown_kind", "kinds"),
        ({"kinds": ["prompt"] * 5}, "empty_policy_span", "kinds"),
        ({"tokens": ["a", "b", 3, "d", "e"]}, "wrong_type", "tokens"),
        ({"reward": "high"}, "wrong_type", "reward"),
        ({"colour": "red"}, "unknown_field", "colour"),
        ({"turn_ids": [-1, -1, 0, 0, 99]}, "bad_turn_ids", "turn_ids"),
        ({"meta": {"turn_values": [0.5, 0.4]}}, "bad_meta", "meta.turn_values"),  # 2 values, 1 turn
        ({"meta": {"uploaded_advantages": [1.0]}}, "bad_meta", "meta.uploaded_advantages"),
    ],
)
def test_bad_episode_names_line_episode_field_and_stores_nothing(client, bad, code, field):
    upload(client, [episode()])  # something already stored must stay as it was
    before = row_counts(client)
    eps = [episode(), episode(), episode(**bad)]
    r = upload(client, eps)
    err = assert_error(r, 422, code, line=3, episode=3, field=field)
    assert err["message"].startswith("line 3, episode 3: ")
    assert row_counts(client) == before


def test_length_mismatch_message_is_actionable(client):
    r = upload(client, [episode(), episode(values=[0.0] * 4)])
    err = assert_error(r, 422, "length_mismatch", line=2, episode=2, field="values")
    assert err["message"] == (
        "line 2, episode 2: field `values` has 4 entries but `tokens` has 5; "
        "every per-token field needs one entry per token."
    )


def test_nan_and_inf_are_refused(client):
    # JSON has no NaN; Python's json writes it anyway and some tools do the same.
    text = jsonl([episode()]) + json.dumps(episode(values=[0, 0, 0.1, float("nan"), 0.2])) + "\n"
    r = client.post("/api/uploads", files={"file": ("x.jsonl", text)})
    err = assert_error(r, 422, "not_finite", line=2, episode=2, field="values")
    assert "token 3" in err["message"]
    text = json.dumps(episode(reward=float("inf"))) + "\n" + jsonl([episode()])
    assert_error(
        client.post("/api/uploads", files={"file": ("x.jsonl", text)}), 422, "not_finite", 1, 1, "reward"
    )
    assert row_counts(client) == (0, 0)


def test_bad_json_names_its_line(client):
    text = jsonl([episode(), episode()]) + '{"tokens": ["a"], "kinds": ["policy"\n'
    err = assert_error(
        client.post("/api/uploads", files={"file": ("x.jsonl", text)}), 422, "bad_json", line=3, episode=3
    )
    assert "not valid JSON" in err["message"]
    # A pretty-printed JSON document with a syntax error on its 4th line.
    doc = '[\n  {"tokens": ["a"],\n   "kinds": ["policy"]},\n  {"tokens": ["b"] "kinds": ["policy"]}\n]'
    assert_error(client.post("/api/uploads", files={"file": ("x.json", doc)}), 422, "bad_json", line=4)
    assert row_counts(client) == (0, 0)


def test_unknown_format_and_empty_upload(client):
    assert_error(client.post("/api/uploads", files={"file": ("x.jsonl", "")}), 422, "empty_upload")
    r = client.post("/api/uploads", files={"file": ("x.jsonl", '{"foo": 1}\n{"foo": 2}\n')})
    err = assert_error(r, 422, "unknown_format", line=1, episode=1)
    assert "foo" in err["message"] and "native" in err["message"]
    r = upload(client, [episode()], format="parquet")
    assert_error(r, 422, "unknown_format", field="format")


def test_size_limits_answer_413(db_url):
    with make_client(
        db_url, max_upload_bytes=2000, max_tokens_per_episode=10, max_episodes_per_upload=3
    ) as c:
        big = jsonl([episode(n_prompt=2, n_policy=50)])
        err = assert_error(c.post("/api/uploads", files={"file": ("x.jsonl", big * 3)}), 413, "too_large")
        assert "2000 bytes" in err["message"]
        err = assert_error(
            upload(c, [episode(), episode(n_policy=9)]), 413, "too_many_tokens", 2, 2, "tokens"
        )
        assert "11 tokens" in err["message"] and "10 tokens per episode" in err["message"]
        err = assert_error(upload(c, [episode() for _ in range(4)]), 413, "too_many_episodes")
        assert "4 episodes" in err["message"] and "3 per upload" in err["message"]
        assert row_counts(c) == (0, 0)


def test_delete_needs_the_token_returned_once(client):
    body = upload(client, [episode(), episode()]).json()
    slug = body["episodes"][0]["slug"]
    assert_error(client.delete(f"/api/episodes/{slug}"), 403, "bad_delete_token")
    assert_error(client.delete(f"/api/episodes/{slug}", params={"token": "nope"}), 403, "bad_delete_token")
    assert (
        client.delete(f"/api/episodes/{slug}", headers={"X-Delete-Token": body["delete_token"]}).status_code
        == 204
    )
    assert_error(client.get(f"/api/episodes/{slug}"), 404, "not_found")
    assert row_counts(client) == (1, 1)
    # Only a hash is stored.
    from sqlalchemy import text

    with client.app.state.engine.connect() as conn:
        stored = conn.execute(text("SELECT delete_token_hash FROM batch")).scalar_one()
    assert body["delete_token"] not in stored and len(stored) == 64
    r = client.delete(f"/api/batches/{body['batch_id']}", params={"token": body["delete_token"]})
    assert r.status_code == 204 and row_counts(client) == (0, 0)


def test_write_token_is_enforced_when_set(db_url):
    with make_client(db_url, write_token="s3cret") as c:
        assert_error(upload(c, [episode()]), 401, "unauthorized")
        r = c.post(
            "/api/uploads",
            files={"file": ("x.jsonl", jsonl([episode()]))},
            headers={"Authorization": "Bearer wrong"},
        )
        assert_error(r, 403, "forbidden")
        r = c.post(
            "/api/uploads",
            files={"file": ("x.jsonl", jsonl([episode()]))},
            headers={"Authorization": "Bearer s3cret"},
        )
        assert r.status_code == 201
        slug, tok = r.json()["episodes"][0]["slug"], r.json()["delete_token"]
        assert_error(c.delete(f"/api/episodes/{slug}", params={"token": tok}), 401, "unauthorized")
        assert c.get(f"/api/episodes/{slug}").status_code == 200  # reads stay open


def test_storage_is_one_compact_row_per_episode(client):
    slug = upload(client, [episode(n_policy=1000, values=[0.5] * 1002)]).json()["episodes"][0]["slug"]
    from sqlalchemy import text

    with client.app.state.engine.connect() as conn:
        n = conn.execute(text("SELECT COUNT(*) FROM episode")).scalar_one()
        kinds_len, values_len = conn.execute(
            text('SELECT LENGTH(kinds), LENGTH("values") FROM episode')
        ).one()
    # Packed (app/core/packing.py): two runs of kinds; one value repeated, stored once as a float32.
    assert n == 1 and kinds_len < 40 and values_len == 12 + 4 + 3
    assert client.get(f"/api/episodes/{slug}").json()["values"] == [0.5] * 1002


def test_nul_in_group_label_is_refused_and_nul_in_names_dropped(client):
    """PostgreSQL text cannot hold NUL: a NUL group is a 422 naming the field; a NUL in the batch
    name or task is dropped from those columns (meta keeps the exact task)."""
    bad = episode(group="a\x00b")
    r = client.post("/api/uploads?format=native", content=jsonl([bad]))
    assert r.status_code == 422
    err = r.json()["error"]
    # Lines and episodes are 1-based (app/core/errors.py): the only episode, on the only line.
    assert (err["field"], err["episode"], err["line"]) == ("group", 1, 1), err
    assert "NUL" in err["message"] and err["message"].startswith("line 1, episode 1:"), err
    ok = episode(group="g", meta={"task": "t\x00ask"})
    r = client.post("/api/uploads?format=native&name=na%00me", content=jsonl([ok]))
    assert r.status_code == 201, r.text
    batch = client.get(f"/api/batches/{r.json()['batch_id']}").json()
    assert batch["name"] == "name"
    slug = r.json()["episodes"][0]["slug"]
    assert client.get(f"/api/episodes/{slug}").json()["meta"]["task"] == "t\x00ask"
