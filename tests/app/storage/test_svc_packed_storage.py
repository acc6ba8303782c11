"""Stored episodes are packed (app/core/packing.py), read back unchanged, and rows stored before
packing still read: the real app on a real SQLite file, real uploads."""

from __future__ import annotations

import json

import numpy as np
from sqlalchemy import text

from app.core import packing
from tests.app.svc_helpers import upload

ARRAYS = ("kinds", "rewards", "values", "logprobs", "advantages", "ref_logprobs", "rollout_logprobs")
ARRAYS += ("entropy", "turn_ids", "token_ids")


def f32(x: np.ndarray) -> list[float]:
    """float32 values as the exact float64 numbers JSON carries (what a trainer logs)."""
    return x.astype(np.float32).astype(np.float64).tolist()


def full_episode(rng: np.random.Generator, n_prompt: int = 300, n_resp: int = 1700) -> dict:
    """An episode with every per-token signal a verl step has, float32 like a trainer's tensors."""
    n = n_prompt + n_resp
    adv = np.zeros(n)
    adv[n_prompt:] = rng.normal()
    rewards = np.zeros(n)
    rewards[-1] = 1.0
    return {
        "tokens": [f"t{i % 977}" for i in range(n)],
        "token_ids": rng.integers(0, 151_000, n).tolist(),
        "kinds": ["prompt"] * n_prompt + ["policy"] * n_resp,
        "reward": 1.0,
        "rewards": rewards.tolist(),
        "values": f32(rng.normal(size=n)),
        "logprobs": f32(-rng.exponential(0.5, n)),
        "ref_logprobs": f32(-rng.exponential(0.5, n)),
        "rollout_logprobs": f32(-rng.exponential(0.5, n)),
        "entropy": f32(rng.exponential(1.0, n)),
        "advantages": f32(adv),
        "group": "g0",
    }


def test_arrays_are_packed_smaller_than_float32_and_read_back_exactly(client):
    rng = np.random.default_rng(0)
    eps = [full_episode(rng) for _ in range(4)]
    r = upload(client, eps)
    assert r.status_code == 201, r.text
    body = r.json()
    columns = ", ".join(f'"{c}"' for c in ARRAYS)
    with client.app.state.engine.connect() as conn:
        rows = conn.execute(text(f"SELECT {columns}, tokens_json, tokens_packed FROM episode")).all()
        stored = conn.execute(text("SELECT stored_bytes FROM batch")).scalar_one()
    raw = packed = 0
    for row, ep in zip(rows, eps, strict=True):
        *blobs, tokens_json, tokens_packed = row
        assert blobs[ARRAYS.index("turn_ids")] is None  # not uploaded
        blobs = [b for b in blobs if b is not None]
        assert len(blobs) == 9 and all(packing.is_packed(b) for b in blobs)
        assert tokens_json == "" and packing.is_packed(tokens_packed)
        packed += sum(map(len, blobs))
        raw += len(ep["tokens"]) * (1 + 4 * 8)  # uint8 kinds; 7 float32 signals, int32 token ids
    # The bound: at most the raw float32/int32 bytes of the same data.
    assert packed <= raw
    assert stored >= packed
    # Every number comes back exactly, through the API and the native export.
    for ep, created in zip(eps, body["episodes"], strict=True):
        got = client.get(f"/api/episodes/{created['slug']}").json()
        for name in ("values", "logprobs", "ref_logprobs", "rollout_logprobs", "entropy", "token_ids"):
            assert got[name] == ep[name], name
        assert got["tokens"] == ep["tokens"] and got["kinds"] == ep["kinds"]


def test_rows_stored_before_packing_still_read(client):
    """A row as written before migration 0009: plain float64/int32/uint8 bytes and JSON tokens."""
    rng = np.random.default_rng(1)
    ep = full_episode(rng, 5, 7)
    ep["values"] = rng.normal(size=12).tolist()  # float64 values that float32 cannot hold
    ep["turn_ids"] = [-1] * 5 + [0] * 3 + [1] * 4
    slug = upload(client, [ep]).json()["episodes"][0]["slug"]
    before = client.get(f"/api/episodes/{slug}").json()
    kinds = bytes([0] * 5 + [1] * 7)
    plain = {name: np.asarray(ep[name], dtype="<f8").tobytes() for name in ARRAYS[1:8]}
    plain["turn_ids"] = np.asarray(ep["turn_ids"], dtype="<i4").tobytes()
    plain["token_ids"] = np.asarray(ep["token_ids"], dtype="<i4").tobytes()
    with client.app.state.engine.begin() as conn:
        sets = ", ".join(f'"{c}" = :{c}' for c in plain)
        conn.execute(
            text(f"UPDATE episode SET kinds = :kinds, {sets}, tokens_json = :tj, tokens_packed = NULL"),
            {"kinds": kinds, **plain, "tj": json.dumps(ep["tokens"])},
        )
        assert not packing.is_packed(conn.execute(text('SELECT "values" FROM episode')).scalar_one())
    after = client.get(f"/api/episodes/{slug}").json()
    assert after == before
    assert after["values"] == ep["values"]
    # The advantages API decodes the old row too.
    r = client.get(f"/api/episodes/{slug}/advantages", params={"scheme": "uploaded"})
    assert r.status_code == 200, r.text
