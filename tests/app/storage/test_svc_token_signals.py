"""``meta.token_signals`` is stored packed in ``episode.token_signals`` (migration 0014,
app/core/token_signals.py), and every answer reads what the JSON gave before: the real app on a
real SQLite file and on PostgreSQL, real uploads of the format examples.

The expected values are computed from the example files themselves, by the rule each format
documents: prime-rl's token export (fixtures/formats/prime_rl_tokens/, written as prime-rl's
trainer writes them) keeps every per-token list that is not a native field in
``meta.token_signals``, booleans as 0/1, null where the trainer wrote null, and leaves out a list
that is all null; Atropos (fixtures/formats/atropos/groups.jsonl, group 2 with per-token
``token_scores`` / ``token_weights`` as in atropos' rubiks_cube_environment) keeps those two as
float lists.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from sqlalchemy import text

from app.core import token_signals as ts
from app.core.arrays import json_dumps
from tests.app.ingest.fmt_helpers import example, lines, stored
from tests.app.svc_helpers import episode, upload

# prime-rl's fields that are native columns or not per-token numbers (app/ingest/prime_rl_tokens.py).
PRIME_RL_OWN = {"token_ids", "loss_mask", "position_ids", "rewards", "losses", "advantages"}
PRIME_RL_OWN |= {"trainer_logprobs", "inference_logprobs", "entropy"}


def prime_rl_expected(obj: dict) -> dict:
    """meta.token_signals of one prime-rl export line, by the format's documented rule: a list of
    booleans stays booleans, other numbers are floats, null stays null."""
    return {
        k: v if all(type(x) is bool for x in v) else [None if x is None else float(x) for x in v]
        for k, v in obj.items()
        if isinstance(v, list) and k not in PRIME_RL_OWN and any(x is not None for x in v)
    }


def stored_row(client, slug: str) -> tuple[str, bytes | None]:
    """(meta_json, token_signals) of the stored row, straight from the database."""
    with client.app.state.engine.connect() as conn:
        meta_json, blob = conn.execute(
            text("SELECT meta_json, token_signals FROM episode WHERE slug = :s"), {"s": slug}
        ).one()
    return meta_json, None if blob is None else bytes(blob)


def answers(client, slug: str) -> dict:
    """Every answer that carries the episode's meta or its signal rows, as JSON text."""
    adv = client.get(f"/api/episodes/{slug}/advantages", params={"critic": "zero"}).json()
    return {
        "episode": client.get(f"/api/episodes/{slug}").text,
        "signals": client.get(f"/api/episodes/{slug}/signals").text,
        "advantages_meta": json.dumps(adv["episode"]["meta"]),
    }


def as_old_row(client, slug: str) -> None:
    """Rewrite the row as migration 0013 left rows: token_signals in meta_json, no blob."""
    meta_json, blob = stored_row(client, slug)
    meta = ts.merge(json.loads(meta_json), blob)
    with client.app.state.engine.begin() as conn:
        conn.execute(
            text("UPDATE episode SET meta_json = :m, token_signals = NULL WHERE slug = :s"),
            {"m": json_dumps(meta), "s": slug},
        )


@pytest.mark.parametrize("name", ["rank_0.jsonl", "rank_1.jsonl"])
def test_prime_rl_signals_are_packed_and_read_back_as_uploaded(client, name):
    objs = lines(f"prime_rl_tokens/{name}")
    _, eps = stored(client, name, example(f"prime_rl_tokens/{name}"))
    assert len(eps) == len(objs)
    for ep, obj in zip(eps, objs, strict=True):
        want = prime_rl_expected(obj)
        # Exact as JSON text: the names in the file's order, floats as floats, nulls as null.
        assert json.dumps(ep["meta"]["token_signals"]) == json.dumps(want)
        meta_json, blob = stored_row(client, ep["slug"])
        assert "token_signals" not in json.loads(meta_json) and ts.MAGIC in (blob or b"")[:3]
        before = answers(client, ep["slug"])
        assert json.loads(before["advantages_meta"])["token_signals"] == want
        # A row stored before migration 0014 (the same meta as JSON) answers the same.
        as_old_row(client, ep["slug"])
        assert answers(client, ep["slug"]) == before


def test_atropos_token_scores_rows_and_meta(client):
    g2 = lines("atropos/groups.jsonl")[1]
    _, eps = stored(client, "groups.jsonl", example("atropos/groups.jsonl"))
    for i, ep in enumerate(eps[3:]):  # group 2's two sequences
        want = {k: [float(x) for x in g2[k][i]] for k in ("token_scores", "token_weights")}
        assert json.dumps(ep["meta"]["token_signals"]) == json.dumps(want)
        assert "token_signals" not in json.loads(stored_row(client, ep["slug"])[0])
        sig = client.get(f"/api/episodes/{ep['slug']}/signals").json()
        rows = {r["name"]: r["values"] for r in sig["signals"]}
        for k in want:  # the signal row: the value on policy tokens, null elsewhere
            assert rows[k] == [
                v if kind == "policy" else None for v, kind in zip(want[k], ep["kinds"], strict=True)
            ]
        before = answers(client, ep["slug"])
        as_old_row(client, ep["slug"])
        assert answers(client, ep["slug"]) == before


def test_every_json_type_comes_back_as_uploaded(client):
    """Floats (null, -0.0, float64 that float32 cannot hold), ints, booleans and what stays JSON."""
    n = 6
    signals = {
        "weights": [0.0, 1.0, 1.0, 0.0, None, 1.0],  # booleans as 0/1 floats, with a null
        "ratio": [1.0, 0.1, -0.0, 1e-310, 2.0**-40 + 1.0, None],  # float64, a subnormal
        "counts": [0, 1, 2, None, 2**40, -3],
        "masked": [True, False, None, True, True, False],
        "mixed": [0, 0.5, 1, 1, 0, 0],  # ints among floats: JSON keeps them apart, so do we
        "labels": ["a", "b", "c", "d", "e", "f"],
        "ragged": [1.0, 2.0],
        "all_null": [None] * n,
    }
    ep = episode(n_prompt=2, n_policy=4, meta={"task": "t", "token_signals": signals, "z": 1})
    r = upload(client, [ep])
    assert r.status_code == 201, r.text
    slug = r.json()["episodes"][0]["slug"]
    got = client.get(f"/api/episodes/{slug}").json()["meta"]
    source = {"source": "upload:native"}  # added by the upload
    assert json.dumps(got) == json.dumps({"task": "t", "token_signals": signals, "z": 1, **source})
    meta_json, blob = stored_row(client, slug)
    # Only the entries that are not one number of one type per token stay in the JSON, in place.
    assert json.dumps(json.loads(meta_json)) == json.dumps(
        {
            "task": "t",
            "token_signals": {k: signals[k] for k in ("mixed", "labels", "ragged")},
            "z": 1,
            **source,
        }
    )
    assert blob is not None


def test_packed_bits_nan_and_booleans_round_trip_exactly():
    """The blob alone: float64 bits (NaN and infinities read as null, as JSON wrote them), 0/1."""
    rng = np.random.default_rng(3)
    n = 4096
    f64 = rng.normal(size=n)  # not float32-exact: kept as float64
    f64[[5, 6, 7]] = [np.nan, np.inf, -np.inf]
    f32 = rng.normal(size=n).astype(np.float32).astype(np.float64)
    zero_one = (rng.random(n) < 0.3).astype(np.float64)
    meta = {"token_signals": {"f64": f64.tolist(), "f32": f32.tolist(), "mask": zero_one.tolist()}}
    rest, arrays = ts.split(meta, n)
    assert rest == {} and arrays is not None
    at, names, lists = ts.unpack_signals(ts.pack_signals(arrays))
    assert (at, names) == (0, ["f64", "f32", "mask"])
    back = np.array([np.nan if v is None else v for v in lists["f64"]])
    finite = np.isfinite(f64)
    assert np.array_equal(back[finite].view(np.uint64), f64[finite].view(np.uint64))
    assert [i for i, v in enumerate(lists["f64"]) if v is None] == [5, 6, 7]
    assert np.array_equal(np.array(lists["f32"]).view(np.uint64), f32.view(np.uint64))
    assert lists["mask"] == zero_one.tolist() and all(type(v) is float for v in lists["mask"])


def test_the_blob_is_far_smaller_than_the_json_it_replaces(client):
    """A prime-rl-like episode of 8,192 tokens: float32 ratios and KL, 0/1 masks and weights."""
    rng = np.random.default_rng(4)
    n = 8192
    log_ratio = (rng.normal(scale=0.05, size=n)).astype(np.float32)
    ratio = np.exp(log_ratio).astype(np.float32)
    signals = {
        "mismatch_kl": (ratio - log_ratio - 1).astype(np.float32).astype(float).tolist(),
        "importance_ratio": ratio.astype(float).tolist(),
        "is_masked": (rng.random(n) < 0.02).astype(float).tolist(),
        "rl_weights": [0.0] * 1024 + [1.0] * (n - 1024),
    }
    ep = episode(n_prompt=1024, n_policy=n - 1024, meta={"token_signals": signals})
    r = upload(client, [ep])
    assert r.status_code == 201, r.text
    slug = r.json()["episodes"][0]["slug"]
    _, blob = stored_row(client, slug)
    as_json = len(json_dumps(signals))
    # float32 ratios near 1 are ~3 bytes each packed against ~19 characters of JSON; the masks
    # are a few runs. Measured: 0.11 of the JSON (43,884 bytes against 399,935).
    assert blob is not None and len(blob) < 0.2 * as_json
    got = client.get(f"/api/episodes/{slug}").json()["meta"]["token_signals"]
    assert json.dumps(got) == json.dumps(signals)


def test_stored_bytes_count_the_blob(client):
    ep = episode(n_prompt=2, n_policy=3, meta={"token_signals": {"w": [0.5] * 5}})
    r = upload(client, [ep])
    assert r.status_code == 201, r.text
    slug = r.json()["episodes"][0]["slug"]
    meta_json, blob = stored_row(client, slug)
    with client.app.state.engine.connect() as conn:
        stored = conn.execute(text("SELECT stored_bytes FROM batch")).scalar_one()
    assert blob is not None and stored >= len(blob) + len(meta_json)


def test_a_readers_own_arrays_read_back_as_the_lists_json_would_give():
    """A reader may hand numpy arrays over instead of lists: packed as they are, read as lists."""
    f = np.array([0.5, np.nan, -0.0, 1.0])
    i = np.array([3, 0, -2, 7], dtype=np.int64)
    b = np.array([True, False, False, True])
    rest, arrays = ts.split({"a": 1, "token_signals": {"f": f, "i": i, "b": b}}, 4)
    assert rest == {"a": 1} and arrays is not None
    meta = ts.merge(rest, ts.pack_signals(arrays))
    assert json.dumps(meta) == json.dumps(
        {
            "a": 1,
            "token_signals": {
                "f": [0.5, None, -0.0, 1.0],
                "i": [3, 0, -2, 7],
                "b": [True, False, False, True],
            },
        }
    )
